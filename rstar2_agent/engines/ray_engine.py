"""Engines in Ray actors: `start_ray_engines` places N engine replicas (hf or vllm) on a Ray cluster and returns
one `RayEngine` proxy per actor, each an ordinary Engine, so a ReplicaPool balances trajectories over them
and the agent loop runs unchanged in the driver.

The driver keeps the tokenizer (prompts are rendered and responses decoded there); only token ids cross the
wire. Streaming (`on_tokens`) is delivered once, when the generation ends. `load_weights` takes a state dict
or a Ray object reference to one: put the weights once (`ray.put`) and pass the reference to every replica,
so N replicas cost one copy into the object store, not N.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from typing import Any

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams


class EngineActor:
    """The actor body (wrapped with ray.remote at runtime, so importing this file needs no Ray). The engine is
    built inside the actor's event loop (vLLM binds to it)."""

    def __init__(self, kind: str, model_path: str, context_length: int, options: dict[str, Any]):
        self.kind, self.model_path, self.context_length, self.options = kind, model_path, context_length, options
        self.engine: Engine | None = None

    async def start(self) -> dict[str, Any]:
        from . import make_engine

        if self.kind == "hf":
            import torch

            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        self.engine = make_engine(self.kind, self.model_path, context_length=self.context_length, **self.options)
        return {"context_length": self.engine.context_length, "kv_capacity": self.engine.kv_capacity,
                "max_batch": self.engine.max_batch}

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        assert self.engine is not None
        return asdict(await self.engine.generate(prompt_ids, SamplingParams(**sampling)))

    async def load_weights(self, state_dict: dict[str, Any]) -> int:
        assert self.engine is not None
        await self.engine.load_weights(state_dict)
        return len(state_dict)

    async def shutdown(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


class RayEngine(Engine):
    """An Engine whose generations run in a Ray actor (see the module docstring)."""

    name = "ray"
    streams = False  # a generation comes back whole

    def __init__(self, actor: Any, info: dict[str, Any], model_path: str, tokenizer: Any, index: int):
        self.actor, self.model_path, self.tokenizer, self.index = actor, model_path, tokenizer, index
        self.context_length = int(info["context_length"])
        self.kv_capacity = info.get("kv_capacity")  # as the actor's engine reported it
        self.max_batch = int(info.get("max_batch") or 1)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        try:
            out = await self.actor.generate.remote(list(prompt_ids), asdict(sampling))
        except Exception as e:  # noqa: BLE001 - Ray wraps the engine's error, or the actor died
            raise EngineError(f"rollout worker {self.index} failed: {_cause(e)}") from e
        gen = Generation(**out)
        if on_tokens is not None and gen.token_ids:
            on_tokens(gen.token_ids, gen.logprobs)
        return gen

    async def load_weights(self, state_dict: Any) -> None:
        import ray

        ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)
        try:
            await self.actor.load_weights.remote(ref)
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"rollout worker {self.index} could not load the new weights: {_cause(e)}") from e

    async def close(self) -> None:
        import ray

        if self.actor is None:
            return
        try:
            await asyncio.wait_for(self.actor.shutdown.remote(), 60)
        except Exception:  # noqa: BLE001 - already dead: nothing to close
            pass
        ray.kill(self.actor)
        self.actor = None


async def start_ray_engines(kind: str, model_path: str, n: int, *, context_length: int,
                            num_cpus: float = 1.0, num_gpus: float = 0.0, actor_options: dict[str, Any] | None = None,
                            engine_options: dict[str, Any] | None = None) -> list[RayEngine]:
    """N engine actors on the connected Ray cluster (call ray.init first), each with `num_gpus` GPUs (vLLM's
    tensor parallelism takes several) and `num_cpus` cores; `actor_options` go to Ray as they are (e.g.
    {"resources": {"rollout": 1}} to keep them on the nodes that advertise it). Actors are spread over nodes."""
    import ray
    from transformers import AutoTokenizer

    if kind not in ("hf", "vllm"):
        raise EngineError(f"rollout workers run the hf or vllm engine, not {kind!r}")
    cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=100_000)(EngineActor)
    actors = [cls.options(**{"scheduling_strategy": "SPREAD", **(actor_options or {})})
              .remote(kind, model_path, context_length, engine_options or {}) for _ in range(n)]
    try:
        infos = await asyncio.gather(*(a.start.remote() for a in actors))
    except Exception as e:  # noqa: BLE001
        for a in actors:
            ray.kill(a)
        raise EngineError(f"rollout workers could not start {kind} on {model_path}: {_cause(e)}") from e
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return [RayEngine(a, info, model_path, tokenizer, i) for i, (a, info) in enumerate(zip(actors, infos, strict=True))]


def _cause(e: BaseException) -> str:
    """The innermost message of a Ray-wrapped exception, on one line."""
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
