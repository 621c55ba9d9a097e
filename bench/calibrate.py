"""Calibrating `rstar2 bench simulate step` on measured runs: fit the model on a synchronous run, predict the others.

A run is read from a `history.json` (the list of per-step metric dicts `run_rl` returns and `rstar2 train ablation`
writes), from a run folder holding one (and its `recipe.yaml`), or from the store by run name (its metrics, and its
rollouts: each one's response tokens, tool calls, seconds and tool seconds). From the synchronous run alone:

- the rollouts of each step (measured ones when the store has them, else lengths drawn to the step's mean
  `response_tokens` and calls to its mean `tool_calls`), replayed batch by batch;
- the engine's decode cost `t0 + t1 * n` per iteration: with the tool calls left out a batch's rollout time is
  exactly t0 * A + t1 * B, where A and B are the batch's times under (1, 0) and (0, 1) (the longest rollout's
  tokens and all tokens, when every rollout fits the slots), so a least-squares fit over the steps gives t0 and t1;
  then one factor scales both so the simulated mean rollout time, tool calls included, equals the measured one;
- the tool latency (tool seconds / calls of the stored rollouts), the grading, update and push times, and the rest
  of the learner's step (`step_time` minus its phases) as means over the steps;
- contention: not visible in a synchronous run (nothing overlaps), so measured on this machine by
  `measure_contention` (two processes of torch matrix work against one) or given.

Then every run is simulated under its own schedule (max_staleness and partial rollouts from its recipe, or given)
over as many steps, and the mean `step_time` over the same steps (the first `skip` left out) is compared.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .step_sim import Schedule, Setup, SimEngine, SimLearner, SimResult, Workload, simulate

DEFAULT_SLOTS = 64  # RLRun's vLLM engine default max_num_seqs
ASSUME_SIGMA_WITHOUT_ROLLOUTS = 0.5  # lognormal shape of the lengths when only the per-step mean is known (assumption)


class CalibrationError(ValueError):
    """A run cannot be read or lacks what the fit needs; the message says what to give."""


@dataclass
class Rollout:
    tokens: float
    calls: int
    seconds: float = 0.0
    tool_seconds: float = 0.0


@dataclass
class RunData:
    name: str
    history: list[dict[str, float]]
    recipe: dict[str, Any] = field(default_factory=dict)
    rollouts: dict[int, list[Rollout]] = field(default_factory=dict)  # 0-based step -> its rollouts

    def schedule(self) -> Schedule:
        return Schedule(int(self.recipe.get("max_staleness", 0) or 0), bool(self.recipe.get("partial_rollouts")))


# ---------------------------------------------------------------- reading runs
def load_run(spec: str, db: str | None = None) -> RunData:
    """`spec`: a history.json, a run folder, or a run name in the store (`db`, or the default store)."""
    path = Path(spec)
    recipe: dict[str, Any] = {}
    history: list[dict[str, float]] | None = None
    if path.is_file():
        history, folder = _read_history(path), path.parent
    elif path.is_dir():
        folder = path
        if (path / "history.json").is_file():
            history = _read_history(path / "history.json")
    else:
        folder = None
    if folder is not None and (folder / "recipe.yaml").is_file():
        import yaml

        recipe = yaml.safe_load((folder / "recipe.yaml").read_text()) or {}
    name = recipe.get("run") or (folder.resolve().name if folder is not None else spec)
    rollouts: dict[int, list[Rollout]] = {}
    if db is not None or folder is None:
        stored, rollouts = _from_store(str(name), db, required=history is None)
        history = history if history is not None else stored
    if not history:
        raise CalibrationError(f"{spec}: no per-step metrics: give a history.json, a run folder that holds one, or "
                               "the name of an RL run in the store (--db)")
    return RunData(str(name), history, recipe, rollouts)


def _read_history(path: Path) -> list[dict[str, float]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise CalibrationError(f"{path}: a history is a JSON list of per-step metric dicts")
    return data


def _from_store(name: str, db: str | None, required: bool) -> tuple[list[dict[str, float]], dict[int, list[Rollout]]]:
    from rstar2_agent.store import Store, StoreError
    from rstar2_agent.train.report import metrics_by_step

    try:
        store = Store(db)
        runs = [r for r in store.runs(name) if r.kind == "rl"]
    except StoreError as e:
        raise CalibrationError(str(e)) from e
    if not runs:
        if required:
            raise CalibrationError(f"no RL run named {name!r} in the store {store.url}")
        return [], {}
    run = runs[-1]
    history = [m for _, m in sorted(metrics_by_step(store, run.id).items())]
    rollouts: dict[int, list[Rollout]] = {}
    for s in store.samples(run.id):
        head = s.problem_id.split("/", 1)[0]
        if not head.startswith("step") or not head[4:].isdigit():
            continue
        rollouts.setdefault(int(head[4:]), []).append(
            Rollout(float(s.tokens), int(s.tool_calls), float(s.seconds), float((s.timings or {}).get("tools", 0.0))))
    return history, rollouts


# ---------------------------------------------------------------- fitting
@dataclass
class Fit:
    setup: Setup
    skip: int
    source: str  # "rollouts" (stored per-rollout data) or "history" (per-step means)
    residual_s: float  # rms of the linear fit of the rollout times, before the scale

    def describe(self) -> dict[str, float | str]:
        e, ln, wl = self.setup.engine, self.setup.learner, self.setup.workload
        return {"t0_s": e.t0, "t1_s": e.t1, "slots": e.slots, "replicas": e.replicas,
                "tool_latency_s": wl.tool_latency_s, "update_s": ln.update_s, "push_s": ln.push_s,
                "grade_s": ln.grade_s, "other_s": ln.other_s, "contention": self.setup.contention,
                "rollouts_per_step": wl.batch, "steps_replayed": len(wl.replay or []), "from": self.source,
                "rollout_fit_rms_s": self.residual_s}


def _mean(history: list[dict[str, float]], key: str) -> float:
    values = [m[key] for m in history if key in m]
    return sum(values) / len(values) if values else 0.0


def _rollouts_per_step(run: RunData) -> int | None:
    r = run.recipe
    if "prompts_per_step" in r:
        g = int(r.get("group_size", 4))
        return int(r["prompts_per_step"]) * (2 * g if r.get("roc", True) else g)
    return None


def fit_sync(run: RunData, contention: float, skip: int = 1, rollouts_per_step: int | None = None,
             seed: int = 0) -> Fit:
    """The model of `run` (a synchronous run), from its steps after the first `skip`."""
    if run.schedule().max_staleness:
        raise CalibrationError(f"{run.name} ran with max_staleness {run.schedule().max_staleness}: fit on a "
                               "synchronous run (max_staleness 0)")
    skip = min(skip, max(0, len(run.history) - 1))
    everything = list(range(len(run.history)))  # replayed: every step's rollouts (start-up slows time, not lengths)
    hist = run.history[skip:]  # fitted: the steps after the start-up
    for key in ("time_rollout", "time_update"):
        if not all(key in m for m in hist):
            raise CalibrationError(f"{run.name}: the steps lack {key}: measure with a version of `rstar2 train rl` "
                                   "that records it")
    stage = (run.recipe.get("stages") or [{}])[0]
    if all(run.rollouts.get(i) for i in everything):
        source = "rollouts"
        replay = [[(max(1.0, r.tokens), r.calls) for r in run.rollouts[i]] for i in everything]
        calls = sum(r.calls for i in everything for r in run.rollouts[i])
        tool = sum(r.tool_seconds for i in everything for r in run.rollouts[i]) / calls if calls else 0.0
    else:
        source = "history"
        n = rollouts_per_step or _rollouts_per_step(run)
        if not n:
            raise CalibrationError(f"{run.name}: how many rollouts a step is unknown (no recipe.yaml beside the "
                                   "history, no rollouts in the store): give --rollouts-per-step")
        cap = float(stage.get("max_response_tokens", 1 << 30))
        replay = [_draw(n, m.get("response_tokens", 1.0), m.get("tool_calls", 0.0), cap, random.Random(seed + i))
                  for i, m in enumerate(run.history)]
        tool = 0.0
    engine_opts = run.recipe.get("engine_options") or {}
    slots = int(engine_opts.get("max_num_seqs", DEFAULT_SLOTS))
    replicas = int((run.recipe.get("ray") or {}).get("rollout_workers", 1)) \
        if run.recipe.get("distributed") == "ray" else 1
    wl = Workload(prompts=len(replay[0]), rollouts_per_prompt=1, max_tokens=int(max(t for b in replay for t, _ in b)),
                  tool_calls=0.0, max_turns=int(stage.get("max_turns", 10)), tool_latency_s=tool, replay=replay)
    learner = SimLearner(update_s=_mean(hist, "time_update"), push_s=_mean(hist, "time_push"),
                      grade_s=_mean(hist, "time_grading"))
    phases = ("time_rollout", "time_grading", "time_update", "time_push")
    if all("step_time" in m for m in hist):
        learner.other_s = max(0.0, _mean(hist, "step_time") - sum(_mean(hist, k) for k in phases))
    measured = [m["time_rollout"] for m in hist]
    a = _rollout_times(wl, SimEngine(replicas, slots, 1.0, 0.0))[skip:]
    b = _rollout_times(wl, SimEngine(replicas, slots, 0.0, 1.0))[skip:]
    t0, t1 = _nnls2(a, b, measured)
    residual = math.sqrt(sum((y - t0 * x - t1 * z) ** 2 for x, z, y in zip(a, b, measured, strict=True)) / len(a))
    engine = SimEngine(replicas, slots, t0, t1)
    setup = Setup("fitted", wl, engine, learner, contention, "fitted on a synchronous run")
    target = sum(measured) / len(measured)

    def mean_rollout(scale: float) -> float:
        s = dataclasses.replace(setup, engine=SimEngine(replicas, slots, t0 * scale, t1 * scale))
        return simulate(s, Schedule(), len(replay), skip).mean("time_rollout")

    scale = _solve(mean_rollout, target, 1e-3, 1e3) if t0 + t1 > 0 else 1.0
    setup.engine = SimEngine(replicas, slots, t0 * scale, t1 * scale)
    return Fit(setup, skip, source, residual)


def _draw(n: int, mean: float, calls: float, cap: float, rng: random.Random) -> list[tuple[float, int]]:
    """n lengths with this mean (lognormal shape ASSUME_SIGMA_WITHOUT_ROLLOUTS, cut at cap) and Poisson calls."""
    raw = [rng.lognormvariate(0.0, ASSUME_SIGMA_WITHOUT_ROLLOUTS) for _ in range(n)]
    f = mean / (sum(raw) / n)
    from .draws import poisson

    return [(min(cap, max(1.0, x * f)), poisson(rng, calls)) for x in raw]


def _rollout_times(wl: Workload, engine: SimEngine) -> list[float]:
    """Each replayed batch's rollout time with tool calls left out (then linear in the engine's t0 and t1)."""
    no_tools = [[(t, 0) for t, _ in batch] for batch in wl.replay or []]
    s = Setup("basis", dataclasses.replace(wl, replay=no_tools, tool_latency_s=0.0), engine, SimLearner(0.0, 0.0))
    return [r.time_rollout for r in simulate(s, Schedule(), len(no_tools), 0).steps]


def _nnls2(a: list[float], b: list[float], y: list[float]) -> tuple[float, float]:
    """min |t0 a + t1 b - y|^2 over t0, t1 >= 0."""
    saa, sbb, sab = sum(x * x for x in a), sum(x * x for x in b), sum(x * z for x, z in zip(a, b, strict=True))
    say, sby = sum(x * v for x, v in zip(a, y, strict=True)), sum(x * v for x, v in zip(b, y, strict=True))
    det = saa * sbb - sab * sab
    if det > 1e-12 * max(1.0, saa * sbb):
        t0, t1 = (say * sbb - sby * sab) / det, (sby * saa - say * sab) / det
        if t0 >= 0 and t1 >= 0:
            return t0, t1
    only_a = (max(0.0, say / saa), 0.0) if saa else (0.0, 0.0)
    only_b = (0.0, max(0.0, sby / sbb)) if sbb else (0.0, 0.0)

    def err(p: tuple[float, float]) -> float:
        return sum((p[0] * x + p[1] * z - v) ** 2 for x, z, v in zip(a, b, y, strict=True))

    return min(only_a, only_b, key=err)


def _solve(f, target: float, lo: float, hi: float, iters: int = 60) -> float:
    """x in [lo, hi] with f(x) = target, f increasing (bisection on a log scale); the nearer end when outside."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


# ---------------------------------------------------------------- predicting
@dataclass
class Prediction:
    run: str
    schedule: str
    steps: int
    measured_step_time: float
    predicted_step_time: float
    error_pct: float  # (predicted - measured) / measured
    contention_that_fits: float | None  # the contention that would make the prediction exact (diagnostic only)


def predict(fit: Fit, run: RunData, schedule: Schedule | None = None) -> Prediction:
    """Simulate `run`'s schedule over its number of steps with the fitted model; compare mean step times."""
    schedule = schedule or run.schedule()
    measured = _measured_step_times(run, fit.skip)
    result = _simulate_like(fit.setup, schedule, len(run.history), fit.skip)
    predicted = result.step_time
    fits = None
    if schedule.max_staleness:
        def at(c: float) -> float:
            return _simulate_like(dataclasses.replace(fit.setup, contention=c), schedule, len(run.history),
                                  fit.skip).step_time

        lo, hi = 0.0, 3.0
        if at(lo) <= measured <= at(hi):
            for _ in range(30):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if at(mid) < measured else (lo, mid)
            fits = (lo + hi) / 2
    return Prediction(run.name, schedule.label, len(run.history), measured, predicted,
                      100.0 * (predicted - measured) / measured, fits)


def _simulate_like(setup: Setup, schedule: Schedule, steps: int, skip: int) -> SimResult:
    return simulate(setup, schedule, steps, min(skip, steps - 1))


def _measured_step_times(run: RunData, skip: int) -> float:
    rows = run.history[min(skip, len(run.history) - 1):]
    if all("step_time" in m for m in rows):
        return sum(m["step_time"] for m in rows) / len(rows)
    if run.schedule().max_staleness:
        raise CalibrationError(f"{run.name}: the steps lack step_time, which an overlapped schedule needs (its phases "
                               "overlap, their sum is not the step)")
    keys = ("time_rollout", "time_grading", "time_update", "time_push")
    return sum(sum(m.get(k, 0.0) for k in keys) for m in rows) / len(rows)


# ---------------------------------------------------------------- contention on this machine
def _matrix_work(reps: int, out, start) -> None:
    """Matrix products on torch's threads, as the learner and vLLM's CPU build run them (numpy's own BLAS threads
    spin when oversubscribed and read several times the slow-down the two real processes show)."""
    import torch

    x = torch.randn(1536, 1536, generator=torch.Generator().manual_seed(0))
    start.wait(timeout=120)  # every process has imported torch: the timed work overlaps whole
    t0 = time.perf_counter()
    for _ in range(reps):
        x = torch.tanh(x @ x * 1e-3)
    out.put(time.perf_counter() - t0)


def measure_contention(seconds: float = 2.0) -> float:
    """How much slower two processes of matrix work run side by side than one alone (the learner and the engine
    share this machine the same way): 0 when they do not slow each other, 1 when each runs at half speed."""
    ctx = multiprocessing.get_context("spawn")

    def run(procs: int, reps: int) -> float:
        q, start = ctx.Queue(), ctx.Barrier(procs)
        ps = [ctx.Process(target=_matrix_work, args=(reps, q, start)) for _ in range(procs)]
        for p in ps:
            p.start()
        times = [q.get(timeout=120) for _ in ps]
        for p in ps:
            p.join(timeout=30)
        return max(times)

    probe = max(run(1, 20), 1e-4)
    reps = max(20, int(20 * seconds / probe))
    alone = min(run(1, reps) for _ in range(2))
    together = min(run(2, reps) for _ in range(2))
    return max(0.0, together / alone - 1.0)


# ---------------------------------------------------------------- synthetic runs (tests, and checking the fit)
def history_of(result: SimResult, setup: Setup) -> list[dict[str, float]]:
    """The per-step metrics `run_rl` records, as a simulated run would have them (time_update is the update
    alone when nothing overlaps it, as rl.py measures it; grading is its own phase)."""
    ln = setup.learner
    out = []
    for s in result.steps:
        busy = max(1e-12, ln.grade_s + ln.other_s + ln.update_s)
        share = s.time_update / busy
        out.append({"step_time": s.step_time, "time_rollout": s.time_rollout, "time_grading": ln.grade_s * share,
                    "time_update": ln.update_s * share, "time_push": s.time_push,
                    "learner_wait_s": s.learner_wait_s, "rollout_wait_s": s.rollout_wait_s,
                    "policy_lag_max": s.policy_lag_max, "policy_lag_mean": s.policy_lag_mean,
                    "response_tokens": s.tokens / result.rollouts_per_step})
    return out

