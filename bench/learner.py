"""`rstar2 bench learner`: the peak memory of one RL policy update (the old-logprob pass, the loss, the backward),
side by side in one process, for each of the learner's memory settings against today's path (micro_batch
trajectories right-padded, full-vocabulary fp32 logits, no activation checkpointing): the LM head in token chunks
(`logprob_chunk_tokens`), micro-batches packed by a token budget (`micro_batch_tokens`), and activation
checkpointing (`gradient_checkpointing`), alone and together.

The policy is a random Qwen3-shaped model (Qwen3's 151,936-word vocabulary, a few narrow layers) or any model
given; the trajectories have a long tail of response lengths as RL rollouts do. Peak memory is what the update
allocates above what was allocated before it: on CUDA torch's allocator statistics, on CPU every allocation and
free the profiler records, summed in order. Every setting computes the same update: the loss column shows it.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass
class LearnerBench:
    model: str
    device: str
    trajectories: int
    tokens: int  # prompt + response tokens of the update
    micro_batch: int
    budget: int
    chunk: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # setting, peak MiB, ratio to the first row, ...


def random_qwen3(folder: Path, layers: int = 4, hidden: int = 256) -> str:
    """A random Qwen3-architecture model at Qwen3's vocabulary (untied head, as Qwen3-14B's), with SmolLM2's
    tokenizer beside it (the learner reads only its pad id): nothing is downloaded."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from rstar2_agent.models import resolve_model

    cfg = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=False,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path).save_pretrained(folder)
    return str(folder)


def trajectories(n: int, prompt: int, max_response: int, seed: int = 0) -> list[Any]:
    """`n` kept rollouts: prompts of about `prompt` tokens, responses from 1/8 of `max_response` to all of it (one
    at the cap, the rest spread below it: the long tail that padding pays for), advantages of both signs."""
    from rstar2_agent.train.learner.update import UpdateItem

    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        r = max_response if i == 0 else int(max_response * (0.125 + 0.875 * float(torch.rand(1, generator=g)) ** 2))
        p = prompt + int(torch.randint(-prompt // 4, prompt // 4 + 1, (1,), generator=g))
        ids = torch.randint(3, 49152, (p + r,), generator=g).tolist()
        items.append(UpdateItem(ids[:p], ids[p:], [1] * r, [-1.0] * r, 1.0 if i % 2 else -1.0))
    return items


def peak_bytes(fn: Any, device: torch.device) -> tuple[int, Any]:
    """(bytes allocated at the peak of `fn()` above what was allocated before it, its result)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, out
    from torch.autograd import DeviceType

    with torch.autograd.profiler.profile(profile_memory=True) as prof:  # every allocation and free, in order
        out = fn()
    records = sorted((e.start_ns(), e.nbytes()) for e in prof.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = peak = 0
    for _, n in records:
        live += n
        peak = max(peak, live)
    return peak, out


def bench_learner(model: str | None = None, n: int = 8, prompt: int = 128, max_response: int = 512,
                  micro_batch: int = 4, budget: int = 0, chunk: int = 128, dtype: str = "fp32", layers: int = 4,
                  hidden: int = 256) -> LearnerBench:
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.model import TorchLearner
    from rstar2_agent.train.learner.update import UpdateConfig, length, micro_batches, policy_update

    with tempfile.TemporaryDirectory() as tmp:
        path = resolve_model(model).path if model else random_qwen3(Path(tmp), layers, hidden)
        learner = TorchLearner(path, OptimConfig(), 1, dtype=dtype)
    items = trajectories(n, prompt, max_response)
    budget = budget or -(-max(map(length, items)) * 4 // 3)  # the recipe's 16K over 12K responses, scaled
    total = sum(len(t.response_ids) for t in items)
    out = LearnerBench(model or f"random Qwen3 ({layers} layers, hidden {hidden}, vocabulary 151,936)",
                       str(learner.device), n, sum(map(length, items)), micro_batch, budget, chunk)
    for checkpointing in (False, True):
        if checkpointing:
            learner.model.gradient_checkpointing_enable()
        for tokens in (0, budget):
            for c in (0, chunk):
                cfg = UpdateConfig(micro_batch=micro_batch, micro_batch_tokens=tokens, logprob_chunk_tokens=c,
                                   pad_id=learner.tokenizer.pad_token_id or 0)
                learner.model.zero_grad(set_to_none=True)
                peak, metrics = peak_bytes(lambda cfg=cfg: policy_update(learner, items, cfg, total), learner.device)
                positions = sum(b["input_ids"].numel() for b in micro_batches(items, micro_batch, cfg.pad_id,
                                                                              tokens=tokens))
                name = ", ".join([f"packed {tokens}" if tokens else f"padded x{micro_batch}",
                                  f"chunks of {c}" if c else "full logits"] + ["checkpointing"] * checkpointing)
                out.rows.append({"setting": name, "peak_mib": peak / 2**20, "ratio": peak / (
                    out.rows[0]["peak_mib"] * 2**20) if out.rows else 1.0, "positions": positions,
                    "loss": metrics["loss"]})
                log.info("%s: %.0f MiB", name, peak / 2**20)
    learner.model.gradient_checkpointing_disable()
    return out
