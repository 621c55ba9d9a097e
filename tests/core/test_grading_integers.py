"""The integer fast path: its verdicts are math-verify's on every form it decides (a grammar's cross product and a
seeded corpus of >= 10,000 (gold, response) pairs), it leaves to math-verify the forms where math-verify's verdict
depends on more than the integer, and what it decides never waits for the process pool."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest

from rstar2_agent.bench.grading import NEAR_INTEGER_GOLDS, answer_corpus, fast_disagreements, rollout_pairs
from rstar2_agent.grading import math as math_grading
from rstar2_agent.grading.math import MathGrader, integer_verdict, verify_answer

from conftest import hang_grade, until

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
DATA_DIR = str(SHARED) if SHARED.is_dir() else None  # the benchmarks' golds join the corpus when present

# The fast path disagrees with math-verify nowhere: a form on which it would (see below) is left to math-verify.
# Were one ever chosen on purpose, it would be listed here with its reason and the corpus tests would expect it.
DELIBERATE_DISAGREEMENTS: list[tuple[str, str]] = []


def _listing(differ) -> str:
    return "\n".join(f"gold {p.gold!r} ({p.kind}): fast {f}, math-verify {s}: ...{p.response[-80:]!r}"
                     for p, f, s in differ[:30])


@pytest.mark.parametrize("predicted, gold, correct", [
    ("42", "42", True), ("042", "42", True), ("42", "042", True), ("73", "073", True), ("-5", "-5", True),
    ("\u22125", "-5", True), ("+42", "42", True), ("-0", "0", True), ("0", "-0", True), ("-42", "42", False),
    ("42.0", "42", True), ("42.000", "42", True), ("-042.0", "-42", True), ("42.", "42", True), ("$42$", "42", True),
    ("$ 42 $", "42", True), ("42^\\circ", "42", True), ("42^{\\circ}.", "42", True), ("42°", "42", True),
    ("42\\%", "42", True), ("x=42", "42", True), ("n = -042", "-42", True), ("e=5", "5", True), ("43", "42", False),
    ("41.0", "42", False), ("x=42", "-42", False), ("2" * 1000, "2" * 1000, True), ("2" * 999 + "3", "2" * 1000, False),
])
def test_decided_forms_match_math_verify(predicted, gold, correct):
    assert integer_verdict(predicted, gold) is correct
    assert verify_answer(predicted, gold) is correct


@pytest.mark.parametrize("predicted, gold", [
    ("$$\\text{42}$$", "42"), ("\\boxed{42}", "42"), ("42^2", "1764"), ("4~2", "4"), ("2" * 1001, "2" * 1001),
])
def test_forms_whose_verdict_is_not_the_integers_go_to_math_verify(predicted, gold):
    """(What math-verify reads `\\text{042}`, `-5\\%`, `+7.`, `4\\,2`, `42,000`, ... as, the fast path decides the same
    way: tests/core/test_grading_forms.py.)"""
    assert integer_verdict(predicted, gold) is None


@pytest.mark.parametrize("gold", NEAR_INTEGER_GOLDS + ("+42", "42 ", " 42", "0042", "-0"))
def test_only_strict_integer_golds_take_the_fast_path(gold):
    decided = integer_verdict("42", gold) is not None
    assert decided == (gold.strip().lstrip("-").isdigit() and gold.strip().isascii())


def test_every_form_of_the_grammar_matches_math_verify():
    """The cross product of what the fast path reads ($...$, sign, leading zeros, .0/., degrees, percent, x=) on
    values that differ in sign, zeros and size: wherever it decides, math-verify says the same."""
    rng = random.Random(0)
    golds = ["0", "073", "-5", str(2 ** 70)]
    forms = ["{s}{v}{f}{u}{t}".format(s=s, v="{v}", f=f, u=u, t=t) for s, f, u, t in itertools.product(
        ["", "+", "-", "\u2212"], ["", ".", ".0", ".00"], ["", "^\\circ", "^{{\\circ}}", "°", "\\%"], ["", "."])]
    forms += ["x={s}{v}".format(s=s, v="{v}") for s in ["", "+", "-", "\u2212"]] + ["N = {v}", "e={v}"]
    decided = 0
    for form, wrap in itertools.product(forms, ["{}", "${}$"]):
        for gold in golds:
            g = abs(int(gold))
            for v in {str(g), f"0{g}", str(g + 1), "0", f"00{rng.randint(0, 9)}"}:
                predicted = wrap.format(form.format(v=v))
                fast = integer_verdict(predicted, gold)
                if fast is not None:
                    decided += 1
                    assert fast == verify_answer(predicted, gold), (predicted, gold)
    assert decided > 1500  # most of the grammar is decided, not left to math-verify


def test_corpus_is_seeded_and_large_with_every_form():
    a, b = answer_corpus(10_000, seed=3), answer_corpus(10_000, seed=3)
    assert a == b and len(a) == 10_000 and a != answer_corpus(10_000, seed=4)
    forms = {p.kind.split("/")[0] for p in a}
    assert {"plain", "leading zero", "decimal zero", "thin space", "trailing period", "dollars", "space", "plus",
            "percent", "assignment", "degrees", "text", "thousands", "minus zero", "unicode minus",
            "arabic digits"} <= forms
    places = {p.kind.split("/")[1] for p in a}
    assert {"answer block", "box only", "nested boxes", "no box", "cut off"} <= places


def test_fast_path_matches_math_verify_on_a_corpus_sample():
    corpus = answer_corpus(10_000, seed=0, data_dir=DATA_DIR)
    sample = random.Random(1).sample(corpus, 1_500)
    decided, differ = fast_disagreements(sample)
    assert decided > 500
    assert [(p.gold, p.response) for p, _, _ in differ] == DELIBERATE_DISAGREEMENTS, _listing(differ)


@pytest.mark.slow
def test_fast_path_matches_math_verify_on_the_whole_corpus():
    corpus = answer_corpus(10_000, seed=0, data_dir=DATA_DIR)
    decided, differ = fast_disagreements(corpus)
    assert decided > 3_500
    assert [(p.gold, p.response) for p, _, _ in differ] == DELIBERATE_DISAGREEMENTS, _listing(differ)




async def test_fast_verdicts_do_not_wait_for_the_pool(monkeypatch):
    """With the only pool process stuck on a comparison, rollout answers on integer golds are still graded."""
    grader = MathGrader(workers=1, timeout=30)
    try:
        monkeypatch.setattr(math_grading, "_grade", hang_grade)
        stuck = asyncio.ensure_future(grader.grade("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5"))
        await until(lambda: grader._slots is not None and grader._slots.locked(),
                    "the stuck comparison to hold the pool's only slot")
        pairs = rollout_pairs(2_000)
        grades = await asyncio.wait_for(asyncio.gather(*(grader.grade(p.response, p.gold) for p in pairs)), 10)
        assert not stuck.done()
        assert [g.correct for g in grades[:200]] == [g.predicted is not None and verify_answer(g.predicted, p.gold)
                                                     for g, p in zip(grades[:200], pairs, strict=False)]
        assert {g.error for g in grades} == {None, "no_answer"}
        stuck.cancel()
    finally:
        grader.close()


async def test_fast_false_sends_every_answer_to_math_verify(monkeypatch):
    grader = MathGrader(workers=1, timeout=1.0, fast=False)
    try:
        monkeypatch.setattr(math_grading, "_grade", hang_grade)
        g = await grader.grade("<answer>\\boxed{42}</answer>", "42")
        assert not g.correct and g.error == "timeout"  # it went to the (stuck) pool
    finally:
        grader.close()


def test_eval_bench_prints_the_grading_rows_with_their_agreement():
    import subprocess
    import sys

    rstar2 = str(Path(sys.executable).with_name("rstar2"))
    p = subprocess.run([rstar2, "bench", "grading", "--answers", "200", "--varied", "300"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("grading ")]
    assert len(lines) == 3 and "rollouts, integer golds (200 answers" in lines[0] and "corpus (200 answers" in lines[1]
    assert "varied integer forms (300 answers" in lines[2] and "same verdicts on 300/300 (0 disagreements)" in lines[2]
    assert all("same verdicts on 200/200" in line and "answers/s" in line for line in lines[:2]), p.stdout
