"""Resample-on-Correct (GRPO-RoC, rStar2-Agent section 2.2): from 2G rollouts of a prompt keep G.

Groups whose rewards are all equal carry no signal and are dropped. The kept counts follow the group's
share of positives and negatives, with at least 2 of each side when the group has them. Negatives are kept
uniformly at random. Positives are kept by their penalty p = p_err + p_format (p_err: failed tool calls / tool
calls, 0.5 without a call; p_format: 1 without a well-formed <answer> block, else min(1, (answer blocks - 1) /
turns); see `penalty`): with probability inversely proportional to p (the paper, `positive_sampling="paper"`)
or the lowest-p top-k (the released code, `"topk"`). A pure function: the same rollouts and seed give the same choice.
"""

from __future__ import annotations

import random
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


def penalty(r: RolloutStats) -> float:
    """p_err (failed calls / calls, 0.5 with no call) + p_format (1 without a well-formed answer, else
    min(1, (answer blocks - 1) / turns))."""
    p_err = r.tool_errors / r.tool_calls if r.tool_calls else 0.5
    p_format = 1.0 if not r.well_formed_answer else min(1.0, (r.answer_blocks - 1) / max(1, r.turns))
    return p_err + p_format


@dataclass
class RoCStats:
    groups: int = 0
    dropped_all_equal: int = 0
    kept_positive: int = 0
    kept_negative: int = 0
    positives: int = 0  # in the kept groups, before down-sampling
    negatives: int = 0
    mean_penalty_positive: float = 0.0  # over all positives of the kept groups
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


def split_counts(n_pos: int, n_neg: int, g: int) -> tuple[int, int]:
    """How many positives and negatives to keep out of a group, G in total."""
    total = n_pos + n_neg
    g = min(g, total)
    keep_pos = round(g * n_pos / total)
    keep_pos = max(keep_pos, min(2, n_pos))
    keep_neg = g - keep_pos
    if keep_neg < min(2, n_neg):
        keep_neg = min(2, n_neg)
        keep_pos = g - keep_neg
    return min(keep_pos, n_pos), min(keep_neg, n_neg)


def resample_on_correct(groups: Sequence[Group[T]], g: int, seed: int, positive_sampling: str = "paper"
                        ) -> tuple[list[list[T]], RoCStats]:
    if positive_sampling not in ("paper", "topk"):
        raise ValueError(f"positive_sampling must be paper or topk, not {positive_sampling!r}")
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
        n_pos, n_neg = split_counts(len(pos), len(neg), g)
        penalties = {i: penalty(group.stats[i]) for i in pos}
        if positive_sampling == "topk":
            chosen_pos = sorted(pos, key=lambda i: (penalties[i], i))[:n_pos]
        else:
            chosen_pos = _weighted_sample(pos, [1.0 / (penalties[i] + EPS) for i in pos], n_pos, rng)
        chosen_neg = rng.sample(neg, n_neg)
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
