"""The math grader: math-verify on the extracted answer, in a process pool, with an outside timeout."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_agent.grading import math as math_grading
from rstar2_agent.grading.math import MathGrader, grade_answer

from conftest import hang_grade


@pytest.mark.parametrize("predicted, gold, correct", [
    ("\\frac{1}{2}", "0.5", True),
    ("1/2", "\\frac12", True),
    ("2^{100}", "1267650600228229401496703205376", True),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
    ("(1, 2)", "(1,2)", True),
    ("3", "4", False),
    ("x+1", "1+x", True),
    ("10\\%", "10", True),
])
def test_grade_answer(predicted, gold, correct):
    assert grade_answer(predicted, gold) is correct


@pytest.fixture
def grader():
    g = MathGrader(workers=1, timeout=20)
    yield g
    g.close()


async def test_grades_the_answer_block_and_reports_missing_answers(grader):
    right = await grader.grade("I computed it.\n<answer>The answer is \\boxed{\\frac{1}{2}}.</answer>", "0.5")
    assert right.correct and right.predicted == "\\frac{1}{2}"
    wrong = await grader.grade("\\boxed{1} ... <answer>\\boxed{3}</answer>", "1")
    assert not wrong.correct and wrong.predicted == "3"
    none = await grader.grade("no boxed answer here", "1")
    assert not none.correct and none.error == "no_answer"
    many = await asyncio.gather(*(grader.grade(f"<answer>\\boxed{{{i}}}</answer>", str(i % 3)) for i in range(9)))
    assert [g.correct for g in many] == [i % 3 == i for i in range(9)]


async def test_answer_block_reads_the_block_the_paper_the_last_box_and_the_release_the_whole_response():
    """A box outside any answer block: no answer for answer_block, right for the paper and the release; no box at
    all: no answer for the paper, while the release's reward then runs math-verify's own extraction over the text."""
    paper, release = MathGrader(workers=1, timeout=20), MathGrader(workers=1, timeout=20, extraction="release")
    block = MathGrader(workers=1, timeout=20, extraction="answer_block")
    try:
        outside = "I computed it: \\boxed{\\frac{1}{2}}"
        assert (await block.grade(outside, "0.5")).error == "no_answer"
        assert (await paper.grade(outside, "0.5")).correct and (await release.grade(outside, "0.5")).correct
        unboxed = "So the final answer is $\\frac{1}{2}$."
        assert (await paper.grade(unboxed, "0.5")).error == "no_answer"
        found = await release.grade(unboxed, "0.5")
        assert found.correct and found.predicted is not None
        assert not (await release.grade(unboxed, "0.25")).correct
    finally:
        block.close()
        paper.close()
        release.close()
    with pytest.raises(ValueError, match="unknown answer extraction"):
        MathGrader(extraction="anywhere")




async def test_a_stuck_comparison_times_out_and_the_grader_recovers(monkeypatch):
    grader = MathGrader(workers=1, timeout=1.0)
    try:
        monkeypatch.setattr(math_grading, "_grade", hang_grade)  # a comparison that never ends
        stuck = await grader.grade("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5")  # not an integer: the pool
        assert not stuck.correct and stuck.error == "timeout"
        monkeypatch.undo()
        grader.timeout = 20
        again = await grader.grade("<answer>\\boxed{\\frac{2}{4}}</answer>", "0.5")
        assert again.correct
    finally:
        grader.close()
