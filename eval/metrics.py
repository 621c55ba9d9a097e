"""Scores from graded samples: avg@n with its standard error and a bootstrap 95% interval, unbiased pass@k,
maj@n, and what the agent did (tokens, tool calls, tool errors, stop reasons), overall and per problem."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np


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


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks + ([n] if n and ks[-1] != n else [])


def summarize(samples: Iterable[Graded], bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    by_problem: dict[str, list[Graded]] = defaultdict(list)
    for s in samples:
        by_problem[s.problem_id].append(s)
    if not by_problem:
        return {"problems": 0, "samples": 0}
    problems = []
    for pid, group in by_problem.items():
        group.sort(key=lambda s: s.sample_index)
        votes = Counter(k for k in (normalize_answer(s.answer) for s in group) if k is not None)
        top = votes.most_common(1)[0][0] if votes else None
        majority_correct = top is not None and any(
            s.correct for s in group if normalize_answer(s.answer) == top)
        problems.append({"problem_id": pid, "n": len(group), "correct": sum(s.correct for s in group),
                         "accuracy": sum(s.correct for s in group) / len(group),
                         "majority_answer": top, "majority_correct": majority_correct})
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
