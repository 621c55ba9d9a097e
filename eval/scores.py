"""Scores from graded samples: avg@n with its standard error and a bootstrap 95% interval, unbiased pass@k,
maj@n, and what the agent did (tokens, tool calls, tool errors, stop reasons), overall and per problem."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Graded:
    """What the metrics need from one finished sample."""
    problem_id: str
    sample_index: int
    correct: bool
    answer: str | None
    tokens: int = 0  # generated response tokens
    tool_calls: int = 0
    tool_errors: int = 0
    stop_reason: str = ""
    first_turn_call: bool = False  # the first turn made well-formed tool calls
    answer_block: bool = False  # the answer is in <answer>\boxed{}</answer>


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def normalize_answer(answer: str | None) -> str | None:
    """A key under which equal answers vote together for maj@n (textual: '073' and '73', '\\dfrac' and
    '\\frac', spaces and a trailing period do not split votes)."""
    if answer is None:
        return None
    a = re.sub(r"\s+", "", answer).rstrip(".").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    a = re.sub(r"^\\text\{(.*)\}$", r"\1", a)
    return str(int(a)) if re.fullmatch(r"[+-]?\d+", a) else a


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """TimeoutError after `seconds` (SIGALRM: main thread only; elsewhere no limit). An alarm already set (e.g.
    pytest-timeout's) is put back with the time it had left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError

    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, expire)
    left, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - start), 1e-3), interval)


def same_answer(a: str, b: str, timeout: float = 2.0) -> bool:
    """Does the math grader (math-verify, rstar2_agent/grading/math.py) take `a` and `b` for the same answer?
    A comparison that fails or takes longer than `timeout` seconds says no (an alarm: it cannot cut a computation
    stuck in C, which is why GraderVotes calls this in a worker process it can kill)."""
    from rstar2_agent.grading.math import grade_answer

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that its own timeouts are off
    try:
        with _deadline(timeout):
            return grade_answer(a, b)
    except Exception:  # noqa: BLE001 - odd LaTeX or a stuck comparison: a separate vote
        return False


def vote(answers: Iterable[str | None], same: Callable[[str, str], bool] | None = None) -> list[list[int]]:
    """Groups of equal answers (indices into `answers`, None left out), largest first, ties in order of first
    appearance. Text-equal answers (normalize_answer) group first; with `same`, each text group then joins the
    first earlier group whose representative (its first answer) `same` takes for equal, so the grader is called at
    most (distinct answers x groups) times."""
    by_text: dict[str, list[int]] = {}
    answers = list(answers)
    for i, a in enumerate(answers):
        key = normalize_answer(a)
        if key is not None:
            by_text.setdefault(key, []).append(i)
    groups: list[list[int]] = []
    for members in by_text.values():
        rep = answers[members[0]]
        home = next((g for g in groups if same is not None and same(answers[g[0]], rep)), None)
        if home is None:
            groups.append(list(members))
        else:
            home += members
    return sorted(groups, key=len, reverse=True)  # stable: ties keep the first seen first


def grader_vote(answers: list[str | None]) -> list[list[int]]:
    """vote() by the math grader's equivalence (in GraderVotes' worker process)."""
    return vote(answers, same_answer)


class GraderVotes:
    """maj@n groups by the math grader's equivalence, one problem's answers at a time, computed in a worker process
    and cut at `timeout` seconds (a comparison stuck in C, e.g. 9^{9^{9^{9}}}, cannot be interrupted in-process);
    a problem that runs out of time, or breaks the worker, votes by text. Problems whose answers are all equal as
    text never reach the worker, and it is started only when one does."""

    def __init__(self, timeout: float = 20.0):
        self.timeout = timeout
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def __call__(self, answers: Iterable[str | None]) -> list[list[int]]:
        answers = list(answers)
        if len({normalize_answer(a) for a in answers} - {None}) < 2:
            return vote(answers)
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver"))
        try:
            return self._pool.submit(grader_vote, answers).result(self.timeout)
        except Exception as e:  # noqa: BLE001 - out of time or a dead worker: this problem votes by text
            log.warning("maj@n: grouping %d answers by the grader failed (%s); they vote by text",
                        len(answers), type(e).__name__)
            self.close()
            return vote(answers)

    def close(self) -> None:
        if self._pool is not None:
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.kill()  # a running comparison cannot be cancelled
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> GraderVotes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks + ([n] if n and ks[-1] != n else [])


def summarize(samples: Iterable[Graded], bootstrap: int = 1000, seed: int = 0,
              votes: Callable[[list[str | None]], list[list[int]]] = vote) -> dict[str, Any]:
    """`votes`: one problem's answers -> the maj@n groups (vote: equal text; GraderVotes: the math grader's
    equivalence)."""
    by_problem: dict[str, list[Graded]] = defaultdict(list)
    for s in samples:
        by_problem[s.problem_id].append(s)
    if not by_problem:
        return {"problems": 0, "samples": 0}
    problems = []
    for pid, group in by_problem.items():
        group.sort(key=lambda s: s.sample_index)
        groups = votes([s.answer for s in group])
        top = groups[0] if groups else []
        problems.append({"problem_id": pid, "n": len(group), "correct": sum(s.correct for s in group),
                         "accuracy": sum(s.correct for s in group) / len(group),
                         "majority_answer": normalize_answer(group[top[0]].answer) if top else None,
                         "majority_votes": len(top), "answer_groups": len(groups),
                         "majority_correct": any(group[i].correct for i in top)})
    per_problem = np.array([p["accuracy"] for p in problems])
    flat = [s for g in by_problem.values() for s in g]
    n_min = min(p["n"] for p in problems)
    rng = np.random.default_rng(seed)
    boots = per_problem[rng.integers(0, len(per_problem), (bootstrap, len(per_problem)))].mean(axis=1)
    calls = sum(s.tool_calls for s in flat)
    return {
        "problems": len(problems),
        "samples": len(flat),
        "n_min": n_min,
        "avg": float(per_problem.mean()),
        "stderr": float(per_problem.std(ddof=1) / np.sqrt(len(per_problem))) if len(per_problem) > 1 else 0.0,
        "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))],
        "pass_at_k": {str(k): float(np.mean([pass_at_k(p["n"], p["correct"], k) for p in problems]))
                      for k in ks_for(n_min)},
        "maj": float(np.mean([p["majority_correct"] for p in problems])),
        "mean_tokens": float(np.mean([s.tokens for s in flat])),
        "mean_tool_calls": float(np.mean([s.tool_calls for s in flat])),
        "tool_error_rate": sum(s.tool_errors for s in flat) / calls if calls else 0.0,
        "stop_reasons": dict(Counter(s.stop_reason for s in flat).most_common()),
        "first_turn_call_rate": float(np.mean([s.first_turn_call for s in flat])),
        "answer_block_rate": float(np.mean([s.answer_block for s in flat])),
        "per_problem": sorted(problems, key=lambda p: p["problem_id"]),
    }
