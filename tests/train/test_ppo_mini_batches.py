"""PPO mini-batches (`ppo_mini_batches`): an RL step's kept rollouts cut in order into k mini-batches, each one
optimizer step against the old logprobs every mini-batch took before the first step. With k = 1 (the release's
setting, the default) the update is what it was; with k = 2 the second mini-batch's ratio is off 1, and the schedule
and the policy version still advance once per RL step. On SmolLM2's 2-layer cut, fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_learner_memory import trajectories

from rstar2_agent.train.config import OptimConfig, RLConfig
from rstar2_agent.train.learner.model import TorchLearner
from rstar2_agent.train.learner.update import UpdateConfig, mini_shards, policy_update, ppo_update
from rstar2_agent.train.rl import update_config

ONE = UpdateConfig(micro_batch=2, temperature=1.0, pad_id=2, logprob_chunk_tokens=0)


def fresh(model: str) -> TorchLearner:
    # lr large enough that one step moves the logprobs visibly; a warm-up so the schedule's position shows in the lr
    return TorchLearner(model, OptimConfig(lr=1e-3, warmup_steps=4, schedule="constant"), 8, dtype="fp32")


def test_mini_shards_cut_in_order_and_shard_each_mini_batch_over_the_ranks():
    items = trajectories(7, seed=3)
    cfg = dataclasses.replace(ONE, ppo_mini_batches=3, micro_batch=1)
    per_rank, totals, batches = mini_shards(items, 2, cfg)
    assert len(per_rank) == 2 and all(len(r) == 3 for r in per_rank)
    minis = [[t for r in per_rank for t in r[m]] for m in range(3)]
    assert [len(m) for m in minis] == [2, 2, 3]  # items[0:2], items[2:4], items[4:7]
    for m, want in zip(minis, (items[0:2], items[2:4], items[4:7]), strict=True):
        assert sorted(map(id, m)) == sorted(map(id, want))
    assert totals == [sum(sum(t.response_mask) for t in m) for m in minis]
    assert batches == [max(len(r[m]) for r in per_rank) for m in range(3)]  # micro_batch 1: one per trajectory
    (alone,), _, _ = mini_shards(items[:2], 1, dataclasses.replace(ONE, ppo_mini_batches=5))
    assert [len(m) for m in alone] == [1, 1]  # more mini-batches than rollouts: the empty ones are left out
    none, totals, batches = mini_shards([], 2, cfg)  # nothing kept: one empty step, so the schedule advances
    assert none == [[[]], [[]]] and totals == [0] and batches == [0]


def test_one_mini_batch_is_the_plain_update_and_two_move_the_ratio_with_one_schedule_step(tiny_smollm2):
    items = trajectories(6, seed=1)
    total = sum(sum(t.response_mask) for t in items)
    plain = fresh(tiny_smollm2)
    want = policy_update(plain, items, ONE, total) | plain.optimizer_step()

    one = fresh(tiny_smollm2)
    (minis,), totals, _ = mini_shards(items, 1, ONE)
    got = ppo_update(one, minis, ONE, totals)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6) and got["lr"] == want["lr"]
    assert got["logprob_gap"] < 1e-6 and got["clip_frac"] == 0.0 and got["ppo_mini_batches"] == 1.0
    for (name, a), b in zip(plain.model.named_parameters(), one.model.parameters(), strict=True):
        assert torch.equal(a, b), name

    two_cfg = dataclasses.replace(ONE, ppo_mini_batches=2)
    two = fresh(tiny_smollm2)
    (minis,), totals, _ = mini_shards(items, 1, two_cfg)
    assert len(minis) == 2 and sum(totals) == total
    got2 = ppo_update(two, minis, two_cfg, totals)
    assert got2["ppo_mini_batches"] == 2.0 and got2["logprob_gap"] > 1e-4  # the second ratio is against the old
    assert two.step == one.step == 1  # one policy version per RL step
    assert two.scheduler.get_last_lr() == one.scheduler.get_last_lr()  # the warm-up advanced once, not twice
    assert any(not torch.equal(a, b) for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True))

    empty = ppo_update(two, *mini_shards([], 1, two_cfg)[0], two_cfg, [0])  # a step with nothing kept
    assert two.step == 2 and empty["grad_norm"] == 0.0 and empty["ppo_mini_batches"] == 1.0


def test_the_recipe_carries_ppo_mini_batches_to_the_update_and_refuses_zero():
    assert update_config(RLConfig(ppo_mini_batches=4), pad_id=0).ppo_mini_batches == 4
    assert update_config(RLConfig(), pad_id=0).ppo_mini_batches == 1
    with pytest.raises(ValueError, match="ppo_mini_batches must be a whole number, at least 1"):
        update_config(RLConfig(ppo_mini_batches=0), pad_id=0)
