"""GPQA-Diamond: 198 graduate-level multiple-choice questions (biology, chemistry, physics).

The four options are shuffled by a per-sample seed, so n samples see n orders and a model's letter bias
averages out; the model answers with the letter. A letter means another option in each sample, so maj@n votes
by the option chosen (details["option"]), not by the letter. The data is gated: never print or publish it.

How the letter is asked for and read is the run's extraction (`--gpqa-extraction`, GPQA_EXTRACTIONS): `ours` asks for
\\boxed{X} after the rStar2 problem instruction and reads a boxed or stated letter (choice.py); `simple-evals`
renders simple-evals' prompt alone and reads the letter with its regex, as its gpqa_eval.py does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from rstar2_agent.benchmark_data import SOURCES

from ..base import PAPER, Benchmark, Context, Outcome, Problem, sample_seed
from .choice import LETTERS, grade_choice, simple_evals_letter

TEMPLATE = "{question}\n\n{options}\n\nAnswer with the letter of the correct option, for example \\boxed{{A}}."
# openai/simple-evals common.py QUERY_TEMPLATE_MULTICHOICE, the one user message of its gpqa_eval.py
SIMPLE_EVALS_TEMPLATE = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering."
    "\n\n{Question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}")


@dataclass(frozen=True)
class Extraction:
    """How a GPQA response is asked for and read."""
    template: str  # the prompt: {question} and {options} (ours), or {Question} and {A}..{D} (simple-evals')
    read: Callable[[str], str | None]  # the model's turns -> the letter, None when it names none
    problem_prefix: bool  # the rStar2 templates' math-problem instruction (it asks for \boxed{}) before the prompt
    checker: dict[str, str]  # the receipt (Benchmark.checker)


GPQA_EXTRACTIONS = {
    "ours": Extraction(TEMPLATE, grade_choice, True, {
        "checker": "choice.py: \\boxed{} or a stated letter, the last", "official": "simple-evals' regex",
        "conformance": "2,922/5,000 same letter, the rest documented differences, 0 unexplained "
                       "(rstar2 bench conformance, seed 0)"}),
    "simple-evals": Extraction(SIMPLE_EVALS_TEMPLATE, simple_evals_letter, False, {
        "checker": "choice.py: simple-evals' prompt and regex, the first 'Answer: X'",
        "official": "simple-evals' regex",
        "conformance": "5,000/5,000 same letter (rstar2 bench conformance, seed 0)"}),
}
DEFAULT_GPQA_EXTRACTION = "ours"


class GPQADiamond(Benchmark):
    name = "gpqa_diamond"
    checker = GPQA_EXTRACTIONS[DEFAULT_GPQA_EXTRACTION].checker
    source = SOURCES["gpqa_diamond"]
    # The paper's (section 5.1): GPQA-Diamond is run as the math benchmarks are, with the Figure 3 prompt, avg@16,
    # T 0.6, 30 turns, 30K tokens (top_p and the 30720-token budget as for math: see base.PAPER).
    defaults = PAPER

    def __init__(self, extraction: str = DEFAULT_GPQA_EXTRACTION):
        if extraction not in GPQA_EXTRACTIONS:
            raise ValueError(f"unknown GPQA extraction {extraction!r}; choose one of {', '.join(GPQA_EXTRACTIONS)}")
        self.extraction = extraction
        self.checker = GPQA_EXTRACTIONS[extraction].checker

    def settings(self):
        """The checker's receipt; a run with another extraction than ours also names it (and is another run)."""
        own = {} if self.extraction == DEFAULT_GPQA_EXTRACTION else {"gpqa_extraction": self.extraction}
        return super().settings() | own

    def run_tag(self) -> str:
        """The default run name's tail: another extraction is another run, not a clash with ours."""
        return "" if self.extraction == DEFAULT_GPQA_EXTRACTION else f"-{self.extraction}"

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
        by_letter = dict(zip(LETTERS, opts, strict=True))
        listed = "\n".join(f"{letter}) {text}" for letter, text in by_letter.items())
        text = GPQA_EXTRACTIONS[self.extraction].template.format(question=problem.text, options=listed,
                                                                 Question=problem.text, **by_letter)
        return text, LETTERS[opts.index(problem.answer)]

    async def run(self, problem, sample_index, ctx: Context) -> Outcome:
        text, answer = self.prompt(problem, sample_index, ctx.seed)
        traj = await ctx.agent(text, tools=None if ctx.use_tools else [],
                               seed=sample_seed(ctx.seed, problem.id, sample_index),
                               problem_prefix=GPQA_EXTRACTIONS[self.extraction].problem_prefix)
        outcome = await self.grade(traj, answer, ctx)
        outcome.details.setdefault("question", text)
        if outcome.predicted is not None and outcome.predicted in LETTERS:  # simple-evals' "b" names no option
            opts = self.options(problem, sample_index, ctx.seed)
            outcome.details["option"] = opts[LETTERS.index(outcome.predicted)]
        return outcome

    async def grade(self, traj, gold, ctx: Context) -> Outcome:
        predicted = GPQA_EXTRACTIONS[self.extraction].read(traj.text)
        reason = "engine_error" if traj.stop_reason == "engine_error" else (
            "no_answer" if predicted is None else None)
        return Outcome(traj, predicted == gold, predicted, gold, None if predicted == gold else reason)
