"""Where the learner and the rollout engines run, decided once from the recipe (`choose_placement`, from its
`distributed` and `placement`): each placement builds the learner (the `Learner` protocol, learner/) and the rollout
side (the engine the agent loop calls, and the sandbox: rollout/workers.py), through the core's factories
(`make_engine`, `make_sandbox`) as eval and serve build theirs.

- local (`distributed: none`): the learner in this process; the rollout engine is the hf engine on the learner's
  own model (`rollout_engine: hf`: an update is live at once, no push) or vLLM in this process (`vllm`: its own
  weights, pushed after each update). `placement: colocated` (learner/colocated.py): the engine sleeps through each
  update (vLLM's sleep mode; the hf engine then holds weights of its own, moved to host memory).
- ray (`distributed: ray`): a group of FSDP learner ranks (learner/ray_group.py), rollout workers behind a replica
  pool and sandbox actors (rollout/workers.py); colocated, rollout worker i shares learner rank i's placement bundle
  and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rstar2_agent.engines.base import TrainableEngine
from rstar2_agent.models import ResolvedModel
from rstar2_agent.sandbox import Sandbox

from .config import RLConfig, check_distributed
from .learner.interface import Learner
from .rollout.workers import local_engine, local_sandbox, start_rollout


class Placement(Protocol):
    def learner(self, model_path: str, total_steps: int) -> Learner:
        """The learner, holding the weights at `model_path`, for a run of `total_steps` optimizer steps."""

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[TrainableEngine, Sandbox]:
        """The rollout engine and the sandbox (not yet started); `learner` may share its weights with the engine;
        `transfer`: vLLM's weight transfer its workers hold, as the weight push chose (train/push)."""


def choose_placement(cfg: RLConfig) -> Placement:
    """The one place that decides where the learner and the engines run."""
    check_distributed(cfg)
    return RayPlacement(cfg) if cfg.distributed == "ray" else LocalPlacement(cfg)


@dataclass
class LocalPlacement:
    cfg: RLConfig

    def learner(self, model_path: str, total_steps: int) -> Learner:
        from .learner.local import LocalLearner

        return LocalLearner(model_path, self.cfg.optim, total_steps, dtype=self.cfg.dtype,
                            checkpoint=self.cfg.checkpoint, gradient_checkpointing=self.cfg.gradient_checkpointing)

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[TrainableEngine, Sandbox]:
        # the hf engine runs on the learner's model, unless colocated: then on weights of its own, which sleep
        shared = learner if self.cfg.rollout_engine == "hf" and self.cfg.placement != "colocated" else None
        return await local_engine(self.cfg, resolved, shared, transfer), local_sandbox(self.cfg)


@dataclass
class RayPlacement:
    cfg: RLConfig

    def learner(self, model_path: str, total_steps: int) -> Learner:
        from .learner.ray_group import LearnerGroup

        return LearnerGroup(self.cfg.ray, model_path, self.cfg.optim, total_steps, dtype=self.cfg.dtype,
                            checkpoint=self.cfg.checkpoint, gradient_checkpointing=self.cfg.gradient_checkpointing,
                            colocated=self.cfg.placement == "colocated", rollout_engine=self.cfg.rollout_engine)

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[TrainableEngine, Sandbox]:
        bundles = getattr(learner, "placement", None) if self.cfg.placement == "colocated" else None
        return await start_rollout(self.cfg, resolved.path, resolved.spec.context_length,
                                   max(s.max_response_tokens for s in self.cfg.stages), bundles=bundles,
                                   transfer=transfer)
