"""The learner in this process: the torch learner behind the `Learner` protocol (protocol.py); its weights reach
the rollout engine by the push the recipe chose (train/push)."""

from __future__ import annotations

import threading

from rstar2_agent.engines.base import Engine

from .model import TorchLearner
from .update import UpdateConfig, UpdateItem, mini_shards, ppo_update


class LocalLearner(TorchLearner):
    def update(self, items: list[UpdateItem], cfg: UpdateConfig, total_tokens: int,
               stop: threading.Event | None = None) -> dict[str, float]:
        """The PPO pass over `items`, an optimizer step per PPO mini-batch (`cfg.ppo_mini_batches`); the step's
        metrics. `stop` set: `UpdateStopped` before the next micro-batch, and no further optimizer step."""
        (minis,), totals, _ = mini_shards(items, 1, cfg)
        return {**ppo_update(self, minis, cfg, totals, stop=stop), "update_tokens": total_tokens}

    def shares_weights(self, engine: Engine) -> bool:
        """The hf engine built on this learner's own model needs no push: an update is live at once."""
        return getattr(engine, "model", None) is self.model
