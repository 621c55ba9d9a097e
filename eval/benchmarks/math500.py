"""MATH-500: the 500-problem test split of MATH chosen by OpenAI's PRM800K, LaTeX answers."""

from .base import MathBenchmark, Problem


class MATH500(MathBenchmark):
    name = "math500"
    hub_id, split, file = "HuggingFaceH4/MATH-500", "test", "math500.jsonl"
    columns = ("unique_id", "problem", "answer", "subject", "level")

    def problem(self, row, index):
        return Problem(row["unique_id"], row["problem"], str(row["answer"]),
                       {"subject": row.get("subject"), "level": row.get("level")})
