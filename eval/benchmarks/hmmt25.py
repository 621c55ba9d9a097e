"""HMMT February 2025: 30 problems with LaTeX answers (one has two values, "a, b")."""

from .base import PAPER, MathBenchmark, Problem


class HMMT25(MathBenchmark):
    name = "hmmt25"
    hub_id, split, file = "MathArena/hmmt_feb_2025", "train", "hmmt_feb_2025.jsonl"
    columns = ("problem_idx", "problem", "answer")
    defaults = PAPER  # the paper's HMMT25 setting: avg@16, T 0.6, top_p 0.95, 30 turns; 30720 tokens (release script)

    def problem(self, row, index):
        return Problem(str(row["problem_idx"]), row["problem"], str(row["answer"]))
