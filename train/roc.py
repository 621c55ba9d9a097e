"""Resample-on-Correct (GRPO-RoC, rStar2-Agent section 2.2): from 2G rollouts of a prompt keep G.

The order and sizes follow the release's down-sampling (microsoft/rStar, rstar2_agent/down_sample/:
`reject_equal_reward`, then `resample_of_correct`, as its run script configures them):
1. Groups whose rewards are all equal carry no signal and are dropped.
2. The sizes of the two sides (`split_counts`), one of two (`roc_sizes`):
   - `"paper"` (default; section 2.2): half the negatives (rounded up, so a mixed group keeps one), the rest of
     the G positives; where the positives run short the negatives fill the rest.
   - `"release"`: each side round(its share x G) (half to even), raised to at least `min_negative` negatives,
     then at least `min_positive` positives, when the group has them (the release's min_zero_reward_trace_num
     and min_non_zero_reward_trace_num, both 2).
   G below min_positive + min_negative is refused (`check_sizes`), as the release's assert refuses it;
   min_positive = min_negative = 1 is the named option for G = 2 or 3.
3. Negatives: `"paper"` keeps them uniformly at random (the paper); `"topk"` keeps the first ones in rollout
   order, as the release's `resample_of_correct` does since its commit "rm sort for negative samples" (#50).
4. Positives are kept by a penalty, one of two:
   - `positive_sampling="paper"` (default): with probability inversely proportional to p = p_err + p_format
     counted on the trajectory (`penalty`: failed calls / calls, 0.5 without a call; 1 without a well-formed
     <answer> block, else min(1, (answer blocks - 1) / turns)).
   - `"topk"`: the lowest-first ranking of the release's `resample_of_correct`, on the penalty its
     `calc_error_ratio_penalty_weights` + `calc_format_penalty_weights` compute from the decoded response
     text (`release_penalty`, set on `RolloutStats.release_penalty`), ties kept in rollout order.
A pure function: the same rollouts and seed give the same choice.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
EPS = 1e-3  # keeps 1/p finite for a flawless positive (p = 0)


@dataclass(frozen=True)
class RolloutStats:
    """What RoC needs to know about a rollout."""
    reward: float
    tool_calls: int = 0
    tool_errors: int = 0
    answer_blocks: int = 0  # <answer> blocks written
    well_formed_answer: bool = False  # one final <answer> block with \\boxed{}
    turns: int = 1
    release_penalty: float | None = None  # `release_penalty` of the decoded response; "topk" ranks by it


def penalty(r: RolloutStats) -> float:
    """p_err (failed calls / calls, 0.5 with no call) + p_format (1 without a well-formed answer, else
    min(1, (answer blocks - 1) / turns))."""
    p_err = r.tool_errors / r.tool_calls if r.tool_calls else 0.5
    p_format = 1.0 if not r.well_formed_answer else min(1.0, (r.answer_blocks - 1) / max(1, r.turns))
    return p_err + p_format


# ---------------------------------------------------------------------------------------------- the release's p
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_HEADED_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


def release_error_ratio(response: str) -> float:
    """The release's p_err (`calc_error_ratio_penalty_weights`): of the `<tool_response>` blocks in the response,
    the share whose text contains "error" (any case); 0.5 without one. So it counts the results the model was
    shown (not a turn's calls that were never answered), a failure reported without the word (a timeout) counts
    as a success, and a success that prints "error" as a failure."""
    blocks = _TOOL_RESPONSE.findall(response)
    if not blocks:
        return 0.5
    return sum("error" in b.lower() for b in blocks) / len(blocks)


def release_format_penalty(response: str) -> float:
    """The release's p_format (`calc_format_penalty_weights`): 1 unless `<answer>` and `</answer>` both occur, each
    exactly as often as closed `<answer>...</answer>` blocks (anywhere in the response, tool responses included;
    no \\boxed{} check); else min(1, (blocks - 1) / turns) where turns counts `<|im_start|>assistant ...
    <|im_end|>` spans: the assistant turns after the first (the first's header is in the prompt) that ended with
    <|im_end|>. No such turn (a one-turn answer) gives 1."""
    opened, closed = response.count("<answer>"), response.count("</answer>")
    if not opened or not closed:
        return 1.0
    blocks = len(_ANSWER_BLOCK.findall(response))
    if opened != blocks or closed != blocks:
        return 1.0
    turns = len(_HEADED_TURN.findall(response))
    if not turns:
        return 1.0
    return min((blocks - 1) / turns, 1.0)


def release_penalty(response: str) -> float:
    """The release's p on one decoded response (special tokens kept, tool responses included), with its
    roc_error_ratio and roc_answer_format both on as its run script sets them. Its text rules assume ChatML turns
    and Hermes `<tool_response>` blocks (the hermes and rstar2-release formats); under markdown every positive
    scores 1.5 and "topk" keeps them in rollout order."""
    return release_error_ratio(response) + release_format_penalty(response)


# ---------------------------------------------------------------------------------------------- down-sampling
@dataclass
class RoCStats:
    groups: int = 0
    dropped_all_equal: int = 0
    kept_positive: int = 0
    kept_negative: int = 0
    positives: int = 0  # in the kept groups, before down-sampling
    negatives: int = 0
    mean_penalty_positive: float = 0.0  # over all positives of the kept groups (the penalty the sampler used)
    mean_penalty_kept_positive: float = 0.0


@dataclass
class Group(Generic[T]):
    items: list[T]
    stats: list[RolloutStats] = field(default_factory=list)


def _weighted_sample(idx: list[int], weights: list[float], k: int, rng: random.Random) -> list[int]:
    """k of idx without replacement, each draw with probability proportional to its weight."""
    idx, weights, out = list(idx), list(weights), []
    for _ in range(min(k, len(idx))):
        pick = rng.choices(range(len(idx)), weights=weights)[0]
        out.append(idx.pop(pick))
        weights.pop(pick)
    return out


def check_sizes(g: int, min_positive: int = 2, min_negative: int = 2, sizes: str = "paper") -> None:
    """Refuse a G that cannot keep the minimum of both sides of a mixed group (the release asserts the same), and
    sizes that are neither the paper's nor the release's."""
    if sizes not in ROC_SIZES:
        raise ValueError(f"roc_sizes must be one of {', '.join(ROC_SIZES)}, not {sizes!r}")
    if min_positive < 1 or min_negative < 1:
        raise ValueError(f"roc_min_positive ({min_positive}) and roc_min_negative ({min_negative}) must be at least 1,"
                         " or a mixed group can lose all its positives or negatives")
    if g < min_positive + min_negative:
        raise ValueError(
            f"group_size (G) = {g} is below roc_min_positive + roc_min_negative = {min_positive + min_negative}: "
            f"Resample-on-Correct keeps at least {min_positive} positive(s) and {min_negative} negative(s) of a mixed "
            f"group. Use group_size >= {min_positive + min_negative} (the release keeps 16 of 32 with both at 2), "
            "or set roc_min_positive=1 and roc_min_negative=1 to keep at least one of each side with G = 2 or 3")


ROC_SIZES = ("paper", "release")


def split_counts(n_pos: int, n_neg: int, g: int, min_positive: int = 2, min_negative: int = 2,
                 sizes: str = "paper") -> tuple[int, int]:
    """How many positives and negatives to keep out of a group, G in total. `paper`: half the negatives, rounded
    up, the positives the rest (the negatives filling what the positives cannot). `release`, as the release's
    `resample_of_correct`: each side round(share x G) (Python's round: half to even); the negatives raised to
    min(min_negative, n_neg), the positives to min(min_positive, n_pos), in that order, the other side taking the
    rest. Where the two roundings miss G (odd G with a tie; the release stops on its assert there) the negatives
    take the difference. A group of at most G rollouts is kept whole."""
    total = n_pos + n_neg
    if total <= g:
        return n_pos, n_neg
    if sizes == "paper":
        keep_neg = min(-(-n_neg // 2), g - (1 if n_pos else 0))
        keep_pos = min(n_pos, g - keep_neg)
        return keep_pos, g - keep_pos
    keep_neg, keep_pos = round(n_neg * g / total), round(n_pos * g / total)
    floor_neg, floor_pos = min(min_negative, n_neg), min(min_positive, n_pos)
    if keep_neg <= floor_neg:
        keep_neg, keep_pos = floor_neg, g - floor_neg
    if keep_pos <= floor_pos:
        keep_pos = floor_pos
    return keep_pos, g - keep_pos


def resample_on_correct(groups: Sequence[Group[T]], g: int, seed: int, positive_sampling: str = "paper",
                        min_positive: int = 2, min_negative: int = 2, sizes: str = "paper"
                        ) -> tuple[list[list[T]], RoCStats]:
    if positive_sampling not in ("paper", "topk"):
        raise ValueError(f"positive_sampling must be paper or topk, not {positive_sampling!r}")
    check_sizes(g, min_positive, min_negative, sizes)
    rng = random.Random(seed)
    stats = RoCStats(groups=len(groups))
    kept_groups: list[list[T]] = []
    pen_all: list[float] = []
    pen_kept: list[float] = []
    for group in groups:
        rewards = [s.reward for s in group.stats]
        if len(set(rewards)) <= 1:
            stats.dropped_all_equal += 1
            continue
        pos = [i for i, s in enumerate(group.stats) if s.reward > 0]
        neg = [i for i, s in enumerate(group.stats) if s.reward <= 0]
        n_pos, n_neg = split_counts(len(pos), len(neg), g, min_positive, min_negative, sizes)
        if positive_sampling == "topk":
            penalties = {i: _release_penalty_of(group.stats[i]) for i in pos}
            chosen_pos = sorted(pos, key=lambda i: (penalties[i], i))[:n_pos]
        else:
            penalties = {i: penalty(group.stats[i]) for i in pos}
            chosen_pos = _weighted_sample(pos, [1.0 / (penalties[i] + EPS) for i in pos], n_pos, rng)
        chosen_neg = neg[:n_neg] if positive_sampling == "topk" else rng.sample(neg, n_neg)
        keep = sorted(chosen_pos + chosen_neg)
        kept_groups.append([group.items[i] for i in keep])
        stats.positives += len(pos)
        stats.negatives += len(neg)
        stats.kept_positive += len(chosen_pos)
        stats.kept_negative += len(chosen_neg)
        pen_all += [penalties[i] for i in pos]
        pen_kept += [penalties[i] for i in chosen_pos]
    stats.mean_penalty_positive = sum(pen_all) / len(pen_all) if pen_all else 0.0
    stats.mean_penalty_kept_positive = sum(pen_kept) / len(pen_kept) if pen_kept else 0.0
    return kept_groups, stats


def _release_penalty_of(r: RolloutStats) -> float:
    if r.release_penalty is None:
        raise ValueError("positive_sampling='topk' ranks by the release's penalty on the response text: build "
                         "RolloutStats with release_penalty=release_penalty(decoded response)")
    return r.release_penalty
