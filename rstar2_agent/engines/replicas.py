"""ReplicaPool: one Engine over several engine replicas, with trajectory-sticky load balancing.

A trajectory (one `run_agent` call, marked by the `current_trajectory` variable of trajectory_scope.py) is placed on a
replica at its first request and stays there for all its turns, so the replica's prefix cache keeps its
context. Policies choose the replica for each new trajectory:

- `static`: round robin, an equal split; never waits (the replica's own queue absorbs the load).
- `least_outstanding`: the replica with the fewest requests in flight (then fewest live trajectories);
  with `max_trajectories` a trajectory waits while every replica holds that many.
- `kv_aware`: each trajectory reserves the KV tokens it may need; it goes to the replica with the most
  unreserved KV capacity among those where the reservation fits, and waits (FIFO, so no one starves) while
  none has room. The reservation is held while the trajectory waits for the sandbox and freed when it ends.
  How much it reserves:
  - adaptive (`reserve_quantile`, the default): its context so far plus the `reserve_quantile` quantile of
    what trajectories that reached its length went on to add, learned online (`LengthModel`: a Kaplan-Meier
    estimate over a window of finished trajectories, the live ones counted as censored, so the short ones
    that finish first do not bias it; with too few samples, the whole budget). A trajectory that waits for a
    replica is placed with what the lengths learned by then say it needs. The reservation is renewed at each
    turn; a turn whose growth does not fit its replica waits (FIFO per replica, ahead of new trajectories)
    until a trajectory there ends, unless every live trajectory there is waiting, when the waiting ones go
    ahead anyway, counted in `overflows` (the engine then preempts if it must).
  - strict (`reserve_quantile=None`): prompt + the most it may still generate and be given, capped by
    the context length: never overflows, but at a long-tailed budget few trajectories fit.
  - fixed (`reserve_tokens`): prompt + that, raised to the actual context when outgrown (it stays placed,
    no wait): blind overbooking, kept for comparison.

KV capacity per replica is what the engine reports (vLLM's block count x block size, in-process or from an
OpenAI-compatible server's /metrics), or `capacity_tokens` when given. The policies and all the waiting and
reservation bookkeeping live in routing.py (`Router`); the pool only maps its callbacks to asyncio
futures. The simulator (bench/replicas_sim.py) drives the same `Router`, so both run the same code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from typing import Any

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams, TrainableEngine, trainable
from .routing import POLICIES, LengthModel, Load, Router, grow, pick
from .trajectory_scope import current_trajectory, trajectory_scope

__all__ = ["POLICIES", "LengthModel", "Load", "ReplicaPool", "grow", "pick"]  # the policies, for older imports
log = logging.getLogger(__name__)


def _setting(name: str) -> property:
    """A pool setting kept in its Router, which reads it at each decision (so a change takes effect at once)."""
    return property(lambda self: getattr(self.placement, name), lambda self, v: setattr(self.placement, name, v))


class ReplicaPool(TrainableEngine):
    """An Engine that spreads trajectories over `engines` (any Engine: hf, vllm, openai, a Ray actor's proxy). It
    trains (sleep, score, load weights on every replica) where every replica does (`untrainable`).

    `max_response_tokens`: the most a trajectory may add after its prompt (the agent's budget; default: the
    whole context). kv_aware reserves (see the module docstring):
    `reserve_quantile` (default): adaptively, from `lengths` (a LengthModel; pass one to share or keep what
    an earlier pool learned); `None`: strictly, prompt + the budget; `reserve_tokens`: prompt + this, fixed."""

    name = "replicas"
    policy = _setting("policy")
    reserve_tokens = _setting("reserve")
    max_response_tokens = _setting("budget")
    max_trajectories = _setting("max_trajectories")

    def __init__(self, engines: list[Engine], policy: str = "kv_aware", *,
                 capacity_tokens: int | list[int] | None = None, max_response_tokens: int | None = None,
                 reserve_tokens: int | None = None, reserve_quantile: float | None = 0.9,
                 lengths: LengthModel | None = None, max_trajectories: int | None = None):
        if not engines:
            raise EngineError("a replica pool needs at least one engine")
        if policy not in POLICIES:
            raise EngineError(f"unknown replica policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.engines = list(engines)
        self.streams = all(getattr(e, "streams", True) for e in engines)
        self.constrains = all(getattr(e, "constrains", False) for e in engines)
        self.tokenizer = engines[0].tokenizer
        self.model_path = engines[0].model_path
        self.reserve_quantile = reserve_quantile
        budget = min(max_response_tokens or self.context_length, self.context_length)
        self.lengths = lengths or LengthModel(budget, reserve_quantile or 0.9)
        caps = capacity_tokens if isinstance(capacity_tokens, list) else [capacity_tokens] * len(engines)
        if len(caps) != len(engines):
            raise EngineError(f"{len(caps)} capacities for {len(engines)} replicas")
        # KV tokens each replica holds: given, or as the engine reports it, else its batch of full contexts (hf)
        capacities = [c or e.kv_capacity or e.context_length * e.max_batch for c, e in zip(caps, engines, strict=True)]
        self.placement = Router(
            policy, capacities, on_placed=self._wake, on_released=self._wake, abandoned=self._abandoned,
            lengths=self.lengths if reserve_quantile is not None else None, reserve=reserve_tokens,
            budget=max_response_tokens, max_context=self.context_length, max_trajectories=max_trajectories)
        self.loads = self.placement.loads
        # a trajectory waiting for a replica, or a turn waiting to grow: the future its request awaits
        self._waiters: dict[int, asyncio.Future] = {}
        # (trajectory id, replica) of the latest requests, for tests and logs; bounded: a server runs for days
        self.history: deque[tuple[int, int]] = deque(maxlen=100_000)
        self._probed = False
        self._probe_lock = asyncio.Lock()

    @property
    def context_length(self) -> int:  # type: ignore[override]  # remote engines learn theirs at the first request
        return min(e.context_length for e in self.engines)

    @property
    def adaptive(self) -> bool:
        return self.placement.adaptive

    @property
    def overflows(self) -> int:
        """Turns let go beyond their replica's capacity because all there waited (adaptive kv_aware)."""
        return self.placement.overflows

    async def probe(self) -> None:
        """Ask remote engines for their context length and KV capacity (vLLM servers' /metrics); the first
        request does it."""
        async with self._probe_lock:
            if self._probed:
                return
            for i, engine in enumerate(self.engines):
                await engine.probe()
                if engine.kv_capacity:
                    self.loads[i].capacity = engine.kv_capacity
                elif self.policy == "kv_aware" and engine.endpoint:
                    log.warning("%s reports no KV cache size (a vLLM server started with --disable-log-stats, or "
                                "not vLLM): kv_aware assumes %d tokens there", engine.endpoint,
                                self.loads[i].capacity)
            self.placement.max_context = self.context_length
            self._probed = True

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if not self._probed:
            await self.probe()
        if current_trajectory.get() is None:  # a lone request: a trajectory of one request
            with trajectory_scope():
                return await self.generate(prompt_ids, sampling, on_tokens)
        scope = current_trajectory.get()
        key, placement = scope.id, self.placement
        if key not in placement.placed:
            scope.pools.append(self)
            if placement.arrive(key, len(prompt_ids)) is None:
                log.debug("trajectory %d waits for a replica (%d ahead)", key, len(placement.queue) - 1)
                await self._wait(key)  # placed when room appears (on_placed)
        if not placement.renew(key, len(prompt_ids)):
            await self._wait(key)  # its reservation grows when it fits (on_released)
        placed = placement.placed[key]
        load = self.loads[placed.replica]
        self.history.append((key, placed.replica))
        load.in_flight += 1
        try:
            gen = await self.engines[placed.replica].generate(prompt_ids, sampling, on_tokens)
        finally:
            load.in_flight -= 1
        if placement.placed.get(key) is placed:
            placement.hold(key, len(prompt_ids) + len(gen.token_ids))
        return gen

    async def _wait(self, key: int) -> None:
        self._waiters[key] = future = asyncio.get_running_loop().create_future()
        await future  # a cancelled one stays until end_trajectory (or the queue drops it: _abandoned)

    def _wake(self, key: int, replica: int) -> None:
        """Router's callback: the trajectory is placed, or its turn may go. A request waiting for it goes on;
        one that is still in the call (arrive, renew) has no future yet and learns it from the return value."""
        future = self._waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _abandoned(self, key: int) -> bool:
        future = self._waiters.get(key)
        return future is None or future.done()  # its caller was cancelled

    def end_trajectory(self, scope_id: int) -> None:
        """Free the trajectory's reservation (or drop it from the queues), then place those waiting, in order."""
        self._waiters.pop(scope_id, None)
        self.placement.end(scope_id)

    def stats(self) -> dict[str, Any]:
        """What /health of `rstar2 serve` shows: the policy, overflows and each replica's load."""
        return {"policy": self.policy, "overflows": self.overflows, "waiting": len(self.placement.queue),
                "replicas": [{"engine": e.name, **dataclasses.asdict(load)}
                             for e, load in zip(self.engines, self.loads, strict=True)]}

    # ------------------------------------------------------------------ training, on every replica
    def untrainable(self) -> list[str]:
        return [n for e in self.engines
                for n in (e.untrainable() if isinstance(e, TrainableEngine) else [e.name])]

    def _replicas(self) -> list[TrainableEngine]:
        return [trainable(e) for e in self.engines]

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        await asyncio.gather(*(e.load_weights(state_dict) for e in self._replicas()))

    @property
    def compute_dtype(self) -> str | None:  # type: ignore[override]
        """fp32 when every replica computes in fp32; else the first other (None: unknown)."""
        kinds = [getattr(e, "compute_dtype", None) for e in self.engines]
        return next((k for k in kinds if k != "fp32"), "fp32")

    async def score(self, ids: list[int], start: int) -> list[float]:
        """The first replica's scores (they all hold the same weights; `score_each` asks every one)."""
        return await self._replicas()[0].score(ids, start)

    async def score_each(self, ids: list[int], start: int) -> list[list[float]]:
        """Every replica's scores, in replica order (a push reaches every one: a check reads every one)."""
        parts = await asyncio.gather(*(e.score_each(ids, start) for e in self._replicas()))
        return [scores for part in parts for scores in part]

    async def sleep(self, level: int = 1) -> None:
        await asyncio.gather(*(e.sleep(level) for e in self._replicas()))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await asyncio.gather(*(e.wake_up(tags) for e in self._replicas()))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines))
