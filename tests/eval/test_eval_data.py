"""Benchmark data and the store: every benchmark loads from the local mirrors (skipped when ../shared/data is
absent), GPQA options shuffle per sample, unknown benchmarks and missing data say what to do, a run resumes
only with its own settings, and an error sample is replaced by its retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar2_agent.eval.benchmarks import DataError, get_benchmark
from rstar2_agent.eval.benchmarks.base import sample_seed
from rstar2_agent.store import Sample, Store, StoreError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
FIXTURE = Path(__file__).resolve().parents[1] / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data (benchmark mirrors) is absent")


@needs_shared
@pytest.mark.parametrize("name, count", [("aime24", 30), ("aime25", 30), ("hmmt25", 30), ("math500", 500),
                                         ("gpqa_diamond", 198)])
def test_each_benchmark_loads_its_mirror(name, count):
    problems = get_benchmark(name).load(SHARED)
    assert len(problems) == count and len({p.id for p in problems}) == count
    assert all(p.text.strip() and p.answer.strip() for p in problems)
    assert len(get_benchmark(name).load(SHARED, limit=2)) == 2


@needs_shared
def test_aime24_keeps_leading_zeros_in_gold():
    golds = {p.answer for p in get_benchmark("aime24").load(SHARED)}
    assert "073" in golds  # graded as numbers, see test_eval_scores


@needs_shared
def test_gpqa_options_shuffle_per_sample_and_the_gold_letter_follows():
    bench = get_benchmark("gpqa_diamond")
    problem = bench.load(SHARED, limit=1)[0]
    letters = set()
    for i in range(16):
        prompt, letter = bench.prompt(problem, i, seed=0)
        line = next(ln for ln in prompt.splitlines() if ln.startswith(f"{letter}) "))
        assert line[3:] == problem.answer  # the gold letter names the correct option
        assert bench.prompt(problem, i, seed=0) == (prompt, letter)  # reproducible
        letters.add(letter)
    assert len(letters) >= 3  # 16 samples see several orders


def test_unknown_benchmark_names_the_choices():
    with pytest.raises(DataError, match="aime24.*gpqa_diamond"):
        get_benchmark("aime23")


def test_missing_data_says_where_it_looked_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    with pytest.raises(DataError) as e:
        get_benchmark("aime25").load(tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and "aime25.jsonl" in msg and "--data-dir" in msg and "RSTAR2_DATA_DIR" in msg
    assert "math-ai/aime25" in msg


def test_a_bad_line_is_reported_with_its_number(tmp_path):
    (tmp_path / "aime24.jsonl").write_text((FIXTURE / "aime24.jsonl").read_text() + "{not json\n")
    with pytest.raises(DataError, match=r"aime24.jsonl:4"):
        get_benchmark("aime24").load(tmp_path)


def test_the_fixture_loads_through_the_env_variable(monkeypatch):
    monkeypatch.setenv("RSTAR2_DATA_DIR", str(FIXTURE))
    assert [p.answer for p in get_benchmark("aime24").load()] == ["5", "042", "1024"]


def test_sample_seeds_are_stable_and_distinct():
    seeds = {sample_seed(0, p, i) for p in ("1", "2") for i in range(8)}
    assert len(seeds) == 16 and sample_seed(0, "1", 0) == sample_seed(0, "1", 0) != sample_seed(1, "1", 0)


def _sample(run_id, status="ok", **kw):
    return Sample(run_id=run_id, problem_id="p", sample_index=0, status=status, correct=status == "ok",
                  answer="1", gold="1", stop_reason="answer" if status == "ok" else "engine_error", **kw)


def test_store_resumes_only_with_the_same_settings(tmp_path):
    store = Store(tmp_path / "s.db")
    run = store.open_run("r", "aime24", "m", {"temperature": 0.6}, {"n": 4})
    again = store.open_run("r", "aime24", "m", {"temperature": 0.6}, {"n": 8})
    assert again.id == run.id and again.info["n"] == 8
    with pytest.raises(StoreError, match=r"temperature: 0.6 -> 1.0.*new --run name"):
        store.open_run("r", "aime24", "m", {"temperature": 1.0})
    assert store.open_run("r", "aime25", "m", {"temperature": 1.0}).id != run.id  # another benchmark


def test_store_replaces_an_error_sample_with_its_retry(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    run = store.open_run("r", "aime24", "m", {})
    store.add_sample(_sample(run.id, "error", error="HTTP 503"), {"turns": []})
    assert store.done(run.id) == set() and store.samples(run.id)[0].attempts == 1
    store.add_sample(_sample(run.id, attempts=2), {"turns": [1]})
    (s,) = store.samples(run.id)
    assert s.status == "ok" and s.attempts == 3 and store.done(run.id) == {("p", 0)}
    assert list(store.trajectories(run.id).values()) == [{"turns": [1]}]


def test_store_error_for_a_bad_url():
    with pytest.raises(StoreError, match="--db"):
        Store("nosuchdialect://x/y")


def test_compare_gives_the_paired_difference_and_its_95_percent_t_interval(tmp_path):
    from rstar2_agent.eval.report import compare

    store = Store(tmp_path / "s.db")
    right = {"a": {0, 1}, "b": {0, 1, 2, 3, 4, 5}}  # b solves 4 more of 10 problems and loses none
    for name, solved in right.items():
        run = store.open_run(name, "aime24", "m", {})
        for p in range(10):
            store.add_sample(Sample(run_id=run.id, problem_id=str(p), sample_index=0, status="ok",
                                    correct=p in solved, answer="1", gold="1", stop_reason="answer"), {"turns": []})
    (bench,), changed = compare(store, "a", "b")
    # differences 1 on 4 problems, 0 on 6: mean 0.4, sd 0.5164, s.e. 0.1633, t(0.975, 9) = 2.2622
    assert bench["diff"] == pytest.approx(0.4) and bench["stderr"] == pytest.approx(0.16330, abs=1e-4)
    assert bench["ci"] == pytest.approx((0.4 - 0.36942, 0.4 + 0.36942), abs=1e-4)
    assert (bench["better"], bench["worse"], len(changed)) == (4, 0, 4)
