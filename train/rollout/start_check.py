"""The hand-off from SFT to RL, checked on the first step's own rollouts (no extra generation): before the first
update, the share of rollouts whose answer the reward can read at all, and the share of groups with signal (some
right, some wrong). RL's reward is 0 without a readable answer, so a starting policy that never writes one (an SFT
that did not teach the format the RL prompts ask for, or a `format` / `answer_extraction` other than SFT's) gives
every group the same reward: GRPO-RoC drops them all and the run spends its steps learning nothing. Such a run stops
here, before anything is updated or saved, with what to fix. A resumed run past step 0 is not checked again."""

from __future__ import annotations

from rstar2_agent.chat_format import answer_scope, extract_answer

from ..config import StartCheck
from .rollouts import Batch, without_engine_errors

CUT_OFF = ("max_tokens", "max_turns", "engine_error")  # what the reward scores 0 whatever the answer (rollouts.py)


class BlindStart(RuntimeError):
    """The first step's rollouts show a policy RL cannot learn from."""


def start_figures(batch: Batch, extraction: str) -> dict[str, float]:
    """The step's answer share (among rollouts that did not fail in the engine), signal share (among groups with
    such rollouts), and the counts they are over."""
    groups = [g for g in without_engine_errors(batch.groups) if g]
    rollouts = [(t, r) for g in groups for t, r in g]
    answered = sum(r > 0 or (t.stop_reason not in CUT_OFF
                             and extract_answer(answer_scope(t, extraction), extraction) is not None)
                   for t, r in rollouts)  # r > 0: the release's extraction also reads answers without a \boxed{}
    signal = sum(0 < sum(r > 0 for _, r in g) < len(g) for g in groups)
    return {"start_answer_share": answered / len(rollouts) if rollouts else 0.0,
            "start_signal_share": signal / len(groups) if groups else 0.0,
            "start_rollouts": float(len(rollouts)), "start_groups": float(len(groups))}


def check_start(check: StartCheck, figures: dict[str, float], model: str, fmt: str, extraction: str) -> None:
    """Raise `BlindStart` naming each threshold the figures miss and what to do about it."""
    n, groups = int(figures["start_rollouts"]), int(figures["start_groups"])
    problems: list[str] = []
    if figures["start_answer_share"] < check.min_answer_share:
        problems.append(
            f"{figures['start_answer_share']:.1%} of its {n} rollouts end with an answer the reward can read "
            f"(format {fmt!r}, answer_extraction {extraction!r}; start_check.min_answer_share is "
            f"{check.min_answer_share:g}), so nearly every reward is 0. Start from an SFT checkpoint whose targets end "
            "in this format's answer (for the rStar2 formats <answer>...\\boxed{}...</answer>), or set `format` and "
            "`answer_extraction` to what SFT taught")
    if figures["start_signal_share"] < check.min_signal_share:
        problems.append(
            f"{figures['start_signal_share']:.1%} of its {groups} groups have both a right and a wrong rollout "
            f"(start_check.min_signal_share is {check.min_signal_share:g}), and GRPO-RoC learns only from those: "
            "choose problems nearer the policy's level (stage data, filter_solved) or a larger group_size")
    if problems:
        raise BlindStart(f"the starting policy {model} would start RL blind: " + "; and ".join(problems) +
                         ". Nothing was updated or saved; set the start_check thresholds to 0 to start anyway.")
