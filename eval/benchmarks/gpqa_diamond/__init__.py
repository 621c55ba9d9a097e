"""GPQA-Diamond: 198 graduate-level multiple-choice questions (biology, chemistry, physics).

The four options are shuffled by a per-sample seed, so n samples see n orders and a model's letter bias
averages out; the model answers with the letter. A letter means another option in each sample, so maj@n votes
by the option chosen (details["option"]), not by the letter. The data is gated: never print or publish it.
"""

from __future__ import annotations

import random

from rstar2_agent.benchmark_data import SOURCES

from ..base import PAPER, Benchmark, Context, Outcome, Problem, sample_seed
from .choice import LETTERS, grade_choice

TEMPLATE = "{question}\n\n{options}\n\nAnswer with the letter of the correct option, for example \\boxed{{A}}."


class GPQADiamond(Benchmark):
    name = "gpqa_diamond"
    checker = {"checker": "choice.py: \\boxed{} or a stated letter, the last", "official": "simple-evals' regex",
               "conformance": "2,922/5,000 same letter, the rest documented differences, 0 unexplained "
                              "(rstar2 bench conformance, seed 0)"}
    source = SOURCES["gpqa_diamond"]
    # The paper's (section 5.1): GPQA-Diamond is run as the math benchmarks are, with the Figure 3 prompt, avg@16,
    # T 0.6, 30 turns, 30K tokens (top_p and the 30720-token budget as for math: see base.PAPER).
    defaults = PAPER

    def problem(self, row, index):
        wrong = [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
        return Problem(str(row["Record ID"]), str(row["Question"]).strip(), str(row["Correct Answer"]).strip(),
                       meta={"incorrect": wrong, "domain": row.get("High-level domain")})

    def options(self, problem: Problem, sample_index: int, seed: int) -> list[str]:
        opts = [problem.answer, *problem.meta["incorrect"]]
        random.Random(sample_seed(seed, problem.id, sample_index)).shuffle(opts)
        return opts

    def prompt(self, problem, sample_index, seed):
        opts = self.options(problem, sample_index, seed)
        listed = "\n".join(f"{letter}) {text}" for letter, text in zip(LETTERS, opts, strict=True))
        return TEMPLATE.format(question=problem.text, options=listed), LETTERS[opts.index(problem.answer)]

    async def run(self, problem, sample_index, ctx: Context) -> Outcome:
        outcome = await super().run(problem, sample_index, ctx)
        if outcome.predicted is not None:
            opts = self.options(problem, sample_index, ctx.seed)
            outcome.details["option"] = opts[LETTERS.index(outcome.predicted)]
        return outcome

    async def grade(self, traj, gold, ctx: Context) -> Outcome:
        predicted = grade_choice(traj.text)
        reason = "engine_error" if traj.stop_reason == "engine_error" else (
            "no_answer" if predicted is None else None)
        return Outcome(traj, predicted == gold, predicted, gold, None if predicted == gold else reason)
