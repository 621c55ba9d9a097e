"""The `Learner` protocol: what the RL step asks of a learner, whichever backend holds it (this process, a Ray group
of FSDP ranks, or learner and engines sharing GPUs). train/placement.py picks and builds one from the recipe."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from .update import UpdateConfig, UpdateItem


class Learner(Protocol):
    step: int  # optimizer steps taken: the policy version the rollouts are tagged with
    tokenizer: Any

    def update(self, items: list[UpdateItem], cfg: UpdateConfig, total_tokens: int,
               stop: threading.Event | None = None) -> dict[str, float]:
        """One policy update on the kept rollouts (the old-logprob pass, then the loss and an optimizer step per PPO
        mini-batch, `cfg.ppo_mini_batches`); its metrics.
        `stop` set: raise `UpdateStopped` before the next micro-batch and take no optimizer step."""

    def full_state_dict(self) -> dict[str, Any]:
        """The whole model's weights (every rank takes part; rank 0's are complete): the chunked push sends them."""

    def score(self, ids: list[int], start: int) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]` at temperature 1 (the checked weight push, push_check.py);
        `compute_dtype` ("fp32" or "bf16") says what they are computed in."""

    def save(self, folder: str | Path, extra: dict[str, Any], meta: dict[str, Any]) -> Path:
        """An HF folder plus the state a resume needs, written atomically; returns the folder."""

    def load_state(self, folder: str | Path) -> dict[str, Any]:
        """Optimizer, schedule, step and RNG from a checkpoint this learner was built from; the saved `extra`."""

    def release_memory(self) -> None:
        """The accelerator memory cached but unused after an update back to the device (colocated placement)."""

    def reset_optimizer(self, restart_schedule: bool = False) -> None:
        """A fresh optimizer state (RL's stage 3); the schedule goes on unless `restart_schedule`."""

    def close(self) -> None:
        """Stop what the learner started (ranks, a Ray connection); idempotent."""
