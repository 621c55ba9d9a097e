"""Resample-on-Correct: the penalty as the design states it, all-equal groups dropped and the split counts, the paper's
sampler following 1/p, and against the release's down-sampling (microsoft/rStar rstar2_agent/down_sample/): G below the
minimum of both sides is refused unless one of each side is asked for, and then a mixed group keeps both; the
counts follow the release's order; "topk" ranks positives by the penalty the release computes on the response
text, on trajectories built turn by turn where that penalty and ours disagree."""

from __future__ import annotations

import functools
import random
from collections import Counter

import pytest

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.train.config import RLConfig
from rstar2_agent.train.rl import RLRun
from rstar2_agent.train.roc import (
    Group,
    RolloutStats,
    _weighted_sample,
    check_sizes,
    penalty,
    release_error_ratio,
    release_format_penalty,
    release_penalty,
    resample_on_correct,
    split_counts,
)
from rstar2_agent.train.rollout.rollouts import rollout_stats
from rstar2_agent.trajectory import ToolCallRecord, Trajectory, Turn


def rs(reward, calls=1, errors=0, blocks=1, ok=True, turns=2):
    return RolloutStats(reward, calls, errors, blocks, ok, turns)


def test_penalty_follows_the_design():
    assert penalty(rs(1, calls=4, errors=1)) == pytest.approx(0.25)
    assert penalty(rs(1, calls=0)) == pytest.approx(0.5)  # no tool call
    assert penalty(rs(1, ok=False)) == pytest.approx(1.0)  # no well-formed answer
    assert penalty(rs(1, blocks=3, turns=4)) == pytest.approx(0.5)  # extra answer blocks


def test_all_equal_groups_are_dropped_and_counts_follow_the_split():
    same = Group(list("abcdefgh"), [rs(1)] * 8)
    zero = Group(list("abcdefgh"), [rs(0)] * 8)
    mixed = Group(list(range(8)), [rs(1)] * 6 + [rs(0)] * 2)
    kept, stats = resample_on_correct([same, zero, mixed], g=4, seed=0, sizes="release")
    assert stats.dropped_all_equal == 2 and len(kept) == 1 and len(kept[0]) == 4
    assert stats.kept_positive == 2 and stats.kept_negative == 2  # at least 2 of each side
    kept, stats = resample_on_correct([mixed], g=4, seed=0)  # the paper's: half the negatives, the rest positives
    assert stats.kept_positive == 3 and stats.kept_negative == 1
    release = functools.partial(split_counts, sizes="release")
    assert release(6, 2, 4) == (2, 2) and release(1, 7, 4) == (1, 3) and release(4, 4, 4) == (2, 2)
    assert release(12, 4, 8) == (6, 2) and release(3, 0, 8) == (3, 0)


def test_topk_keeps_the_lowest_release_penalties():
    stats = [RolloutStats(1, release_penalty=p) for p in (0.5, 0.0, 1.0, 0.2)] + [rs(0)] * 4
    kept, _ = resample_on_correct([Group(list(range(8)), stats)], g=4, seed=0, positive_sampling="topk",
                                  sizes="release")
    positives = [i for i in kept[0] if i < 4]
    assert positives == [1, 3]  # penalties 0.0 and 0.2 beat 0.5 and 1.0 (below: the release's penalty)


def test_the_paper_sampler_follows_inverse_penalty():
    weights = [1 / 0.25, 1 / 0.5, 1 / 1.0, 1 / 1.5]
    rng = random.Random(0)
    counts = Counter(_weighted_sample([0, 1, 2, 3], weights, 1, rng)[0] for _ in range(40000))
    total = sum(weights)
    for i, w in enumerate(weights):
        assert counts[i] / 40000 == pytest.approx(w / total, abs=0.01)
    chi2 = sum((counts[i] - 40000 * w / total) ** 2 / (40000 * w / total) for i, w in enumerate(weights))
    assert chi2 < 16.3  # p > 0.001 with 3 degrees of freedom




# ---------------------------------------------------------------------------------------------- G and the minimums
def test_g_below_the_minimum_of_both_sides_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=r"group_size \(G\) = 2 .*group_size >= 4.*roc_min_positive=1"):
        check_sizes(2)
    with pytest.raises(ValueError, match="group_size >= 4"):
        resample_on_correct([Group([0, 1, 2, 3], [RolloutStats(1.0)] + [RolloutStats(0.0)] * 3)], g=2, seed=0)
    with pytest.raises(ValueError, match="at least 1"):
        check_sizes(4, min_positive=0)
    with pytest.raises(ValueError, match="group_size >= 4"):  # refused before any model is loaded
        RLRun(RLConfig(model="no-such-model", group_size=2, out=str(tmp_path)))
    check_sizes(4)
    check_sizes(2, min_positive=1, min_negative=1)
    RLConfig(group_size=2, roc=False)  # plain GRPO keeps every rollout: nothing to refuse


@pytest.mark.parametrize("positive_sampling", ["paper", "topk"])
def test_with_one_of_each_side_a_mixed_group_at_g2_keeps_a_positive_and_a_negative(positive_sampling):
    for n_pos in (1, 2, 3):  # every mixed group of 2G = 4
        stats = [RolloutStats(1.0 if i < n_pos else 0.0, release_penalty=0.5) for i in range(4)]
        for seed in range(20):
            kept, roc = resample_on_correct([Group(list(range(4)), stats)], g=2, seed=seed,
                                            positive_sampling=positive_sampling, min_positive=1, min_negative=1)
            assert len(kept[0]) == 2 and roc.kept_positive == 1 and roc.kept_negative == 1


def test_the_counts_follow_the_release_order_and_rounding():
    release = functools.partial(split_counts, sizes="release")
    # the negatives' floor is applied first, then the positives'; Python's round (half to even) on each side
    assert release(1, 7, 4) == (1, 3) and release(7, 1, 4) == (3, 1)
    assert release(3, 5, 4) == (2, 2) and release(5, 3, 4) == (2, 2)
    assert release(1, 31, 16) == (1, 15) and release(31, 1, 16) == (15, 1)
    assert release(3, 29, 16) == (2, 14) and release(9, 23, 16) == (4, 12)
    assert release(5, 5, 5) == (3, 2)  # both round 2.5 to 2: the negatives' floor (2, inclusive) comes first
    assert release(7, 7, 7) == (4, 3)  # both round 3.5 to 4 (the release's assert stops here): the negatives
    # take G minus the positives
    assert release(3, 1, 4) == (3, 1)  # a group of G is kept whole
    for g in range(4, 17):  # any mixed 2G: G in total, both sides at least 2
        for n_pos in range(1, 2 * g):
            p, n = release(n_pos, 2 * g - n_pos, g)
            assert p + n == g and p >= min(2, n_pos) and n >= min(2, 2 * g - n_pos)


def test_the_paper_sizes_keep_half_the_negatives_and_the_rest_positives():
    # 2G = 32 rollouts down to G = 16: half the negatives (rounded up), the positives the rest; no floors of 2
    assert split_counts(27, 5, 16) == (13, 3) and split_counts(16, 16, 16) == (8, 8)
    assert split_counts(2, 30, 16) == (1, 15) and split_counts(31, 1, 16) == (15, 1)  # a lone negative is kept
    assert split_counts(3, 1, 4) == (3, 1)  # a group of G is kept whole
    assert split_counts(2, 10, 4) == (1, 3)  # half the negatives (5) leave room for one positive of G = 4
    for g in range(2, 17):  # any mixed 2G: G in total, both sides kept, the negatives half (up to G - 1)
        for n_pos in range(1, 2 * g):
            n_neg = 2 * g - n_pos
            p, n = split_counts(n_pos, n_neg, g)
            assert p + n == g and p >= 1 and n >= 1 and n == min(-(-n_neg // 2), g - 1)
    with pytest.raises(ValueError, match="roc_sizes must be one of paper, release"):
        check_sizes(4, sizes="half")


# ---------------------------------------------------------------------------------------------- the release's p
def test_the_release_penalty_on_text():
    ok = "<tool_response>\n{\"status\": \"success\", \"stdout\": \"4\"}\n</tool_response>"
    bad = "<tool_response>\nNameError: x\n</tool_response>"
    assert release_error_ratio("no calls") == 0.5
    assert release_error_ratio(ok + bad + bad) == pytest.approx(2 / 3)
    later = "<|im_start|>assistant\n<answer>\\boxed{4}</answer><|im_end|>"  # a turn after the first, closed
    assert release_format_penalty("<answer>\\boxed{4}</answer><|im_end|>") == 1.0  # one turn: no later turn
    assert release_format_penalty("call<|im_end|>" + ok + later) == 0.0
    assert release_format_penalty("<answer>1</answer> call<|im_end|>" + ok + later) == 1.0  # 2 blocks, 1 turn
    assert release_format_penalty("<answer>1 call<|im_end|>" + ok + later) == 1.0  # an unclosed <answer>
    assert release_format_penalty("call<|im_end|>" + ok + later[:-len("<|im_end|>")]) == 1.0  # the turn was cut
    assert release_penalty("call<|im_end|>" + bad + later) == 1.0


def build(fmt: ChatFormat, turns: list[tuple[str, list[ToolCallRecord]]]) -> Trajectory:
    """A trajectory as the loop builds it: each turn's ids, then the ids of its tool responses (mask 0)."""
    traj = Trajectory(prompt_ids=fmt.render_prompt("What is 2 + 2?"))
    for text, calls in turns:
        ids = fmt.encode(text)
        traj.add_generated(ids, [-0.5] * len(ids))
        turn = Turn(text, len(ids), "stop", calls)
        traj.turns.append(turn)
        if calls:
            inserted = fmt.tool_response_ids([c.response for c in calls], text.endswith(fmt.eos_text), text)
            traj.add_inserted(inserted)
            turn.inserted_tokens = len(inserted)
    return traj


def call(status: str, response: str) -> ToolCallRecord:
    return ToolCallRecord(0, "c", "python_code_with_standard_io", {"code": "...", "input": ""}, "...", status=status,
                          response=response)


def test_topk_ranks_by_what_the_release_counts_not_by_our_counts(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer, "hermes")
    eos = fmt.eos_text
    code = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "...", "input": ""}}\n' \
           '</tool_call>' + eos
    answer = "<answer>The answer is \\boxed{4}.</answer>" + eos
    timeout = '{"name": "python_code_with_standard_io", "status": "failure: timeout", "stdout": "", "stderr": ""}'
    printed = '{"name": "python_code_with_standard_io", "status": "success", "stdout": "error-free", "stderr": ""}'
    four = '{"name": "python_code_with_standard_io", "status": "success", "stdout": "4", "stderr": ""}'
    rollouts = {
        # no call, one turn: ours 0.5 + 0; the release has no turn after the first: 0.5 + 1
        "direct": ([(answer, [])], 0.5, 1.5),
        # a timed-out call then the answer: ours counts a failed call (1 + 0); the release finds no "error": 0 + 0
        "timeout": ([(code, [call("timeout", timeout)]), (answer, [])], 1.0, 0.0),
        # a run that prints "error-free": ours 0 + 0; the release reads it as an error: 1 + 0
        "printed": ([(code, [call("ok", printed)]), (answer, [])], 0.0, 1.0),
        # an early answer, a check, the answer again: ours (2-1)/2 turns; the release (2-1)/1 turn after the first
        "twice": ([("<answer>\\boxed{4}</answer> Let me check.\n" + code, [call("ok", four)]), (answer, [])], 0.5, 1.0),
    }
    stats = {}
    for name, (turns, ours, release) in rollouts.items():
        s = rollout_stats(build(fmt, turns), 1.0, fmt)
        assert (penalty(s), s.release_penalty) == pytest.approx((ours, release)), name
        stats[name] = s

    names = ["direct", "twice", "timeout"] + ["wrong"] * 5
    group = [stats[n] if n in stats else RolloutStats(0.0, release_penalty=1.5) for n in names]
    kept, _ = resample_on_correct([Group(names, group)], g=4, seed=0, positive_sampling="topk", sizes="release")
    assert sorted(n for n in kept[0] if n != "wrong") == ["timeout", "twice"]  # release p 0.0 and 1.0 beat 1.5
    assert sorted(["direct", "twice", "timeout"], key=lambda n: penalty(stats[n]))[:2] == ["direct", "twice"]  # ours

    # negatives: the first ones in rollout order, as the release keeps them (whatever the seed)
    order = ["twice", "timeout"] + [f"wrong{i}" for i in range(6)]
    mixed = [stats["twice"], stats["timeout"]] + [RolloutStats(0.0, release_penalty=1.5)] * 6
    for seed in range(5):
        kept, _ = resample_on_correct([Group(order, mixed)], g=4, seed=seed, positive_sampling="topk", sizes="release")
        assert kept[0] == ["twice", "timeout", "wrong0", "wrong1"]

    with pytest.raises(ValueError, match="release_penalty"):
        resample_on_correct([Group(names, [RolloutStats(float(n != "wrong")) for n in names])], g=4, seed=0,
                            positive_sampling="topk", sizes="release")
