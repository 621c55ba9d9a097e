"""ReplicaPool: one Engine over several engine replicas, with trajectory-sticky load balancing.

A trajectory (one `run_agent` call, marked by the `current_trajectory` variable of scope.py) is placed on a
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
    that finish first do not bias it; with too few samples, the whole budget). The reservation is renewed
    at each turn; a turn whose growth does not fit its replica waits (FIFO per replica, ahead of new
    trajectories) until a trajectory there ends, unless every live trajectory there is waiting, when the
    waiting ones go ahead anyway, counted in `overflows` (the engine then preempts if it must).
  - strict (`reserve_quantile=None`): prompt + the most it may still generate and be given, capped by
    the context length: never overflows, but at a long-tailed budget few trajectories fit.
  - fixed (`reserve_tokens`): prompt + that, raised to the actual context when outgrown (it stays placed,
    no wait): blind overbooking, kept for comparison.

KV capacity per replica is what the engine reports (vLLM's block count x block size, in-process or from an
OpenAI-compatible server's /metrics), or `capacity_tokens` when given. `pick` is shared with the simulator
(rollout_sim.py), so both run the same policy code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams
from .scope import TrajectoryScope, current_trajectory, trajectory_scope

log = logging.getLogger(__name__)
POLICIES = ("static", "least_outstanding", "kv_aware")


# ---------------------------------------------------------------- the policies (shared with the simulator)
@dataclass
class Load:
    """What a policy knows about one replica."""
    capacity: int  # KV cache tokens
    reserved: int = 0  # tokens reserved by its live trajectories (kv_aware)
    pending: int = 0  # tokens its live trajectories wait to add to their reservations (adaptive kv_aware)
    used: int = 0  # tokens its live trajectories hold: their contexts as last seen (adaptive kv_aware)
    trajectories: int = 0  # live trajectories placed on it
    in_flight: int = 0  # requests running or queued in the engine now
    placed: int = 0  # trajectories placed on it so far

    @property
    def free(self) -> int:
        """What a new trajectory may reserve: waiting growth comes first."""
        return self.capacity - self.reserved - self.pending


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


def grow(load: Load, reserved: int, target: int, context: int) -> int | None:
    """The reservation a placed trajectory takes for its next turn (adaptive kv_aware), or None: the turn waits.

    It holds `reserved`, has `context` tokens (counted in `load.used`) and wants `target`: its context plus a
    look-ahead. It gets it when that fits the replica's unreserved capacity, or when the contexts the replica's
    trajectories hold now leave room for its look-ahead: the others' look-aheads are estimates, its context is
    not. Then the reservations pass the capacity by look-ahead only, and no new trajectory is placed there
    until they are back under it; the contexts held never pass it (`load.used <= capacity`)."""
    if target <= load.capacity - load.reserved + reserved or load.used + target - context <= load.capacity:
        return target
    return None


class LengthModel:
    """How many more KV tokens a live trajectory will need, learned online from the ones that finished.

    `reservation(prompt, length)` is prompt + length (tokens after the prompt so far) + the lesser of
    - the `quantile` quantile of the tokens that trajectories which reached `length` went on to add: a
      Kaplan-Meier estimate on `bin`-token steps over the last `window` finished trajectories, with the live
      ones as censored samples at the length last seen (`update`): early in a step only short trajectories
      have finished, and counting the live ones as "at least this long" keeps that from reading as "all are
      short" (once they have been seen past those lengths: the pool sees a length at each turn);
    - the `quantile` quantile of one turn's tokens (generated plus tool response) over the last `window`
      turns: the pool renews the reservation at each turn, so it only has to look one turn ahead;
    capped at prompt + `budget`. Where too few samples (`min_samples`) back an estimate, it is the budget."""

    def __init__(self, budget: int, quantile: float = 0.9, *, window: int = 4096, min_samples: int = 32,
                 bin: int = 256, refresh: int = 16):
        if not 0 < quantile < 1:
            raise ValueError(f"reserve quantile {quantile} must lie strictly between 0 and 1")
        self.budget, self.quantile, self.min_samples, self.bin = budget, quantile, min_samples, bin
        self.refresh = refresh  # rebuild the estimates after this many trajectories finished
        self.finished: deque[int] = deque(maxlen=window)  # tokens after the prompt of each finished trajectory
        self.turns: deque[int] = deque(maxlen=window)  # tokens each turn added
        self.live: dict[int, int] = {}
        self._fresh = 0  # finishes since the estimates were built
        self._upper: list[int] | None = None  # by bin of the length reached: the quantile of the final length
        self._turn = budget  # the quantile of a turn's tokens

    def update(self, key: int, length: int) -> None:
        """Trajectory `key` is live and has `length` tokens after its prompt."""
        if length > self.live.get(key, length):
            self.turns.append(length - self.live[key])
        self.live[key] = length

    def finish(self, key: int, length: int | None = None) -> None:
        """Trajectory `key` ended with `length` tokens after its prompt (default: its last update)."""
        last = self.live.pop(key, 0)
        if length is not None and length > last:
            self.turns.append(length - last)
        self.finished.append(max(last, length or 0))
        self._fresh += 1

    def learn(self, turns: list[list[int]]) -> None:
        """Remember finished trajectories given as the tokens each of their turns added (a previous step's)."""
        for t in turns:
            self.turns.extend(t)
            self.finished.append(sum(t))
        self._upper = None

    def reservation(self, prompt: int, length: int) -> int:
        if self._upper is None or self._fresh >= self.refresh:
            self._build()
        s = min(length // self.bin, len(self._upper) - 1)
        return prompt + min(self.budget, max(self._upper[s], length + self.bin), length + self._turn)

    def _build(self) -> None:
        nbins = self.budget // self.bin + 1
        events, censored = [0] * nbins, [0] * nbins
        for n in self.finished:
            events[min(n // self.bin, nbins - 1)] += 1
        for n in self.live.values():
            censored[min(n // self.bin, nbins - 1)] += 1
        at_risk, total = [0] * nbins, 0
        for b in range(nbins - 1, -1, -1):
            total += events[b] + censored[b]
            at_risk[b] = total
        upper = []
        for s in range(nbins):
            surv, end = 1.0, self.budget
            for b in range(s + 1, nbins):  # those that ended in its own bin may have ended below its length
                if at_risk[b] < self.min_samples:
                    break  # too little evidence this far out: assume the budget
                surv *= 1 - events[b] / at_risk[b]
                if surv <= 1 - self.quantile:
                    end = (b + 1) * self.bin
                    break
            upper.append(end)
        self._upper, self._fresh = upper, 0
        if len(self.turns) >= self.min_samples:
            turns = sorted(self.turns)
            self._turn = turns[min(len(turns) - 1, int(self.quantile * len(turns)))]


# ---------------------------------------------------------------- the pool
@dataclass
class _Placed:
    replica: int
    reserved: int
    prompt: int = 0  # tokens of its first request
    context: int = 0  # tokens it holds as last seen (counted in its replica's Load.used; adaptive kv_aware)


@dataclass
class _Waiting:
    scope_id: int
    need: int  # a new trajectory: the reservation it needs; a turn waiting to grow: the growth
    future: asyncio.Future
    target: int = 0  # a turn waiting to grow: the reservation it wants
    prompt: int = 0  # a new trajectory: its prompt tokens


class ReplicaPool(Engine):
    """An Engine that spreads trajectories over `engines` (any Engine: hf, vllm, openai, a Ray actor's proxy).

    `max_response_tokens`: the most a trajectory may add after its prompt (the agent's budget; default: the
    whole context). kv_aware reserves (see the module docstring):
    `reserve_quantile` (default): adaptively, from `lengths` (a LengthModel; pass one to share or keep what
    an earlier pool learned); `None`: strictly, prompt + the budget; `reserve_tokens`: prompt + this, fixed."""

    name = "replicas"

    def __init__(self, engines: list[Engine], policy: str = "kv_aware", *,
                 capacity_tokens: int | list[int] | None = None, max_response_tokens: int | None = None,
                 reserve_tokens: int | None = None, reserve_quantile: float | None = 0.9,
                 lengths: LengthModel | None = None, max_trajectories: int | None = None):
        if not engines:
            raise EngineError("a replica pool needs at least one engine")
        if policy not in POLICIES:
            raise EngineError(f"unknown replica policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.engines, self.policy = list(engines), policy
        self.tokenizer = engines[0].tokenizer
        self.model_path = engines[0].model_path
        self.max_response_tokens, self.max_trajectories = max_response_tokens, max_trajectories
        self.reserve_tokens, self.reserve_quantile = reserve_tokens, reserve_quantile
        budget = min(max_response_tokens or self.context_length, self.context_length)
        self.lengths = lengths or LengthModel(budget, reserve_quantile or 0.9)
        caps = capacity_tokens if isinstance(capacity_tokens, list) else [capacity_tokens] * len(engines)
        if len(caps) != len(engines):
            raise EngineError(f"{len(caps)} capacities for {len(engines)} replicas")
        # KV tokens each replica holds: given, or as the engine reports it, else its batch of full contexts (hf)
        self.loads = [Load(capacity=c or e.kv_capacity or e.context_length * e.max_batch)
                      for c, e in zip(caps, engines, strict=True)]
        self._placed: dict[int, _Placed] = {}
        self._waiting: deque[_Waiting] = deque()  # new trajectories, in arrival order
        self._growing: list[deque[_Waiting]] = [deque() for _ in engines]  # turns waiting to grow, by replica
        self._placements = 0
        self.overflows = 0  # turns let go beyond their replica's capacity because all there waited (adaptive)
        # (trajectory id, replica) of the latest requests, for tests and logs; bounded: a server runs for days
        self.history: deque[tuple[int, int]] = deque(maxlen=100_000)
        self._probed = False
        self._probe_lock = asyncio.Lock()

    @property
    def context_length(self) -> int:  # type: ignore[override]  # remote engines learn theirs at the first request
        return min(e.context_length for e in self.engines)

    @property
    def adaptive(self) -> bool:
        return self.policy == "kv_aware" and self.reserve_tokens is None and self.reserve_quantile is not None

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
            self._probed = True

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if not self._probed:
            await self.probe()
        if current_trajectory.get() is None:  # a lone request: a trajectory of one request
            with trajectory_scope():
                return await self.generate(prompt_ids, sampling, on_tokens)
        scope = current_trajectory.get()
        placed = self._placed.get(scope.id) or await self._place(scope, len(prompt_ids))
        load = self.loads[placed.replica]
        if self.adaptive:
            await self._renew(scope.id, placed, len(prompt_ids))
        elif self.policy == "kv_aware" and len(prompt_ids) > placed.reserved:  # it outgrew a fixed reservation
            load.reserved += len(prompt_ids) - placed.reserved
            placed.reserved = len(prompt_ids)
        self.history.append((scope.id, placed.replica))
        load.in_flight += 1
        try:
            gen = await self.engines[placed.replica].generate(prompt_ids, sampling, on_tokens)
        finally:
            load.in_flight -= 1
        if self.adaptive and self._placed.get(scope.id) is placed:
            self._hold(scope.id, placed, len(prompt_ids) + len(gen.token_ids))
        return gen

    def _need(self, prompt_tokens: int) -> int:
        if self.policy != "kv_aware":
            return 0
        if self.adaptive:
            return min(self.lengths.reservation(prompt_tokens, 0), self.context_length)
        budget = next(b for b in (self.reserve_tokens, self.max_response_tokens, self.context_length) if b is not None)
        return min(prompt_tokens + budget, self.context_length)

    async def _place(self, scope: TrajectoryScope, prompt_tokens: int) -> _Placed:
        need = self._need(prompt_tokens)
        scope.pools.append(self)
        replica = None if self._waiting else self._pick(need)
        if replica is not None:
            return self._assign(scope.id, replica, need, prompt_tokens)
        waiting = _Waiting(scope.id, need, asyncio.get_running_loop().create_future(), prompt=prompt_tokens)
        self._waiting.append(waiting)
        log.debug("trajectory %d waits for a replica (%d ahead)", scope.id, len(self._waiting) - 1)
        return await waiting.future  # end_trajectory places it

    def _pick(self, need: int) -> int | None:
        return pick(self.policy, self.loads, need, self._placements, self.max_trajectories)

    def _assign(self, scope_id: int, replica: int, need: int, prompt_tokens: int) -> _Placed:
        reserved = min(need, self.loads[replica].capacity)
        self._placements += 1
        self.loads[replica].trajectories += 1
        self.loads[replica].placed += 1
        self.loads[replica].reserved += reserved
        self._placed[scope_id] = placed = _Placed(replica, reserved, prompt_tokens)
        if self.adaptive:
            self._hold(scope_id, placed, prompt_tokens)
        return placed

    def _hold(self, scope_id: int, placed: _Placed, context: int) -> None:
        """The trajectory holds `context` tokens on its replica now."""
        self.loads[placed.replica].used += context - placed.context
        placed.context = context
        self.lengths.update(scope_id, context - placed.prompt)

    async def _renew(self, scope_id: int, placed: _Placed, context: int) -> None:
        """Renew the trajectory's reservation for its next turn (adaptive kv_aware); wait while it cannot grow."""
        self._hold(scope_id, placed, context)
        r, load = placed.replica, self.loads[placed.replica]
        target = max(context, min(self.lengths.reservation(placed.prompt, context - placed.prompt),
                                  self.context_length))
        took = None if self._growing[r] else grow(load, placed.reserved, target, context)
        if took is None:
            waiting = _Waiting(scope_id, target - placed.reserved, asyncio.get_running_loop().create_future(),
                               target)
            self._growing[r].append(waiting)
            load.pending += waiting.need
            self._unblock(r)
            await waiting.future  # _unblock grows it
            return
        shrank = took < placed.reserved
        load.reserved += took - placed.reserved
        placed.reserved = took
        if shrank:
            self._unblock(r)
            self._place_waiting()

    def _unblock(self, r: int) -> None:
        """Let the turns waiting to grow on replica r go, in order, while they fit; if every live trajectory there
        waits, none would end to make room: they all go (overflows; the engine preempts if it must)."""
        load, queue, stuck = self.loads[r], self._growing[r], False
        while queue:
            head = queue[0]
            placed = self._placed.get(head.scope_id)
            took = grow(load, placed.reserved, head.target, placed.context)
            if took is None:
                if len(queue) < load.trajectories and not stuck:
                    return
                if not stuck:
                    log.warning("replica %d: all %d trajectories wait to grow; letting them go beyond the KV "
                                "capacity (the engine may preempt)", r, len(queue))
                took, stuck = head.target, True
                self.overflows += 1
            queue.popleft()
            load.pending -= head.need
            load.reserved += took - placed.reserved
            placed.reserved = took
            if not head.future.done():
                head.future.set_result(None)

    def end_trajectory(self, scope_id: int) -> None:
        """Free the trajectory's reservation (or drop it from the queues), then place those waiting, in order."""
        placed = self._placed.pop(scope_id, None)
        if placed is not None:
            load = self.loads[placed.replica]
            load.trajectories -= 1
            load.reserved -= placed.reserved
            growing = self._growing[placed.replica]
            for w in [w for w in growing if w.scope_id == scope_id]:  # it was cancelled while waiting to grow
                growing.remove(w)
                load.pending -= w.need
            if self.adaptive:
                load.used -= placed.context
                self.lengths.finish(scope_id, placed.context - placed.prompt)
                self._unblock(placed.replica)
        for w in list(self._waiting):
            if w.scope_id == scope_id:
                self._waiting.remove(w)
        self._place_waiting()

    def _place_waiting(self) -> None:
        while self._waiting:
            head = self._waiting[0]
            if head.future.done():  # its caller was cancelled
                self._waiting.popleft()
                continue
            replica = self._pick(head.need)
            if replica is None:
                break
            self._waiting.popleft()
            head.future.set_result(self._assign(head.scope_id, replica, head.need, head.prompt))

    def stats(self) -> dict[str, Any]:
        """What /health of `rstar2 serve` shows: the policy, overflows and each replica's load."""
        return {"policy": self.policy, "overflows": self.overflows, "waiting": len(self._waiting),
                "replicas": [{"engine": e.name, **dataclasses.asdict(load)}
                             for e, load in zip(self.engines, self.loads, strict=True)]}

    async def load_weights(self, state_dict: dict[str, Any]) -> None:
        await asyncio.gather(*(e.load_weights(state_dict) for e in self.engines))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines))
