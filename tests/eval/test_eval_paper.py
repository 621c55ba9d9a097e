"""Per-benchmark defaults and `rstar2 eval paper`: each benchmark runs as its authors run it (BFCL v3: one greedy
sample), flags override, the same effective settings resume the same run, the 95% intervals over problems on
known numbers, and the paper table at toy size with the real SmolLM2 (the session engine, and once through the
CLI)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from rstar2_agent.eval import paper
from rstar2_agent.eval.benchmarks import BENCHMARKS, PAPER
from rstar2_agent.eval.benchmarks.base import REASONING_BUDGET
from rstar2_agent.eval.benchmarks.bfcl_v3 import BFCLv3
from rstar2_agent.eval.eval_commands import eval_group
from rstar2_agent.eval.harness import ModelSource, default_run_name
from rstar2_agent.eval.paper import Interval, PaperRow, bfcl_interval, paper_table, problem_interval, wilson
from rstar2_agent.eval.runner import EvalConfig
from rstar2_agent.store import Sample, Store

FIXTURE = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


# ------------------------------------------------------------------------------------------ defaults
@pytest.mark.parametrize("name", ["aime24", "aime25", "hmmt25", "math500", "gpqa_diamond"])
def test_math_and_gpqa_run_as_the_paper_does(name):
    d = BENCHMARKS[name].defaults
    assert (d.n, d.temperature, d.top_p, d.max_tokens, d.max_turns) == (16, 0.6, 1.0, 30720, 30)


def test_bfcl_ifeval_and_arena_hard_run_one_greedy_sample_with_room_to_reason():
    for bench in (BFCLv3, BENCHMARKS["ifeval"], BENCHMARKS["arena_hard"]):
        d = bench.defaults
        assert (d.n, d.temperature, d.top_p) == (1, 0.0, 1.0) and d.max_tokens == REASONING_BUDGET == 16384


def test_flags_override_the_benchmark_defaults():
    cfg = EvalConfig(max_tokens=64, temperature=0.3)
    assert cfg.given() == ["temperature", "max_tokens"]
    bfcl = cfg.resolve(BFCLv3.defaults)
    assert (bfcl.n, bfcl.temperature, bfcl.top_p, bfcl.max_tokens) == (1, 0.3, 1.0, 64)
    aime = cfg.resolve(BENCHMARKS["aime24"].defaults)
    assert (aime.n, aime.temperature, aime.top_p, aime.max_tokens, aime.max_turns) == (16, 0.3, 1.0, 64, 30)
    assert cfg.max_tokens == 64 and cfg.n is None  # resolve returns a copy
    with pytest.raises(ValueError, match="resolve"):
        cfg.settings()  # an open setting never reaches the store


def test_cli_leaves_unset_flags_to_the_benchmark(monkeypatch, tmp_path):
    seen = {}

    async def fake_evaluate(names, source, cfg, store, run_name, data_dir, out, benchmarks=None):
        seen[tuple(names)] = cfg
        return {}

    monkeypatch.setattr("rstar2_agent.eval.harness.evaluate", fake_evaluate)
    runner = CliRunner()
    db = str(tmp_path / "s.db")
    assert runner.invoke(eval_group, ["aime24,aime25", "--db", db]).exit_code == 0
    assert runner.invoke(eval_group, ["aime24", "--n", "2", "--top-p", "0.5", "--db", db]).exit_code == 0
    plain, flagged = seen[("aime24", "aime25")], seen[("aime24",)]
    assert plain.given() == [] and plain.resolve(PAPER) == EvalConfig().resolve(PAPER)
    assert flagged.given() == ["n", "top_p"] and (flagged.n, flagged.top_p) == (2, 0.5)


def test_the_same_effective_settings_resume_the_same_run(tmp_path):
    store, source, aime = Store(tmp_path / "s.db"), ModelSource(), BENCHMARKS["aime24"].defaults

    def open_run(cfg: EvalConfig, defaults=aime, bench="aime24"):
        resolved = cfg.resolve(defaults)
        name = default_run_name(source, resolved, defaults)
        return name, store.open_run(name, bench, source.label(), resolved.settings())

    name, run = open_run(EvalConfig())
    assert name == "smollm2-135m-t0.6"  # the name runs had before the per-benchmark defaults
    explicit = EvalConfig(n=16, temperature=0.6, top_p=1.0, max_tokens=30720, max_turns=30)
    again, same = open_run(explicit)
    assert again == name and same.id == run.id  # the defaults spelled out as flags: the same run resumes
    short, other = open_run(EvalConfig(max_tokens=64))
    assert short == "smollm2-135m-t0.6-tokens64" and other.id != run.id  # other settings: another run, no clash
    assert open_run(EvalConfig(top_p=0.95))[0] == "smollm2-135m-t0.6-top_p0.95"
    bfcl, _ = open_run(EvalConfig(), BFCLv3.defaults, "bfcl_v3")
    assert bfcl == "smollm2-135m-t0"


# ------------------------------------------------------------------------------------------ intervals
def test_t_quantiles_and_wilson_on_known_values():
    for df, t in ((1, 12.7062), (3, 3.1824), (19, 2.0930), (29, 2.0452)):
        assert paper.t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson(0, 30) == pytest.approx((0.0, 0.1135), abs=1e-4)


def test_interval_over_problems():
    # 20 problems, half at 4/16 and half at 12/16: mean 0.5, sd 0.2565, t(19) 2.0930 -> 0.5 +- 0.1200
    ci = problem_interval([0.25] * 10 + [0.75] * 10)
    assert ci.method == "t" and (ci.lo, ci.hi) == pytest.approx((0.3800, 0.6200), abs=1e-4)
    # the same 320 samples as if independent (Wilson on 160/320) would claim about +-0.055: the problem is the unit
    naive = wilson(160, 320)
    assert naive[1] - naive[0] < (ci.hi - ci.lo) / 2
    # every problem solved by all or none of its samples (always so with one sample): Wilson over problems
    ci = problem_interval([1.0] * 8 + [0.0] * 2)
    assert ci.method == "wilson" and (ci.lo, ci.hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert problem_interval([0.5]) is None  # one problem: no spread over problems
    assert problem_interval([0.0]).method == "wilson"


def _bfcl_sample(pid: str, correct: bool) -> Sample:
    return Sample(problem_id=pid, sample_index=0, correct=correct, status="ok", answer="[]", gold="[]",
                  stop_reason="answer")


def test_bfcl_interval_bootstraps_items_within_categories():
    from rstar2_agent.eval.benchmarks.bfcl_v3.data import overall

    items = [_bfcl_sample(f"simple_{i}", i % 2 == 0) for i in range(20)]
    items += [_bfcl_sample(f"irrelevance_{i}", i < 15) for i in range(20)]
    score = overall({"simple": (0.5, 20), "irrelevance": (0.75, 20)})["overall"]
    ci = bfcl_interval(items)
    assert ci.method == "bootstrap" and ci.lo < score < ci.hi and ci.hi - ci.lo < 0.2
    same = bfcl_interval([_bfcl_sample(f"simple_{i}", True) for i in range(5)])
    assert same.lo == same.hi  # nothing varies: no spread
    assert bfcl_interval([]) is None and bfcl_interval(items + [_bfcl_sample("java_0", True)]) is None  # 1 item


def test_paper_table_rows():
    rows = [PaperRow("aime24", 80.6, 12.5, Interval(2.0, 30.0, "t"), 30, 16, "r"),
            PaperRow("aime25", 69.8, skipped="no data for aime25: no aime25.jsonl in /x. Put a JSONL file ..."),
            PaperRow("bfcl_v3", 60.8, 61.0, Interval(55.0, 66.0, "bootstrap"), 100, 1, "r")]
    console = Console(file=io.StringIO(), width=200)
    console.print(paper_table(rows, "t"))
    text = console.file.getvalue()
    assert "2.0-30.0 (t)" in text and " no " in text and " yes " in text
    assert "skipped: no data for aime25 " in text and "/x" not in text  # the reason's gist; the CLI prints it whole
    assert [r.inside for r in rows] == [False, None, True]


# ------------------------------------------------------------------------------------------ end to end
def _rows_by_name(rows):
    assert [r.benchmark for r in rows] == list(paper.PAPER_SCORES)
    return {r.benchmark: r for r in rows}


@pytest.mark.slow
async def test_paper_at_toy_size_with_the_session_engine(tmp_path, monkeypatch, tiny_engine):
    """The fixture's AIME24 and one BFCL category run; the benchmarks without data say why; the same call again
    only reads the store. The pipeline's machinery, whatever the model writes: the session's tiny SmolLM2 generates
    under the registry's name and format for smollm2-135m."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    store = Store(tmp_path / "paper.db")
    cfg = EvalConfig(n=2, max_tokens=32, max_turns=2, limit=1, concurrency=4, retries=0)
    log = Console(file=io.StringIO(), width=250)
    rows = _rows_by_name(await paper.run_paper(ModelSource(), cfg, store, data_dir=str(FIXTURE), categories="simple",
                                         console=log, engine=tiny_engine))
    for name, file in (("aime25", "aime25.jsonl"), ("hmmt25", "hmmt_feb_2025.jsonl"), ("math500", "math500.jsonl"),
                       ("gpqa_diamond", "gpqa_diamond.jsonl")):
        assert rows[name].skipped and file in rows[name].skipped and rows[name].score is None
    aime, bfcl = rows["aime24"], rows["bfcl_v3"]
    assert (aime.problems, aime.n, aime.run) == (1, 2, "smollm2-135m-t0.6-tokens32-turns2")
    assert aime.score is not None and (aime.interval is not None) != bool(aime.note)  # one problem: Wilson if 0 or 1
    assert (bfcl.problems, bfcl.n, bfcl.run) == (1, 2, "smollm2-135m-t0-tokens32-turns2") and "count 0" in bfcl.note
    assert bfcl.interval is None and "1 item" in bfcl.note
    header = log.file.getvalue()
    assert ("aime24 (run smollm2-135m-t0.6-tokens32-turns2): n 2, temperature 0.6, top_p 1, max_tokens 32, "
            "max_turns 2 (benchmark defaults; flags: --n, --max-tokens, --max-turns)") in header
    assert "bfcl_v3 (run smollm2-135m-t0-tokens32-turns2): n 2, temperature 0, top_p 1" in header

    runs = {r.benchmark: r for r in store.runs()}
    before = {b: [s.id for s in store.samples(r.id)] for b, r in runs.items()}
    assert len(before["aime24"]) == 2 and len(before["bfcl_v3"]) == 2
    again = _rows_by_name(await paper.run_paper(ModelSource(), cfg, store, data_dir=str(FIXTURE), categories="simple",
                                          console=log, engine=tiny_engine))
    assert {b: [s.id for s in store.samples(r.id)] for b, r in runs.items()} == before  # resumed: nothing new
    assert again["aime24"].score == aime.score and again["bfcl_v3"].score == bfcl.score


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data (benchmark mirrors) is absent")
async def test_paper_runs_all_six_with_the_mirrors(tmp_path, monkeypatch, tiny_engine):
    """Every benchmark's mirror loads and runs one problem (the tiny SmolLM2 generates: the data's path is tested)."""
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    cfg = EvalConfig(n=1, max_tokens=24, max_turns=1, limit=1, concurrency=4, retries=0)
    rows = _rows_by_name(await paper.run_paper(ModelSource(), cfg, Store(tmp_path / "paper.db"), data_dir=str(SHARED),
                                         categories="simple", console=Console(file=io.StringIO()), engine=tiny_engine))
    assert all(not r.skipped and r.problems == 1 and r.n == 1 for r in rows.values())
    assert all(rows[b].interval.method == "wilson" for b in ("aime24", "aime25", "hmmt25", "math500", "gpqa_diamond"))
    assert rows["bfcl_v3"].interval is None  # one item in its category


@pytest.mark.slow
def test_paper_command_prints_the_table(tmp_path):
    """`rstar2 eval paper --limit 1` through the CLI (it starts its own hf engine): six rows, the missing data
    as skipped rows with their reasons, and which format it ran the model in and why."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RSTAR2_DATA_DIR", None)
    args = [RSTAR2, "eval", "paper", "--limit", "1", "--n", "1", "--max-tokens", "16", "--max-turns", "1",
            "--categories", "simple", "--concurrency", "2", "--data-dir", str(FIXTURE), "--db", str(tmp_path / "p.db")]
    p = subprocess.run(args, capture_output=True, text=True, timeout=280, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    for bench, paper_score in paper.PAPER_SCORES.items():
        assert any(bench in ln and f"{paper_score:.1f}" in ln for ln in lines), p.stdout
    for bench in ("aime25", "hmmt25", "math500", "gpqa_diamond"):  # a row that says so, then the whole reason
        assert any(ln.startswith("│ " + bench) and f"skipped: no data for {bench}" in ln for ln in lines), p.stdout
        reason = next(ln for ln in lines if ln.startswith(f"{bench} skipped: no data for {bench}"))
        assert "--data-dir" in reason
    assert "aime24 (run smollm2-135m-t0.6-tokens16-turns1): n 1" in p.stderr
    assert "format markdown: the registry's format for smollm2-135m (a 135M model never learned Hermes" in p.stdout


@pytest.mark.parametrize("judge,comparable", [("self", False), ("gpt-4-1106-preview", True)])
def test_a_self_judged_arena_hard_row_makes_no_comparison_with_the_paper(judge, comparable):
    """Without --judge-url the model under test judges itself: the row shows the score and says so, but no paper
    number and no 'paper in CI' verdict; with a judge the row compares."""
    from rstar2_agent.eval.paper import paper_row, paper_table
    from rstar2_agent.eval.report import BenchResult

    summary = {"samples": 10, "problems": 10, "n_min": 1,
               "arena": {"score": 0.8, "ci": [0.7, 0.9], "judge": judge, "dropped": 0}}
    row = paper_row("arena_hard", BenchResult(None, [], 0, summary))
    assert row.score == pytest.approx(80.0) and row.comparable is comparable
    assert row.inside is (True if comparable else None)  # the paper's 86.6 lies in 70-90 with a judge
    cells = paper_table([row], "t").columns[4]._cells
    assert cells == (["86.6"] if comparable else [""])
    assert ("smoke test" in row.note) is not comparable
