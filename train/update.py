"""One policy update's forward and backward (GRPO-RoC's token-level PPO-clip loss), shared by the in-process
learner (rl.py) and each FSDP rank of the Ray learner group (distributed.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .learner import Learner
from .loss import ppo_clip_loss, token_logprobs


@dataclass
class UpdateItem:
    """What the learner needs of one kept rollout (Ray ships these to the learner ranks)."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    advantage: float


def policy_update(learner: Learner, items: list[UpdateItem], cfg: Any, total_tokens: int, pad_id: int, *,
                  batches: int = 0, scale: float = 1.0) -> dict[str, float]:
    """Forward and backward of the token-level PPO-clip loss over `items` in micro-batches (no optimizer step);
    `cfg` is the run's RLConfig (micro_batch, temperature, eps_low, eps_high).
    The loss is divided by the whole step's response tokens, so micro-batches and ranks add up; `batches`
    pads with empty micro-batches (FSDP ranks must run as many forward passes) and `scale` undoes FSDP's
    gradient averaging over ranks. Metrics are this share's token-weighted parts."""
    learner.model.train()
    chunks: list[list[UpdateItem]] = [items[i:i + cfg.micro_batch] for i in range(0, len(items), cfg.micro_batch)]
    chunks += [[UpdateItem([pad_id, pad_id], [], [], [], 0.0)]] * max(0, batches - len(chunks))
    metrics = {"loss": 0.0, "clip_frac": 0.0, "logprob_gap": 0.0, "entropy": 0.0}
    for part in chunks:
        batch = _batch(part, pad_id)
        logits = learner.logits({"input_ids": batch["input_ids"], "attention_mask": batch["attention"]})
        logits, targets = logits[:, :-1], batch["input_ids"][:, 1:].to(learner.device)
        logp = token_logprobs(logits, targets, cfg.temperature)
        mask = batch["mask"][:, 1:].to(learner.device)
        loss, stats = ppo_clip_loss(logp, batch["old_logp"][:, 1:].to(learner.device),
                                    batch["adv"][:, 1:].to(learner.device), mask, cfg.eps_low, cfg.eps_high,
                                    denominator=max(1, total_tokens))
        (loss * scale).backward()
        weight = float(mask.sum()) / max(1, total_tokens)
        metrics["entropy"] += _entropy_sum(logits, mask, cfg.temperature) / max(1, total_tokens)
        metrics["loss"] += float(loss.detach())
        metrics["clip_frac"] += stats["clip_frac"] * weight
        metrics["logprob_gap"] += stats["logprob_gap"] * weight
    learner.model.eval()
    return metrics


@torch.no_grad()
def _entropy_sum(logits: torch.Tensor, mask: torch.Tensor, temperature: float, chunk: int = 128) -> float:
    """The sampling distribution's entropy summed over the masked positions, `chunk` positions at a time: a
    full-vocabulary softmax of the whole micro-batch at once would be several GB of temporaries on long rollouts."""
    total = 0.0
    for s in range(0, logits.size(1), chunk):
        logp = torch.log_softmax(logits[:, s:s + chunk] / max(temperature, 1e-6), -1)
        total += float(((-(logp.exp() * logp).sum(-1)) * mask[:, s:s + chunk]).sum())
    return total


def _batch(items: list[UpdateItem], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt + response ids, the response mask (generated tokens), the engine's logprobs and
    each token's advantage, aligned so that position t holds token t."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in items)
    out = {k: torch.zeros((len(items), width), dtype=d) for k, d in (
        ("input_ids", torch.long), ("attention", torch.long), ("mask", torch.float32), ("old_logp", torch.float32),
        ("adv", torch.float32))}
    out["input_ids"].fill_(pad_id)
    for b, t in enumerate(items):
        p, r = len(t.prompt_ids), len(t.response_ids)
        out["input_ids"][b, :p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        out["attention"][b, :p + r] = 1
        if r:
            out["mask"][b, p:p + r] = torch.tensor(t.response_mask, dtype=torch.float32)
            out["old_logp"][b, p:p + r] = torch.tensor(t.logprobs, dtype=torch.float32)
        out["adv"][b, p:p + r] = t.advantage
    return out
