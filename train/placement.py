"""Where the learner and the rollout engines run, decided once from the recipe (`backend`): each backend builds
the learner (the `Learner` protocol) and the rollout side (the engine the agent loop calls, and the sandbox),
through the core's factories (`make_engine`, `make_sandbox`) as eval and serve build theirs.

- local (`distributed: none`): the learner in this process; the rollout engine is the hf engine on the learner's
  own model (`rollout_engine: hf`: an update is live at once, no push) or vLLM in this process (`vllm`: its own
  weights, pushed after each update). `placement: colocated` (colocated.py): the engine sleeps through each update
  (vLLM's sleep mode; the hf engine then holds weights of its own, moved to host memory).
- ray (`distributed: ray`): a group of FSDP learner ranks, rollout workers behind a replica pool, sandbox actors
  (ray_group.py); colocated, rollout worker i shares learner rank i's placement bundle and GPU.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from rstar2_agent.engines import Engine, make_engine
from rstar2_agent.models import ResolvedModel
from rstar2_agent.sandbox import Sandbox, SandboxConfig, make_sandbox

from ..config import RLConfig, check_distributed
from .protocol import Learner

VLLM_DEFAULTS: dict[str, Any] = {"kv_cache_gib": 1.0, "max_num_seqs": 64}  # one process on a CPU: a small KV cache


class Backend(Protocol):
    def learner(self, model_path: str, total_steps: int) -> Learner:
        """The learner, holding the weights at `model_path`, for a run of `total_steps` optimizer steps."""

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[Engine, Sandbox]:
        """The rollout engine and the sandbox (not yet started); `learner` may share its weights with the engine;
        `transfer`: vLLM's weight transfer its workers hold, as the weight push chose (train/push)."""


def backend(cfg: RLConfig) -> Backend:
    """The one place that decides where the learner and the engines run."""
    check_distributed(cfg)
    return RayBackend(cfg) if cfg.distributed == "ray" else LocalBackend(cfg)


def local_sandbox(cfg: RLConfig) -> Sandbox:
    return make_sandbox(config=SandboxConfig(workers=cfg.sandbox_workers))


async def local_engine(cfg: RLConfig, resolved: ResolvedModel, shared: Any = None, transfer: str | None = None
                       ) -> Engine:
    """The rollout engine in this process: vLLM (`VLLM_DEFAULTS`, the run's seed, then `engine_options`; started in
    a thread, off the event loop), or the hf engine, on `shared`'s model and tokenizer when given (the learner's: no
    push) or on its own weights."""
    context = resolved.spec.context_length
    if cfg.rollout_engine == "vllm":
        # colocated: vLLM's sleep mode; the weight push's transfer (CUDA IPC colocated on a GPU, else none: chunked)
        colocated = {"sleep_mode": True} if cfg.placement == "colocated" else {}
        return await asyncio.to_thread(make_engine, "vllm", resolved.path, context_length=context,
                                       **{**VLLM_DEFAULTS, "seed": cfg.seed, **colocated, **cfg.engine_options,
                                          "weight_transfer": transfer})
    weights = {"model": shared.model, "tokenizer": shared.tokenizer} if shared is not None else {}
    return make_engine("hf", resolved.path, context_length=context, **weights)


@dataclass
class LocalBackend:
    cfg: RLConfig

    def learner(self, model_path: str, total_steps: int) -> Learner:
        from .local import LocalLearner

        return LocalLearner(model_path, self.cfg.optim, total_steps, dtype=self.cfg.dtype,
                            checkpoint=self.cfg.checkpoint, gradient_checkpointing=self.cfg.gradient_checkpointing)

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[Engine, Sandbox]:
        # the hf engine runs on the learner's model, unless colocated: then on weights of its own, which sleep
        shared = learner if self.cfg.rollout_engine == "hf" and self.cfg.placement != "colocated" else None
        return await local_engine(self.cfg, resolved, shared, transfer), local_sandbox(self.cfg)


@dataclass
class RayBackend:
    cfg: RLConfig

    def learner(self, model_path: str, total_steps: int) -> Learner:
        from .ray_group import LearnerGroup

        return LearnerGroup(self.cfg.ray, model_path, self.cfg.optim, total_steps, dtype=self.cfg.dtype,
                            checkpoint=self.cfg.checkpoint, gradient_checkpointing=self.cfg.gradient_checkpointing,
                            colocated=self.cfg.placement == "colocated")

    async def rollout(self, resolved: ResolvedModel, learner: Learner | None, transfer: str | None = None
                      ) -> tuple[Engine, Sandbox]:
        from .ray_group import start_rollout

        bundles = getattr(learner, "placement", None) if self.cfg.placement == "colocated" else None
        return await start_rollout(self.cfg.ray, resolved.path, resolved.spec.context_length,
                                   max(s.max_response_tokens for s in self.cfg.stages), bundles=bundles,
                                   transfer=transfer)
