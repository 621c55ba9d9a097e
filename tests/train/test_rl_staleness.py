"""Bounded staleness (`max_staleness`, train/rollout/version_gate.py): the version gate on the real in-process vLLM
engine (a push waits for whole rollouts, or interrupts and continues partial ones with every token's version kept), and
`run_rl` with max_staleness 1 on the session's shared engine (both on the tiny SmolLM2: the gate's and the loss's
properties hold for any policy): the lag stays within the bound, is above 0 where the
schedule overlaps, the loss gets the behaviour weights, each step is stored once with its rollouts' versions."""

from __future__ import annotations

import asyncio
import os

import pytest

from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.train.config import CheckpointConfig, RLConfig, Stage, StartCheck
from rstar2_agent.train.data.pool import draw, stage_pool
from rstar2_agent.train.rl import RLRun, run_rl
from rstar2_agent.train.rollout.version_gate import VersionGate, lag_metrics
from rstar2_agent.train.run_frame import checkpoints

from conftest import count_prompt, until


def test_max_staleness_needs_an_engine_with_its_own_weights(tmp_path):
    with pytest.raises(ValueError, match="rollout_engine: vllm"):
        RLRun(RLConfig(max_staleness=1, model=str(tmp_path / "absent")))
    with pytest.raises(ValueError, match="max_staleness must be 0"):
        RLRun(RLConfig(max_staleness=-1, rollout_engine="vllm", model=str(tmp_path / "absent")))


def test_lag_is_the_learner_version_minus_the_oldest_token():
    assert lag_metrics(5, [5, 4, 4, 3]) == {"policy_lag_max": 2.0, "policy_lag_mean": 1.0}
    assert lag_metrics(0, []) == {"policy_lag_max": 0.0, "policy_lag_mean": 0.0}


def original_weights(engine):
    from safetensors.torch import load_file

    return load_file(os.path.join(engine.model_path, "model.safetensors"))


async def test_a_push_waits_for_whole_rollouts_and_new_ones_wait_for_the_push(tiny_vllm_engine):
    gate = VersionGate(tiny_vllm_engine)
    weights = original_weights(tiny_vllm_engine)
    ids = count_prompt(tiny_vllm_engine.tokenizer)
    long = SamplingParams(temperature=1.0, max_tokens=96, seed=3, ignore_eos=True)
    loaded: list[int] = []
    heard: list[int] = []

    async def load():
        loaded.append(gate.version)
        await tiny_vllm_engine.load_weights(weights)

    async def rollout():
        async with gate.trajectory() as versions:
            gen = await gate.generate(ids, long, lambda new, lps: heard.extend(new))
        return gen, versions

    first = asyncio.ensure_future(rollout())
    await until(lambda: heard, "the first rollout's first tokens", timeout=30)  # in flight
    push = asyncio.ensure_future(gate.push(load))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(rollout())  # arrives while the push waits: starts after it
    drained = await push
    (gen, v_first), (_, v_late) = await first, await late
    assert first.done() and loaded == [0] and gate.version == 1
    assert len(gen.token_ids) == 96 and v_first.pieces == [(0, 96)]  # all of it from version 0
    assert v_late.pieces == [(1, 96)] and v_late.gate_wait > 0 and drained > 0


async def test_partial_rollouts_are_interrupted_by_a_push_and_go_on_with_the_new_weights(tiny_vllm_engine):
    gate = VersionGate(tiny_vllm_engine, partial=True)
    weights = original_weights(tiny_vllm_engine)
    ids = count_prompt(tiny_vllm_engine.tokenizer)
    heard: list[int] = []
    sampling = SamplingParams(temperature=1.0, max_tokens=160, seed=4, ignore_eos=True)

    async def rollout():
        async with gate.trajectory() as versions:
            gen = await gate.generate(ids, sampling, lambda new, lps: heard.extend(new))
        return gen, versions

    task = asyncio.ensure_future(rollout())
    await until(lambda: len(heard) >= 8, "the rollout's first 8 tokens", timeout=30)
    assert await gate.push(lambda: tiny_vllm_engine.load_weights(weights)) == 0.0  # no waiting for the rollout
    gen, versions = await task
    assert gate.interrupted == 1 and gate.version == 1
    assert len(gen.token_ids) == len(gen.logprobs) == 160 and heard == gen.token_ids
    (v0, n0), (v1, n1) = versions.pieces
    assert (v0, v1) == (0, 1) and n0 >= 8 and n1 > 0 and n0 + n1 == 160 and versions.oldest == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_run_rl_with_max_staleness_1_overlaps_within_the_bound(tmp_path, tiny_vllm_engine):
    """Three steps on the shared engine (the learner starts from its weights; they are restored after)."""
    from rstar2_agent.store import Store

    cfg = RLConfig(model=tiny_vllm_engine.model_path,
                   stages=[Stage(steps=3, max_response_tokens=48, max_turns=2, data_size=8)],
                   prompts_per_step=2, group_size=2, roc_min_positive=1, roc_min_negative=1, micro_batch=4,
                   out=str(tmp_path / "rl"), db=str(tmp_path / "s.db"), format="markdown", dtype="fp32",
                   rollout_engine="vllm", max_staleness=1, save_every=1, checkpoint=CheckpointConfig(keep=1),
                   start_check=StartCheck(min_answer_share=0.0))  # the tiny model writes no answer block
    try:
        _, history = await run_rl(cfg, engine=tiny_vllm_engine)
    finally:
        await tiny_vllm_engine.load_weights(original_weights(tiny_vllm_engine))
    # batches 0 and 1 start at once on version 0; batch 2 right after the first push, on version 1
    assert [h["policy_lag_max"] for h in history] == [0, 1, 1]
    assert all(h["stale_groups_dropped"] == 0 for h in history)
    assert all(k in h for h in history for k in ("learner_wait_s", "rollout_wait_s", "step_time", "push_wait_s"))
    assert all("tis_weight_mean" in h for h in history if h["update_tokens"])  # the decoupled loss's weights
    store = Store(cfg.db)
    (run,) = store.runs("rl")
    samples = store.samples(run.id)
    assert store.last_step(run.id) == 3 and len(samples) == 3 * 2 * 4  # each step once
    assert {(s.details["step"], s.details["version"]) for s in samples} == {(0, 0), (1, 0), (2, 1)}
    assert all(s.seconds > 0 for s in samples)  # each rollout's wall time, in the row
    assert [p.name for p in checkpoints(cfg.out)] == ["checkpoint-3"]  # saved each step, the older ones pruned


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_batch_one_version_stale_still_teaches_the_learner(tmp_path, tiny_vllm_engine):
    """Learning under lag, with real rollouts from the tiny engine and rewards set by hand (the model solves
    none of these): batches A and B are both generated on version 0; the update on A moves the learner to version
    1 and is pushed; B, now one version old, is trained with the decoupled loss (the ratio against the learner's
    proximal logprobs, the truncated weight to the engine's): its advantage-weighted logprob under the learner
    rises, and the step reports the lag."""
    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.update import UpdateItem, micro_batches, old_logprobs
    from rstar2_agent.train.loss import grpo_advantages
    from rstar2_agent.train.rollout.rollouts import Batch

    cfg = RLConfig(model=tiny_vllm_engine.model_path,
                   stages=[Stage(steps=2, max_response_tokens=48, max_turns=2, data_size=8)],
                   prompts_per_step=1, group_size=2, roc_min_positive=1, roc_min_negative=1, micro_batch=4,
                   out=str(tmp_path / "rl"), format="markdown", dtype="fp32", rollout_engine="vllm",
                   max_staleness=1, optim=OptimConfig(lr=1e-5, warmup_steps=0, schedule="constant"))
    run = RLRun(cfg, engine=tiny_vllm_engine)

    def graded(batch: Batch) -> Batch:  # 2 "right", 2 "wrong" in each group
        batch.groups = [[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in batch.groups]
        return batch

    def weighted_logprob(batch: Batch) -> float:
        items = [UpdateItem(t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, a) for g in batch.groups
                 for (t, _), a in zip(g, grpo_advantages([r for _, r in g]), strict=True)]
        parts = micro_batches(items, cfg.micro_batch, run.fmt.tokenizer.pad_token_id or 0)
        olds = old_logprobs(run.learner, parts, cfg.temperature)
        return sum(float((b["adv"][:, 1:] * b["mask"][:, 1:] * o).sum()) for b, o in zip(parts, olds, strict=True))

    try:
        await run.start()
        stage, rollouts = cfg.stages[0], run.rollouts
        pool = stage_pool(stage, cfg)
        a, b = await asyncio.gather(*(rollouts.batch(draw(pool, cfg.prompts_per_step, cfg.seed, s), 4, stage, s)
                                      for s in (0, 1)))
        first = await run.learn(graded(a), None, None)
        assert first["policy_lag_max"] == 0 and rollouts.gate.version == 1 and run.learner.step == 1
        before = weighted_logprob(graded(b))
        second = await run.learn(b, None, None)
        assert second["policy_lag_max"] == 1 and second["update_tokens"] > 0 and "tis_weight_mean" in second
        assert weighted_logprob(b) > before
    finally:
        await run.close()
        await tiny_vllm_engine.load_weights(original_weights(tiny_vllm_engine))
