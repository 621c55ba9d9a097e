"""The benchmarks `rstar2 eval` knows, by name."""

from __future__ import annotations

from .aime24 import AIME24
from .aime25 import AIME25
from .base import PAPER, Benchmark, Context, DataError, Outcome, Problem, RunDefaults
from .gpqa_diamond import GPQADiamond
from .hmmt25 import HMMT25
from .math500 import MATH500
from .synthetic import Synthetic

__all__ = ["BENCHMARKS", "PAPER", "Benchmark", "Context", "DataError", "Outcome", "Problem", "RunDefaults",
           "get_benchmark"]

BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (AIME24, AIME25, HMMT25, MATH500, GPQADiamond,
                                                                    Synthetic)}


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise DataError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)} "
                        "(several at once as a comma list)")
    return BENCHMARKS[name]()
