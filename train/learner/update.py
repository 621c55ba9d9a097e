"""One policy update's forward and backward (GRPO-RoC's token-level PPO-clip loss), shared by the in-process
learner (local.py) and each FSDP rank of the Ray learner group (ray_group.py). What it reads of the recipe is
`UpdateConfig`, built once per run (rl.py `update_config`) and sent to the ranks instead of the recipe.

Before the first gradient, a no-grad forward pass of the pre-update policy gives the old logprobs of the kept
rollouts (verl's `compute_log_prob`, which the release runs after down-sampling), and the PPO ratio is taken
against them, not against the rollout engine's: vLLM in bf16 and an fp32 (or FSDP) learner give the same
token different logprobs, and a ratio against the engine's would fire the clip on that mismatch alone. With one
optimizer step per RL step (one PPO epoch, one mini-batch: the default, and the release's with train_batch_size =
ppo_mini_batch_size = 128) the weights do not move between that pass and the update's forwards, so the ratio is 1
on every token and the clip never fires: the update is the plain token-level policy gradient of the learner's
policy. `ppo_mini_batches` > 1 cuts the step into that many optimizer steps against the same old logprobs
(`ppo_update`), and from the second on the ratio and the clip act. The engine's logprobs measure the gap per
step, and with `rollout_correction: tis` weight each token by min(pi_learner / pi_engine, tis_cap), the
correction for having sampled from the engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..config import LOGPROB_CHUNK_TOKENS
from ..loss import ppo_clip_loss, rollout_mismatch, tis_weights, token_entropy, token_logprobs
from .model import TorchLearner


class UpdateStopped(Exception):
    """The update was asked to stop (its command is ending: SIGTERM, Ctrl-C) and did, between two micro-batches."""


def check_stop(stop: threading.Event | None) -> None:
    """Raise `UpdateStopped` when `stop` is set: called before every micro-batch's forward, so a command that ends
    waits for one micro-batch, not the whole update (minutes at 14B, and minutes on 2 CPU cores here)."""
    if stop is not None and stop.is_set():
        raise UpdateStopped("the policy update was stopped before its optimizer step; nothing of it is kept")


@dataclass(frozen=True)
class UpdateConfig:
    """What one policy update reads: the micro-batch (`micro_batch` trajectories right-padded, or with
    `micro_batch_tokens` > 0 trajectories packed back to back up to that many tokens), the LM head's token chunk
    (`logprob_chunk_tokens`; 0: full-vocabulary logits), the sampling temperature the logprobs are taken at, the PPO
    clip bounds, the rollout correction (`none` or `tis`, already resolved from the recipe's `auto`) and its cap, and
    the tokenizer's pad id."""
    micro_batch: int = 8
    temperature: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    rollout_correction: str = "none"
    tis_cap: float = 2.0
    pad_id: int = 0
    micro_batch_tokens: int = 0
    logprob_chunk_tokens: int = LOGPROB_CHUNK_TOKENS
    ppo_mini_batches: int = 1

    def __post_init__(self) -> None:
        if self.rollout_correction not in ("none", "tis"):
            raise ValueError(f"an update's rollout_correction is none or tis (auto is resolved by the recipe), not "
                             f"{self.rollout_correction!r}")
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, not {self.micro_batch!r}")
        if not isinstance(self.ppo_mini_batches, int) or self.ppo_mini_batches < 1:
            raise ValueError(f"ppo_mini_batches must be a whole number, at least 1 (1: one optimizer step per RL step, "
                             f"as the release), not {self.ppo_mini_batches!r}")
        for name in ("micro_batch_tokens", "logprob_chunk_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number of tokens, 0 to turn it off, not {value!r}")


@dataclass
class UpdateItem:
    """What the learner needs of one kept rollout (Ray ships these to the learner ranks)."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]  # the rollout engine's
    advantage: float


def policy_update(learner: TorchLearner, items: list[UpdateItem], cfg: UpdateConfig, total_tokens: int, *,
                  batches: int = 0, scale: float = 1.0, stop: threading.Event | None = None) -> dict[str, float]:
    """The old-logprob pass, then forward and backward of the token-level PPO-clip loss over `items` in
    micro-batches (no optimizer step).
    The loss is divided by the whole step's response tokens, so micro-batches and ranks add up; `batches`
    pads with empty micro-batches (FSDP ranks must run as many forward passes) and `scale` undoes FSDP's
    gradient averaging over ranks. Metrics are this share's token-weighted parts. With `stop` set it raises
    `UpdateStopped` before the next micro-batch (see `check_stop`)."""
    parts = micro_batches(items, cfg.micro_batch, cfg.pad_id, batches, tokens=cfg.micro_batch_tokens)
    old = old_logprobs(learner, parts, cfg.temperature, stop, chunk=cfg.logprob_chunk_tokens)
    return _loss_backward(learner, parts, old, cfg, total_tokens, scale, stop)


def ppo_update(learner: TorchLearner, minis: list[list[UpdateItem]], cfg: UpdateConfig, totals: list[int], *,
               batches: list[int] | None = None, scale: float = 1.0, stop: threading.Event | None = None
               ) -> dict[str, float]:
    """One RL step's update as PPO mini-batches (`mini_shards`): the old logprobs of every mini-batch first, under
    the pre-update policy, then each mini-batch's loss (over its own `totals[i]` response tokens, across ranks) and
    an optimizer step. With one mini-batch this is `policy_update` and one step. The schedule and `learner.step`
    advance once per RL step (verl steps its lr scheduler once per update too), so warm-up counts RL steps whatever
    the mini-batch count. Metrics: the mini-batches' token-weighted, grad_norm their mean, lr the step's."""
    batches = batches or [0] * len(minis)
    parts = [micro_batches(m, cfg.micro_batch, cfg.pad_id, b, tokens=cfg.micro_batch_tokens)
             for m, b in zip(minis, batches, strict=True)]
    olds = [old_logprobs(learner, p, cfg.temperature, stop, chunk=cfg.logprob_chunk_tokens) for p in parts]
    whole = max(1, sum(totals))
    out: dict[str, float] = {}
    norms = []
    for k, (part, old, total) in enumerate(zip(parts, olds, totals, strict=True)):
        metrics = _loss_backward(learner, part, old, cfg, total, scale, stop)
        check_stop(stop)
        step = learner.optimizer_step(advance=k == len(parts) - 1)
        norms.append(step["grad_norm"])
        out.setdefault("lr", step["lr"])
        for key, v in metrics.items():
            out[key] = out.get(key, 0.0) + v * total / whole
    return {**out, "grad_norm": sum(norms) / len(norms), "ppo_mini_batches": float(len(parts))}


def mini_shards(items: list[UpdateItem], world: int, cfg: UpdateConfig
                ) -> tuple[list[list[list[UpdateItem]]], list[int], list[int]]:
    """The step's items as `cfg.ppo_mini_batches` mini-batches in order (the release's and verl's split), each
    sharded over `world` ranks (`shards`): per rank its list of mini-batch shares, each mini-batch's response tokens
    over all ranks (its loss's denominator), and the micro-batches every rank runs in it. Empty mini-batches
    (fewer items than mini-batches) are left out; with no items at all there is one, empty, so the step (no
    gradient) still advances the schedule."""
    n, k = len(items), cfg.ppo_mini_batches
    minis = [m for m in (items[i * n // k:(i + 1) * n // k] for i in range(k)) if m] or [[]]  # none: one empty step
    per_rank: list[list[list[UpdateItem]]] = [[] for _ in range(world)]
    totals, batches = [], []
    for mini in minis:
        parts, b = shards(mini, world, cfg.micro_batch, cfg.micro_batch_tokens)
        for r in range(world):
            per_rank[r].append(parts[r])
        totals.append(sum(sum(i.response_mask) for i in mini))
        batches.append(b)
    return per_rank, totals, batches


def _loss_backward(learner: TorchLearner, parts: list[dict[str, torch.Tensor]], old: list[torch.Tensor],
                   cfg: UpdateConfig, total_tokens: int, scale: float, stop: threading.Event | None
                   ) -> dict[str, float]:
    """Forward and backward of the PPO-clip loss over prepared micro-batches against their old logprobs."""
    learner.model.train()
    denominator = max(1, total_tokens)
    metrics: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
    for batch, old_logp in zip(parts, old, strict=True):
        check_stop(stop)
        logp, entropy = forward_logprobs(learner, batch, cfg.temperature, cfg.logprob_chunk_tokens)
        mask = batch["mask"][:, 1:].to(learner.device)
        engine_logp = batch["engine_logp"][:, 1:].to(learner.device)
        stats = rollout_mismatch(old_logp, engine_logp, mask)
        weights = None
        if cfg.rollout_correction == "tis":
            weights, tis = tis_weights(old_logp, engine_logp, mask, cfg.tis_cap)
            stats |= tis
        loss, clip = ppo_clip_loss(logp, old_logp, batch["adv"][:, 1:].to(learner.device), mask, cfg.eps_low,
                                   cfg.eps_high, denominator=denominator, weights=weights)
        (loss * scale).backward()
        share = float(mask.sum()) / denominator
        metrics["entropy"] += float((entropy.detach() * mask).sum()) / denominator
        metrics["loss"] += float(loss.detach())
        for k, v in (clip | stats).items():
            metrics[k] = metrics.get(k, 0.0) + v * share
    learner.model.eval()
    return metrics


MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def forward_logprobs(learner: TorchLearner, batch: dict[str, torch.Tensor], temperature: float, chunk: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's logprob of the next token under softmax(logits / T) and the entropy there, [batch, width - 1]
    each (position t holds token t + 1): the LM head `chunk` tokens at a time (chunked_head.py), on the positions
    whose next token is a generated one (the batch's `mask`, all that the loss and its metrics read; the prompt, tool
    output and padding positions hold 0), or with `chunk` 0 from the full-vocabulary fp32 logits, every position."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if chunk:
        select = batch["mask"][:, 1:] > 0 if "mask" in batch else None
        return learner.chunked_logprobs(inputs, temperature, chunk, select)
    logits = learner.logits(inputs)[:, :-1]
    targets = batch["input_ids"][:, 1:].to(learner.device)
    return token_logprobs(logits, targets, temperature), token_entropy(logits, temperature)


def length(item: UpdateItem) -> int:
    return len(item.prompt_ids) + len(item.response_ids)


def chunks(items: list[UpdateItem], size: int) -> list[list[UpdateItem]]:
    """`items` in micro-batches of at most `size`, in order."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def token_chunks(items: list[UpdateItem], budget: int) -> list[list[UpdateItem]]:
    """`items` in micro-batches of at most `budget` tokens (prompt + response), first-fit decreasing: longest first,
    each into the first micro-batch it fits in (fewer forward passes than cutting in order). A trajectory longer
    than the budget is a micro-batch of its own (RLRun refuses a budget below the longest response, so only a long
    prompt can take one over)."""
    parts: list[list[UpdateItem]] = []
    room: list[int] = []
    for t in sorted(items, key=length, reverse=True):
        n = length(t)
        i = next((i for i, r in enumerate(room) if n <= r), None)
        if i is None:
            parts.append([t])
            room.append(budget - n)
        else:
            parts[i].append(t)
            room[i] -= n
    return parts


def cut(items: list[UpdateItem], size: int, tokens: int = 0) -> list[list[UpdateItem]]:
    """The one place an update is cut into micro-batches: by `tokens` when set, else `size` trajectories each."""
    return token_chunks(items, tokens) if tokens else chunks(items, size)


def shards(items: list[UpdateItem], world: int, size: int, tokens: int = 0) -> tuple[list[list[UpdateItem]], int]:
    """Each rank's items and the micro-batches every rank must run (the most any rank has), so the ranks' FSDP
    collectives line up. By trajectories: rank r takes items r, r + world, ...; with a token budget (`tokens`), the
    items go longest first to the rank with the fewest tokens so far, so every rank has about the same work."""
    if tokens:
        parts: list[list[UpdateItem]] = [[] for _ in range(world)]
        load = [0] * world
        for t in sorted(items, key=length, reverse=True):
            r = load.index(min(load))
            parts[r].append(t)
            load[r] += length(t)
    else:
        parts = [items[r::world] for r in range(world)]
    return parts, max(len(cut(p, size, tokens)) for p in parts)


def micro_batches(items: list[UpdateItem], size: int, pad_id: int, batches: int = 0, tokens: int = 0
                  ) -> list[dict[str, torch.Tensor]]:
    """`items` cut into micro-batches (`cut`), padded to `batches` with empty ones; each right-padded (`_batch`) or,
    with a token budget, packed into one row (`_packed`)."""
    parts = cut(items, size, tokens)
    parts += [[UpdateItem([pad_id, pad_id], [], [], [], 0.0)]] * max(0, batches - len(parts))
    return [_packed(part) if tokens else _batch(part, pad_id) for part in parts]


@torch.no_grad()
def old_logprobs(learner: TorchLearner, parts: list[dict[str, torch.Tensor]], temperature: float,
                 stop: threading.Event | None = None, chunk: int = LOGPROB_CHUNK_TOKENS) -> list[torch.Tensor]:
    """The current (pre-update) policy's logprob of every token under softmax(logits / T), one [batch, width - 1]
    tensor per micro-batch (position t holds token t + 1, as in the update), without gradients or dropout."""
    learner.model.eval()
    out = []
    for batch in parts:
        check_stop(stop)
        out.append(forward_logprobs(learner, batch, temperature, chunk)[0])
    return out


def _batch(items: list[UpdateItem], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt + response ids, the attention mask, the response mask (generated tokens), the engine's
    logprobs and each token's advantage, aligned so that position t holds token t."""
    width = max(length(t) for t in items)
    out = {k: torch.zeros((len(items), width), dtype=d) for k, d in (
        ("input_ids", torch.long), ("attention_mask", torch.long), ("mask", torch.float32),
        ("engine_logp", torch.float32), ("adv", torch.float32))}
    out["input_ids"].fill_(pad_id)
    for b, t in enumerate(items):
        p, r = len(t.prompt_ids), len(t.response_ids)
        out["input_ids"][b, :p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        out["attention_mask"][b, :p + r] = 1
        if r:
            out["mask"][b, p:p + r] = torch.tensor(t.response_mask, dtype=torch.float32)
            out["engine_logp"][b, p:p + r] = torch.tensor(t.logprobs, dtype=torch.float32)
        out["adv"][b, p:p + r] = t.advantage
    return out


def _packed(items: list[UpdateItem]) -> dict[str, torch.Tensor]:
    """The trajectories back to back in one row, no padding, with position ids restarting at each: with no
    attention mask, transformers reads the restarts as sequence boundaries (masking_utils
    `find_packed_sequence_indices`: a block-diagonal causal mask for sdpa and eager, varlen for flash attention), so
    no token attends across trajectories. The position that predicts the next trajectory's first token is a
    prompt position (mask 0), so nothing is learned across a boundary either. Keys as `_batch`'s, with
    `position_ids` in place of `attention_mask`."""
    cols: dict[str, list] = {k: [] for k in ("input_ids", "position_ids", "mask", "engine_logp", "adv")}
    for t in items:
        p, r = len(t.prompt_ids), len(t.response_ids)
        cols["input_ids"] += t.prompt_ids + t.response_ids
        cols["position_ids"] += range(p + r)
        cols["mask"] += [0.0] * p + [float(m) for m in t.response_mask]
        cols["engine_logp"] += [0.0] * p + list(t.logprobs)
        cols["adv"] += [0.0] * p + [t.advantage] * r
    return {k: torch.tensor([v], dtype=torch.long if k in ("input_ids", "position_ids") else torch.float32)
            for k, v in cols.items()}
