"""`rstar2 train problems`: each source read in its own schema (JSONL, Parquet, a folder), each filter on its own
(integer answers, duplicates after normalising, 8-gram overlap with the evaluation sets), the filters' order, the
counts the command prints, and an RL stage reading the result. Fixtures: tests/data/problems/, made-up problems
written in each source's schema; benchmarks/ holds made-up rows in each benchmark mirror's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rstar2_agent.benchmark_data import SOURCES, DataError
from rstar2_agent.problem import Problem
from rstar2_agent.train.data.problems import (
    BenchmarkIndex,
    Counts,
    curate,
    from_text,
    integer_answer,
    integer_answers,
    normalize,
    parse_source,
    read_problems,
    stage_problems,
    uncontaminated,
    unique,
)
from rstar2_agent.train.train_commands import train_group

DATA = Path(__file__).resolve().parents[1] / "data" / "problems"
BENCH = DATA / "benchmarks"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
SOURCES_ARGS = [f"dapo:{DATA / 'dapo.jsonl'}", f"omr:{DATA / 'omr.jsonl'}", f"euler:{DATA / 'euler.jsonl'}"]


def _problems(spec: str) -> list[Problem]:
    return list(parse_source(spec).problems())


# ---------------------------------------------------------------------------------------------- sources
def test_dapo_rows_lose_the_answer_format_instruction_and_keep_the_ground_truth():
    problems = _problems(f"dapo:{DATA / 'dapo.jsonl'}")
    assert len(problems) == 6 and {p.source for p in problems} == {"dapo"}
    assert problems[0].text.startswith("A jar holds $5$ red") and problems[0].text.endswith("in the jar?")
    assert not any("Answer:" in p.text for p in problems)
    assert [p.answer for p in problems] == ["22", "\\frac{1}{4}", "4.0", "22", "0", "042"]


def test_dapo_as_parquet_in_a_folder_and_with_chat_message_prompts_reads_the_same(tmp_path):
    """The hub's own files are Parquet; BytedTsinghua-SIA/DAPO-Math-17k keeps the prompt as chat messages."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (DATA / "dapo.jsonl").read_text().splitlines()]
    (tmp_path / "en").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:4]), tmp_path / "en" / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), tmp_path / "en" / "train-00001-of-00002.parquet")
    messages = tmp_path / "raw.jsonl"
    messages.write_text("".join(json.dumps({"prompt": r["source_prompt"], "reward_model": r["reward_model"]}) + "\n"
                                for r in rows))
    expected = _problems(f"dapo:{DATA / 'dapo.jsonl'}")
    assert _problems(f"dapo:{tmp_path / 'en'}") == expected
    assert _problems(f"dapo:{messages}") == expected


def test_openmathreasoning_reads_only_aops_problems_with_an_extracted_answer():
    problems = _problems(f"omr:{DATA / 'omr.jsonl'}")
    assert len(problems) == 5  # of 7 rows: the no_answer_extracted and the converted_proof rows are left out
    assert {p.source for p in problems} == {"openmathreasoning"}
    assert not any("Prove" in p.text or "bounded" in p.text for p in problems)


def test_project_euler_drops_huge_answers_and_reads_integer_columns():
    problems = _problems(f"euler:{DATA / 'euler.jsonl'}")
    assert [p.answer for p in problems] == ["41286", "0.2500000000", "5702886"]  # the 23-digit answer is left out


def test_a_row_in_another_schema_names_the_columns_it_needs(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    with pytest.raises(DataError, match=r"row 0 is not in the dapo schema.*prompt, reward_model.ground_truth"):
        _problems(f"dapo:{bad}")


def test_sources_that_cannot_be_read_say_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"DAPO-Math-17k-Processed:en \(split train\).*dapo:PATH"):
        _problems("hub:open-r1/DAPO-Math-17k-Processed:en")
    with pytest.raises(DataError, match="known: .*nvidia/openmathreasoning"):
        parse_source("hub:someone/unknown-set")
    with pytest.raises(DataError, match="unknown source 'gsm8k:x'"):
        parse_source("gsm8k:x")
    with pytest.raises(DataError, match="no file or folder"):
        _problems(f"omr:{tmp_path / 'missing.parquet'}")
    hub = parse_source("hub:nvidia/OpenMathReasoning::tir")
    assert (hub.hub_id, hub.config, hub.split, hub.schema.kind) == ("nvidia/OpenMathReasoning", None, "tir", "omr")


# ---------------------------------------------------------------------------------------------- filters
@pytest.mark.parametrize("answer, expected", [
    ("42", "42"), (" 7\n", "7"), ("-3", "-3"), ("+5", "5"), ("042", "42"), ("0", "0"), ("-0", "0"),
    ("4.0", None), ("\\frac{1}{2}", None), ("2^{10}", None), ("1,000", None), ("$5$", None), ("\\boxed{5}", None),
    ("12 cm", None), ("", None), ("x=3", None), ("3, 4", None), ("１２", None)])
def test_integer_answers_are_strict(answer, expected):
    assert integer_answer(answer) == expected


def test_the_integer_filter_counts_what_it_drops_and_writes_answers_plainly():
    counts = Counts()
    kept = list(integer_answers([from_text("a", "007", "s"), from_text("b", "0.5", "s"), from_text("c", "-12", "s")],
                                counts))
    assert [(p.text, p.answer) for p in kept] == [("a", "7"), ("c", "-12")] and counts.non_integer == 1


def test_dedupe_ignores_whitespace_and_latex_spacing_but_not_the_math():
    base = "Let $x + y = 10$ and $x - y = 2$. Find $xy$."
    same = ["Let $x+y=10$ and  $x-y=2$.\nFind $xy$.", "Let $x\\,+\\,y = 10$ and $x\\;-\\;y = 2$. Find\\quad $xy$.",
            "Let \\(x + y = 10\\) and \\(x - y = 2\\). Find $xy$.", "  Let $x + y = 10$ and $x - y = 2$. Find $xy$.  "]
    other = ["Let $x + y = 12$ and $x - y = 2$. Find $xy$.", "let $x + y = 10$ and $x - y = 2$. Find $xy$.",
             "Let $x + y = 10$ and $x - y = 2$. Find $x/y$."]
    assert all(normalize(s) == normalize(base) for s in same)
    assert not any(normalize(o) == normalize(base) for o in other)
    counts = Counts()
    kept = list(unique([from_text(t, "1", "s") for t in [base, *same, *other]], counts))
    assert [p.text for p in kept] == [base, *other] and counts.duplicate == len(same)
    assert normalize("a\\\\ b") == "a\\\\b"  # a LaTeX line break is not a spacing command


def test_a_benchmark_problem_behind_a_one_line_preamble_is_contaminated():
    bench = ("Let $N$ be the number of ways to tile a $2\\times 9$ strip of squares with dominoes and unit squares "
             "so that no two unit squares share an edge. Find the remainder when $N$ is divided by $1000$.")
    index = BenchmarkIndex([bench])
    assert index.contaminated(bench)
    assert index.contaminated("Here is a problem from last year's contest, try it.\n" + bench)
    assert index.contaminated(bench.upper().replace(" ", "  "))  # case and spacing do not hide it
    assert index.contaminated("Using dominoes and unit squares so that no two unit squares share an edge, count.")
    assert not index.contaminated("How many domino tilings does a $2\\times 9$ board have, with no unit squares?")
    # any shared run of 8 words counts, even a stock phrase: the rule is strict by design (no false negatives)
    assert index.contaminated("Let $N$ be the number of ways to tile a floor with red and blue tiles.")
    counts = Counts()
    kept = list(uncontaminated([from_text("Intro.\n" + bench, "1", "s"), from_text("What is 2+2?", "4", "s")], index,
                               counts))
    assert [p.text for p in kept] == ["What is 2+2?"] and counts.contaminated == 1


def test_the_filters_run_in_the_papers_order():
    """A problem with a fractional answer counts as non-integer even when it repeats (filter 1 before 2); the
    second copy of a contaminated problem counts as a duplicate (filter 2 before 3)."""
    bench = "one two three four five six seven eight nine ten"
    rows = [from_text("What is half of one?", "1/2", "s"), from_text("What is half of one?", "1/2", "s"),
            from_text("Intro. " + bench, "3", "s"), from_text("Intro.  " + bench, "3", "s"),
            from_text("What is 6 times 7?", "42", "s")]
    counts = Counts()
    kept = list(curate(rows, BenchmarkIndex([bench]), counts))
    assert [p.text for p in kept] == ["What is 6 times 7?"]
    assert counts.as_json() == {
        "read": 5, "kept": 1, "dropped": {"non_integer": 2, "duplicate": 1, "contaminated": 1},
        "kept_by_source": {"s": 1},
        "decontamination": {"by_benchmark": {"?": 1}, "top_ngrams": {"one two three four five six seven eight": 1},
                            "boilerplate_ngrams": 0}}


AIME_ENDING = "where $m$ and $n$ are relatively prime positive integers. Find $m+n$."


def test_boilerplate_shared_by_many_benchmark_problems_strikes_nothing_and_hits_are_reported():
    """The AIME sentence "m and n are relatively prime positive integers find m n" ends many benchmark problems:
    it is the competitions' phrasing, not a problem, so a training problem that uses it is kept (the named rule,
    `boilerplate`); a training problem that shares a problem's own words is still struck, and the hits are counted
    by benchmark and by n-gram. boilerplate=0 is the paper's rule as written: the sentence strikes."""
    bench = [("aime24", f"The probability that two dice sum to seven is $m/n$, {AIME_ENDING}"),
             ("aime25", f"A circle of radius three touches a square of side four at one corner; its area is $m/n$, "
                        f"{AIME_ENDING}"),
             ("hmmt25", f"The ratio of the perimeters of two similar heptagons drawn inside a cube is $m/n$, "
                        f"{AIME_ENDING}"),
             ("math500", "Find the number of ordered pairs of positive integers whose product is six factorial.")]
    training = f"A fair coin is tossed ten times; the chance of exactly four heads is $m/n$, {AIME_ENDING}"
    index = BenchmarkIndex(bench)
    assert index.boilerplate and not index.contaminated(training)  # the ending alone strikes nothing
    copied = "Find the number of ordered pairs of positive integers whose product is six factorial, please."
    assert index.contaminated(copied)
    assert index.report()["by_benchmark"] == {"math500": 1}
    assert list(index.report()["top_ngrams"]) == ["find the number of ordered pairs of positive"]
    assert BenchmarkIndex(bench, boilerplate=0).contaminated(training)  # the paper's literal rule


def test_the_index_reads_the_benchmarks_as_eval_does(monkeypatch):
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    assert set(SOURCES) == {"aime24", "aime25", "hmmt25", "math500", "gpqa_diamond"}
    index = BenchmarkIndex.load(data_dir=BENCH)
    assert index.contaminated("A spin-1/2 particle sits in a magnetic field along z and is prepared along x.")  # GPQA
    monkeypatch.setenv("RSTAR2_DATA_DIR", str(BENCH))
    assert BenchmarkIndex.load().grams == index.grams
    with pytest.raises(DataError, match="unknown benchmark"):
        BenchmarkIndex.load(["aime23"])


# ---------------------------------------------------------------------------------------------- the command
def test_the_command_prints_the_counts_and_writes_the_problems(tmp_path, monkeypatch):
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    out = tmp_path / "rl.jsonl"
    r = CliRunner().invoke(train_group, ["problems", *SOURCES_ARGS, "--out", str(out), "--data-dir", str(BENCH),
                                         "--json"])
    assert r.exit_code == 0, r.output
    # dapo 6 read: 2 non-integer, 1 duplicate, 1 contaminated (an AIME fixture behind a preamble), 2 kept;
    # omr 5 read: 1 non-integer, 2 duplicates (a second solution row, a DAPO problem), 1 contaminated, 1 kept;
    # euler 3 read: 1 non-integer, 2 kept
    counts = json.loads(r.stdout)
    assert {k: counts[k] for k in ("read", "kept", "dropped")} == {
        "read": 14, "kept": 5, "dropped": {"non_integer": 4, "duplicate": 3, "contaminated": 2}}
    assert counts["kept_by_source"] == {"dapo": 2, "openmathreasoning": 1, "project-euler": 2}
    assert counts["decontamination"]["by_benchmark"] == {"aime24": 1, "hmmt25": 1}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(row) for row in rows] == [{"problem", "answer", "source"}] * 5
    assert [(row["source"], row["answer"]) for row in rows] == [
        ("dapo", "22"), ("dapo", "42"), ("openmathreasoning", "10"), ("project-euler", "41286"),
        ("project-euler", "5702886")]
    again = CliRunner().invoke(train_group, ["problems", f"problems:{out}", "--out", str(tmp_path / "again.jsonl"),
                                             "--data-dir", str(BENCH), "--json"])
    assert json.loads(again.output)["dropped"] == {"non_integer": 0, "duplicate": 0, "contaminated": 0}
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


def test_the_command_fails_cleanly_without_benchmark_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    out = tmp_path / "rl.jsonl"
    r = CliRunner().invoke(train_group, ["problems", *SOURCES_ARGS, "--out", str(out), "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "no data for aime24" in r.output and "--data-dir" in r.output
    assert not out.exists()
    r = CliRunner().invoke(train_group, ["problems", *SOURCES_ARGS, "--out", str(out), "--data-dir", str(tmp_path),
                                         "--benchmarks", ""])
    assert r.exit_code == 0 and "7 of 14 problems" in r.output  # no benchmark named: the 2 overlapping stay


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data (benchmark mirrors) is absent")
def test_real_benchmark_problems_behind_a_preamble_are_caught(tmp_path):
    """Five problems of each real benchmark (read from the private mirrors at test time, written nowhere but
    tmp_path) behind a one-line preamble, among the DAPO fixture: all 25 are contaminated, and the fixture's made-up
    AIME-like problem is kept: "find the remainder when N is divided by 1000" is a run of 8 words that many real
    AIME problems share, boilerplate (the paper's rule as written, boilerplate 0, struck it)."""
    rows = [json.loads(line) for line in (DATA / "dapo.jsonl").read_text().splitlines()]
    for name, source in SOURCES.items():
        for i, text in enumerate(source.questions(SHARED)[:5]):
            rows.append({"prompt": f"Problem {i} of a {name} practice sheet.\n{text}",
                         "reward_model": {"ground_truth": str(i + 1)}})
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(train_group, ["problems", f"dapo:{tmp_path / 'mixed.jsonl'}", "--out",
                                         str(tmp_path / "out.jsonl"), "--data-dir", str(SHARED), "--json"])
    assert r.exit_code == 0, r.output
    counts = json.loads(r.stdout)
    assert counts["dropped"]["contaminated"] == 25
    assert counts["kept"] == 3 and counts["read"] == 6 + 25
    hits = counts["decontamination"]
    assert set(hits["by_benchmark"]) == set(SOURCES) and hits["boilerplate_ngrams"] > 0


# ---------------------------------------------------------------------------------------------- RL stages
def _pool(stage, out, data_dir=None, kept=None):
    from rstar2_agent.train.config import RLConfig
    from rstar2_agent.train.data.pool import stage_pool

    return stage_pool(stage, RLConfig(out=str(out), data_dir=data_dir), kept)  # no model


def test_an_rl_stage_reads_a_problems_file_with_stable_ids_and_a_seeded_cap(tmp_path):
    from rstar2_agent.train.config import Stage

    out = tmp_path / "rl.jsonl"
    CliRunner().invoke(train_group, ["problems", *SOURCES_ARGS, "--out", str(out), "--data-dir", str(BENCH)])
    problems = read_problems(out)
    pool = _pool(Stage(steps=1, data=str(out)), tmp_path)
    assert pool == {p.id: p for p in problems} and len(pool) == 5
    assert _pool(Stage(steps=1, data=f"problems:{out}", data_size=0), tmp_path) == pool
    capped = _pool(Stage(steps=1, data=str(out), data_size=3, data_seed=1), tmp_path)
    assert len(capped) == 3 and capped == _pool(Stage(steps=1, data=str(out), data_size=3, data_seed=1), tmp_path)
    assert set(capped) <= set(pool)
    assert {len(_pool(Stage(steps=1, data=str(out), data_size=3, data_seed=s), tmp_path)) for s in range(4)} == {3}
    kept = sorted(pool)[:2]  # a resumed stage after its filter keeps only these
    assert set(_pool(Stage(steps=1, data=str(out)), tmp_path, kept=kept)) == set(kept)


def test_an_rl_stage_curates_its_sources_once_and_reads_the_cache_after(tmp_path, monkeypatch):
    from rstar2_agent.train.config import Stage

    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    dapo = tmp_path / "dapo.jsonl"
    dapo.write_bytes((DATA / "dapo.jsonl").read_bytes())
    stage = Stage(steps=1, data=[f"dapo:{dapo}", f"euler:{DATA / 'euler.jsonl'}"])
    first = _pool(stage, tmp_path / "run", BENCH)
    assert sorted(p.answer for p in first.values()) == ["22", "41286", "42", "5702886"]
    assert len(list((tmp_path / "run").glob("problems-*.jsonl"))) == 1
    dapo.unlink()  # the stage reads its cached curation now
    assert _pool(stage, tmp_path / "run", BENCH) == first
    assert stage_problems(stage.data, BENCH, tmp_path / "run") == read_problems(
        next((tmp_path / "run").glob("problems-*.jsonl")))
    with pytest.raises(ValueError, match="problems file"):
        _pool(Stage(steps=1, data="gsm8k"), tmp_path)
