"""GPQA-Diamond's --gpqa-extraction: `simple-evals` asks with simple-evals' prompt and grades as its regex reads the
response (the first "Answer: X", re.search; no match is wrong), through the benchmark's own grading; `ours` (the
default) is unchanged; the extraction is stored with the run, so the two never resume into one run."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from rstar2_agent.cli import main
from rstar2_agent.eval.benchmarks import Context, Problem, get_benchmark, get_benchmarks
from rstar2_agent.eval.benchmarks.gpqa_diamond import GPQADiamond
from rstar2_agent.store import Store, StoreError
from rstar2_agent.trajectory import Trajectory, Turn

# openai/simple-evals common.py ANSWER_PATTERN_MULTICHOICE, as gpqa_eval.py applies it (the oracle here)
OFFICIAL = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?"
PROBLEM = Problem("q1", "Which gas is inert?", "Argon", meta={"incorrect": ["Oxygen", "Chlorine", "Fluorine"]})


def _traj(text: str) -> Trajectory:
    return Trajectory(prompt_ids=[], turns=[Turn(text, 5, "stop")], stop_reason="answer")


async def _grade(extraction: str, response: str, gold: str):
    return await GPQADiamond(extraction).grade(_traj(response), gold, Context(agent=None, math_grader=None, seed=0))


@pytest.mark.parametrize("response, gold, ours", [
    ("Thinking...\n\\boxed{B}", "B", "B"),  # boxed only: ours reads it, simple-evals' regex does not
    ("<answer>\\boxed{C}</answer>", "C", "C"),
    ("Answer: b", "B", None),  # (?i): simple-evals reads "b", which is not the gold "B"
    ("Answer:C", "C", "C"),  # no space
    ("Answer: A\nOn second thought...\nAnswer: C", "A", "C"),  # two answers: re.search takes the first
    ("Answer: A\nOn second thought...\nAnswer: C", "C", "C"),
    ("Answer: $D$", "D", "D"),
    ("The answer is (B).", "B", "B"),  # ours reads the statement, the regex needs "Answer:"
    ("Answer: DC", "D", None),  # the regex takes the first letter of a run
    ("**Answer: A**", "A", "A"),
    ("Answer:\nB", "B", "B"),  # [ \t]*: the regex does not cross the line
    ("no idea", "A", None),
])
async def test_gpqa_simple_evals_verdicts_are_the_regexs(response, gold, ours):
    m = re.search(OFFICIAL, response)
    theirs = m.group(1) if m else None
    out = await _grade("simple-evals", response, gold)
    assert (out.predicted, out.correct) == (theirs, theirs == gold)
    assert out.reason == ("no_answer" if theirs is None else None)
    mine = await _grade("ours", response, gold)  # the default reading, unchanged: where the two differ
    assert (mine.predicted, mine.correct) == (ours, ours == gold)


def test_gpqa_simple_evals_prompt_is_theirs_and_ours_is_unchanged():
    opts = GPQADiamond().options(PROBLEM, 3, 0)
    listed = "\n".join(f"{letter}) {text}" for letter, text in zip("ABCD", opts, strict=True))
    gold = "ABCD"[opts.index("Argon")]
    theirs = ("Answer the following multiple choice question. The last line of your response should be of the "
              "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step "
              f"before answering.\n\nWhich gas is inert?\n\n{listed}")
    assert GPQADiamond("simple-evals").prompt(PROBLEM, 3, 0) == (theirs, gold)
    ours = f"Which gas is inert?\n\n{listed}\n\nAnswer with the letter of the correct option, for example \\boxed{{A}}."
    assert GPQADiamond().prompt(PROBLEM, 3, 0) == (ours, gold)


@pytest.mark.parametrize("extraction, response, prefix", [("ours", "\\boxed{{{L}}}", True),
                                                          ("simple-evals", "Answer: {L}", False),
                                                          ("simple-evals", "Answer: {l}", False)])
async def test_gpqa_run_asks_without_our_instruction_under_simple_evals(extraction, response, prefix):
    bench, seen = GPQADiamond(extraction), {}

    async def agent(prompt, tools=None, seed=None, **kw):
        seen.update(kw, prompt=prompt)
        _, gold = bench.prompt(PROBLEM, 0, 0)
        return _traj(response.format(L=gold, l=gold.lower()))

    out = await bench.run(PROBLEM, 0, Context(agent=agent, math_grader=None, seed=0))
    assert seen["problem_prefix"] is prefix and out.details["question"] == seen["prompt"]
    if response.endswith("{l}"):  # simple-evals' lower-case letter: wrong, and it names no option to vote for
        assert not out.correct and "option" not in out.details
    else:
        assert out.correct and out.details["option"] == "Argon"


def test_gpqa_extraction_is_stored_and_never_resumes_the_other(tmp_path):
    ours, theirs = GPQADiamond(), GPQADiamond("simple-evals")
    assert ours.settings() == {"checker": GPQADiamond.checker} and ours.run_tag() == ""  # old runs still resume
    assert theirs.settings()["gpqa_extraction"] == "simple-evals" and theirs.run_tag() == "-simple-evals"
    assert theirs.settings()["checker"] != ours.settings()["checker"]
    store = Store(tmp_path / "r.db")
    store.open_run("r", "gpqa_diamond", "m", {"n": 1} | ours.settings())
    with pytest.raises(StoreError, match="gpqa_extraction"):
        store.open_run("r", "gpqa_diamond", "m", {"n": 1} | theirs.settings())
    with pytest.raises(ValueError, match="ours, simple-evals"):
        GPQADiamond("lm-eval")


def test_gpqa_extraction_flag_reaches_the_benchmark(monkeypatch, tmp_path):
    import rstar2_agent.eval.harness as harness

    got = {}

    async def evaluate(names, source, cfg, store, *args, benchmarks=None, **kw):
        got.update(benchmarks)

    monkeypatch.setattr(harness, "evaluate", evaluate)
    for flags, extraction in (([], "ours"), (["--gpqa-extraction", "simple-evals"], "simple-evals")):
        result = CliRunner().invoke(main, ["eval", "aime24,gpqa_diamond", "--db", str(tmp_path / "r.db"), *flags])
        assert result.exit_code == 0, result.output
        assert got["gpqa_diamond"].extraction == extraction
    assert get_benchmark("gpqa_diamond", gpqa_extraction="simple-evals").extraction == "simple-evals"
    assert get_benchmarks(["gpqa_diamond"])["gpqa_diamond"].extraction == "ours"
    bad = CliRunner().invoke(main, ["eval", "gpqa_diamond", "--gpqa-extraction", "regex"])
    assert bad.exit_code == 2 and "simple-evals" in bad.output


def test_gpqa_simple_evals_agrees_with_the_official_side_on_the_conformance_corpus():
    """`rstar2 bench conformance`'s GPQA corpus, official side (bench/conformance_official.py, here in-process: it is
    a regex) against the benchmark's reading under simple-evals: every letter equal; ours keeps its differences."""
    import random

    from rstar2_agent.bench import conformance, conformance_official

    cases = conformance.gpqa_cases(random.Random(0), 2000)
    official = [conformance_official.gpqa(c) for c in cases]
    assert [conformance.ours(c, "simple-evals") for c in cases] == official
    assert sum(conformance.ours(c) != o for c, o in zip(cases, official, strict=True)) > 500
