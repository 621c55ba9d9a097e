"""Eval scores and graders: pass@k against the closed form, the summary on hand-built samples, multiple-choice
letter extraction, and the math grader on the equivalent forms benchmarks use."""

from __future__ import annotations

import itertools

import pytest

from rstar2_agent.eval.metrics import Graded, normalize_answer, pass_at_k, summarize
from rstar2_agent.grading.choice import grade_choice, letter_of
from rstar2_agent.grading.math import MathGrader


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
    ("it is \\boxed{73}, no <answer> block", "73", True, None),  # outside <answer>: the last \\boxed{}
    ("<answer>73</answer>", "73", False, "no_answer"),  # not boxed
    ("I do not know.", "73", False, "no_answer"),
])
async def test_math_grader_cases(grader, text, gold, correct, reason):
    g = await grader.grade(text, gold)
    assert g.correct is correct and g.error == reason
