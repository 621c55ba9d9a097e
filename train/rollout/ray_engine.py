"""Engines in Ray actors: `start_ray_engines` places N engine replicas (hf or vllm) on a Ray cluster and returns
one `RayEngine` proxy per actor, each an ordinary Engine, so a ReplicaPool balances trajectories over them
and the agent loop runs unchanged in the driver.

The driver keeps the tokenizer (prompts are rendered and responses decoded there); only token ids cross the
wire. Streaming (`on_tokens`) is delivered once, when the generation ends. Weights reach the actors three ways:
`load_weights` takes a state dict or a Ray object reference to one (put the weights once, `ray.put`, and pass
the reference to every replica, so N replicas cost one copy into the object store, not N); the actors join
a push group (push/collective.py: `join_weight_group`, then `receive_weights` while the learner broadcasts,
each bucket loaded before the next arrives); or, vLLM on GPUs, vLLM's own weight transfer (push/vllm.py:
the learner's rank 0 calls `init_weight_transfer`, then per push `start_`, `receive_`, `finish_weight_transfer`).

An actor that dies (its process killed, its node lost) is replaced: the first request to fail with the actor's
death starts a new actor, loads the last weights it was given (`RayEngine.weights`: the last object reference,
or a callable that makes one, as the learner group sets after a collective push), and every request that
failed with that death is sent again to the replacement. A request is one turn of a trajectory whose earlier
turns (and tool results) are kept, so the failed turn is what reruns, from the same prompt ids. At most
`max_restarts` replacements per worker; past that the request fails with an EngineError that says what to do.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from rstar2_agent.engines.base import EngineError, Generation, OnTokens, SamplingParams, TrainableEngine

from ..config import ROLLOUT_ENGINES

log = logging.getLogger(__name__)


class EngineActor:
    """The actor body (wrapped with ray.remote at runtime, so importing this file needs no Ray). The engine is
    built inside the actor's event loop (vLLM binds to it)."""

    def __init__(self, kind: str, model_path: str, context_length: int, options: dict[str, Any]):
        self.kind, self.model_path, self.context_length, self.options = kind, model_path, context_length, options
        self.engine: TrainableEngine | None = None
        self.group: Any = None  # a collective.WeightGroup while in one

    async def start(self) -> dict[str, Any]:
        from .trainable import make_trainable_engine

        if self.kind == "hf":
            import torch

            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        self.engine = make_trainable_engine(self.kind, self.model_path, context_length=self.context_length,
                                            **self.options)
        return {"context_length": self.engine.context_length, "kv_capacity": self.engine.kv_capacity,
                "max_batch": self.engine.max_batch, "compute_dtype": self.engine.compute_dtype}

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        assert self.engine is not None
        return asdict(await self.engine.generate(prompt_ids, SamplingParams(**sampling)))

    async def load_weights(self, state_dict: dict[str, Any]) -> int:
        assert self.engine is not None
        await self.engine.load_weights(state_dict)
        return len(state_dict)

    async def score(self, ids: list[int], start: int) -> list[float]:
        assert self.engine is not None
        return await self.engine.score(ids, start)

    async def sleep(self, level: int) -> None:
        assert self.engine is not None
        await self.engine.sleep(level)

    async def wake_up(self, tags: list[str] | None) -> None:
        assert self.engine is not None
        await self.engine.wake_up(tags)

    def pid(self) -> int:
        return os.getpid()

    def placement_group(self) -> str | None:
        """The id of the placement group this actor was scheduled in (None: none)."""
        import ray

        return ray.get_runtime_context().get_placement_group_id()

    def device(self) -> str:
        """Where this worker receives pushed weights: its GPU when Ray gave it one, else the CPU."""
        from rstar2_agent.devices import on_gpu

        return "cuda" if self.kind == "vllm" and on_gpu() else "cpu"

    async def join_weight_group(self, host: str, port: int, rank: int, world: int, device: str,
                                timeout_s: float) -> None:
        """Join (in a thread: generation goes on meanwhile) the learner's push group as `rank`, its
        buffers on `device` (the group's: "cuda" when every member has a GPU, else "cpu")."""
        from ..push.collective import WeightGroup

        self.leave_weight_group()
        self.group = await asyncio.to_thread(WeightGroup, host, port, rank, world, device=device,
                                             timeout_s=timeout_s)

    async def receive_weights(self, buckets: list[Any]) -> int:
        """Receive the broadcast state dict bucket by bucket (in a thread), each bucket loaded into the engine
        before the next is received (bounded receive buffers: one bucket); returns the number of names."""
        if self.group is None:
            raise EngineError("this rollout worker is in no push group: join_weight_group first")
        assert self.engine is not None
        received = self.group.receive_each(buckets)
        count = 0

        async def parts() -> AsyncIterator[dict[str, Any]]:
            nonlocal count
            while (part := await asyncio.to_thread(next, received, None)) is not None:
                count += len(part)
                yield part
                del part

        await self.engine.load_weight_parts(parts())
        return count

    def weight_transfer(self) -> tuple[str | None, int]:
        """vLLM's weight transfer of this worker's engine ("nccl", "ipc", or None) and its tensor-parallel size
        (how many ranks it takes in the transfer group)."""
        return getattr(self.engine, "weight_transfer", None), int(self.options.get("tensor_parallel_size", 1))

    # vLLM's weight transfer (push/vllm.py RolloutClient calls these from the learner's rank 0)
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        await self.engine.init_weight_transfer(init_info)  # type: ignore[union-attr]

    async def start_weight_transfer(self) -> None:
        await self.engine.start_weight_transfer()  # type: ignore[union-attr]

    async def receive_weight_transfer(self, update_info: dict[str, Any]) -> None:
        await self.engine.receive_weight_transfer(update_info)  # type: ignore[union-attr]

    async def finish_weight_transfer(self) -> None:
        await self.engine.finish_weight_transfer()  # type: ignore[union-attr]

    async def shutdown_weight_transfer(self) -> None:
        await self.engine.shutdown_weight_transfer()  # type: ignore[union-attr]

    async def abort_weight_transfer(self) -> int:
        """A failed push ended on this worker's engine (VLLMEngine.abort_weight_transfer); names it had loaded."""
        return await self.engine.abort_weight_transfer()  # type: ignore[union-attr]

    def leave_weight_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()

    async def shutdown(self) -> None:
        self.leave_weight_group()
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


class RayEngine(TrainableEngine):
    """An Engine whose generations run in a Ray actor (see the module docstring)."""

    name = "ray"
    streams = False  # a generation comes back whole

    def __init__(self, actor: Any, info: dict[str, Any], model_path: str, tokenizer: Any, index: int, *,
                 spawn: Callable[[], Any] | None = None, max_restarts: int = 3):
        """`spawn` makes a new (unstarted) actor like this one: without it a dead actor is not replaced."""
        self.actor, self.model_path, self.tokenizer, self.index = actor, model_path, tokenizer, index
        self.context_length = int(info["context_length"])
        self.kv_capacity = info.get("kv_capacity")  # as the actor's engine reported it
        self.max_batch = int(info.get("max_batch") or 1)
        self.compute_dtype = info.get("compute_dtype")  # as the actor's engine reported it
        self.spawn, self.max_restarts = spawn, max_restarts
        self.restarts = 0
        self.reruns = 0  # requests sent again after their actor died
        self.incarnation = 0  # +1 at each replacement (the learner group rebuilds its push group then)
        # what a replacement loads: None (the model's own weights), an object reference, or an async callable
        # returning one (the learner group's last pushed weights)
        self.weights: Any = None
        self._replacing = asyncio.Lock()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        out = await self._call("generate", list(prompt_ids), asdict(sampling))
        gen = Generation(**out)
        if on_tokens is not None and gen.token_ids:
            on_tokens(gen.token_ids, gen.logprobs)
        return gen

    async def _call(self, method: str, *args: Any) -> Any:
        """The actor's `method`; when the actor dies under it, replace the actor and call again."""
        import ray

        for _ in range(self.max_restarts + 2):
            actor, incarnation = self.actor, self.incarnation
            if actor is None:
                raise EngineError(f"rollout worker {self.index} is closed")
            try:
                return await getattr(actor, method).remote(*args)
            except ray.exceptions.RayActorError as e:
                await self.replace(incarnation, e)
                self.reruns += 1
            except Exception as e:  # noqa: BLE001 - Ray wraps the engine's own error: not a death, not retried
                raise EngineError(f"rollout worker {self.index} failed: {_cause(e)}") from e
        raise EngineError(f"rollout worker {self.index} kept dying: raise RayConfig.max_worker_restarts or see "
                          f"the worker's log (ray logs)")

    async def replace(self, incarnation: int, cause: BaseException | None = None) -> None:
        """Replace the actor of `incarnation` (unless another request did already) with a new one holding the
        last weights. Raises EngineError when it may not (no `spawn`, or `max_restarts` spent)."""
        import ray

        async with self._replacing:
            if self.incarnation != incarnation or self.actor is None:
                return  # replaced (or closed) while this request waited
            why = _cause(cause) if cause is not None else "it stopped answering"
            if self.spawn is None or self.restarts >= self.max_restarts:
                raise EngineError(
                    f"rollout worker {self.index} died ({why}) after {self.restarts} replacements "
                    f"(max_worker_restarts={self.max_restarts}): its node is failing or its engine runs out of "
                    f"memory; see `ray logs` for the worker, lower engine_options (gpu_memory_utilization on "
                    f"a GPU, kv_cache_gib on a CPU) or rollout concurrency, or raise RayConfig.max_worker_restarts")
            self.restarts += 1
            log.warning("rollout worker %d died (%s): starting a replacement (%d/%d)", self.index, why,
                        self.restarts, self.max_restarts)
            try:
                ray.kill(self.actor)
            except Exception:  # noqa: BLE001 - gone already
                pass
            actor = self.spawn()
            try:
                await actor.start.remote()
                weights = self.weights() if callable(self.weights) else self.weights
                weights = await weights if inspect.isawaitable(weights) else weights
                if weights is not None:
                    await actor.load_weights.remote(weights)
            except Exception as e:  # noqa: BLE001
                ray.kill(actor)
                raise EngineError(f"rollout worker {self.index} died and its replacement could not start: "
                                  f"{_cause(e)}") from e
            self.actor, self.incarnation = actor, self.incarnation + 1

    async def ensure_alive(self, timeout_s: float = 60.0) -> None:
        """Ping the actor; replace it if it is dead (the learner group does this before rebuilding its group)."""
        import ray

        incarnation = self.incarnation
        try:
            await asyncio.wait_for(self.actor.pid.remote(), timeout_s)
        except (TimeoutError, ray.exceptions.RayActorError) as e:
            await self.replace(incarnation, e)

    async def score(self, ids: list[int], start: int) -> list[float]:
        """The actor's engine scores (TrainableEngine.score); a replacement actor scores with the weights it was
        given."""
        return await self._call("score", list(ids), start)

    async def sleep(self, level: int = 1) -> None:
        await self._call("sleep", level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call("wake_up", tags)

    async def pid(self) -> int:
        """The actor's process id (the fault tests kill it)."""
        return await self._call("pid")

    async def load_weights(self, state_dict: Any) -> None:
        """Load a state dict, or an object reference to one (kept: a replacement loads it too)."""
        import ray

        self.weights = ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)
        try:
            await self._call("load_weights", ref)
        except EngineError as e:
            raise EngineError(f"rollout worker {self.index} could not load the new weights: {e}") from e

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
                            engine_options: dict[str, Any] | None = None, max_restarts: int = 3,
                            bundles: Any = None) -> list[RayEngine]:
    """N engine actors on the connected Ray cluster (call ray.init first), each with `num_gpus` GPUs (vLLM's
    tensor parallelism takes several) and `num_cpus` cores; `actor_options` go to Ray as they are (e.g.
    {"resources": {"rollout": 1}} to keep them on the nodes that advertise it). Actors are spread over nodes; a
    dead one is replaced at most `max_restarts` times. `bundles`: a placement group whose bundle i holds actor i (and
    its replacements), beside what else it holds (the colocated placement: a learner rank on the same GPU)."""
    import ray
    from transformers import AutoTokenizer

    if kind not in ROLLOUT_ENGINES:
        raise EngineError(f"rollout workers run the {' or '.join(ROLLOUT_ENGINES)} engine, not {kind!r}")
    cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=100_000)(EngineActor)

    def spawn(i: int) -> Any:
        where: Any = "SPREAD"
        if bundles is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            where = PlacementGroupSchedulingStrategy(bundles, placement_group_bundle_index=i % bundles.bundle_count)
        return (cls.options(**{"scheduling_strategy": where, **(actor_options or {})})
                .remote(kind, model_path, context_length, engine_options or {}))

    actors = [spawn(i) for i in range(n)]
    try:
        infos = await asyncio.gather(*(a.start.remote() for a in actors))
    except Exception as e:  # noqa: BLE001
        for a in actors:
            ray.kill(a)
        raise EngineError(f"rollout workers could not start {kind} on {model_path}: {_cause(e)}") from e
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return [RayEngine(a, info, model_path, tokenizer, i, spawn=functools.partial(spawn, i), max_restarts=max_restarts)
            for i, (a, info) in enumerate(zip(actors, infos, strict=True))]


def ray_workers(engine: TrainableEngine) -> list[RayEngine]:
    """The Ray rollout workers behind `engine` (a RayEngine, or a ReplicaPool of them)."""
    workers = getattr(engine, "engines", [engine])
    if not workers or not all(isinstance(w, RayEngine) for w in workers):
        raise EngineError(f"a collective weight push needs Ray rollout workers, not {type(engine).__name__}")
    return workers


def _cause(e: BaseException) -> str:
    """The innermost message of a Ray-wrapped exception, on one line."""
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1][:300] if str(cause).strip() else ''}"
