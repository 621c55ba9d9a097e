"""AIME 2024: 30 problems, integer answers 0-999 (some written with leading zeros, e.g. "073")."""

from rstar2_agent.benchmark_data import SOURCES

from .base import PAPER, MathBenchmark, Problem


class AIME24(MathBenchmark):
    name = "aime24"
    source = SOURCES["aime24"]
    defaults = PAPER  # the paper's AIME24 setting: avg@16, T 0.6, 30 turns; 30720 tokens (release script); top_p 1

    def problem(self, row, index):
        return Problem(str(row["id"]), row["problem"], str(row["answer"]), meta={"url": row.get("url")})
