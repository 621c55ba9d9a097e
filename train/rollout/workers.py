"""The rollout workers: the engine the agent loop calls and the sandbox, started for the recipe's placement. In this
process (`local_engine`, `local_sandbox`): vLLM or the hf engine (on the learner's own model when given), and a warm
sandbox pool. On Ray (`start_rollout`): `ray.rollout_workers` engine actors behind one ReplicaPool (ray_engine.py)
and the sandbox actors; colocated, worker i in learner rank i's placement bundle and on its GPU."""

from __future__ import annotations

import asyncio
from typing import Any

from rstar2_agent.engines.base import TrainableEngine
from rstar2_agent.models import ResolvedModel
from rstar2_agent.sandbox import Sandbox, SandboxConfig, make_sandbox

from ..config import RLConfig
from ..ray_cluster import COLOCATED_SHARE, connect

VLLM_DEFAULTS: dict[str, Any] = {"kv_cache_gib": 1.0, "max_num_seqs": 64}  # one process on a CPU: a small KV cache


def local_sandbox(cfg: RLConfig) -> Sandbox:
    return make_sandbox(config=SandboxConfig(workers=cfg.sandbox_workers))


async def local_engine(cfg: RLConfig, resolved: ResolvedModel, shared: Any = None, transfer: str | None = None
                       ) -> TrainableEngine:
    """The rollout engine in this process: vLLM (`VLLM_DEFAULTS`, the run's seed, then `engine_options`; started in
    a thread, off the event loop), or the hf engine, on `shared`'s model and tokenizer when given (the learner's: no
    push) or on its own weights."""
    from .trainable import make_trainable_engine

    context = resolved.spec.context_length
    if cfg.rollout_engine == "vllm":
        # colocated: vLLM's sleep mode; the weight push's transfer (CUDA IPC colocated on a GPU, else none: chunked)
        colocated = {"sleep_mode": True} if cfg.placement == "colocated" else {}
        return await asyncio.to_thread(
            make_trainable_engine, "vllm", resolved.path, context_length=context,
            **{**VLLM_DEFAULTS, "seed": cfg.seed, **colocated, **cfg.engine_options, "weight_transfer": transfer})
    weights = {"model": shared.model, "tokenizer": shared.tokenizer} if shared is not None else {}
    return make_trainable_engine("hf", resolved.path, context_length=context, **weights)


async def start_rollout(rl: RLConfig, model_path: str, context_length: int, max_response_tokens: int,
                        bundles: Any = None, transfer: str | None = None):
    """The rollout workers behind one ReplicaPool, and the sandbox actors (not yet started). `bundles`: the learner
    group's placement (colocated): worker i in rank i's bundle, on its GPU, with vLLM's sleep mode. `transfer`: vLLM's
    weight transfer each vLLM worker holds, as the weight push chose (train/push)."""
    from rstar2_agent.engines.replicas import ReplicaPool
    from rstar2_agent.sandbox.ray_pool import RaySandbox

    from .ray_engine import start_ray_engines

    cfg = rl.ray
    connect(cfg)
    options, gpus = rl.engine_options, cfg.gpus_per_rollout_worker
    if bundles is not None:
        gpus = cfg.gpus_per_learner * (1 - COLOCATED_SHARE)
        if rl.rollout_engine == "vllm":
            options = {"sleep_mode": True, **options}
    if rl.rollout_engine == "vllm":
        options = {**options, "weight_transfer": transfer}
    engines = await start_ray_engines(rl.rollout_engine, model_path, cfg.rollout_workers,
                                      context_length=context_length, num_cpus=cfg.cpus_per_rollout_worker,
                                      num_gpus=gpus, engine_options=options, max_restarts=cfg.max_worker_restarts,
                                      bundles=bundles)
    pool = ReplicaPool(engines, cfg.replica_policy, max_response_tokens=max_response_tokens)
    sandbox = RaySandbox(cfg.sandbox_actors, SandboxConfig(workers=rl.sandbox_workers),
                         num_cpus_per_actor=cfg.cpus_per_sandbox_actor, max_restarts=cfg.max_worker_restarts,
                         actor_options={"resources": cfg.sandbox_resources} if cfg.sandbox_resources else None)
    return pool, sandbox
