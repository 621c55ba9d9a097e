"""`rstar2 train ablation`: GRPO-RoC against plain GRPO at the same rollout budget, over several seeds.

Arms, from one RL recipe (its stages, data, budgets, learning rate):
- `roc`: Resample-on-Correct, 2G rollouts sampled per prompt, G kept (the recipe's group_size is G);
- `grpo`: plain GRPO, G sampled and all used (half the sampling of `roc`: the same number of rollouts enter
  the update);
- `grpo-2g` (with `--with-2g`): plain GRPO on all 2G (the same sampling as `roc`).
Each (arm, seed) is one `run_rl` with that seed: the same seed gives every arm the same prompts in the same
order (a step's prompts are a function of the seed and the step). Runs are stored as any RL run; an (arm,
seed) whose run finished before is read back from its `history.json`, so the command resumes.

The report: per step, each arm's mean over seeds with a band (min to max over seeds) of the positive rollouts'
tool error ratio, accuracy, response length and format violations (a PNG); and a table of the final values
(the mean of the last `--final-steps` steps of each run), RoC's positive tool-error ratio as a multiple of
GRPO's, and a paired test over seeds of RoC minus GRPO (a t test and the exact sign-flip permutation p).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from rstar2_agent.stats import student_t_cdf

from .rl import RLConfig, run_rl

CURVES = (("tool_error_ratio_positive", "tool error ratio among positive rollouts"),
          ("accuracy", "rollout accuracy"), ("response_tokens", "generated tokens per rollout"),
          ("format_violations", "format violations (no <answer> with \\boxed{})"))


def arms(cfg: RLConfig, with_2g: bool) -> dict[str, RLConfig]:
    g = cfg.group_size
    out = {"roc": dataclasses.replace(cfg, roc=True), "grpo": dataclasses.replace(cfg, roc=False)}
    if with_2g:
        out["grpo-2g"] = dataclasses.replace(cfg, roc=False, group_size=2 * g)
    return out


async def run_ablation(cfg: RLConfig, seeds: list[int], out: str, with_2g: bool = False,
                       on_run: Callable[[str, int, int, int, dict[str, float]], None] | None = None
                       ) -> dict[str, dict[int, list[dict[str, float]]]]:
    """Every (arm, seed) run's per-step metrics: {arm: {seed: [metrics of step 1, ...]}}."""
    histories: dict[str, dict[int, list[dict[str, float]]]] = {}
    for seed, (arm, arm_cfg) in product(seeds, arms(cfg, with_2g).items()):  # arms side by side, seed by seed
        folder = Path(out) / f"{arm}-seed{seed}"
        done = folder / "history.json"
        if done.exists():
            histories.setdefault(arm, {})[seed] = json.loads(done.read_text())
            continue
        run_cfg = dataclasses.replace(arm_cfg, seed=seed, out=str(folder), run=f"{Path(out).name}-{arm}-seed{seed}")

        def step_done(step: int, total: int, metrics: dict[str, float], arm: str = arm, seed: int = seed) -> None:
            if on_run:
                on_run(arm, seed, step, total, metrics)

        _, history = await run_rl(run_cfg, resume=folder.exists(), on_step=step_done)
        done.write_text(json.dumps(history))
        histories.setdefault(arm, {})[seed] = history
    return histories


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


def plot(histories: dict[str, dict[int, list[dict[str, float]]]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (metric, label) in zip(axes.flat, CURVES, strict=True):
        for arm, runs in histories.items():
            steps = min(len(h) for h in runs.values())
            per_step = [[h[i].get(metric, math.nan) for h in runs.values()] for i in range(steps)]
            xs = list(range(1, steps + 1))
            ax.plot(xs, [statistics.fmean(v) for v in per_step], marker="o", markersize=3, label=arm)
            ax.fill_between(xs, [min(v) for v in per_step], [max(v) for v in per_step], alpha=0.2)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summary(rows: list[Row]) -> dict[str, Any]:
    return {r.metric: dataclasses.asdict(r) for r in rows}
