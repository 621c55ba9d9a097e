"""`rstar2 train ablation`: GRPO-RoC against plain GRPO at the same rollout budget, over several seeds.

Arms, from one RL recipe (its stage, data, budgets, learning rate):
- `roc`: Resample-on-Correct, 2G rollouts sampled per prompt, G kept (the recipe's group_size is G);
- `grpo`: plain GRPO, G sampled and all used (half the sampling of `roc`: the same number of rollouts enter
  the update);
- `grpo-2g` (with `--with-2g`): plain GRPO on all 2G (the same sampling as `roc`).
Each (arm, seed) is one `run_rl` with that seed: the same seed gives every arm the same prompts in the same
order (a step's prompts are a function of the seed and the step). Every run checkpoints each step (the older
checkpoints are pruned); a rerun reads a finished run back from its `history.json` and resumes an unfinished one
from its last checkpoint (run_rl's exactly-once resume), so the command continues where it stopped.

Two readings. The training rollouts' metrics per step (a PNG of each arm's mean over seeds with a min-max band,
and a table of final values with a paired test over seeds): noisy, since a step's few prompts move them more
than the arm does. And the held-out probe (probe.py): the SFT start, each arm's midpoint and final checkpoints,
on one fixed set of held-out tool tasks, the same for every policy; RoC against GRPO as a ratio with a 95%
interval from a paired bootstrap over prompts and seeds (stats.paired_ratio_bootstrap), each arm against the
start, and, when the tool-error interval straddles 1, a power estimate (`power`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from rstar2_agent.problem import Problem
from rstar2_agent.stats import Z95, RatioInterval, paired_ratio_bootstrap, student_t_cdf
from rstar2_agent.store import Store

from ..config import RLConfig
from ..report import metrics_by_step
from ..rl import run_rl
from ..run_frame import checkpoints
from .probe import ProbeJob, ProbeSettings, cells, probe_problems, probe_settings, run_probes, stored, value

CURVES = (("tool_error_ratio_positive", "tool error ratio among positive rollouts"),
          ("accuracy", "rollout accuracy"), ("response_tokens", "generated tokens per rollout"),
          ("format_violations", "format violations (no <answer> with \\boxed{})"))


def arms(cfg: RLConfig, with_2g: bool) -> dict[str, RLConfig]:
    g = cfg.group_size
    out = {"roc": dataclasses.replace(cfg, roc=True), "grpo": dataclasses.replace(cfg, roc=False)}
    if with_2g:
        out["grpo-2g"] = dataclasses.replace(cfg, roc=False, group_size=2 * g)
    return out


@dataclass
class Ablation:
    """What an ablation has: each (arm, seed) run's per-step metrics ({arm: {seed: [step 1, ...]}}), the held-out
    probe's records by name (start, ARM-seedS-stepK), its problems and the steps it probes."""
    histories: dict[str, dict[int, list[dict[str, float]]]]
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    dropped: int = 0  # probe problems drawn and dropped as training questions
    points: tuple[int, ...] = ()  # the probed steps: 0 (the SFT start), the midpoint, the end
    steps: int = 0
    rollouts_per_step: dict[str, int] = field(default_factory=dict)  # per arm: sampled in a training step


def probe_points(total: int) -> tuple[int, ...]:
    return tuple(sorted({0, total // 2, total}))


def probe_name(arm: str, seed: int, step: int) -> str:
    return "start" if step == 0 else f"{arm}-seed{seed}-step{step}"


def prune(folder: Path, keep: set[int]) -> None:
    """Delete the checkpoints of `folder` but the newest and those of the `keep` steps (a checkpoint each step
    is ~1.6 GB at 135M with the optimizer state)."""
    found = checkpoints(folder)
    for path in found[:-1]:
        if int(path.name.split("-")[1]) not in keep:
            shutil.rmtree(path, ignore_errors=True)


def stored_history(cfg: RLConfig) -> list[dict[str, float]]:
    """A run's per-step metrics as the store holds them (after a resume, the steps of every attempt)."""
    store = Store(cfg.db)
    runs = [r for r in store.runs(cfg.run) if r.kind == "rl"]
    steps = metrics_by_step(store, runs[-1].id) if runs else {}
    return [steps[k] for k in sorted(steps)]


async def train_arm(arm_cfg: RLConfig, folder: Path, total: int, keep: set[int],
                    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
                    train: bool = True) -> list[dict[str, float]]:
    """One (arm, seed) run to `total` steps: read back when finished, resumed from its last checkpoint when not
    (run_rl's exactly-once resume), a checkpoint each step, the older ones pruned but `keep`'s."""
    done = folder / "history.json"
    if done.exists():
        history = json.loads(done.read_text())
        if len(history) == total:
            return history
        if len(history) > total:
            raise ValueError(f"{folder} trained {len(history)} steps, more than the {total} asked: give the same "
                             f"--steps, or another --out")
    if not train:
        return stored_history(arm_cfg)

    def step_done(step: int, steps: int, metrics: dict[str, float]) -> None:
        prune(folder, keep | {step - 1})  # the step's own checkpoint comes after this call
        if on_step:
            on_step(step, steps, metrics)

    await run_rl(arm_cfg, resume=bool(checkpoints(folder)), on_step=step_done)
    history = stored_history(arm_cfg)
    prune(folder, keep | {total})
    done.write_text(json.dumps(history))
    return history


async def run_ablation(cfg: RLConfig, seeds: list[int], out: str, with_2g: bool = False,
                       on_run: Callable[[str, int, int, int, dict[str, float]], None] | None = None,
                       probe: ProbeSettings | None = None,
                       on_probe: Callable[[str, dict[str, Any], bool], None] | None = None,
                       report_only: bool = False) -> Ablation:
    """The SFT start probed first (or read back); then seed by seed, every arm trained (or resumed, or read back)
    and the probe of each arm's midpoint and final checkpoints (or read back). `report_only`: nothing is trained
    or probed, what the runs and probes stored so far is read."""
    cfg = dataclasses.replace(cfg, save_every=1)
    total = sum(s.steps for s in cfg.stages)
    points = probe_points(total)
    problems, dropped = probe_problems(cfg, probe) if probe else ([], 0)
    result = Ablation({}, problems=problems, dropped=dropped, points=points if probe else (), steps=total,
                      rollouts_per_step={arm: c.rollouts_per_prompt * c.prompts_per_step
                                         for arm, c in arms(cfg, with_2g).items()})
    if probe and not report_only and seeds:  # the start first: a partial run has it, and every arm shares it
        start = ProbeJob("start", cfg.model, seeds[0])
        result.probes.update(await run_probes(cfg, [start], problems, probe, Path(out) / "probe", on_probe))
    for seed in seeds:
        jobs: list[ProbeJob] = []
        for arm, arm_cfg in arms(cfg, with_2g).items():  # arms side by side, seed by seed
            folder = Path(out) / f"{arm}-seed{seed}"
            run_cfg = dataclasses.replace(arm_cfg, seed=seed, out=str(folder), run=f"{Path(out).name}-{arm}-seed{seed}")

            def step_done(step: int, steps: int, metrics: dict[str, float], arm: str = arm, seed: int = seed) -> None:
                if on_run:
                    on_run(arm, seed, step, steps, metrics)

            history = await train_arm(run_cfg, folder, total, set(points), step_done, train=not report_only)
            result.histories.setdefault(arm, {})[seed] = history
            if len(history) == total:
                jobs += [ProbeJob(probe_name(arm, seed, k), str(folder / f"checkpoint-{k}"), seed)
                         for k in points if k and arm in ("roc", "grpo")]
        if probe:
            jobs.insert(0, ProbeJob("start", cfg.model, seeds[0]))  # the SFT start: one policy for every arm and seed
            folder = Path(out) / "probe"
            if report_only:
                wanted = probe_settings(cfg, probe, problems)
                found = {j.name: stored(folder / f"{j.name}.json", wanted) for j in jobs}
                result.probes.update({k: v for k, v in found.items() if v is not None})
            else:
                result.probes.update(await run_probes(cfg, jobs, problems, probe, folder, on_probe))
                for job in jobs[1:]:  # a probed midpoint's checkpoint is not needed again (jobs[0]: the start)
                    if job.name in result.probes and Path(job.model).name != f"checkpoint-{total}":
                        shutil.rmtree(job.model, ignore_errors=True)
    return result


# ------------------------------------------------------------------ the report
@dataclass
class Row:
    metric: str
    means: dict[str, float]  # per arm: the mean over seeds of each run's final value
    ratio: float | None  # roc / grpo
    diff: float  # mean over seeds of (roc - grpo)
    t: float | None
    p_t: float | None  # two-sided, Student t with seeds - 1 degrees of freedom
    p_perm: float  # two-sided, exact sign flips of the per-seed differences


def final(history: list[dict[str, float]], metric: str, last: int) -> float:
    values = [m[metric] for m in history[-last:] if metric in m]
    return sum(values) / len(values) if values else float("nan")


def table(histories: dict[str, dict[int, list[dict[str, float]]]], last: int = 2) -> list[Row]:
    seeds = sorted(set(histories["roc"]) & set(histories["grpo"]))
    rows = []
    for metric, _ in CURVES:
        means = {arm: statistics.fmean(final(h[s], metric, last) for s in seeds if s in h)
                 for arm, h in histories.items()}
        diffs = [final(histories["roc"][s], metric, last) - final(histories["grpo"][s], metric, last) for s in seeds]
        t, p_t = paired_t(diffs)
        ratio = means["roc"] / means["grpo"] if means["grpo"] else None
        rows.append(Row(metric, means, ratio, statistics.fmean(diffs), t, p_t, sign_flip_p(diffs)))
    return rows


def paired_t(diffs: list[float]) -> tuple[float | None, float | None]:
    n = len(diffs)
    if n < 2:
        return None, None
    sd = statistics.stdev(diffs)
    if sd == 0:
        return (None, None) if statistics.fmean(diffs) == 0 else (math.copysign(math.inf, diffs[0]), 0.0)
    t = statistics.fmean(diffs) / (sd / math.sqrt(n))
    return t, 2 * (1 - student_t_cdf(abs(t), n - 1))


def sign_flip_p(diffs: list[float]) -> float:
    """The share of the 2^n sign assignments whose mean is at least as far from 0 as the observed one."""
    observed = abs(sum(diffs))
    flips = list(product((1, -1), repeat=len(diffs)))
    return sum(abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed - 1e-12
               for signs in flips) / len(flips)


def plot(histories: dict[str, dict[int, list[dict[str, float]]]], path: str, title: str,
         ab: Ablation | None = None, seeds: list[int] | None = None) -> None:
    """Per step, each arm's mean over seeds with a min-max band of the training rollouts' metrics; with `ab`, the
    held-out probe's value of each arm at the start, the midpoint and the end (diamonds, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    probe_of = {curve: metric for metric, curve in PROBE_CURVE.items()}
    for ax, (metric, label) in zip(axes.flat, CURVES, strict=True):
        for i, (arm, runs) in enumerate(histories.items()):
            color = f"C{i}"
            steps = min((len(h) for h in runs.values()), default=0)
            if steps:
                per_step = [[h[i].get(metric, math.nan) for h in runs.values()] for i in range(steps)]
                xs = list(range(1, steps + 1))
                ax.plot(xs, [statistics.fmean(v) for v in per_step], marker="o", markersize=3, label=arm,
                        color=color)
                ax.fill_between(xs, [min(v) for v in per_step], [max(v) for v in per_step], alpha=0.2, color=color)
            if ab is not None and seeds is not None:
                xs, ys = [], []
                for k in ab.points:
                    names = ["start"] if k == 0 else [probe_name(arm, s, k) for s in seeds]
                    found = [ab.probes[n] for n in names if n in ab.probes]
                    if found:
                        xs.append(k)
                        ys.append(statistics.fmean(value(r, probe_of[metric]) for r in found))
                if xs:
                    ax.plot(xs, ys, marker="D", markersize=6, linestyle="--", color=color,
                            label=f"{arm}: held-out probe")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step (probe at 0 = the SFT start)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summary(rows: list[Row]) -> dict[str, Any]:
    return {r.metric: dataclasses.asdict(r) for r in rows}


# ------------------------------------------------------------------ the probe's report
PROBE_METRICS = ("tool_error_ratio_among_positives", "accuracy", "tokens", "format_violations")
PROBE_CURVE = dict(zip(PROBE_METRICS, (m for m, _ in CURVES), strict=True))  # probe metric -> training curve
# one GPU, for the power estimate's cost: assumptions, not measurements (no GPU here). vLLM decoding a 135M model
# at 32-64 sequences a batch on one H100-class GPU, and the learner's forward and backward (~6 x 135M FLOPs a
# token) at ~30% of its bf16 peak; the sandbox's tool calls overlap the decoding.
GPU_ROLLOUT_TOKENS_PER_S = 20_000.0
GPU_TRAIN_TOKENS_PER_S = 50_000.0


def _grid(ab: Ablation, arm: str, seeds: list[int], step: int, metric: str) -> tuple[list[list[float]], ...]:
    rows = [cells(ab.probes[probe_name(arm, s, step)], metric) for s in seeds]
    return [n for n, _ in rows], [d for _, d in rows]


def _interval(a: tuple[list[list[float]], ...], b: tuple[list[list[float]], ...], seeds: int,
              resample: str = "both") -> RatioInterval | None:
    try:
        return paired_ratio_bootstrap(*a, *b, resample=resample if seeds > 1 else "prompts")
    except ValueError:  # a ratio with nothing under it (no positive rollout with a call in one arm, ...)
        return None


def probed_seeds(ab: Ablation, seeds: list[int], step: int) -> list[int]:
    """The seeds whose roc and grpo probes at `step` are both stored (the pairing: only those enter)."""
    return [s for s in seeds if all(probe_name(a, s, step) in ab.probes for a in ("roc", "grpo"))]


def compare(ab: Ablation, seeds: list[int], step: int, metric: str) -> dict[str, Any] | None:
    """RoC against GRPO on the probe at `step`: each arm's pooled value, their ratio and its paired 95% interval."""
    ok = probed_seeds(ab, seeds, step)
    if not ok:
        return None
    roc, grpo = _grid(ab, "roc", ok, step, metric), _grid(ab, "grpo", ok, step, metric)
    pooled = {arm: sum(map(sum, g[0])) / sum(map(sum, g[1])) if sum(map(sum, g[1])) else None
              for arm, g in (("roc", roc), ("grpo", grpo))}
    ci = _interval(roc, grpo, len(ok))
    return {**pooled, "ratio": ci.ratio if ci else None, "ci95": [ci.lo, ci.hi] if ci else None, "seeds": ok}


def moved(ab: Ablation, seeds: list[int], step: int, metric: str) -> dict[str, Any]:
    """Each arm at `step` against the SFT start on the same prompts: the ratio and its 95% interval."""
    out: dict[str, Any] = {}
    ok = probed_seeds(ab, seeds, step)
    if "start" not in ab.probes or not ok:
        return out
    start = cells(ab.probes["start"], metric)
    base = ([start[0]] * len(ok), [start[1]] * len(ok))  # one start policy: the same cells for every seed
    for arm in ("roc", "grpo"):
        ci = _interval(_grid(ab, arm, ok, step, metric), base, len(ok))
        out[arm] = {"over_start": ci.ratio, "ci95": [ci.lo, ci.hi]} if ci else None
    return out


def step_seconds(ab: Ablation, arm: str) -> float:
    """Measured seconds of one training step of `arm` (rollouts, grading, update, weight push), mean over runs."""
    keys = ("time_rollout", "time_grading", "time_update", "time_push")
    steps = [sum(m.get(k, 0.0) for k in keys) for h in ab.histories.get(arm, {}).values() for m in h]
    return statistics.fmean(steps) if steps else math.nan


def power(ab: Ablation, seeds: list[int], samples: int) -> dict[str, Any] | None:
    """How many prompts, seeds or steps the measured spread of the tool-error ratio's log says the interval needs
    to exclude 1 at the measured effect, and what that costs. Var(log ratio) is modelled as v_p P0/P + v_s S0/S,
    v_p and v_s from bootstraps resampling prompts only and seeds only; steps assume the log effect grows linearly
    from 0 at the shared start (check it against the midpoint) with the spread unchanged."""
    metric, end = PROBE_METRICS[0], ab.steps
    ok = probed_seeds(ab, seeds, end)
    if not ok:
        return None
    roc, grpo = _grid(ab, "roc", ok, end, metric), _grid(ab, "grpo", ok, end, metric)
    both = _interval(roc, grpo, len(ok))
    if both is None or both.ratio <= 0:
        return None
    effect = abs(math.log(both.ratio))
    p0, s0 = len(ab.problems), len(ok)
    v_p = _interval(roc, grpo, len(ok), "prompts").log_sd ** 2
    v_s = _interval(roc, grpo, len(ok), "seeds").log_sd ** 2 if s0 > 1 else None
    target = (effect / Z95) ** 2 if effect else 0.0  # the variance of log ratio at which the interval excludes 1
    out: dict[str, Any] = {"log_ratio": math.log(both.ratio), "log_sd": both.log_sd, "var_prompts": v_p,
                           "var_seeds": v_s, "prompts": p0, "seeds": s0, "steps": end,
                           "model": "var(log ratio) = var_prompts * P0/P + var_seeds * S0/S"}
    if not effect:
        return {**out, "note": "no measured effect (ratio 1): no size makes the interval exclude 1"}
    vs = v_s or 0.0
    need = {"prompts_at_these_seeds": math.ceil(p0 * v_p / (target - vs)) if target > vs else None,
            "seeds_at_these_prompts": math.ceil(s0 * vs / (target - v_p)) if v_s and target > v_p else None,
            "scale_prompts_and_seeds_by": both.log_sd ** 2 / target,
            "steps_at_these_prompts_and_seeds": math.ceil(end * Z95 * both.log_sd / effect)}
    if v_s is None:
        out["note"] = "one seed: the seed component is unknown (taken as 0); run two seeds or more to measure it"
    mid = compare(ab, seeds, end // 2, metric) if end // 2 else None
    if mid and mid["ratio"]:
        out["log_ratio_at_midpoint"] = math.log(mid["ratio"])
    probe_s = [r["seconds"] / r["rollouts"] for r in ab.probes.values()]
    per_rollout = statistics.fmean(probe_s) if probe_s else math.nan
    step_s = step_seconds(ab, "roc") + step_seconds(ab, "grpo")
    tokens = statistics.fmean(value(r, "tokens") for r in ab.probes.values())
    cfg_rollouts = {arm: statistics.fmean(m.get("update_tokens", 0.0) for h in ab.histories[arm].values() for m in h)
                    for arm in ("roc", "grpo")}

    train_tokens = {arm: statistics.fmean(m["response_tokens"] * ab.rollouts_per_step[arm] for h in
                                          ab.histories[arm].values() for m in h) for arm in ("roc", "grpo")}

    def cost(prompts: int, n_seeds: int, steps: int) -> dict[str, float]:
        probes = (1 + 2 * 2 * n_seeds) * prompts * samples  # start, then mid and end for both arms, every seed
        cpu = n_seeds * steps * step_s + probes * per_rollout
        gen = probes * tokens + n_seeds * steps * sum(train_tokens.values())
        trained = n_seeds * steps * sum(cfg_rollouts.values())
        return {"cpu_hours": round(cpu / 3600, 2),
                "gpu_hours": round((gen / GPU_ROLLOUT_TOKENS_PER_S + trained / GPU_TRAIN_TOKENS_PER_S) / 3600, 3)}

    options = {}
    if need["prompts_at_these_seeds"]:
        options["prompts"] = {"prompts": need["prompts_at_these_seeds"], "seeds": s0, "steps": end,
                              **cost(need["prompts_at_these_seeds"], s0, end)}
    if need["seeds_at_these_prompts"]:
        options["seeds"] = {"prompts": p0, "seeds": need["seeds_at_these_prompts"], "steps": end,
                            **cost(p0, need["seeds_at_these_prompts"], end)}
    k = need["scale_prompts_and_seeds_by"]
    options["prompts_and_seeds"] = {"prompts": math.ceil(p0 * k), "seeds": max(s0, math.ceil(s0 * k)), "steps": end,
                                    **cost(math.ceil(p0 * k), max(s0, math.ceil(s0 * k)), end)}
    options["steps"] = {"prompts": p0, "seeds": s0, "steps": need["steps_at_these_prompts_and_seeds"],
                        **cost(p0, s0, need["steps_at_these_prompts_and_seeds"])}
    return {**out, "needed": need, "options": options,
            "measured": {"cpu_seconds_per_probe_rollout": per_rollout, "cpu_seconds_per_step_roc_plus_grpo": step_s,
                         "probe_tokens_per_rollout": tokens},
            "gpu_assumption": {"rollout_tokens_per_s": GPU_ROLLOUT_TOKENS_PER_S,
                               "train_tokens_per_s": GPU_TRAIN_TOKENS_PER_S,
                               "note": "one H100/H200-class GPU, vLLM for rollouts; assumed, not measured here"}}


def probe_summary(ab: Ablation, seeds: list[int]) -> dict[str, Any]:
    """The probe's figures: per metric RoC and GRPO at the end, their ratio and paired 95% interval, the SFT
    start, the midpoint, and each arm's movement from the start."""
    out: dict[str, Any] = {}
    mid = ab.steps // 2
    for metric in PROBE_METRICS:
        row = compare(ab, seeds, ab.steps, metric) or {"roc": None, "grpo": None, "ratio": None, "ci95": None}
        row["start"] = value(ab.probes["start"], metric) if "start" in ab.probes else None
        if mid and mid != ab.steps:
            row["midpoint"] = compare(ab, seeds, mid, metric)
        row["moved_from_start"] = moved(ab, seeds, ab.steps, metric)
        out[metric] = row
    return out


def ablation_settings(cfg: RLConfig, recipe: str, seeds: list[int], ab: Ablation, probe: ProbeSettings | None
                      ) -> dict[str, Any]:
    """What the figures were measured with, and how much of the asked ablation had finished."""
    stage = cfg.stages[-1]
    runs = {f"{arm}-seed{s}": len(h) for arm, by_seed in ab.histories.items() for s, h in by_seed.items()}
    return {"recipe": recipe, "model": cfg.model, "seeds": seeds, "steps": ab.steps,
            "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
            "rollouts_per_step": ab.rollouts_per_step,
            "temperature": cfg.temperature, "max_response_tokens": stage.max_response_tokens,
            "max_turns": stage.max_turns, "lr": cfg.optim.lr, "rollout_engine": cfg.rollout_engine,
            "train_data": {"data": stage.data, "data_seed": stage.data_seed, "data_size": stage.data_size},
            "probe": None if probe is None else {
                **dataclasses.asdict(probe), "points": list(ab.points), "dropped_as_training_questions": ab.dropped,
                "first_ids": [p.id for p in ab.problems[:3]],
                "sampling": "rollout seed = f(training seed, prompt, sample); the SFT start probed once, with "
                            f"seed {seeds[0]}'s draws, for every arm and seed"},
            "finished": {"steps_done": runs, "probes_stored": sorted(ab.probes)},
            "machine": _machine()}


def _machine() -> str:
    """Where the figures were measured: the CPU cores, and the GPUs torch sees."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{os.cpu_count()} CPU cores" + (f", {len(gpus)} GPU(s): {', '.join(sorted(set(gpus)))}" if gpus else
                                           ", no GPU")


@dataclass
class Outcome:
    """What `write_outputs` made of an ablation: the summary document, the training table's rows (None until both
    arms have runs on a common seed), and where the summary and the curves went."""
    doc: dict[str, Any]
    rows: list[Row] | None
    arms: list[str]  # the training table's columns
    summary_file: Path
    png: Path


def write_outputs(cfg: RLConfig, recipe: str, seeds: list[int], ab: Ablation, probe: ProbeSettings | None,
                  out: str, final_steps: int, summary_path: str | None = None, png: str | None = None) -> Outcome:
    """The ablation's summary (its settings; the training table and its tests once both arms have runs on a common
    seed, also as OUT/summary.json; the probe's summary; a power estimate when the probe's tool-error interval
    straddles 1) to `summary_path` (default OUT/ablation-summary.json), and the curves to `png` (OUT/curves.png)."""
    histories = {arm: {s: h for s, h in runs.items() if h} for arm, runs in ab.histories.items()}
    Path(out).mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"settings": ablation_settings(cfg, recipe, seeds, ab, probe)}
    rows = None
    if all(histories.get(a) for a in ("roc", "grpo")) and set(histories["roc"]) & set(histories["grpo"]):
        rows = table(histories, final_steps)
        doc["training"] = summary(rows)
        (Path(out) / "summary.json").write_text(json.dumps(doc["training"], indent=1))
    if probe:
        doc["probe"] = probe_summary(ab, seeds)
        ci = doc["probe"]["tool_error_ratio_among_positives"]["ci95"]
        if ci and ci[0] <= 1 <= ci[1]:
            doc["power"] = power(ab, seeds, probe.samples)
    summary_file = Path(summary_path or Path(out) / "ablation-summary.json")
    summary_file.parent.mkdir(parents=True, exist_ok=True)
    summary_file.write_text(json.dumps(doc, indent=1) + "\n")
    curves = Path(png or Path(out) / "curves.png")
    plot(histories, str(curves), f"GRPO-RoC vs GRPO ({recipe}, seeds {','.join(map(str, seeds))})",
         ab if probe else None, seeds)
    return Outcome(doc, rows, list(histories), summary_file, curves)
