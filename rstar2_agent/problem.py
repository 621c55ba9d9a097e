"""What eval and RL both pose to the model: a problem. An eval benchmark loads its problems and grades a sample of
each (eval/benchmarks/base.py); an RL stage draws its prompts from a pool of them and rewards a rollout by its answer
(train/data/pool.py). The generators (synthetic.py, training's tool tasks) make problems with a program that
solves them, as subclasses that add it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One problem: `text` as its source words it (a benchmark's template, the chat format's prefix come on top),
    the `answer` a response is graded against, and the `source` it came from, which says what grades it: an eval
    benchmark by its own `grade` (math-verify, an option letter, IFEval's checks, a judge), every RL source by the
    math grader. `meta` holds what a source keeps beside (GPQA's wrong options, IFEval's instructions); it takes no
    part in equality."""
    id: str
    text: str
    answer: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
