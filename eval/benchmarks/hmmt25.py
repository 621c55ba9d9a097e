"""HMMT February 2025: 30 problems with LaTeX answers (one has two values, "a, b")."""

from rstar2_agent.benchmark_data import SOURCES

from .base import PAPER, MathBenchmark, Problem


class HMMT25(MathBenchmark):
    name = "hmmt25"
    source = SOURCES["hmmt25"]
    defaults = PAPER  # the paper's HMMT25 setting: avg@16, T 0.6, 30 turns; 30720 tokens (release script); top_p 1

    def problem(self, row, index):
        return Problem(str(row["problem_idx"]), row["problem"], str(row["answer"]))
