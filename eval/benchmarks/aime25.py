"""AIME 2025 (I and II): 30 problems, integer answers 0-999."""

from .base import PAPER, MathBenchmark, Problem


class AIME25(MathBenchmark):
    name = "aime25"
    hub_id, split, file = "math-ai/aime25", "test", "aime25.jsonl"
    columns = ("id", "problem", "answer")
    defaults = PAPER  # the paper's AIME25 setting: avg@16, T 0.6, top_p 0.95, 30 turns; 30720 tokens (release script)

    def problem(self, row, index):
        return Problem(str(row["id"]), row["problem"], str(row["answer"]))
