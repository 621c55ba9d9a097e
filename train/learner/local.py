"""The learner in this process: the torch learner behind the `Learner` protocol (protocol.py)."""

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

    async def push(self, engine: Engine) -> None:
        """The current weights into `engine`: a shared model needs nothing; vLLM in this process on the same GPU
        (colocated) maps the learner's tensors through CUDA IPC, in place; else it loads the state dict."""
        if self.shares_weights(engine):
            return
        if getattr(engine, "weight_transfer", None) == "ipc":
            from rstar2_agent.engines.vllm_transfer import push_in_place

            await push_in_place(self.model, engine)
        else:
            await engine.load_weights(self.full_state_dict())
