"""BFCL v3 (Berkeley Function Calling Leaderboard): its data, one grading entry point per item kind, and the
v3 overall score. Data and checkers come from the `bfcl-eval==2025.6.8` package (install it with --no-deps);
see ast_checker.py and multi_turn.py for what is imported from it and what is re-implemented.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from .ast_checker import Check, check_ast, check_relevance
from .multi_turn import Call, check_multi_turn

NON_LIVE = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance", "java", "javascript")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_relevance",
        "live_irrelevance")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = NON_LIVE + LIVE + MULTI_TURN
PREFIX = "BFCL_v3_"
# the user turn of a miss_func item where the held-out functions appear (bfcl_eval constants/default_prompts.py)
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
MAX_STEPS = 20  # model steps per user turn before BFCL force-quits the item (MAXIMUM_STEP_LIMIT)
MULTI_TURN_DOCS = {"GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
                   "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json", "TicketAPI": "ticket_api.json",
                   "TradingBot": "trading_bot.json", "TravelAPI": "travel_booking.json",
                   "VehicleControlAPI": "vehicle_control.json"}


def language(category: str) -> str:
    return {"java": "Java", "javascript": "JavaScript"}.get(category, "Python")


def is_relevance(category: str) -> bool:
    return category.endswith("relevance")


def package_data_dir() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


def _read(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@cache
def _multi_turn_docs(data_dir: Path, class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(_read(data_dir / "multi_turn_func_doc" / MULTI_TURN_DOCS[class_name]))


def load_items(category: str, data_dir: Path | None = None) -> list[dict[str, Any]]:
    """The category's items with their possible answer under "ground_truth" (absent for relevance categories).
    Multi-turn items also get "function" (the docs shown from the start, the held-out ones removed) and
    "missed_function" as {turn index: [docs]}, as bfcl_eval prepares them."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL v3 category {category!r}; choose from {', '.join(CATEGORIES)}")
    root = data_dir or package_data_dir()
    items = _read(root / f"{PREFIX}{category}.json")
    if not is_relevance(category):
        answers = {a["id"]: a["ground_truth"] for a in _read(root / "possible_answer" / f"{PREFIX}{category}.json")}
        for item in items:
            item["ground_truth"] = answers[item["id"]]
    if category in MULTI_TURN:
        for item in items:
            docs = [copy.deepcopy(d) for c in item["involved_classes"] for d in _multi_turn_docs(root, c)]
            missed = {turn: [d for d in docs if d["name"] in names]
                      for turn, names in item.get("missed_function", {}).items()}
            held_out = {d["name"] for ds in missed.values() for d in ds}
            item["function"] = [d for d in docs if d["name"] not in held_out]
            item["missed_function"] = missed
    return items


@cache
def category_size(category: str) -> int:
    """Items in the full category (what BFCL counts a category that was not run as)."""
    return len(_read(package_data_dir() / f"{PREFIX}{category}.json"))


# ------------------------------------------------------------------------------------------ grading
def first_answer(values: list) -> Any:
    """A parameter's first acceptable value; a dict's (or list of dicts') values are lists of acceptable values
    too, each taken at its first."""
    v = values[0]
    if isinstance(v, dict):
        return {k: x[0] for k, x in v.items() if x and x[0] != ""}
    if isinstance(v, list) and v and isinstance(v[0], dict) and all(isinstance(x, list) for x in v[0].values()):
        return [{k: x[0] for k, x in d.items() if x and x[0] != ""} for d in v]
    return v


def grade_single_turn(category: str, functions: list[dict], calls: list[dict], ground_truth: list | None = None
                      ) -> Check:
    """Produced calls `[{"name", "arguments"}]` (original function names) for a single-turn item."""
    if is_relevance(category):
        return check_relevance(calls, category)
    return check_ast(functions, calls, ground_truth or [], category, language(category))


def grade_multi_turn(category: str, item: dict[str, Any], model_turns: list[list[Call]]) -> Check:
    return check_multi_turn(model_turns, item["ground_truth"], item["involved_classes"], item["initial_config"],
                            long_context="long_context" in category)


# ------------------------------------------------------------------------------------------ overall
def category_weights(counts: dict[str, int] | None = None) -> dict[str, float]:
    """Each category's weight in the BFCL v3 overall accuracy (the weights sum to 1), as bfcl_eval computes it
    in `generate_leaderboard_csv` (bfcl_eval/eval_checker/eval_runner_helper.py):

    overall = unweighted mean of three groups:
    - non-live: unweighted mean of simple AST, multiple, parallel, parallel_multiple and irrelevance, where
      simple AST is itself the unweighted mean of simple (Python), java and javascript;
    - live: the mean over all live items (each category weighted by its item count) of live_simple,
      live_multiple, live_parallel, live_parallel_multiple, live_irrelevance and live_relevance;
    - multi-turn: unweighted mean of base, miss_func, miss_param and long_context.

    `counts`: items per live category as run; missing ones count as the full category (BFCL's convention).
    """
    counts = counts or {}
    weights = {c: 1 / 3 * 1 / 5 * 1 / 3 for c in ("simple", "java", "javascript")}
    weights |= {c: 1 / 3 * 1 / 5 for c in ("multiple", "parallel", "parallel_multiple", "irrelevance")}
    live_counts = {c: counts.get(c) or category_size(c) for c in LIVE}
    total = sum(live_counts.values())
    weights |= {c: 1 / 3 * n / total for c, n in live_counts.items()}
    weights |= {c: 1 / 3 * 1 / 4 for c in MULTI_TURN}
    return weights


def overall(scores: dict[str, tuple[float, int]]) -> dict[str, Any]:
    """BFCL v3 summary scores from `{category: (accuracy, items run)}`. A category not run counts 0, as in
    bfcl_eval; "complete" says whether all 17 were run."""
    acc = {c: scores[c][0] if c in scores else 0.0 for c in CATEGORIES}
    weights = category_weights({c: n for c, (_, n) in scores.items()})

    def part(cats: tuple[str, ...]) -> float:
        w = sum(weights[c] for c in cats)
        return sum(weights[c] * acc[c] for c in cats) / w

    return {"overall": sum(weights[c] * acc[c] for c in CATEGORIES), "non_live": part(NON_LIVE), "live": part(LIVE),
            "multi_turn": part(MULTI_TURN),
            "non_live_ast": (sum(acc[c] for c in ("simple", "java", "javascript")) / 3
                             + sum(acc[c] for c in ("multiple", "parallel", "parallel_multiple"))) / 4,
            "relevance": acc["live_relevance"], "irrelevance": (acc["irrelevance"] + acc["live_irrelevance"]) / 2,
            "complete": all(c in scores for c in CATEGORIES)}
