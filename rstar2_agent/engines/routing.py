"""Where trajectories run: the placement policies and the state machine that applies them over replicas.

The policies (`pick`, `grow`, `LengthModel`; what they mean is in replicas.py's docstring) are plain functions
of the replicas' `Load`s. `Router` is the bookkeeping around them, synchronous and without events, so that
two drivers run the same code: ReplicaPool (replicas.py) over real engines, with asyncio futures, and the
discrete-event simulator (rstar2_agent.bench.replicas_sim), with simulated time.

A driver tells a `Router` what happens to a trajectory (its `key`):
- `arrive(key, prompt_tokens)`: a new trajectory; it is placed on a replica, or queued (FIFO) while none
  takes it; queued ones are placed in order when room appears.
- `renew(key, context)`: its next turn, with `context` tokens, wants to run. kv_aware renews the reservation
  (adaptive: grows it; fixed: raises it to the context when outgrown); an adaptive turn whose growth does not
  fit waits (FIFO per replica) until it fits or every live trajectory on the replica waits (then they all go,
  counted in `overflows`).
- `hold(key, context)`: the turn is done and the trajectory holds `context` tokens (adaptive kv_aware).
- `end(key)`: it ended (or its caller gave up): free its reservation, drop it from the queues, let waiting
  turns go and place waiting trajectories.
It tells the driver back through two callbacks, called at the moment it happens, also from inside the call
that caused it: `on_placed(key, replica)` when a trajectory is placed, and `on_released(key, replica)` when a
turn may go to its replica. Both fire for the trajectory or turn of the call itself too (`arrive` and `renew`
return whether they did before returning). The driver owns everything else: requests in flight
(`Load.in_flight`), the engines, time.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
POLICIES = ("static", "least_outstanding", "kv_aware")


# ---------------------------------------------------------------- the policies
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


# ---------------------------------------------------------------- the state machine
@dataclass
class Placed:
    """A live trajectory on its replica."""
    replica: int
    reserved: int  # KV tokens reserved for it (kv_aware)
    prompt: int = 0  # tokens of its first request
    context: int = 0  # tokens it holds as last seen (counted in its replica's Load.used; adaptive kv_aware)


@dataclass
class _New:
    """A new trajectory waiting for a replica."""
    key: int
    need: int  # the reservation it needed when it arrived
    prompt: int


@dataclass
class _Turn:
    """A turn waiting for its reservation to grow (adaptive kv_aware)."""
    key: int
    target: int  # the reservation it wants
    need: int  # the growth it waits for (counted in its replica's Load.pending)


Callback = Callable[[int, int], None]


class Router:
    """The pool's placement and reservation bookkeeping over replicas of the given KV `capacities`.

    kv_aware reserves prompt + `reserve` tokens when `reserve` is set (fixed); else adaptively from `lengths`
    when given; else prompt + `budget` (strict; default `max_context`). Reservations are capped at
    `max_context` when given. `max_trajectories` caps the live trajectories a replica takes (not for static).
    `abandoned(key)`: whether a queued trajectory's caller is gone; such a one is dropped when it reaches the
    head of the queue. `log_overflows`: warn when a replica's waiting turns all go at once."""

    def __init__(self, policy: str, capacities: list[int], *, on_placed: Callback, on_released: Callback,
                 lengths: LengthModel | None = None, reserve: int | None = None, budget: int | None = None,
                 max_context: int | None = None, max_trajectories: int | None = None,
                 abandoned: Callable[[int], bool] | None = None, log_overflows: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy, self.lengths, self.reserve, self.budget = policy, lengths, reserve, budget
        self.max_context, self.max_trajectories = max_context, max_trajectories
        self.on_placed, self.on_released, self.abandoned = on_placed, on_released, abandoned
        self.log_overflows = log_overflows
        self.loads = [Load(capacity=c) for c in capacities]
        self.placed: dict[int, Placed] = {}
        self.queue: OrderedDict[int, _New] = OrderedDict()  # new trajectories, in arrival order
        self.growing: list[deque[_Turn]] = [deque() for _ in capacities]  # turns waiting to grow, by replica
        self.placements = 0  # trajectories placed so far
        self.overflows = 0  # turns let go beyond their replica's capacity because all there waited (adaptive)
        self.waits = 0  # turns that waited for their reservation to grow (adaptive)

    @property
    def adaptive(self) -> bool:
        return self.policy == "kv_aware" and self.reserve is None and self.lengths is not None

    def _cap(self, tokens: int) -> int:
        return tokens if self.max_context is None else min(tokens, self.max_context)

    def need(self, prompt_tokens: int) -> int:
        """The reservation a new trajectory needs (0 but for kv_aware)."""
        if self.policy != "kv_aware":
            return 0
        if self.adaptive:
            return self._cap(self.lengths.reservation(prompt_tokens, 0))
        budget = next(b for b in (self.reserve, self.budget, self.max_context) if b is not None)
        return self._cap(prompt_tokens + budget)

    def arrive(self, key: int, prompt_tokens: int) -> int | None:
        """A new trajectory: its replica (on_placed was called), or None: it waits in the queue."""
        need = self.need(prompt_tokens)
        replica = None if self.queue else self._pick(need)
        if replica is None:
            self.queue[key] = _New(key, need, prompt_tokens)
            return None
        self._assign(key, replica, need, prompt_tokens)
        return replica

    def renew(self, key: int, context: int) -> bool:
        """The trajectory's next turn, on `context` tokens, wants to run: True if it went (on_released was
        called), False if it waits to grow (on_released is called when it may go)."""
        placed = self.placed[key]
        r, load = placed.replica, self.loads[placed.replica]
        if not self.adaptive:
            if self.policy == "kv_aware" and context > placed.reserved:  # it outgrew a fixed reservation
                load.reserved += context - placed.reserved
                placed.reserved = context
            self.on_released(key, r)
            return True
        self.hold(key, context)
        target = max(context, self._cap(self.lengths.reservation(placed.prompt, context - placed.prompt)))
        took = None if self.growing[r] else grow(load, placed.reserved, target, context)
        if took is None:  # it waits until it fits (or a trajectory on its replica ends)
            self.growing[r].append(_Turn(key, target, target - placed.reserved))
            load.pending += target - placed.reserved
            self.waits += 1
            self._unblock(r)
            return not any(t.key == key for t in self.growing[r])
        shrank = took < placed.reserved
        load.reserved += took - placed.reserved
        placed.reserved = took
        self.on_released(key, r)
        if shrank:  # room for others
            self._unblock(r)
            self._place_waiting()
        return True

    def hold(self, key: int, context: int) -> None:
        """The trajectory holds `context` tokens on its replica now (adaptive kv_aware; else nothing to do)."""
        placed = self.placed.get(key)
        if placed is None or not self.adaptive:
            return
        self.loads[placed.replica].used += context - placed.context
        placed.context = context
        self.lengths.update(key, context - placed.prompt)

    def end(self, key: int, context: int | None = None) -> None:
        """The trajectory ended with `context` tokens (default: as last held): free its reservation (or drop it
        from the queues), then let waiting turns go and place waiting trajectories, in order."""
        placed = self.placed.pop(key, None)
        if placed is not None:
            load, growing = self.loads[placed.replica], self.growing[placed.replica]
            load.trajectories -= 1
            load.reserved -= placed.reserved
            for turn in [t for t in growing if t.key == key]:  # its caller gave up while it waited to grow
                growing.remove(turn)
                load.pending -= turn.need
            if self.adaptive:
                load.used -= placed.context
                self.lengths.finish(key, (placed.context if context is None else context) - placed.prompt)
                self._unblock(placed.replica)
        self.queue.pop(key, None)
        self._place_waiting()

    def _pick(self, need: int) -> int | None:
        return pick(self.policy, self.loads, need, self.placements, self.max_trajectories)

    def _assign(self, key: int, replica: int, need: int, prompt_tokens: int) -> None:
        load, reserved = self.loads[replica], min(need, self.loads[replica].capacity)
        self.placements += 1
        load.trajectories += 1
        load.placed += 1
        load.reserved += reserved
        self.placed[key] = Placed(replica, reserved, prompt_tokens)
        self.hold(key, prompt_tokens)
        self.on_placed(key, replica)

    def _place_waiting(self) -> None:
        while self.queue:
            head = next(iter(self.queue.values()))
            if self.abandoned is not None and self.abandoned(head.key):
                self.queue.popitem(last=False)
                continue
            # adaptive: what it needs now (the lengths learned since it arrived); else what it needed then
            need = self.need(head.prompt) if self.adaptive else head.need
            replica = self._pick(need)
            if replica is None:
                return
            self.queue.popitem(last=False)
            self._assign(head.key, replica, need, head.prompt)

    def _unblock(self, r: int) -> None:
        """Let the turns waiting to grow on replica r go, in order, while they fit; if every live trajectory there
        waits, none would end to make room: they all go (overflows; the engine preempts if it must)."""
        load, queue, stuck = self.loads[r], self.growing[r], False
        while queue:
            head = queue[0]
            placed = self.placed[head.key]
            took = grow(load, placed.reserved, head.target, placed.context)
            if took is None:
                if len(queue) < load.trajectories and not stuck:
                    return
                if not stuck and self.log_overflows:
                    log.warning("replica %d: all %d trajectories wait to grow; letting them go beyond the KV "
                                "capacity (the engine may preempt)", r, len(queue))
                took, stuck = head.target, True
                self.overflows += 1
            queue.popleft()
            load.pending -= head.need
            load.reserved += took - placed.reserved
            placed.reserved = took
            self.on_released(head.key, r)
