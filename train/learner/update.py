"""One policy update's forward and backward (GRPO-RoC's token-level PPO-clip loss), shared by the in-process
learner (local.py) and each FSDP rank of the Ray learner group (ray_group.py). What it reads of the recipe is
`UpdateConfig`, built once per run (rl.py `update_config`) and sent to the ranks instead of the recipe.

Before the first gradient, a no-grad forward pass of the pre-update policy gives the old logprobs of the kept
rollouts (verl's `compute_log_prob`, which the release runs after down-sampling), and the PPO ratio is taken
against them, not against the rollout engine's: vLLM in bf16 and an fp32 (or FSDP) learner give the same
token different logprobs, and a ratio against the engine's would fire the clip on that mismatch alone. With one
optimizer step per RL step (one PPO epoch, one mini-batch: ours, and the release's with train_batch_size =
ppo_mini_batch_size = 128) the weights do not move between that pass and the update's forwards, so the ratio is 1
on every token and the clip never fires: the update is the plain token-level policy gradient of the learner's
policy. The engine's logprobs measure the gap per step, and with `rollout_correction: tis` weight each token by
min(pi_learner / pi_engine, tis_cap), the correction for having sampled from the engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..loss import ppo_clip_loss, rollout_mismatch, tis_weights, token_logprobs
from .model import TorchLearner

ROLLOUT_CORRECTIONS = ("auto", "none", "tis")


class UpdateStopped(Exception):
    """The update was asked to stop (its command is ending: SIGTERM, Ctrl-C) and did, between two micro-batches."""


def check_stop(stop: threading.Event | None) -> None:
    """Raise `UpdateStopped` when `stop` is set: called before every micro-batch's forward, so a command that ends
    waits for one micro-batch, not the whole update (minutes at 14B, and minutes on 2 CPU cores here)."""
    if stop is not None and stop.is_set():
        raise UpdateStopped("the policy update was stopped before its optimizer step; nothing of it is kept")


@dataclass(frozen=True)
class UpdateConfig:
    """What one policy update reads: the micro-batch size, the sampling temperature the logprobs are taken at, the
    PPO clip bounds, the rollout correction (`none` or `tis`, already resolved from the recipe's `auto`) and its
    cap, and the tokenizer's pad id."""
    micro_batch: int = 8
    temperature: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    rollout_correction: str = "none"
    tis_cap: float = 2.0
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.rollout_correction not in ("none", "tis"):
            raise ValueError(f"an update's rollout_correction is none or tis (auto is resolved by the recipe), not "
                             f"{self.rollout_correction!r}")
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, not {self.micro_batch!r}")


@dataclass
class UpdateItem:
    """What the learner needs of one kept rollout (Ray ships these to the learner ranks)."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]  # the rollout engine's
    advantage: float


def check_rollout_correction(mode: str, cap: float) -> None:
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout_correction must be one of {', '.join(ROLLOUT_CORRECTIONS)}, not {mode!r} "
                         "(tis: truncated importance weights against the rollout engine's policy; auto: none, or tis "
                         "when max_staleness >= 1)")
    if not cap > 0:
        raise ValueError(f"tis_cap must be a positive number (verl's default is 2.0), not {cap!r}")


def policy_update(learner: TorchLearner, items: list[UpdateItem], cfg: UpdateConfig, total_tokens: int, *,
                  batches: int = 0, scale: float = 1.0, stop: threading.Event | None = None) -> dict[str, float]:
    """The old-logprob pass, then forward and backward of the token-level PPO-clip loss over `items` in
    micro-batches (no optimizer step).
    The loss is divided by the whole step's response tokens, so micro-batches and ranks add up; `batches`
    pads with empty micro-batches (FSDP ranks must run as many forward passes) and `scale` undoes FSDP's
    gradient averaging over ranks. Metrics are this share's token-weighted parts. With `stop` set it raises
    `UpdateStopped` before the next micro-batch (see `check_stop`)."""
    parts = micro_batches(items, cfg.micro_batch, cfg.pad_id, batches)
    old = old_logprobs(learner, parts, cfg.temperature, stop)
    learner.model.train()
    denominator = max(1, total_tokens)
    metrics: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
    for batch, old_logp in zip(parts, old, strict=True):
        check_stop(stop)
        logits = learner.logits({"input_ids": batch["input_ids"], "attention_mask": batch["attention"]})
        logits, targets = logits[:, :-1], batch["input_ids"][:, 1:].to(learner.device)
        logp = token_logprobs(logits, targets, cfg.temperature)
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
        metrics["entropy"] += _entropy_sum(logits, mask, cfg.temperature) / denominator
        metrics["loss"] += float(loss.detach())
        for k, v in (clip | stats).items():
            metrics[k] = metrics.get(k, 0.0) + v * share
    learner.model.eval()
    return metrics


def chunks(items: list[UpdateItem], size: int) -> list[list[UpdateItem]]:
    """`items` in micro-batches of at most `size`, in order: the one place an update is cut into micro-batches."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def shards(items: list[UpdateItem], world: int, size: int) -> tuple[list[list[UpdateItem]], int]:
    """Rank r's items (r, r + world, ...) and the micro-batches every rank must run (the most any rank has), so
    the ranks' FSDP collectives line up."""
    parts = [items[r::world] for r in range(world)]
    return parts, max(len(chunks(p, size)) for p in parts)


def micro_batches(items: list[UpdateItem], size: int, pad_id: int, batches: int = 0) -> list[dict[str, torch.Tensor]]:
    """`items` in micro-batches of `size` (see `_batch`), padded to `batches` with empty ones."""
    parts = chunks(items, size)
    parts += [[UpdateItem([pad_id, pad_id], [], [], [], 0.0)]] * max(0, batches - len(parts))
    return [_batch(part, pad_id) for part in parts]


@torch.no_grad()
def old_logprobs(learner: TorchLearner, parts: list[dict[str, torch.Tensor]], temperature: float,
                 stop: threading.Event | None = None) -> list[torch.Tensor]:
    """The current (pre-update) policy's logprob of every token under softmax(logits / T), one [batch, width - 1]
    tensor per micro-batch (position t holds token t + 1, as in the update), without gradients or dropout."""
    learner.model.eval()
    out = []
    for batch in parts:
        check_stop(stop)
        logits = learner.logits({"input_ids": batch["input_ids"], "attention_mask": batch["attention"]})
        out.append(token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:].to(learner.device), temperature))
    return out


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
        ("input_ids", torch.long), ("attention", torch.long), ("mask", torch.float32),
        ("engine_logp", torch.float32), ("adv", torch.float32))}
    out["input_ids"].fill_(pad_id)
    for b, t in enumerate(items):
        p, r = len(t.prompt_ids), len(t.response_ids)
        out["input_ids"][b, :p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        out["attention"][b, :p + r] = 1
        if r:
            out["mask"][b, p:p + r] = torch.tensor(t.response_mask, dtype=torch.float32)
            out["engine_logp"][b, p:p + r] = torch.tensor(t.logprobs, dtype=torch.float32)
        out["adv"][b, p:p + r] = t.advantage
    return out
