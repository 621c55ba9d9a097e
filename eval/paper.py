"""`rstar2 eval paper`: the rStar2-Agent-14B numbers of the paper (arXiv 2508.20722), run again with each benchmark's
own defaults (eval/benchmarks/*.py) and set beside the paper's, each with a 95% interval over problems.

The interval is over problems, the unit that was sampled: the k samples of one problem are not independent draws
of the benchmark, so 16 samples x 30 problems are 30 observations, not 480. For the mean of the per-problem
accuracies (pass@1 averaged over the samples): Wilson's score interval when every problem's mean is 0 or 1
(always so with one sample a problem), else Student's t over the per-problem means. BFCL v3's score is its
weighted overall (categories weighted as BFCL does), so its interval is a percentile bootstrap that resamples
items within each category. IFEval's number is prompt-level strict accuracy, one greedy sample a prompt, so its
interval is Wilson's over prompts. Arena-Hard's is the win rate against gpt-4-0314 over the judge's battles, with
the benchmark's percentile bootstrap over battles (100 rounds; 95% here, where the benchmark prints 90%).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from rstar2_agent.stats import t_quantile, wilson
from rstar2_agent.store import Sample, Store

from .benchmarks import DEFAULT_GPQA_EXTRACTION, JudgeSpec, get_benchmarks
from .report import BenchResult, bfcl_category, load
from .runner import EvalConfig

# rStar2-Agent-14B in the paper: AIME24, AIME25, HMMT25 from its main math table (avg@16 pass@1), MATH-500 from its
# Table 3, GPQA-Diamond, BFCL v3, IFEval (strict prompt-level) and Arena-Hard from its generalization table
# (Table 5; after the non-reasoning SFT alone: BFCL v3 63.1, IFEval 83.7, Arena-Hard 86.8). In the order the table
# prints them.
PAPER_SCORES = {"aime24": 80.6, "aime25": 69.8, "hmmt25": 52.7, "math500": 97.8, "gpqa_diamond": 60.9,
                "bfcl_v3": 60.8, "ifeval": 83.4, "arena_hard": 86.6}


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float
    method: str  # wilson, t, bootstrap

    def __contains__(self, x: float) -> bool:
        return self.lo <= x <= self.hi


@dataclass
class PaperRow:
    benchmark: str
    paper: float  # percent
    score: float | None = None  # percent; None when skipped or nothing is stored
    interval: Interval | None = None  # percent
    problems: int = 0
    n: int = 0  # samples per problem (the fewest)
    run: str | None = None
    skipped: str | None = None  # why it did not run
    note: str = ""
    comparable: bool = True  # False: not the paper's measurement (Arena-Hard judged by the model under test)

    @property
    def inside(self) -> bool | None:
        return None if self.interval is None or not self.comparable else self.paper in self.interval


def problem_interval(per_problem: Sequence[float]) -> Interval | None:
    """The 95% interval of the mean over problems of their accuracies; None for one problem with a fractional
    accuracy (no spread over problems to measure)."""
    values = np.asarray(per_problem, dtype=float)
    if values.size == 0:
        return None
    if np.all((values == 0) | (values == 1)):
        return Interval(*wilson(int(values.sum()), int(values.size)), "wilson")
    if values.size < 2:
        return None
    half = t_quantile(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    mean = float(values.mean())
    return Interval(max(0.0, mean - half), min(1.0, mean + half), "t")


def bfcl_interval(samples: Sequence[Sample], reps: int = 2000, seed: int = 0) -> Interval | None:
    """A percentile bootstrap of BFCL v3's overall: items resampled within each category, weighted as BFCL does.
    None when a category has fewer than 2 items (its spread cannot be measured)."""
    from rstar2_agent.eval.benchmarks.bfcl_v3.data import category_weights

    per_item: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        per_item[bfcl_category(s.problem_id)][s.problem_id].append(s.correct)
    if not per_item or min(len(items) for items in per_item.values()) < 2:
        return None
    weights = category_weights({c: len(items) for c, items in per_item.items()})
    rng = np.random.default_rng(seed)
    total = np.zeros(reps)
    for category, items in per_item.items():
        acc = np.array([np.mean(v) for v in items.values()])
        total += weights[category] * acc[rng.integers(0, acc.size, (reps, acc.size))].mean(axis=1)
    return Interval(float(np.percentile(total, 2.5)), float(np.percentile(total, 97.5)), "bootstrap")


def paper_row(benchmark: str, result: BenchResult | None, run: str | None = None) -> PaperRow:
    """Our score, its interval and the paper's number for one benchmark's stored run (in percent)."""
    row = PaperRow(benchmark, PAPER_SCORES[benchmark], run=run)
    if result is None or not result.summary.get("samples"):
        row.note = "nothing stored yet"
        return row
    s = result.summary
    row.problems, row.n = s["problems"], s["n_min"]
    if benchmark == "bfcl_v3":
        score, interval = s["bfcl"]["overall"], bfcl_interval(result.samples)
        notes = [] if s["bfcl"]["complete"] else ["not all 17 categories: those not run count 0"]
        row.note = "; ".join(notes + ([] if interval else ["a category with 1 item: no interval"]))
    elif benchmark == "ifeval":
        f = s["ifeval"]
        score = f["prompt_strict"]
        interval = Interval(*wilson(round(f["prompt_strict"] * f["prompts"]), f["prompts"]), "wilson")
        row.note = f"strict prompt-level; loose {100 * f['prompt_loose']:.1f}"
    elif benchmark == "arena_hard":
        a = s["arena"]
        if "score" not in a:
            row.note = "no prompt with both verdicts"
            return row
        score, interval = a["score"], Interval(a["ci"][0], a["ci"][1], "bootstrap")
        row.note = f"judge {a['judge']}" + (f"; {a['dropped']} prompts without a verdict" if a["dropped"] else "")
        if a["judge"] == JudgeSpec().label():  # no --judge-url: the model judged itself, a smoke test of the pipeline
            row.comparable = False
            row.note = "judged by the model under test (no --judge-url): a smoke test, not the paper's measure"
    else:
        score, interval = s["avg"], problem_interval([p["accuracy"] for p in s["per_problem"]])
        if interval is None:
            row.note = "one problem: no interval over problems"
    row.score = 100 * score
    if interval is not None:
        row.interval = Interval(100 * interval.lo, 100 * interval.hi, interval.method)
    return row


def paper_table(rows: Sequence[PaperRow], title: str) -> Table:
    table = Table(title=title)
    for col in ("benchmark", "problems x n", "ours %", "95% CI", "paper %", "paper in CI", "note"):
        table.add_column(col, justify="left" if col in ("benchmark", "note") else "right")
    for r in rows:
        if r.skipped is not None:
            gist = re.split(r"[:;.] ", r.skipped)[0]  # the whole reason follows the table
            table.add_row(r.benchmark, "", "", "", f"{r.paper:.1f}", "", f"skipped: {gist}")
            continue
        ci = "" if r.interval is None else f"{r.interval.lo:.1f}-{r.interval.hi:.1f} ({r.interval.method})"
        inside = {True: "yes", False: "no", None: ""}[r.inside]
        table.add_row(r.benchmark, f"{r.problems} x {r.n}" if r.problems else "",
                      "" if r.score is None else f"{r.score:.1f}", ci, f"{r.paper:.1f}" if r.comparable else "",
                      inside, r.note)
    table.caption = ("ours: pass@1 averaged over each problem's samples (BFCL v3: its weighted overall; IFEval: strict "
                     "prompt-level; Arena-Hard: win rate vs gpt-4-0314). 95% CI over problems: wilson when every "
                     "problem scored 0 or 1, t over per-problem accuracies otherwise, bootstrap within BFCL "
                     "categories; Arena-Hard: the benchmark's bootstrap over battles")
    return table


async def run_paper(source, cfg: EvalConfig, store: Store, run_name: str | None = None, data_dir: str | None = None,
                    categories: str = "all", out: str | None = None, console: Console | None = None,
                    engine=None, judge=None, gpqa_extraction: str = DEFAULT_GPQA_EXTRACTION) -> list[PaperRow]:
    """Run (or resume) the paper's benchmarks, each with its own defaults where `cfg` leaves a setting None; a
    benchmark without data is skipped with the reason. Returns the rows, in PAPER_SCORES order."""
    from .harness import evaluate

    skipped: dict[str, str] = {}
    runs = await evaluate(list(PAPER_SCORES), source, cfg, store, run_name, data_dir, out, console,
                          benchmarks=get_benchmarks(list(PAPER_SCORES), categories, judge, gpqa_extraction),
                          engine=engine,
                          skipped=skipped)
    rows = []
    for bench in PAPER_SCORES:
        if bench in skipped:
            rows.append(PaperRow(bench, PAPER_SCORES[bench], skipped=skipped[bench]))
            continue
        result = next((r for r in load(store, runs[bench]) if r.run.benchmark == bench), None)
        rows.append(paper_row(bench, result, runs[bench]))
    return rows
