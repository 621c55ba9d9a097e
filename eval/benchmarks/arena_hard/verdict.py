"""Arena-Hard-Auto v0.1's judging (Li et al. 2024, lmarena/arena-hard-auto): the judge's prompt, its verdict
labels, the two games per prompt and the score.

A judge model compares the model's answer with the baseline's (gpt-4-0314) twice: game 1 with the baseline as
assistant A and the model as B, game 2 swapped. Each verdict is one of five labels; from the model's side a win
scores 1, a tie 0.5, a loss 0, and a decisive verdict (`>>`) counts as 3 battles. The score is the mean over all
battles, i.e. the win rate against the baseline (the baseline itself would score 50%), with a percentile bootstrap
over battles (100 rounds, as the benchmark's `show_result.py`). A prompt with a game the judge gave no verdict is
left out, as the benchmark leaves it out.

The judge's system prompt and user template below are the benchmark's own text (the v0.1 judge config,
`config/judge_config.yaml` in lmarena/arena-hard-auto, Apache-2.0), reproduced exactly because the benchmark is
defined by them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BASELINE = "gpt-4-0314"
JUDGE_MODEL = "gpt-4-1106-preview"  # the benchmark's judge for v0.1 (temperature 0, max_tokens 4096)
JUDGE_MAX_TOKENS = 4096
JUDGE_ATTEMPTS = 2  # the v0.1 config's number_of_judgment_attempts: a judgment with no label is asked to finish
WEIGHT = 3  # battles a decisive verdict counts as

JUDGE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to "
    "the user prompt displayed below. You will be given assistant A's answer and assistant B's answer. Your job is "
    "to evaluate which assistant's answer is better.\n\n"
    "Begin your evaluation by generating your own answer to the prompt. You must provide your answers before "
    "judging any answers.\n\n"
    "When evaluating the assistants' answers, compare both assistants' answers with your answer. You must identify "
    "and correct any mistakes or inaccurate information.\n\n"
    "Then consider if the assistant's answers are helpful, relevant, and concise. Helpful means the answer "
    "correctly responds to the prompt or follows the instructions. Note when user prompt has any ambiguity or more "
    "than one interpretation, it is more helpful and appropriate to ask for clarifications or more information from "
    "the user than providing an answer based on assumptions. Relevant means all parts of the response closely "
    "connect or are appropriate to what is being asked. Concise means the response is clear and not verbose or "
    "excessive.\n\n"
    "Then consider the creativity and novelty of the assistant's answers when needed. Finally, identify any missing "
    "important information in the assistants' answers that would be beneficial to include when responding to the "
    "user prompt.\n\n"
    "After providing your explanation, you must output only one of the following choices as your final verdict "
    "with a label:\n\n"
    "1. Assistant A is significantly better: [[A>>B]]\n"
    "2. Assistant A is slightly better: [[A>B]]\n"
    "3. Tie, relatively the same: [[A=B]]\n"
    "4. Assistant B is slightly better: [[B>A]]\n"
    "5. Assistant B is significantly better: [[B>>A]]\n\n"
    "Example output: \"My final verdict is tie: [[A=B]]\"."
)
JUDGE_TEMPLATE = (
    "<|User Prompt|>\n{question}\n\n"
    "<|The Start of Assistant A's Answer|>\n{answer_a}\n<|The End of Assistant A's Answer|>\n\n"
    "<|The Start of Assistant B's Answer|>\n{answer_b}\n<|The End of Assistant B's Answer|>"
)
# what the benchmark's judging asks when a judgment ends without a label (its second attempt)
CONTINUE = "continue your judgment and finish by outputting a final verdict label"

# A's score for each label the judge may write (the five it is asked for, and the mirrored forms of the same
# verdicts); B's is 1 minus it.
A_SCORE = {"A>>B": 1.0, "A>B": 1.0, "A=B": 0.5, "B>A": 0.0, "B>>A": 0.0,
           "A<<B": 0.0, "A<B": 0.0, "B=A": 0.5, "B<A": 1.0, "B<<A": 1.0}
LABELS = ("A>>B", "A>B", "A=B", "B>A", "B>>A")
_DOUBLE = re.compile(r"\[\[([AB<>=]+)\]\]")
_SINGLE = re.compile(r"\[([AB<>=]+)\]")


def parse_verdict(judgment: str) -> str | None:
    """The label of a judgment: the `[[...]]` labels it writes (a single-bracket `[...]` when there is none), read
    from the upper-cased judgment as the benchmark's current code reads it; None when there is no known label, or
    when it writes different ones (the v0.1 code leaves such a judgment without a verdict)."""
    text = judgment.upper()
    found = _DOUBLE.findall(text) or _SINGLE.findall(text)
    labels = {m.strip() for m in found if m.strip()}
    if len(labels) != 1:
        return None
    label = labels.pop()
    return label if label in A_SCORE else None


def game_messages(question: str, answer_a: str, answer_b: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_TEMPLATE.format(question=question, answer_a=answer_a,
                                                              answer_b=answer_b)}]


def model_battles(verdict: str, model_is_a: bool) -> list[float]:
    """The model's battle scores from one game's verdict: 1/0.5/0, three of them for a decisive verdict."""
    a = A_SCORE[verdict]
    score = a if model_is_a else 1.0 - a
    return [score] * (WEIGHT if ">>" in verdict or "<<" in verdict else 1)


def prompt_battles(game1: str | None, game2: str | None) -> list[float]:
    """One prompt's battles: game 1 has the baseline as A and the model as B, game 2 the model as A. A prompt with
    a game without a verdict has none (the benchmark drops it)."""
    if game1 is None or game2 is None:
        return []
    return model_battles(game1, model_is_a=False) + model_battles(game2, model_is_a=True)


@dataclass(frozen=True)
class ArenaScore:
    score: float  # win rate against the baseline, 0-1
    lo: float
    hi: float
    prompts: int  # prompts with both verdicts
    dropped: int  # prompts left out (a game without a verdict)
    battles: int


def arena_score(games: Sequence[tuple[str | None, str | None]], rounds: int = 100, level: float = 0.95,
                seed: int = 0) -> ArenaScore | None:
    """The win rate over every prompt's battles and its percentile bootstrap interval (battles resampled with
    replacement, `rounds` times; the benchmark prints 90%, the paper table here 95%). None when no prompt has
    both verdicts."""
    per_prompt = [prompt_battles(g1, g2) for g1, g2 in games]
    battles = np.array([b for p in per_prompt for b in p], dtype=float)
    if battles.size == 0:
        return None
    rng = np.random.default_rng(seed)
    boots = battles[rng.integers(0, battles.size, (rounds, battles.size))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    kept = sum(bool(p) for p in per_prompt)
    return ArenaScore(float(battles.mean()), float(np.percentile(boots, tail)), float(np.percentile(boots, 100 - tail)),
                      kept, len(per_prompt) - kept, int(battles.size))
