"""A discrete-event simulation of one RL rollout step: N multi-turn rollouts over R engine replicas.

Each replica is modelled on vLLM's scheduler: a FIFO waiting queue, at most `max_num_seqs` running
requests, a KV cache of `kv_tokens` tokens. A request is admitted when its context fits the free KV (the
prefix of a trajectory's earlier turns stays cached between turns unless evicted, least recently used
first); when the running requests outgrow the cache, cached prefixes are evicted, then the newest running
request is preempted and later recomputed (vLLM's recompute preemption). A decode step takes
`step_s + per_seq_s * batch + per_kv_token_s * KV tokens in the batch`; prefill (and recompute) costs
`prefill_s` per token and stalls the replica. Between turns a trajectory waits for its tool calls.

The pool side is the ReplicaPool's own state machine, `routing.Router` (placing, the FIFO of new rollouts,
reservations and their growth, overflows), driven by simulated events where the pool uses asyncio futures: its
callbacks start a rollout's first turn and send a turn to its replica. One step differs: the pool also tells it
(`hold`) what a trajectory holds when a generation returns; the simulator only at the next turn, so its length
model counts a turn's generated and tool tokens as one turn, the pool's as two. `static` is the paper's baseline:
every rollout is given to a replica at the start, round robin (an equal split; the n rollouts of a prompt spread
over replicas, which balances better than contiguous chunks), and each replica's engine admits FIFO and preempts
and recomputes on overflow, as vLLM does. `least_outstanding` and `kv_aware` place a rollout when a replica takes
it (at most `max_num_seqs` live trajectories per replica). kv_aware reserves prompt + `budget` (strict), prompt +
`reserve` (fixed), or, with `quantile`, adaptively: renewed at each turn, a turn that cannot grow waits at the
pool.

Defaults (SimConfig) model Qwen3-14B in bf16 on one MI300X a replica, the paper's setup: 500K KV tokens
(160 KiB a token, ~80 GB), max_num_seqs 256, a 12,288-token budget; a decode step costs 10 ms + 50 us a
sequence + 40 ns a KV token read; prefill 50 us a token. The `longtail` workload: 16 rollouts a prompt,
~5% + a difficulty-driven share running to 8K-12K tokens, 1-10 turns, tool calls ~0.15 s (2% at 10 s).

Time is fluid within a replica: all running requests advance one token per step; the replica wakes at its
next event (a turn ends, the KV fills, or `chunk` steps pass), or when a turn arrives.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from rstar2_agent.engines.routing import LengthModel, Router

from .draws import poisson


@dataclass
class Rollout:
    """The shape of one recorded (or synthetic) trajectory."""
    prompt: int  # prompt tokens
    turns: list[int]  # tokens generated in each assistant turn
    inserted: list[int]  # tool-response tokens inserted after each turn but the last
    tool_s: list[float]  # seconds of tool calls after each turn but the last


@dataclass
class SimConfig:
    replicas: int = 8
    kv_tokens: int = 500_000  # KV cache per replica (Qwen3-14B at 160 KiB a token: ~80 GB)
    max_num_seqs: int = 256  # running requests per replica
    budget: int = 12_288  # max response tokens of a trajectory
    reserve: int | None = None  # kv_aware reserves prompt + this (None: the budget, so it never overflows)
    quantile: float | None = None  # adaptive kv_aware: reserve up to this quantile of the learned length
    step_s: float = 0.010  # decode step: weights read once (14B bf16 on one MI300X)
    per_seq_s: float = 5e-5  # ... plus per sequence in the batch
    per_kv_token_s: float = 4e-8  # ... plus per KV token read (160 KiB at ~4 TB/s)
    prefill_s: float = 5e-5  # per prefilled or recomputed token (~28 GFLOP at ~0.5 PFLOP/s)
    chunk: int = 64  # at most this many decode steps between step-time updates


@dataclass
class SimResult:
    policy: str
    replicas: int
    rollouts: int
    makespan: float  # seconds until the last rollout ends
    idle: float  # fraction of replica-time with nothing to run (waiting for tools, or no work left)
    preemptions: int  # running requests preempted because the KV cache overflowed
    recomputed: int  # tokens prefilled again (after preemption or eviction of a cached prefix)
    generated: int  # tokens decoded
    overflows: int = 0  # turns the adaptive kv_aware pool let go beyond its replica's capacity (to avoid deadlock)
    waits: int = 0  # turns that waited for their reservation to grow (adaptive kv_aware)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# ---------------------------------------------------------------- the replica (engine) model
@dataclass
class _Req:
    traj: int
    left: int  # tokens still to generate in this turn
    ctx: int = 0  # context tokens when it (re)started running
    s0: float = 0.0  # the replica's step counter when it started
    seq: int = 0  # admission order (the newest is preempted first)


@dataclass
class _Replica:
    cfg: SimConfig
    index: int
    t: float = 0.0
    steps: float = 0.0  # decode steps done: a running request has ctx + (steps - s0) tokens
    busy: float = 0.0
    k_base: float = 0.0  # sum of (ctx - s0) over running: KV in use = k_base + batch * steps
    running: dict[int, _Req] = field(default_factory=dict)  # by trajectory
    done_at: list = field(default_factory=list)  # heap of (step at which it ends, seq, traj)
    waiting: deque = field(default_factory=deque)  # of _Req
    cache: OrderedDict = field(default_factory=OrderedDict)  # traj -> cached prefix tokens, LRU first
    cached: int = 0
    version: int = 0  # bumped on each re-plan; stale wake-ups are dropped
    target: float = 0.0  # the step counter at the planned wake-up

    def kv(self) -> float:
        return self.k_base + len(self.running) * self.steps

    def step_time(self, k: float) -> float:
        """Seconds for k decode steps from now (the KV grows by one token per request per step)."""
        b, c = len(self.running), self.cfg
        return k * (c.step_s + c.per_seq_s * b + c.per_kv_token_s * (self.kv() + b * k / 2))

    def advance(self, t: float) -> None:
        """Decode until time t (fluid: fractional steps)."""
        if t <= self.t:
            return
        if self.running:
            self.steps = min(self.steps + (t - self.t) / self.step_time(1.0), self.target)
            self.busy += t - self.t
        self.t = t


class _Sim:
    def __init__(self, rollouts: list[Rollout], policy: str, cfg: SimConfig, prior: list[Rollout] | None = None):
        self.rollouts, self.policy, self.cfg = rollouts, policy, cfg
        self.reps = [_Replica(cfg, i) for i in range(cfg.replicas)]
        self.events: list = []  # (time, tie, kind, a, b)
        self.tie = itertools.count()
        self.seq = itertools.count()
        self.turn = [0] * len(rollouts)
        self.context = [r.prompt for r in rollouts]  # its tokens so far
        self.computed = [0] * len(rollouts)  # of those, how many had their KV computed before
        self.preemptions = self.recomputed = self.generated = 0
        lengths = None
        if policy == "kv_aware" and cfg.quantile is not None and cfg.reserve is None:
            lengths = LengthModel(cfg.budget, cfg.quantile)
            if prior:  # what the pool learned in the previous step
                lengths.learn([[t + i for t, i in zip(r.turns, [*r.inserted, 0], strict=True)] for r in prior])
        # the pool's own state machine; static gives every rollout out at the start (no cap on live ones)
        self.pool = Router(policy, [cfg.kv_tokens] * cfg.replicas, lengths=lengths, reserve=cfg.reserve,
                              budget=cfg.budget, max_trajectories=None if policy == "static" else cfg.max_num_seqs,
                              on_placed=self.placed, on_released=self.send, log_overflows=False)
        self.loads = self.pool.loads
        self.now = self.end = 0.0

    # -- pool side
    def placed(self, traj: int, r: int) -> None:
        """The trajectory got a replica: its first turn arrives at the pool."""
        self.submit(traj)

    def submit(self, traj: int) -> None:
        """The trajectory's next turn arrives at the pool; the pool sends it (`send`) now or when it may go."""
        self.pool.renew(traj, self.context[traj])

    def send(self, traj: int, r: int) -> None:
        """The trajectory's next turn arrives at its replica's engine."""
        rep = self.reps[r]
        rep.advance(self.now)
        rep.waiting.append(_Req(traj, self.rollouts[traj].turns[self.turn[traj]]))
        self.loads[r].in_flight += 1
        self.plan(rep)

    # -- replica side
    def admit(self, rep: _Replica) -> None:
        cfg = self.cfg
        while rep.waiting and len(rep.running) < cfg.max_num_seqs:
            req = rep.waiting[0]
            ctx = self.context[req.traj]
            own = rep.cache.get(req.traj, 0)
            room = cfg.kv_tokens - len(rep.running) - 1  # and a step to grow
            while rep.kv() + rep.cached - own + ctx > room and self.evict(rep, keep=req.traj):
                pass
            if rep.kv() + rep.cached - own + ctx > room:
                return  # the head waits for room (FIFO, as vLLM)
            rep.waiting.popleft()
            if own:
                del rep.cache[req.traj]
                rep.cached -= own
            prefill = ctx - own
            self.recomputed += prefill - (ctx - self.computed[req.traj])
            self.computed[req.traj] = ctx
            dt = prefill * cfg.prefill_s
            rep.t += dt
            rep.busy += dt
            req.ctx, req.s0, req.seq = ctx, rep.steps, next(self.seq)
            rep.running[req.traj] = req
            rep.k_base += ctx - rep.steps
            heapq.heappush(rep.done_at, (rep.steps + req.left, req.seq, req.traj))

    def evict(self, rep: _Replica, keep: int | None = None) -> bool:
        for traj, n in rep.cache.items():
            if traj != keep:
                del rep.cache[traj]
                rep.cached -= n
                return True
        return False

    def preempt_newest(self, rep: _Replica) -> None:
        req = max(rep.running.values(), key=lambda q: q.seq)
        made = int(rep.steps - req.s0)
        del rep.running[req.traj]
        rep.k_base -= req.ctx - req.s0
        self.context[req.traj] = self.computed[req.traj] = req.ctx + made  # recomputed when admitted again
        self.generated += made
        req.left -= made
        rep.waiting.appendleft(req)
        self.preemptions += 1

    def plan(self, rep: _Replica) -> None:
        """Admit what fits, then schedule the replica's next wake-up."""
        self.admit(rep)
        rep.version += 1
        if not rep.running:
            return
        b = len(rep.running)
        ends = rep.done_at[0][0] if rep.done_at else math.inf
        full = (self.cfg.kv_tokens - rep.cached - rep.k_base) / b  # the step at which the KV overflows
        rep.target = max(min(ends, full, rep.steps + self.cfg.chunk), rep.steps)
        k = rep.target - rep.steps
        heapq.heappush(self.events, (rep.t + rep.step_time(k), next(self.tie), "wake", rep.index, rep.version))

    def wake(self, rep: _Replica, now: float) -> None:
        if rep.running:
            rep.steps = rep.target
            rep.busy += now - rep.t
        rep.t = now
        while rep.done_at:  # turns that ended (entries of preempted requests are stale)
            at, seq, traj = rep.done_at[0]
            req = rep.running.get(traj)
            if req is None or req.seq != seq:
                heapq.heappop(rep.done_at)
                continue
            if at > rep.steps + 1e-6:
                break
            heapq.heappop(rep.done_at)
            rep.steps = max(rep.steps, at)
            self.turn_ended(rep, req, now)
        cap, b = self.cfg.kv_tokens, len(rep.running)
        while rep.cached and rep.kv() + rep.cached + b * self.cfg.chunk > cap:  # make room for a chunk
            self.evict(rep)
        while rep.running and rep.kv() + len(rep.running) > cap:  # no room for another step
            self.preempt_newest(rep)
        self.plan(rep)

    def turn_ended(self, rep: _Replica, req: _Req, now: float) -> None:
        del rep.running[req.traj]
        rep.k_base -= req.ctx - req.s0
        self.generated += req.left
        self.loads[rep.index].in_flight -= 1
        traj, ro = req.traj, self.rollouts[req.traj]
        k = self.turn[traj]
        self.context[traj] = self.computed[traj] = req.ctx + req.left
        if k + 1 < len(ro.turns):  # the tool runs; the prefix stays cached until evicted
            rep.cache[traj] = self.context[traj]
            rep.cached += self.context[traj]
            self.context[traj] += ro.inserted[k]
            self.turn[traj] = k + 1
            heapq.heappush(self.events, (now + ro.tool_s[k], next(self.tie), "tool", traj, rep.index))
            return
        self.end = max(self.end, now)  # the rollout is done: free its place
        self.pool.end(traj, self.context[traj])

    def run(self) -> SimResult:
        for traj, ro in enumerate(self.rollouts):  # all arrive at the start, in order
            self.pool.arrive(traj, ro.prompt)
        while self.events:
            self.now, _, kind, a, b = heapq.heappop(self.events)
            if kind == "wake":
                if self.reps[a].version == b:
                    self.wake(self.reps[a], self.now)
            else:  # a tool call returned: the next turn goes to the same replica
                self.submit(a)
        if self.pool.queue or self.pool.placed:
            raise RuntimeError("the simulation ended with rollouts left: a replica is too small for one rollout")
        span = self.end
        idle = 1 - sum(min(r.busy, span) for r in self.reps) / (span * len(self.reps)) if span else 0.0
        return SimResult(self.policy, self.cfg.replicas, len(self.rollouts), span, idle, self.preemptions,
                         self.recomputed, self.generated, self.pool.overflows, self.pool.waits)


def simulate(rollouts: list[Rollout], policy: str, cfg: SimConfig, prior: list[Rollout] | None = None) -> SimResult:
    """Replay one step of `rollouts` over `cfg.replicas` replicas under `policy`. `prior`: the rollouts of the
    previous step, which the adaptive kv_aware pool has learned from (default: none, the first step)."""
    big = max(r.prompt + sum(r.turns) + sum(r.inserted) for r in rollouts)
    if big + cfg.max_num_seqs >= cfg.kv_tokens:
        raise ValueError(f"a rollout of {big} tokens does not fit a replica's KV cache of {cfg.kv_tokens}")
    return _Sim(rollouts, policy, cfg, prior).run()


# ---------------------------------------------------------------- workloads
def longtail(n: int, seed: int = 0, *, group: int = 16, budget: int = 12_288, max_turns: int = 10) -> list[Rollout]:
    """A step shaped like the paper's: groups of `group` rollouts per prompt, the prompt's difficulty sets
    their lengths; most rollouts are short, a tail runs to 8K-12K tokens (some truncated at the budget);
    more tokens, more turns; tool calls take ~0.3 s, a few run to their 10 s timeout."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % group == 0:
            hard = rng.random()
            prompt = int(min(max(rng.gauss(350, 80), 150), 800))
        if rng.random() < 0.05 + 0.35 * hard**2:
            total = budget if rng.random() < 0.4 else rng.randint(8_000, budget)
        else:
            total = int(min(rng.lognormvariate(math.log(1_000 + 2_500 * hard), 0.5), 8_000))
        turns = min(max_turns, 1 + poisson(rng, 0.5 + total / 1_500))
        inserted = [int(min(rng.lognormvariate(math.log(60), 0.8), 600)) for _ in range(turns - 1)]
        generated = max(total - sum(inserted), 20 * turns)
        weights = [rng.expovariate(1.0) for _ in range(turns)]
        split = [max(20, int(generated * w / sum(weights))) for w in weights]
        tool_s = [10.0 if rng.random() < 0.02 else rng.lognormvariate(math.log(0.15), 1.0) for _ in range(turns - 1)]
        out.append(Rollout(prompt, split, inserted, tool_s))
    return out


def from_trajectory(d: dict, tokens_per_char: float = 0.3) -> Rollout:
    """A Rollout from a stored Trajectory.to_dict() (inserted tokens and tool times as recorded)."""
    turns = d.get("turns") or [{"num_tokens": d.get("num_generated_tokens", 1), "tool_calls": []}]
    tool_s = [sum(c.get("duration", 0.0) for c in t.get("tool_calls", [])) for t in turns[:-1]]
    inserted = [t.get("inserted_tokens") or int(tokens_per_char * sum(len(c.get("response", ""))
                                                                      for c in t.get("tool_calls", [])))
                for t in turns[:-1]]
    return Rollout(len(d.get("prompt_ids", [])) or 1, [max(1, t.get("num_tokens", 1)) for t in turns], inserted,
                   tool_s)


def recorded(n: int, seed: int = 0, db: str | None = None) -> list[Rollout]:
    """N rollouts resampled from recorded trajectories: those in the store at `db`, else a built-in sample
    of the embedded SmolLM2 on math questions (recorded_sample.py)."""
    if db is not None:
        from rstar2_agent.store import Store, TrajectoryRow

        store = Store(db)
        try:
            with store.session() as s:
                shapes = [from_trajectory(row.data) for row in s.query(TrajectoryRow).limit(20_000)]
        finally:
            store.close()
        if not shapes:
            raise ValueError(f"the store {db} has no trajectories; run an eval first, or use --workload longtail")
    else:
        from .recorded_sample import SMOLLM2_SAMPLE

        shapes = [Rollout(p, list(t), list(i), list(s)) for p, t, i, s in SMOLLM2_SAMPLE]
    rng = random.Random(seed)
    return [shapes[rng.randrange(len(shapes))] for _ in range(n)]


def compare(rollouts: list[Rollout], replicas: list[int], cfg: SimConfig, reserve: int | None = None,
            quantile: float | None = 0.9, prior: list[Rollout] | None = None) -> list[tuple[str, SimResult]]:
    """At each replica count: static, least_outstanding, kv_aware strict, kv_aware with a fixed `reserve` (when
    given), kv_aware adaptive at `quantile` (when given) in a first step and, with `prior`, in a later step
    that learned from `prior`. A list of (label, result)."""
    rows = []
    for r in replicas:
        base = {**cfg.__dict__, "replicas": r, "reserve": None, "quantile": None}
        runs = [("static", SimConfig(**base), None), ("least_outstanding", SimConfig(**base), None),
                ("kv_aware strict", SimConfig(**base), None)]
        if reserve is not None:
            runs.append((f"kv_aware fixed {reserve}", SimConfig(**{**base, "reserve": reserve}), None))
        if quantile is not None:
            adaptive = SimConfig(**{**base, "quantile": quantile})
            runs.append((f"kv_aware adaptive q{quantile:g}, step 1", adaptive, None))
            if prior is not None:
                runs.append((f"kv_aware adaptive q{quantile:g}, later step", adaptive, prior))
        rows += [(label, simulate(rollouts, label.split()[0], c, p)) for label, c, p in runs]
    return rows
