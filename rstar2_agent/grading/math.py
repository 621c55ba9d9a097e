"""Math grading with math-verify, run in a process pool with the timeout enforced from outside, and a fast path
for integer golds that decides in the calling process.

The predicted answer is read as the grader's `extraction` says (chat_format.EXTRACTIONS): `paper`, the last
\\boxed{} after the last tool response; `answer_block`, the last \\boxed{} of the last <answer> block; `release`,
the release's reward: the last \\boxed{} anywhere, and where there is none math-verify's own extraction over the
whole response. math-verify's own timeouts use signals, which break
in threads, so they are turned off and a stuck comparison is cut by the pool: the call returns `timeout` and the
pool's processes are replaced.

The fast path (`integer_verdict`, grading/integers.py): when the gold is strictly an integer ("42", "073", "-5") and
the prediction is one of the forms models write an integer in, decide from the integers. Each form is there because
math-verify's verdict on it is a function of the integers written in it for every value: the integer comparison
(`42`, `042.0`, `42^\\circ`, `\\$42`, `42\\text{ cm}`, `(42)`, `\\frac{84}{2}`, `1{,}000`, ...) or what math-verify
reads the form as (`\\text{042}` is compared as text and wrong against 42, `-5\\%` is -0.05, `4\\,2` the mixed
number 4+2, `+7.` is wrong); tests/core/test_grading_forms.py checks each form against math-verify over seeded values,
and the corpus tests in tests/core/test_grading_integers.py over >10,000 pairs. A form whose verdict depends on more
than that goes to math-verify.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any

from ..chat_format import EXTRACTIONS, answer_scope, extract_answer
from .integers import integer_verdict


@dataclass
class MathGrade:
    correct: bool
    predicted: str | None
    error: str | None = None  # "no_answer", "timeout", or math-verify's failure


def _as_latex(text: str) -> str:
    text = text.strip()
    return text if text.startswith("$") else f"${text}$"


def verify_answer(predicted: str, gold: str, timeout: int | None = None) -> bool:
    """math-verify's verdict: is `predicted` (an answer string) equal to `gold` as math? In-process; no timeout of
    its own, unless `timeout` (seconds; math-verify's own, by signals, so in the main thread only): a comparison cut
    there is wrong, as the pool's timeout makes it."""
    from math_verify import parse, verify

    gold_parsed = parse(_as_latex(gold), parsing_timeout=timeout)
    pred_parsed = parse(_as_latex(predicted), parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip()
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def grade_answer(predicted: str, gold: str) -> bool:
    """`verify_answer`, through the integer fast path when it decides."""
    verdict = integer_verdict(predicted, gold)
    return verify_answer(predicted, gold) if verdict is None else verdict


def _grade(text: str, gold: str, extraction: str = "paper") -> MathGrade:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that its timeouts are off: ours is outside
    predicted = extract_answer(text, extraction)
    if predicted is None and extraction == "release":
        return _whole_response(text, gold)
    if predicted is None:
        return MathGrade(False, None, "no_answer")
    try:
        return MathGrade(verify_answer(predicted, gold), predicted)
    except Exception as e:  # noqa: BLE001 - a parser crash on odd LaTeX is a wrong answer, not a crash
        return MathGrade(False, predicted, f"{type(e).__name__}: {e}")


def _whole_response(text: str, gold: str) -> MathGrade:
    """The release's last resort (verl's math_verify reward): math-verify extracts an answer from the whole text."""
    from math_verify import parse, verify

    try:
        found = parse(text, parsing_timeout=None)
        if not found:
            return MathGrade(False, None, "no_answer")
        return MathGrade(bool(verify(parse(_as_latex(gold), parsing_timeout=None), found, timeout_seconds=None)),
                         str(found[-1]))
    except Exception as e:  # noqa: BLE001 - as in _grade
        return MathGrade(False, None, f"{type(e).__name__}: {e}")


class MathGrader:
    """`await grader.grade(response_text, gold)`; many at once, each cut at `timeout` seconds. What the integer
    fast path decides is answered in the calling process at once, never queued behind the pool (`fast=False`:
    everything goes to math-verify, the baseline `rstar2 bench grading` measures it against). `extraction`: how the
    answer is read (chat_format.EXTRACTIONS; a caller that learns the format later may set it before grading)."""

    def __init__(self, workers: int | None = None, timeout: float = 10.0, fast: bool = True,
                 extraction: str = "paper"):
        if extraction not in EXTRACTIONS:
            raise ValueError(f"unknown answer extraction {extraction!r}; choose one of {', '.join(EXTRACTIONS)}")
        self.workers, self.timeout, self.fast = workers or max(1, (os.cpu_count() or 2) // 2), timeout, fast
        self.extraction = extraction
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("forkserver"))
        return self._pool

    async def grade_trajectory(self, traj: Any, gold: str) -> MathGrade:
        """A trajectory's answer, read where the extraction reads it (chat_format.answer_scope)."""
        return await self.grade(answer_scope(traj, self.extraction), gold)

    async def grade(self, text: str, gold: str) -> MathGrade:
        predicted = extract_answer(text, self.extraction)
        if predicted is None and self.extraction != "release":  # nothing to compare: no process needed
            return MathGrade(False, None, "no_answer")
        verdict = integer_verdict(predicted, gold) if self.fast and predicted is not None else None
        if verdict is not None:
            return MathGrade(verdict, predicted)
        loop = asyncio.get_running_loop()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:  # no more comparisons than processes: the timeout covers only the comparison
            for _ in range(2):
                pool = self._executor()
                try:
                    return await asyncio.wait_for(loop.run_in_executor(pool, _grade, text, gold, self.extraction),
                                                  self.timeout)
                except TimeoutError:
                    self._reset(pool)
                    return MathGrade(False, predicted, "timeout")
                except concurrent.futures.process.BrokenProcessPool:
                    self._reset(pool)  # another comparison's timeout took the pool down: once more on a new one
            return MathGrade(False, predicted, "grader process died")

    def _reset(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Replace a pool whose worker is stuck: kill its processes (a running task cannot be cancelled)."""
        if self._pool is pool:
            self._pool = None
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._pool is not None:
            self._reset(self._pool)
