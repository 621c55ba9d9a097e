"""AIME 2025 (I and II): 30 problems, integer answers 0-999."""

from rstar2_agent.benchmark_data import SOURCES

from .base import PAPER, MathBenchmark, Problem


class AIME25(MathBenchmark):
    name = "aime25"
    source = SOURCES["aime25"]
    defaults = PAPER  # the paper's AIME25 setting: avg@16, T 0.6, 30 turns; 30720 tokens (release script); top_p 1

    def problem(self, row, index):
        return Problem(str(row["id"]), row["problem"], str(row["answer"]))
