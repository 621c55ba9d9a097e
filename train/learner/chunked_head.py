"""Log-probabilities and entropy of the next tokens from the model's last hidden states, the LM head applied a token
chunk at a time.

The full path (the model's logits, then fp32 log-softmax) holds tokens x vocab fp32 values per micro-batch, and
autograd keeps them until the backward: 16K tokens of Qwen3's 151,936-word vocabulary are 10 GB, twice over with
the log-softmax beside them. Here the head runs on `chunk` tokens at a time under activation checkpointing: the
forward keeps each chunk's hidden states (alive anyway) and its `chunk` logprobs, and the backward recomputes one
chunk's logits at a time. The ops are the full path's (the head's matmul in bf16 where autocast or FSDP's mixed
precision has it, then fp32 / T, log-softmax, gather), so the numbers agree to float tolerance.

The head stays inside the model's own forward: `ChunkedHead` stands in for the `lm_head` Linear (the same
Parameter, so state-dict names and a tied embedding are kept), because under FSDP2 the root module's forward hooks
gather the head's (or the tied embedding's) shards before it runs and reduce its gradient after the backward; a
head applied after the forward returned would miss them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint


class ChunkedHead(torch.nn.Linear):
    """The model's `lm_head`, its class swapped in place by `install`. Called by the model as always, it returns
    logits (generation, SFT); inside `targets(...)` it returns, per position, [logprob of the target, entropy]
    instead, and the model's `logits` output holds those. One request at a time: the learner's forward passes run
    one after another, and the hf engine that may share the model never runs during an update."""

    request: tuple[torch.Tensor, float, int, torch.Tensor | None] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.request is None:
            return super().forward(hidden)
        targets, temperature, chunk, select = self.request
        logp, entropy = chunked_logprobs(hidden[:, :targets.size(1)], self.weight, self.bias, targets, temperature,
                                         chunk, select)
        return torch.stack([logp, entropy], -1)

    @contextlib.contextmanager
    def targets(self, targets: torch.Tensor, temperature: float, chunk: int, select: torch.Tensor | None = None
                ) -> Iterator[None]:
        """While open, the forward gives targets' [batch, width] logprobs under softmax(logits / temperature) and
        the entropy of that distribution (detached: a metric), `chunk` tokens at a time; position t of `targets`
        is the token that follows position t of the input. With `select` ([batch, width], true where wanted) the
        head runs on those positions only and the others hold 0."""
        if chunk < 1:
            raise ValueError(f"the logprob chunk must be at least 1 token, not {chunk!r}")
        self.request = (targets, temperature, chunk, select)
        try:
            yield
        finally:
            self.request = None


def install(model: torch.nn.Module) -> ChunkedHead:
    """Make the model's output embedding a `ChunkedHead` (before FSDP shards it); idempotent."""
    head = model.get_output_embeddings()
    if isinstance(head, ChunkedHead):
        return head
    if type(head) is not torch.nn.Linear:
        raise TypeError(f"the chunked logprobs need the model's output head to be a torch Linear, not "
                        f"{type(head).__name__}: set logprob_chunk_tokens: 0 for the full-logits path")
    head.__class__ = ChunkedHead
    return head


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                     temperature: float, chunk: int, select: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, width] logprob of each target, [batch, width] entropy) from [batch, width, hidden] states, the
    head `chunk` tokens at a time; with gradients on, each chunk is checkpointed so its logits live only while
    that chunk is computed (forward, then again in the backward). With `select` ([batch, width] booleans) only the
    selected positions go through the head (an RL update reads the response's, not the prompt's or the padding's);
    the others are 0."""
    batch, width = targets.shape
    hidden, targets = hidden.reshape(batch * width, -1), targets.reshape(-1)
    if select is not None:
        where = select.reshape(-1).nonzero().squeeze(-1)
        hidden, targets = hidden.index_select(0, where), targets.index_select(0, where)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, entropies = [], []
    # split, not slicing: its backward assembles the hidden states' gradient once, not one full-size tensor a chunk
    for h, t in zip(hidden.split(chunk), targets.split(chunk), strict=True):
        if grad:
            logp, entropy = checkpoint(_chunk, h, weight, bias, t, temperature, use_reentrant=False)
        else:
            logp, entropy = _chunk(h, weight, bias, t, temperature)
        logps.append(logp)
        entropies.append(entropy)
    logp, entropy = torch.cat(logps), torch.cat(entropies)  # none selected: split still gives one empty chunk
    if select is not None:
        logp = logp.new_zeros(batch * width).index_copy(0, where, logp)
        entropy = entropy.new_zeros(batch * width).index_copy(0, where, entropy)
    return logp.view(batch, width), entropy.view(batch, width)


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
           temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), -1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # after the gather, so the backward's recomputation stops before it
        entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy
