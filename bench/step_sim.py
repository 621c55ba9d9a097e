"""`rstar2 bench simulate step`: a discrete-event model of RL steps, synchronous against bounded staleness.

One step of GRPO-RoC is: generate a batch of rollouts on the rollout engines, grade them, update the learner, push the
new weights to the engines. The model follows each rollout and the learner through time:

- Rollouts run on `replicas` engine replicas of `slots` concurrent sequences each; a new rollout goes to the replica
  with the most free slots (the paper's load-balanced scheduler assigns by free KV cache). A rollout alternates decode
  segments and tool calls (its response tokens split evenly over its turns; each call waits `tool_latency_s`, holding
  its slot). A replica decodes all its sequences together: one iteration takes `t0 + t1 * n` seconds for n decoding
  sequences (the fixed part is reading the weights, the per-sequence part the KV cache and the sampling), so one
  sequence gets a token per iteration.
- The learner, for step b: waits until batch b is complete, grades it, does the rest of its step (`other_s`: RoC,
  storing rollouts), updates, then pushes version b+1. Batch j's rollouts may start only once the engines hold
  version >= j - max_staleness: 0 is the synchronous step. Without partial rollouts a push stops new rollouts, waits
  for those in flight to finish, then loads the weights; with partial rollouts it loads them at once and the rollouts
  in flight continue with the new weights after the load. A rollout's policy lag is its batch minus the version it
  started with.
- Contention `c`: when the engines decode while the learner works (grading, updating) on the same hardware, both run
  1 + c times slower; c = 0 for separate GPUs, c = 1 for a machine both use fully (the CPU recipes on 2 cores), in
  between when one of them leaves part of the machine idle. Calibration (`calibrate.py`) measures it.

Every batch j draws the same rollouts under every schedule (a seed per batch), so schedules compare on equal work.
The paper-scale setup (`paper_setups`) names every figure it assumes, with its source.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from dataclasses import dataclass, field

from .draws import poisson

# ---------------------------------------------------------------- the paper's setup (arXiv 2508.20722, section 3-4)
PAPER_GPUS = 64  # "64 MI300X GPUs" (abstract, section 3)
PAPER_PROMPTS = 512  # prompts per step (section 4; train/recipes/rl-qwen3-14b-base-mi300x.yaml)
PAPER_ROLLOUTS_PER_PROMPT = 32  # 2G with G = 16: 32 sampled, RoC keeps 16 (section 2.2, the release's config)
PAPER_KEPT_PER_PROMPT = 16  # G: what the update trains on
PAPER_STAGES = {1: (8192, 10), 2: (12288, 10), 3: (12288, 15)}  # max response tokens, max turns (section 4)
PAPER_TOOL_CALLS_PER_STEP = 45_000  # "up to 45K concurrent tool calls" per step (section 3.1)
PAPER_TOOL_LATENCY_S = 0.3  # "average latency of 0.3 seconds" per call (section 3.1)
PAPER_STEPS, PAPER_WEEK_S = 510, 7 * 86400  # "510 RL steps within one week": at most ~1,186 s a step, all included
GPUS_PER_NODE = 8  # MI300X nodes hold 8 GPUs
MODEL_PARAMS = 14.8e9  # Qwen3-14B(-Base): 14.8B parameters (its model card)
MODEL_BYTES = 2 * MODEL_PARAMS  # bf16 weights

# ---------------------------------------------------------------- assumptions (no figure in the paper)
# Response lengths: lognormal, cut at the stage's budget (the cut ones are truncated rollouts). Assumption: median
# 2,800 tokens and shape 0.75 give a mean near 3.4K and ~5% at the 8K cap in stage 1.
ASSUME_MEDIAN_TOKENS = 2800.0
ASSUME_SIGMA = 0.75
ASSUME_PROMPT_TOKENS = 300  # problem + system prompt (assumption)
# Decode on one MI300X, vLLM, bf16, one replica per GPU: an iteration takes t0 + t1 * sequences. Assumption: t0 ~ the
# 29.6 GB of weights read at ~1.5 TB/s effective plus scheduling; t1 ~ the KV cache of one ~4K-token sequence of
# Qwen3-14B (40 layers x 8 KV heads x 128 x 2 x 2 bytes = 160 KiB a token, 0.65 GB) read at ~5 TB/s.
ASSUME_DECODE_T0_S = 0.025
ASSUME_DECODE_T1_S = 0.00013
ASSUME_SLOTS = 256  # concurrent sequences per GPU (the recipe's max_num_seqs; the KV cache holds ~220 of 4K tokens)
# Update: forward for the learner's logprobs (2N flops a token) + forward/backward with activation recompute (8N),
# over the kept rollouts' prompt + response tokens, at an assumed 35% of the MI300X's 1,307 dense bf16 TFLOP/s.
ASSUME_MFU = 0.35
MI300X_BF16_FLOPS = 1.307e15  # AMD's datasheet, dense
# Weight push. Colocated (verl's hybrid engine, the paper): resharding in GPU memory, assumption 5 s. Separate rollout
# GPUs: a broadcast of the bf16 weights over 400 Gb/s (50 GB/s) links, pipelined, plus 5 s to load them (assumption).
ASSUME_PUSH_COLOCATED_S = 5.0
ASSUME_PUSH_SPLIT_S = MODEL_BYTES / 50e9 + 5.0
ASSUME_GRADE_S = 0.0  # grading runs in the environment service while rollouts finish (section 3.1): off the path
ASSUME_SHARD = GPUS_PER_NODE  # simulate one node's share (1/8 of GPUs and prompts): the scheduler spreads evenly

# Published asynchronous-over-synchronous throughput ratios, for the table's footnote.
PUBLISHED = (("AReaL (arXiv 2505.24298)", "up to 2.77x"), ("verl fully async, 128 GPUs", "2.35-2.67x"),
             ("ROLL Flash (arXiv 2510.11345)", "2.24-2.72x"))


@dataclass
class Workload:
    """The rollouts of one step. `replay`: measured rollouts, (response tokens, tool calls) per step; batch j replays
    step j % len(replay). Otherwise drawn: lognormal lengths cut at `max_tokens`, Poisson tool calls (at most
    max_turns - 1)."""
    prompts: int
    rollouts_per_prompt: int
    max_tokens: int
    median_tokens: float = ASSUME_MEDIAN_TOKENS
    sigma: float = ASSUME_SIGMA
    tool_calls: float = 0.0  # mean per rollout
    max_turns: int = 10
    tool_latency_s: float = 0.0
    replay: list[list[tuple[float, int]]] | None = None

    @property
    def batch(self) -> int:
        return self.prompts * self.rollouts_per_prompt

    def draw(self, j: int, seed: int) -> list[tuple[float, int]]:
        if self.replay:
            return self.replay[j % len(self.replay)]
        rng = random.Random(seed * 1_000_003 + j)
        return [(min(float(self.max_tokens), max(1.0, rng.lognormvariate(math.log(self.median_tokens), self.sigma))),
                 min(self.max_turns - 1, poisson(rng, self.tool_calls))) for _ in range(self.batch)]


@dataclass
class SimEngine:
    replicas: int
    slots: int  # concurrent sequences per replica
    t0: float  # seconds per decode iteration, fixed
    t1: float  # seconds per decode iteration per decoding sequence

    def tokens_per_s(self, n: int) -> float:
        """One replica's decode throughput with n sequences decoding."""
        return n / (self.t0 + self.t1 * n)


@dataclass
class SimLearner:
    update_s: float  # seconds alone on its hardware
    push_s: float
    grade_s: float = 0.0
    other_s: float = 0.0  # the rest of the learner's step: RoC, storing the rollouts, metrics


@dataclass
class Setup:
    name: str
    workload: Workload
    engine: SimEngine
    learner: SimLearner
    contention: float = 0.0  # 0: separate hardware; 1: both use the whole machine
    note: str = ""


@dataclass(frozen=True)
class Schedule:
    max_staleness: int = 0
    partial: bool = False

    @property
    def label(self) -> str:
        if self.max_staleness == 0:
            return "sync"
        return f"max_staleness {self.max_staleness}" + (", partial rollouts" if self.partial else "")


@dataclass
class StepRecord:
    step: int
    step_time: float  # the learner's view: from waiting for the batch to the end of the push
    learner_wait_s: float
    time_update: float  # grading, rest and update, wall
    time_push: float  # push wall, the drain before it included
    time_rollout: float  # the batch's first start to its last finish
    rollout_wait_s: float  # engines empty and barred from starting rollouts (waiting for weights)
    policy_lag_max: int
    policy_lag_mean: float
    tokens: float


@dataclass
class SimResult:
    setup: str
    schedule: Schedule
    steps: list[StepRecord]
    warmup: int
    rollouts_per_step: int
    rollout_seconds: list[float] = field(default_factory=list)

    @property
    def measured(self) -> list[StepRecord]:
        return self.steps[self.warmup:] or self.steps

    @property
    def step_time(self) -> float:
        return sum(s.step_time for s in self.measured) / len(self.measured)

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_per_step / self.step_time

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.measured) / sum(s.step_time for s in self.measured)

    def mean(self, name: str) -> float:
        return sum(getattr(s, name) for s in self.measured) / len(self.measured)


class _Replica:
    __slots__ = ("n", "held", "v", "tv", "rate", "heap", "token")

    def __init__(self) -> None:
        self.n = 0  # sequences decoding
        self.held = 0  # slots held (decoding or in a tool call)
        self.v = 0.0  # tokens each decoding sequence has produced so far (processor sharing: all advance together)
        self.tv = 0.0
        self.rate = 0.0  # tokens/s per sequence
        self.heap: list[tuple[float, int]] = []  # (v at which the segment ends, rollout)
        self.token = 0


class _Sim:
    """The event loop; `run` returns when the learner has finished `steps` steps."""

    def __init__(self, setup: Setup, schedule: Schedule, seed: int):
        self.s, self.k, self.partial, self.seed = setup, schedule.max_staleness, schedule.partial, seed
        self.t = 0.0
        self.version = 0
        self.reps = [_Replica() for _ in range(setup.engine.replicas)]
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.decoding = 0
        self.in_flight = 0
        self.paused = self.draining = False
        # rollouts: [batch, tokens per segment, calls left, replica, start version, start time, tokens]
        self.r: list[list] = []
        self.batches: dict[int, list[tuple[float, int]]] = {}
        self.left: dict[int, int] = {}
        self.first_start: dict[int, float] = {}
        self.done_at: dict[int, float] = {}
        self.lags: dict[int, list[int]] = {}
        self.next_batch, self.next_index = 0, 0
        self.seconds: list[float] = []
        # learner
        self.step, self.phase, self.step_start = 0, "wait", 0.0
        self.work: list[float] = []
        self.work_left, self.work_rate, self.work_t, self.ltoken = 0.0, 1.0, 0.0, 0
        self.marks: dict[str, float] = {}
        self.rollout_wait = 0.0
        self.records: list[StepRecord] = []

    # -------------------------------------------------------------- rates
    def _learner_busy(self) -> bool:
        return self.phase == "work"

    def _factor(self) -> float:
        return 1.0 / (1.0 + self.s.contention)

    def _retime(self, rep: _Replica, i: int) -> None:
        rep.v += rep.rate * (self.t - rep.tv)
        rep.tv = self.t
        e = self.s.engine
        rep.rate = 0.0 if self.paused or rep.n == 0 else \
            (self._factor() if self._learner_busy() else 1.0) / (e.t0 + e.t1 * rep.n)
        rep.token += 1
        if rep.rate > 0 and rep.heap:
            self._push(self.t + max(0.0, rep.heap[0][0] - rep.v) / rep.rate, "dec", i, rep.token)

    def _retime_all(self) -> None:
        for i, rep in enumerate(self.reps):
            self._retime(rep, i)

    def _retime_learner(self) -> None:
        if self.phase != "work":
            return
        self.work_left -= self.work_rate * (self.t - self.work_t)
        self.work_t = self.t
        self.work_rate = self._factor() if self.decoding and not self.paused else 1.0
        self.ltoken += 1
        self._push(self.t + max(0.0, self.work_left) / self.work_rate, "learner", 0, self.ltoken)

    def _push(self, when: float, kind: str, a: int, token: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, a, token))

    # -------------------------------------------------------------- rollouts
    def _admit(self) -> None:
        wl = self.s.workload
        while not self.paused and not self.draining and self.next_batch - self.version <= self.k:
            i = min(range(len(self.reps)), key=lambda x: self.reps[x].held)
            rep = self.reps[i]
            if rep.held >= self.s.engine.slots:
                return
            j = self.next_batch
            if j not in self.batches:
                self.batches[j] = wl.draw(j, self.seed)
                self.left[j] = len(self.batches[j])
                self.first_start[j] = self.t
                self.lags[j] = []
            tokens, calls = self.batches[j][self.next_index]
            self.r.append([j, tokens / (calls + 1), calls, i, self.version, self.t, tokens])
            self.lags[j].append(j - self.version)
            rep.held += 1
            self.in_flight += 1
            self._decode(len(self.r) - 1)
            self.next_index += 1
            if self.next_index == len(self.batches[j]):
                self.next_batch, self.next_index = j + 1, 0

    def _decode(self, rid: int) -> None:
        ro = self.r[rid]
        i = ro[3]
        rep = self.reps[i]
        rep.v += rep.rate * (self.t - rep.tv)
        rep.tv = self.t
        heapq.heappush(rep.heap, (rep.v + ro[1], rid))
        rep.n += 1
        self.decoding += 1
        self._retime(rep, i)
        if self.decoding == 1:
            self._retime_learner()

    def _on_decoded(self, i: int) -> None:
        rep = self.reps[i]
        rep.v += rep.rate * (self.t - rep.tv)
        rep.tv = self.t
        eps = 1e-9 * max(1.0, rep.v)
        while rep.heap and rep.heap[0][0] <= rep.v + eps:
            _, rid = heapq.heappop(rep.heap)
            rep.n -= 1
            self.decoding -= 1
            ro = self.r[rid]
            if ro[2] > 0:
                ro[2] -= 1
                self._push(self.t + self.s.workload.tool_latency_s, "tool", rid, 0)
            else:
                self._finish(rid)
        self._retime(rep, i)
        if self.decoding == 0:
            self._retime_learner()

    def _finish(self, rid: int) -> None:
        ro = self.r[rid]
        self.reps[ro[3]].held -= 1
        self.in_flight -= 1
        self.seconds.append(self.t - ro[5])
        j = ro[0]
        self.left[j] -= 1
        if self.left[j] == 0:
            self.done_at[j] = self.t
            if self.phase == "wait" and j == self.step:
                self._start_work()
        if self.draining and self.in_flight == 0:
            self._start_push()

    # -------------------------------------------------------------- learner
    def _start_work(self) -> None:
        ln = self.s.learner
        self.marks["work"] = self.t
        self.work = [w for w in (ln.grade_s, ln.other_s, ln.update_s) if w > 0] or [0.0]
        self.phase = "work"
        self.work_left, self.work_t, self.work_rate = self.work.pop(0), self.t, 1.0
        self._retime_all()
        self._retime_learner()

    def _on_learner(self) -> None:
        if self.work:
            self.work_left, self.work_t = self.work.pop(0), self.t
            self._retime_learner()
            return
        self.marks["updated"] = self.t
        self.phase = "push"
        self._retime_all()
        if self.partial or self.in_flight == 0:
            self._start_push()
        else:
            self.draining = True

    def _start_push(self) -> None:
        self.draining, self.paused = False, True
        self._retime_all()
        self._push(self.t + self.s.learner.push_s, "pushed", 0, 0)

    def _on_pushed(self) -> None:
        self.paused = False
        self.version = self.step + 1
        b = self.step
        lags = self.lags.get(b, [0])
        self.records.append(StepRecord(
            step=b + 1, step_time=self.t - self.step_start, learner_wait_s=self.marks["work"] - self.step_start,
            time_update=self.marks["updated"] - self.marks["work"], time_push=self.t - self.marks["updated"],
            time_rollout=self.done_at[b] - self.first_start[b], rollout_wait_s=self.rollout_wait,
            policy_lag_max=max(lags), policy_lag_mean=sum(lags) / len(lags),
            tokens=sum(tok for tok, _ in self.batches[b])))
        self.batches.pop(b - 1, None)
        self.step, self.step_start, self.rollout_wait, self.phase = b + 1, self.t, 0.0, "wait"
        self._retime_all()
        self._admit()
        if self.step in self.done_at:
            self._start_work()

    # -------------------------------------------------------------- loop
    def run(self, steps: int) -> list[StepRecord]:
        self._admit()
        while len(self.records) < steps:
            if not self.events:
                raise RuntimeError("simulation stalled: no event left (a setup with no replica or no slot?)")
            when, _, kind, a, token = heapq.heappop(self.events)
            if kind == "dec" and token != self.reps[a].token or kind == "learner" and token != self.ltoken:
                continue
            if self.in_flight == 0:
                self.rollout_wait += when - self.t
            self.t = when
            if kind == "dec":
                self._on_decoded(a)
            elif kind == "tool":
                self._decode(a)
            elif kind == "learner":
                self._on_learner()
            else:
                self._on_pushed()
            self._admit()
        return self.records


def simulate(setup: Setup, schedule: Schedule, steps: int = 8, warmup: int = 3, seed: int = 0) -> SimResult:
    """Run `steps` learner steps; the mean over the steps after `warmup` is the steady state."""
    if setup.engine.replicas < 1 or setup.engine.slots < 1:
        raise ValueError("a setup needs at least one replica with at least one slot")
    if schedule.max_staleness < 0:
        raise ValueError("max_staleness must be >= 0")
    sim = _Sim(setup, schedule, seed)
    records = sim.run(steps)
    return SimResult(setup.name, schedule, records, min(warmup, steps - 1), setup.workload.batch, sim.seconds)


# ---------------------------------------------------------------- the paper's scale
def paper_workload(stage: int = 1, shard: int = ASSUME_SHARD) -> Workload:
    max_tokens, max_turns = PAPER_STAGES[stage]
    rollouts = PAPER_PROMPTS * PAPER_ROLLOUTS_PER_PROMPT
    return Workload(prompts=PAPER_PROMPTS // shard, rollouts_per_prompt=PAPER_ROLLOUTS_PER_PROMPT,
                    max_tokens=max_tokens, tool_calls=PAPER_TOOL_CALLS_PER_STEP / rollouts, max_turns=max_turns,
                    tool_latency_s=PAPER_TOOL_LATENCY_S)


def mean_tokens(wl: Workload, n: int = 20000, seed: int = 0) -> float:
    """The mean response length of the drawn distribution (cut at the budget)."""
    rng = random.Random(seed)
    mu = math.log(wl.median_tokens)
    return sum(min(float(wl.max_tokens), rng.lognormvariate(mu, wl.sigma)) for _ in range(n)) / n


def paper_update_s(trainer_gpus: int, stage: int = 1) -> float:
    """Seconds of one update of the 14B model on `trainer_gpus` MI300X (the assumptions above)."""
    tokens = PAPER_PROMPTS * PAPER_KEPT_PER_PROMPT * (mean_tokens(paper_workload(stage)) + ASSUME_PROMPT_TOKENS)
    return 10 * MODEL_PARAMS * tokens / (trainer_gpus * ASSUME_MFU * MI300X_BF16_FLOPS)


def paper_setup(rollout_gpus: int | None = None, stage: int = 1, shard: int = ASSUME_SHARD) -> Setup:
    """None: the paper's colocated setup (all 64 GPUs generate, then all train); else `rollout_gpus` generate and the
    other 64 - rollout_gpus train, on separate GPUs (what bounded staleness needs, and this project's recipe)."""
    wl = paper_workload(stage, shard)
    if rollout_gpus is None:
        return Setup("colocated 64", wl, SimEngine(PAPER_GPUS // shard, ASSUME_SLOTS, ASSUME_DECODE_T0_S,
                                                ASSUME_DECODE_T1_S),
                     SimLearner(paper_update_s(PAPER_GPUS, stage), ASSUME_PUSH_COLOCATED_S, ASSUME_GRADE_S), 1.0,
                     "verl's hybrid engine: the GPUs generate, then train (the paper)")
    if not 0 < rollout_gpus < PAPER_GPUS or rollout_gpus % shard:
        raise ValueError(f"rollout GPUs must be a multiple of {shard} between {shard} and {PAPER_GPUS - shard}")
    trainer = PAPER_GPUS - rollout_gpus
    return Setup(f"split {rollout_gpus}+{trainer}", wl, SimEngine(rollout_gpus // shard, ASSUME_SLOTS,
                                                                ASSUME_DECODE_T0_S, ASSUME_DECODE_T1_S),
                 SimLearner(paper_update_s(trainer, stage), ASSUME_PUSH_SPLIT_S, ASSUME_GRADE_S), 0.0,
                 f"{rollout_gpus} GPUs generate, {trainer} train")


def balanced_splits(stage: int = 1, shard: int = ASSUME_SHARD) -> tuple[int, ...]:
    """The rollout-GPU counts (whole nodes) on either side of the split where generating a batch at full slots takes
    as long as the update on the other GPUs: the candidates a staleness schedule is simulated on."""
    wl = paper_workload(stage, shard)
    work = wl.batch * shard * mean_tokens(wl) / SimEngine(1, ASSUME_SLOTS, ASSUME_DECODE_T0_S,
                                                       ASSUME_DECODE_T1_S).tokens_per_s(ASSUME_SLOTS)
    grid = range(shard, PAPER_GPUS, shard)
    best = min(grid, key=lambda g: abs(work / g - paper_update_s(PAPER_GPUS - g, stage)))
    return tuple(g for g in grid if abs(g - best) <= shard)


SCHEDULES = (Schedule(1, False), Schedule(1, True), Schedule(2, False), Schedule(2, True))


@dataclass
class Row:
    schedule: str
    setup: str
    step_time: float
    rollouts_per_s: float
    tokens_per_s: float
    vs_sync: float
    time_rollout: float
    time_update: float
    time_push: float
    learner_wait_s: float
    policy_lag_max: int
    policy_lag_mean: float


def _row(r: SimResult, sync: float) -> Row:
    return Row(r.schedule.label, r.setup, r.step_time, r.rollouts_per_s, r.tokens_per_s, sync / r.step_time,
               r.mean("time_rollout"), r.mean("time_update"), r.mean("time_push"), r.mean("learner_wait_s"),
               max(s.policy_lag_max for s in r.measured), r.mean("policy_lag_mean"))


def paper_table(stage: int = 1, steps: int = 7, warmup: int = 3, seed: int = 0, shard: int = ASSUME_SHARD,
                splits: tuple[int, ...] | None = None) -> list[Row]:
    """The paper's synchronous colocated step, this project's split recipe (48 + 16) synchronous, and each
    bounded-staleness schedule on the split of rollout and trainer GPUs that serves it best."""
    splits = splits or balanced_splits(stage, shard)
    base = simulate(paper_setup(None, stage, shard), Schedule(), steps, warmup, seed)
    rows = [_row(base, base.step_time)]
    recipe = simulate(paper_setup(48, stage, shard), Schedule(), steps, warmup, seed)
    rows.append(_row(recipe, base.step_time))
    for sched in SCHEDULES:
        best = min((simulate(paper_setup(g, stage, shard), sched, steps, warmup, seed) for g in splits),
                   key=lambda r: r.step_time)
        rows.append(_row(best, base.step_time))
    return rows


def assumptions(stage: int = 1, shard: int = ASSUME_SHARD) -> dict[str, str]:
    """Every figure the paper-scale table rests on, with where it comes from."""
    wl = paper_workload(stage, shard)
    mean = mean_tokens(wl)
    e = SimEngine(1, ASSUME_SLOTS, ASSUME_DECODE_T0_S, ASSUME_DECODE_T1_S)
    return {
        "GPUs": f"{PAPER_GPUS} MI300X (paper)",
        "batch": f"{PAPER_PROMPTS} prompts x {PAPER_ROLLOUTS_PER_PROMPT} rollouts, {PAPER_KEPT_PER_PROMPT} kept per "
                 "prompt (paper)",
        "budget": f"stage {stage}: {wl.max_tokens} response tokens, {wl.max_turns} turns (paper)",
        "tool calls": f"{wl.tool_calls:.2f} per rollout = 45K per step / 16,384 rollouts; "
                      f"{PAPER_TOOL_LATENCY_S} s each (paper)",
        "response length": f"lognormal, median {ASSUME_MEDIAN_TOKENS:.0f}, shape {ASSUME_SIGMA}, cut at the budget: "
                           f"mean {mean:.0f} tokens (assumption)",
        "decode": f"{ASSUME_DECODE_T0_S * 1e3:.0f} ms + {ASSUME_DECODE_T1_S * 1e3:.2f} ms x sequences per iteration "
                  f"per GPU: {e.tokens_per_s(ASSUME_SLOTS):.0f} tok/s at {ASSUME_SLOTS} sequences, "
                  f"{e.tokens_per_s(1):.0f} at 1 (assumption)",
        "slots": f"{ASSUME_SLOTS} sequences per GPU (the 14B recipe's max_num_seqs; assumption)",
        "update": f"10 x {MODEL_PARAMS / 1e9:.1f}B flops x kept tokens at {ASSUME_MFU:.0%} MFU of "
                  f"{MI300X_BF16_FLOPS / 1e15:.3f} PFLOP/s: {paper_update_s(PAPER_GPUS, stage):.0f} s on 64 GPUs, "
                  "linear in GPUs (assumption)",
        "push": f"colocated {ASSUME_PUSH_COLOCATED_S:.0f} s, split {ASSUME_PUSH_SPLIT_S:.1f} s (assumption)",
        "grading": "in the environment service, off the learner's path (paper, section 3.1)",
        "scale": f"one node's share simulated (1/{shard} of GPUs and prompts; assumption: even spread)",
        "check": f"the paper's pace: {PAPER_STEPS} steps in a week = at most {PAPER_WEEK_S / PAPER_STEPS:.0f} s a "
                 "step, evaluation and checkpoints included",
    }


def as_json(rows: list[Row], stage: int, extra: dict | None = None) -> dict:
    return {"stage": stage, "rows": [dataclasses.asdict(r) for r in rows], "assumptions": assumptions(stage),
            "published": dict(PUBLISHED), **(extra or {})}
