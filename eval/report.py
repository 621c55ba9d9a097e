"""Reports read from the store: the terminal table, `--out DIR` files (results.json, samples.jsonl,
report.html) and the comparison of two runs."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from rstar2_agent.stats import t_quantile
from rstar2_agent.store import Run, Sample, Store, StoreError

from .benchmarks import benchmark_type
from .benchmarks.arena_hard import arena_summary
from .benchmarks.base import MathBenchmark
from .benchmarks.ifeval import ifeval_scores
from .scores import Graded, GraderVotes, summarize, vote


@dataclass
class BenchResult:
    run: Run
    samples: list[Sample]  # status ok
    errors: int  # samples stored as errors (a resume retries them)
    summary: dict[str, Any]


def graded(s: Sample) -> Graded:
    """The answer votes as the option chosen where the benchmark records it (GPQA: a letter means another option
    in each sample's order)."""
    details = s.details or {}
    fmt = details.get("format") or {}
    return Graded(s.problem_id, s.sample_index, s.correct, details.get("option", s.answer), s.tokens, s.tool_calls,
                  s.tool_errors, s.stop_reason, bool(fmt.get("first_turn_call")), bool(fmt.get("answer_block")))


def math_answers(benchmark: str) -> bool:
    """Answers the math grader compares (they vote together for maj@n when it takes them for equal)."""
    return issubclass(benchmark_type(benchmark) or object, MathBenchmark)


def load(store: Store, name: str) -> list[BenchResult]:
    runs = store.runs(name)
    if not runs:
        known = sorted({r.name for r in store.runs()})
        raise StoreError(f"no run named {name!r} in {store.url}; runs there: {', '.join(known) or 'none'}")
    out = []
    with GraderVotes() as grader_votes:
        for run in runs:
            rows = store.samples(run.id)
            ok = [s for s in rows if s.status == "ok"]
            summary = summarize((graded(s) for s in ok), votes=grader_votes if math_answers(run.benchmark) else vote)
            if run.benchmark == "bfcl_v3" and ok:
                summary["bfcl"] = bfcl_scores(ok)
            if run.benchmark == "ifeval" and ok:
                summary["ifeval"] = ifeval_scores(s.details or {} for s in ok)
            if run.benchmark == "arena_hard" and ok:
                summary["arena"] = arena_summary(ok)
            out.append(BenchResult(run, ok, len(rows) - len(ok), summary))
    return out


def bfcl_category(problem_id: str) -> str:
    """BFCL ids are the category, an underscore and the item's number ("live_simple_3-1-0")."""
    return problem_id.rsplit("_", 1)[0]


def bfcl_scores(samples: list[Sample]) -> dict[str, Any]:
    """Per-category accuracy (mean over samples) and BFCL v3's summary scores (its own weighting)."""
    from rstar2_agent.eval.benchmarks.bfcl_v3 import data as bfcl

    by_cat: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_cat[bfcl_category(s.problem_id)].append(s)
    scores = {c: (sum(s.correct for s in v) / len(v), len({s.problem_id for s in v})) for c, v in by_cat.items()}
    return {"categories": {c: {"accuracy": a, "items": n} for c, (a, n) in scores.items()}, **bfcl.overall(scores)}


def bfcl_table(result: BenchResult) -> Table | None:
    scores = result.summary.get("bfcl")
    if not scores:
        return None
    table = Table(title=f"BFCL v3 by category (overall {_pct(scores['overall'])}%"
                  + ("" if scores["complete"] else "; categories not run count 0, as BFCL counts them") + ")")
    for col in ("category", "items", "accuracy %"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for c, v in scores["categories"].items():
        table.add_row(c, str(v["items"]), _pct(v["accuracy"]))
    for key in ("non_live", "live", "multi_turn", "relevance", "irrelevance"):
        table.add_row(f"[bold]{key}", "", _pct(scores[key]))
    return table


def ifeval_table(result: BenchResult) -> Table | None:
    scores = result.summary.get("ifeval")
    if not scores:
        return None
    table = Table(title=f"IFEval ({scores['prompts']} prompts, {scores['instructions']} instructions): prompt strict "
                  f"{_pct(scores['prompt_strict'])}%, prompt loose {_pct(scores['prompt_loose'])}%, instruction strict "
                  f"{_pct(scores['instruction_strict'])}%, instruction loose {_pct(scores['instruction_loose'])}%")
    for col in ("instruction", "n", "strict %", "loose %"):
        table.add_column(col, justify="left" if col == "instruction" else "right")
    for kind, v in scores["per_type"].items():
        table.add_row(kind, str(v["n"]), _pct(v["strict"]), _pct(v["loose"]))
    return table


def arena_table(result: BenchResult) -> Table | None:
    a = result.summary.get("arena")
    if not a:
        return None
    table = Table(title=f"Arena-Hard v0.1 vs {a.get('baseline', 'the baseline')} (judge {a.get('judge')})")
    for col in ("score %", f"{100 * a.get('level', 0.95):.0f}% CI (bootstrap)", "prompts", "dropped (no verdict)",
                "battles", "verdicts"):
        table.add_column(col, justify="right")
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(a["verdicts"].items()))
    if "score" not in a:
        table.add_row("", "", "0", str(a["dropped"]), "0", verdicts)
    else:
        table.add_row(_pct(a["score"]), f"{_pct(a['ci'][0])}-{_pct(a['ci'][1])}", str(a["prompts"]),
                      str(a["dropped"]), str(a["battles"]), verdicts)
    return table


def benchmark_tables(result: BenchResult) -> list[Table]:
    """The benchmark's own scores beside the common table (BFCL v3's categories, IFEval's four accuracies,
    Arena-Hard's win rate)."""
    return [t for t in (bfcl_table(result), ifeval_table(result), arena_table(result)) if t is not None]


def console(stderr: bool = False):
    """A rich console; when output is not a terminal (logs, CI), wide enough for the tables."""
    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=150)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def results_table(results: list[BenchResult], title: str) -> Table:
    """avg@n with its standard error and bootstrap 95% interval, pass@n, maj@n, what the agent did."""
    table = Table(title=title)
    for col in ("benchmark", "problems x n", "avg@n %", "95% CI", "pass@n %", "maj@n %", "tokens", "tool calls",
                "tool err %", "errors"):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    stops = []
    for r in results:
        if receipt := (r.run.config or {}).get("checker"):  # the benchmark's Benchmark.checker, as the run stored it
            stops.append(f"{r.run.benchmark}: checker {receipt.get('checker')}; against {receipt.get('official')}: "
                         f"{receipt.get('conformance')}")
        s = r.summary
        if not s.get("samples"):
            table.add_row(r.run.benchmark, "0", *[""] * 7, str(r.errors))
            continue
        n = list(s["pass_at_k"])[-1]
        table.add_row(r.run.benchmark, f"{s['problems']} x {s['n_min']}", f"{_pct(s['avg'])} ± {_pct(s['stderr'])}",
                      f"{_pct(s['ci95'][0])}-{_pct(s['ci95'][1])}", _pct(s["pass_at_k"][n]), _pct(s["maj"]),
                      f"{s['mean_tokens']:.0f}", f"{s['mean_tool_calls']:.2f}", _pct(s["tool_error_rate"]),
                      str(r.errors))
        stops.append(f"{r.run.benchmark}: stops " + ", ".join(f"{k} {v}" for k, v in s["stop_reasons"].items())
                     + f"; first turn a well-formed tool call {_pct(s['first_turn_call_rate'])}%, answer in "
                     f"<answer>\\boxed{{}}</answer> {_pct(s['answer_block_rate'])}%")
    table.caption = "\n".join(stops) if stops else None
    return table


def run_meta(run: Run) -> dict[str, Any]:
    return {"name": run.name, "benchmark": run.benchmark, "model": run.model, "settings": run.config,
            "info": run.info, "version": run.version, "git_commit": run.git_commit, "status": run.status,
            "created_at": run.created_at.isoformat(), "finished_at": run.finished_at and run.finished_at.isoformat()}


def sample_dict(s: Sample) -> dict[str, Any]:
    keep = ("problem_id", "sample_index", "status", "correct", "answer", "gold", "reason", "stop_reason", "tokens",
            "tool_calls", "tool_errors", "turns", "seconds", "timings", "details", "error", "attempts")
    return {k: getattr(s, k) for k in keep}


def write_outputs(store: Store, name: str, out: str | Path) -> list[Path]:
    """results.json, samples.jsonl (with trajectories) and report.html, all from the store."""
    from .html import render_html

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = load(store, name)
    (out / "results.json").write_text(json.dumps(
        [{**run_meta(r.run), "errors": r.errors, "metrics": r.summary} for r in results], indent=2))
    trajectories: dict[int, dict[str, dict[int, Any]]] = {}
    with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
        for r in results:
            trajs = store.trajectories(r.run.id)
            trajectories[r.run.id] = trajs
            for s in store.samples(r.run.id):
                f.write(json.dumps({"benchmark": r.run.benchmark, **sample_dict(s), "trajectory": trajs.get(s.id)},
                                   ensure_ascii=False) + "\n")
    (out / "report.html").write_text(render_html(name, results, trajectories), encoding="utf-8")
    return [out / "results.json", out / "samples.jsonl", out / "report.html"]


def compare(store: Store, a: str, b: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per benchmark in both runs: accuracies, the difference and its paired standard error over problems;
    per problem: the ones whose accuracy differs, largest change first."""
    ra = {r.run.benchmark: r for r in load(store, a)}
    rb = {r.run.benchmark: r for r in load(store, b)}
    benches, problems = [], []
    for bench in [x for x in ra if x in rb]:
        pa = {p["problem_id"]: p["accuracy"] for p in ra[bench].summary.get("per_problem", [])}
        pb = {p["problem_id"]: p["accuracy"] for p in rb[bench].summary.get("per_problem", [])}
        shared = sorted(set(pa) & set(pb))
        diffs = np.array([pb[p] - pa[p] for p in shared])
        benches.append({
            "benchmark": bench, "problems": len(shared),
            "a": float(np.mean([pa[p] for p in shared])) if shared else 0.0,
            "b": float(np.mean([pb[p] for p in shared])) if shared else 0.0,
            "diff": float(diffs.mean()) if shared else 0.0,
            "stderr": float(diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else 0.0,
            "better": int((diffs > 0).sum()), "worse": int((diffs < 0).sum())})
        half = t_quantile(0.975, len(diffs) - 1) * benches[-1]["stderr"] if len(diffs) > 1 else float("nan")
        benches[-1]["ci"] = (benches[-1]["diff"] - half, benches[-1]["diff"] + half)  # paired t over problems, 95%
        problems += [{"benchmark": bench, "problem_id": p, "a": pa[p], "b": pb[p], "diff": pb[p] - pa[p]}
                     for p in shared if pa[p] != pb[p]]
    if not benches:
        raise StoreError(f"the runs {a!r} and {b!r} share no benchmark")
    problems.sort(key=lambda d: (-abs(d["diff"]), d["benchmark"], d["problem_id"]))
    return benches, problems
