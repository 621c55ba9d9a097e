"""ReplicaPool: one Engine over several engine replicas, with trajectory-sticky load balancing.

A trajectory (one `run_agent` call, marked by the `current_trajectory` context variable) is placed on a
replica at its first request and stays there for all its turns, so the replica's prefix cache keeps its
context. Policies choose the replica for each new trajectory:

- `static`: round robin, an equal split; never waits (the replica's own queue absorbs the load).
- `least_outstanding`: the replica with the fewest requests in flight (then fewest live trajectories);
  with `max_trajectories` a trajectory waits while every replica holds that many.
- `kv_aware`: each trajectory reserves the KV tokens it may need (its prompt plus the most it may still
  generate and be given, capped by the context length); it goes to the replica with the most unreserved
  KV capacity among those where the reservation fits, and waits (FIFO, so no one starves) while none has
  room. The reservation is held while the trajectory waits for the sandbox and freed when it ends.
  With `reserve_tokens` below the budget the pool overbooks: a trajectory reserves prompt + that, and a
  trajectory that outgrows it has its reservation raised to its actual context (it stays placed; the
  engine may have to preempt). Fuller batches, at the risk of the recomputation the strict mode rules out.

KV capacity per replica is what the engine reports (vLLM's block count x block size, in-process or from an
OpenAI-compatible server's /metrics), or `capacity_tokens` when given. `pick` is shared with the simulator
(rollout_sim.py), so both run the same policy code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import re
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams

log = logging.getLogger(__name__)
POLICIES = ("static", "least_outstanding", "kv_aware")


# ---------------------------------------------------------------- trajectory scope (set by run_agent)
@dataclass
class TrajectoryScope:
    id: int
    pools: list[ReplicaPool] = field(default_factory=list)  # pools that placed it; told when it ends


current_trajectory: ContextVar[TrajectoryScope | None] = ContextVar("current_trajectory", default=None)
_scope_ids = itertools.count()


@contextlib.contextmanager
def trajectory_scope() -> Iterator[TrajectoryScope]:
    """All engine requests made inside belong to one trajectory; pools release it on exit."""
    scope = TrajectoryScope(next(_scope_ids))
    token = current_trajectory.set(scope)
    try:
        yield scope
    finally:
        current_trajectory.reset(token)
        for pool in scope.pools:
            pool.end_trajectory(scope.id)


def one_trajectory(fn):
    """Decorator for an async function whose engine requests form one trajectory (run_agent)."""
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        with trajectory_scope():
            return await fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------- the policies (shared with the simulator)
@dataclass
class Load:
    """What a policy knows about one replica."""
    capacity: int  # KV cache tokens
    reserved: int = 0  # tokens reserved by its live trajectories (kv_aware)
    trajectories: int = 0  # live trajectories placed on it
    in_flight: int = 0  # requests running or queued in the engine now

    @property
    def free(self) -> int:
        return self.capacity - self.reserved


def pick(policy: str, loads: list[Load], need: int, index: int, max_trajectories: int | None = None) -> int | None:
    """The replica for a new trajectory that may need `need` KV tokens (the `index`-th placed), or None: wait."""
    open_ = [i for i, ld in enumerate(loads) if max_trajectories is None or ld.trajectories < max_trajectories]
    if policy == "static":
        return index % len(loads)
    if policy == "least_outstanding":
        return min(open_, key=lambda i: (loads[i].in_flight, loads[i].trajectories, i), default=None)
    if policy == "kv_aware":
        fits = [i for i in open_ if loads[i].free >= min(need, loads[i].capacity)]
        return max(fits, key=lambda i: (loads[i].free, -loads[i].in_flight, -i), default=None)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


# ---------------------------------------------------------------- the pool
@dataclass
class _Placed:
    replica: int
    reserved: int


@dataclass
class _Waiting:
    scope_id: int
    need: int
    future: asyncio.Future


class ReplicaPool(Engine):
    """An Engine that spreads trajectories over `engines` (any Engine: hf, vllm, openai, a Ray actor's proxy).

    `max_response_tokens`: the most a trajectory may add after its prompt (the agent's budget); the kv_aware
    reservation is prompt + this, capped by the context length (default: the whole context).
    `reserve_tokens`: reserve prompt + this instead (overbooking, see the module docstring)."""

    name = "replicas"

    def __init__(self, engines: list[Engine], policy: str = "kv_aware", *,
                 capacity_tokens: int | list[int] | None = None, max_response_tokens: int | None = None,
                 reserve_tokens: int | None = None, max_trajectories: int | None = None):
        if not engines:
            raise EngineError("a replica pool needs at least one engine")
        if policy not in POLICIES:
            raise EngineError(f"unknown replica policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.engines, self.policy = list(engines), policy
        self.tokenizer = engines[0].tokenizer
        self.model_path = engines[0].model_path
        self.context_length = min(e.context_length for e in engines)
        self.max_response_tokens, self.max_trajectories = max_response_tokens, max_trajectories
        self.reserve_tokens = reserve_tokens
        caps = capacity_tokens if isinstance(capacity_tokens, list) else [capacity_tokens] * len(engines)
        if len(caps) != len(engines):
            raise EngineError(f"{len(caps)} capacities for {len(engines)} replicas")
        self.loads = [Load(capacity=c or reported_capacity(e) or _fallback_capacity(e))
                      for c, e in zip(caps, engines, strict=True)]
        self._placed: dict[int, _Placed] = {}
        self._waiting: deque[_Waiting] = deque()
        self._placements = 0
        self.history: list[tuple[int, int]] = []  # (trajectory id, replica) of each request, for tests and logs

    async def probe(self) -> None:
        """Read KV capacity from OpenAI-compatible vLLM servers (their /metrics); call once before use."""
        for i, engine in enumerate(self.engines):
            cap = await served_capacity(engine)
            if cap:
                self.loads[i].capacity = cap

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if current_trajectory.get() is None:  # a lone request: a trajectory of one request
            with trajectory_scope():
                return await self.generate(prompt_ids, sampling, on_tokens)
        scope = current_trajectory.get()
        placed = self._placed.get(scope.id) or await self._place(scope, len(prompt_ids))
        load = self.loads[placed.replica]
        if self.policy == "kv_aware" and len(prompt_ids) > placed.reserved:  # it outgrew an overbooked reservation
            load.reserved += len(prompt_ids) - placed.reserved
            placed.reserved = len(prompt_ids)
        self.history.append((scope.id, placed.replica))
        load.in_flight += 1
        try:
            return await self.engines[placed.replica].generate(prompt_ids, sampling, on_tokens)
        finally:
            load.in_flight -= 1

    async def _place(self, scope: TrajectoryScope, prompt_tokens: int) -> _Placed:
        budget = next(b for b in (self.reserve_tokens, self.max_response_tokens, self.context_length) if b is not None)
        need = min(prompt_tokens + budget, self.context_length) if self.policy == "kv_aware" else 0
        scope.pools.append(self)
        replica = None if self._waiting else self._pick(need)
        if replica is not None:
            return self._assign(scope.id, replica, need)
        waiting = _Waiting(scope.id, need, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        log.debug("trajectory %d waits for a replica (%d ahead)", scope.id, len(self._waiting) - 1)
        return await waiting.future  # end_trajectory places it

    def _pick(self, need: int) -> int | None:
        return pick(self.policy, self.loads, need, self._placements, self.max_trajectories)

    def _assign(self, scope_id: int, replica: int, need: int) -> _Placed:
        reserved = min(need, self.loads[replica].capacity)
        self._placements += 1
        self.loads[replica].trajectories += 1
        self.loads[replica].reserved += reserved
        self._placed[scope_id] = placed = _Placed(replica, reserved)
        return placed

    def end_trajectory(self, scope_id: int) -> None:
        """Free the trajectory's reservation (or drop it from the queue), then place those waiting, in order."""
        placed = self._placed.pop(scope_id, None)
        if placed is not None:
            load = self.loads[placed.replica]
            load.trajectories -= 1
            load.reserved -= placed.reserved
        for w in list(self._waiting):
            if w.scope_id == scope_id:
                self._waiting.remove(w)
        while self._waiting:
            head = self._waiting[0]
            if head.future.done():  # its caller was cancelled
                self._waiting.popleft()
                continue
            replica = self._pick(head.need)
            if replica is None:
                break
            self._waiting.popleft()
            head.future.set_result(self._assign(head.scope_id, replica, head.need))

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        await asyncio.gather(*(e.load_weights(state_dict) for e in self.engines))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines))


# ---------------------------------------------------------------- KV capacity as engines report it
def reported_capacity(engine: Engine) -> int | None:
    """KV cache tokens of an in-process vLLM engine (blocks x block size), else None."""
    cache = getattr(getattr(getattr(engine, "engine", None), "vllm_config", None), "cache_config", None)
    if cache is not None and getattr(cache, "num_gpu_blocks", None):
        return int(cache.num_gpu_blocks) * int(cache.block_size)
    return None


_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.M)


async def served_capacity(engine: Engine) -> int | None:
    """KV cache tokens of a vLLM OpenAI server, from the `vllm:cache_config_info` metric; None if unknown."""
    client, base = getattr(engine, "client", None), getattr(engine, "base", None)
    if client is None or base is None:
        return None
    try:
        resp = await client.get(base.removesuffix("/v1") + "/metrics")
        match = _CACHE_INFO.search(resp.text) if resp.status_code == 200 else None
    except Exception:  # noqa: BLE001 - not a vLLM server, or no metrics: fall back
        return None
    if match is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def _fallback_capacity(engine: Engine) -> int:
    """Engines that do not report a KV size (hf) hold at most their batch of full contexts."""
    return engine.context_length * int(getattr(engine, "max_batch", 1))
