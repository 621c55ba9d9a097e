"""Math grading with math-verify, run in a process pool with the timeout enforced from outside.

The predicted answer is the last \\boxed{} of the last <answer> block (else the last \\boxed{} anywhere), as
chat_format.extract_answer finds it. math-verify's own timeouts use signals, which break in threads, so they
are turned off and a stuck comparison is cut by the pool: the call returns `timeout` and the pool's
processes are replaced.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
from dataclasses import dataclass

from ..chat_format import extract_answer


@dataclass
class MathGrade:
    correct: bool
    predicted: str | None
    error: str | None = None  # "no_answer", "timeout", or math-verify's failure


def _as_latex(text: str) -> str:
    text = text.strip()
    return text if text.startswith("$") else f"${text}$"


def grade_answer(predicted: str, gold: str) -> bool:
    """Is `predicted` (an answer string) equal to `gold` as math? In-process; no timeout of its own."""
    from math_verify import parse, verify

    gold_parsed = parse(_as_latex(gold), parsing_timeout=None)
    pred_parsed = parse(_as_latex(predicted), parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip()
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _grade(text: str, gold: str) -> MathGrade:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that its timeouts are off: ours is outside
    predicted = extract_answer(text)
    if predicted is None:
        return MathGrade(False, None, "no_answer")
    try:
        return MathGrade(grade_answer(predicted, gold), predicted)
    except Exception as e:  # noqa: BLE001 - a parser crash on odd LaTeX is a wrong answer, not a crash
        return MathGrade(False, predicted, f"{type(e).__name__}: {e}")


class MathGrader:
    """`await grader.grade(response_text, gold)`; many at once, each cut at `timeout` seconds."""

    def __init__(self, workers: int | None = None, timeout: float = 10.0):
        self.workers, self.timeout = workers or max(1, (os.cpu_count() or 2) // 2), timeout
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("forkserver"))
        return self._pool

    async def grade(self, text: str, gold: str) -> MathGrade:
        if extract_answer(text) is None:  # nothing to compare: no process needed
            return MathGrade(False, None, "no_answer")
        loop = asyncio.get_running_loop()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:  # no more comparisons than processes: the timeout covers only the comparison
            for _ in range(2):
                pool = self._executor()
                try:
                    return await asyncio.wait_for(loop.run_in_executor(pool, _grade, text, gold), self.timeout)
                except TimeoutError:
                    self._reset(pool)
                    return MathGrade(False, extract_answer(text), "timeout")
                except concurrent.futures.process.BrokenProcessPool:
                    self._reset(pool)  # another comparison's timeout took the pool down: once more on a new one
            return MathGrade(False, extract_answer(text), "grader process died")

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
