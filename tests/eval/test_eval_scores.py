"""Eval scores and graders: pass@k against the closed form, the summary on hand-built samples, maj@n voting by
the grader's equivalence, multiple-choice letter extraction, and the math grader on the equivalent forms
benchmarks use."""

from __future__ import annotations

import itertools
import time

import pytest

from rstar2_agent.eval.benchmarks.gpqa_diamond.choice import grade_choice, letter_of
from rstar2_agent.eval.report import graded
from rstar2_agent.eval.scores import Graded, GraderVotes, grader_vote, normalize_answer, pass_at_k, summarize, vote
from rstar2_agent.grading.math import MathGrader

from conftest import timeout_scale


@pytest.mark.parametrize("n, c", [(1, 0), (1, 1), (4, 1), (6, 2), (8, 5), (16, 3)])
def test_pass_at_k_equals_the_share_of_k_subsets_with_a_correct_sample(n, c):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(outcomes, k))
        exact = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(exact)
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def test_summary_on_hand_built_samples():
    def g(pid, i, correct, answer, calls=0, errors=0, stop="answer"):
        return Graded(pid, i, correct, answer, tokens=100 * (i + 1), tool_calls=calls, tool_errors=errors,
                      stop_reason=stop)

    samples = [g("a", 0, True, "5", 2, 1), g("a", 1, True, "5.", 1), g("a", 2, False, "6"), g("a", 3, False, "6"),
               g("b", 0, False, "1"), g("b", 1, False, "1"), g("b", 2, False, None, stop="max_tokens"),
               g("b", 3, True, "2", 1)]
    s = summarize(samples)
    assert s["problems"] == 2 and s["samples"] == 8 and s["n_min"] == 4
    assert s["avg"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert s["stderr"] == pytest.approx(abs(0.5 - 0.25) / 2)  # sd of (0.5, 0.25) over sqrt(2)
    assert s["ci95"][0] <= s["avg"] <= s["ci95"][1] and 0.25 <= s["ci95"][0] and s["ci95"][1] <= 0.5
    assert list(s["pass_at_k"]) == ["1", "2", "4"] and s["pass_at_k"]["4"] == 1.0
    assert s["pass_at_k"]["1"] == pytest.approx(s["avg"])
    # majority: a votes "5" and "5." together (2) against "6" (2): the first seen wins and is correct;
    # b votes "1" (wrong)
    assert s["maj"] == pytest.approx(0.5)
    assert s["mean_tokens"] == pytest.approx(250) and s["mean_tool_calls"] == pytest.approx(0.5)
    assert s["tool_error_rate"] == pytest.approx(1 / 4)
    assert s["stop_reasons"] == {"answer": 7, "max_tokens": 1}
    assert [p["correct"] for p in s["per_problem"]] == [2, 1]


def test_normalized_answers_vote_together():
    assert normalize_answer("073") == normalize_answer("73") == "73"
    assert normalize_answer("\\dfrac{1}{2}") == normalize_answer("\\frac{1}{2} ")
    assert normalize_answer(None) is None


def _answers(*pairs) -> list[Graded]:
    return [Graded("p", i, correct, answer) for i, (answer, correct) in enumerate(pairs)]


def test_maj_votes_answers_the_grader_takes_for_equal():
    samples = _answers(("0.5", True), ("\\frac{1}{2}", True), ("1/2", True), ("3", False))
    with GraderVotes() as votes:  # as reports run it: the grader in a worker process
        s = summarize(samples, votes=votes)
    (p,) = s["per_problem"]
    assert s["maj"] == 1.0 and p["majority_correct"] and p["majority_votes"] == 3 and p["answer_groups"] == 2
    (p,) = summarize(samples)["per_problem"]  # by text alone the four split
    assert p["majority_votes"] == 1 and p["answer_groups"] == 4


def test_grader_votes_change_the_majority():
    # "3" leads by text (2 votes against 1 each); by the grader 1/2 has 3
    samples = _answers(("3", False), ("\\dfrac12", True), ("3", False), ("0.5", True), ("1/2", True))
    assert summarize(samples)["maj"] == 0.0
    s = summarize(samples, votes=grader_vote)
    assert s["maj"] == 1.0 and s["per_problem"][0]["majority_answer"] == "\\frac12"


def test_vote_compares_each_answer_with_group_representatives_only():
    calls = []

    def same(a, b):
        calls.append((a, b))
        return a.lower() == b.lower()

    groups = vote(["a", "b", "A", None, "b", "c", "a"], same)
    assert groups == [[0, 6, 2], [1, 4], [5]]  # equal text first ("a" twice, "b" twice), then "A" joins "a"
    assert calls == [("a", "b"), ("a", "A"), ("a", "c"), ("b", "c")]  # one call per (distinct answer, group)
    assert vote([None, None], same) == [] and vote(["1", "2", "1"]) == [[0, 2], [1]]


def test_a_stuck_comparison_votes_by_text_and_the_next_problem_still_groups():
    start = time.monotonic()
    with GraderVotes(timeout=3) as votes:
        assert votes(["9^{9^{9^{9}}}", "3", "3"]) == [[1, 2], [0]]  # the worker is killed, the text vote stands
        assert votes(["0.5", "1/2"]) == [[0, 1]]  # a fresh worker
        assert votes(["7", "7"]) == [[0, 1]]  # all equal text: no worker needed
    assert time.monotonic() - start < 60 * timeout_scale()


def test_gpqa_votes_by_the_option_not_the_letter():
    from rstar2_agent.store import Sample

    def s(i, letter, option, correct):
        return graded(Sample(problem_id="q", sample_index=i, correct=correct, answer=letter, stop_reason="answer",
                             tokens=1, tool_calls=0, tool_errors=0, details={"option": option}))

    # the same option under two letters (the options are shuffled per sample) against one other option
    (p,) = summarize([s(0, "A", "Argon", True), s(1, "C", "Argon", True), s(2, "A", "Neon", False)])["per_problem"]
    assert p["majority_answer"] == "Argon" and p["majority_votes"] == 2 and p["majority_correct"]


@pytest.mark.parametrize("text, letter", [
    ("<answer>The answer is \\boxed{B}.</answer>", "B"),
    ("\\boxed{\\text{(C)}}", "C"),
    ("<answer>\\boxed{D) 42 eV}</answer>", "D"),
    ("Thinking about A and B... The answer is (D).", "D"),
    ("**A**", "A"),
    ("Answer: C\n", "C"),
    ("<answer>Option D</answer> but earlier: the answer is A", "D"),
    ("The answer is a function of x.", None),  # an article is not a letter
    ("\\boxed{42}", None),
    ("no idea", None),
    ("\\boxed{E}", None),  # only A-D exist
])
def test_choice_letter_extraction(text, letter):
    assert grade_choice(text) == letter


def test_letter_of_unwraps():
    assert letter_of("\\textbf{B}") == "B" and letter_of("(a)") == "A" and letter_of("AB") is None


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(workers=1, timeout=30)
    yield g
    g.close()


@pytest.mark.parametrize("text, gold, correct, reason", [
    ("<answer>\\boxed{\\dfrac12}</answer>", "0.5", True, None),
    ("<answer>\\boxed{073}</answer>", "73", True, None),
    ("<answer>\\boxed{73}</answer>", "073", True, None),
    ("<answer>\\boxed{(x+1)^2}</answer>", "x^2+2x+1", True, None),
    ("<answer>\\boxed{74}</answer>", "73", False, None),
    ("it is \\boxed{73}, no <answer> block", "73", True, None),  # the paper: the last box, block or not
    ("<answer>73</answer>", "73", False, "no_answer"),  # not boxed
    ("I do not know.", "73", False, "no_answer"),
])
async def test_math_grader_cases(grader, text, gold, correct, reason):
    g = await grader.grade(text, gold)
    assert g.correct is correct and g.error == reason
