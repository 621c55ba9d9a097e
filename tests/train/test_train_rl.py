"""GRPO-RoC's step (Resample-on-Correct itself: test_roc.py): the advantage and clipped loss on a hand-computed
example, stages; and with the real engine and the real sandbox: one update changes the weights and raises the
advantage-weighted logprob of its batch; `run_rl` runs, stores and resumes, and the Ray path matches one process,
all on the 2-layer SmolLM2 (conftest's tiny_smollm2: the machinery, in seconds)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from rstar2_agent.chat_format import default_extraction
from rstar2_agent.train.config import OptimConfig, RLConfig, Stage
from rstar2_agent.train.data.pool import draw, stage_pool
from rstar2_agent.train.loss import grpo_advantages, ppo_clip_loss
from rstar2_agent.train.rl import RLRun, run_rl, stage_of

from conftest import tiny


def test_advantages_and_the_clipped_loss_by_hand():
    adv = grpo_advantages([1, 0, 0, 1])
    assert adv == pytest.approx([math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2], rel=1e-5)
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.5, 1.0]))
    a = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss, stats = ppo_clip_loss(new, old, a, mask)
    # token 0: ratio 1.5, A>0 -> clipped at 1.28; token 1: ratio 0.5, A>0 -> 0.5; token 2: A<0 -> min(-1.5, -1.28)
    assert float(loss) == pytest.approx(-(1.28 + 0.5 - 1.5) / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3)  # the clip is active only for token 0


def test_stage_of_global_steps():
    stages = [Stage(steps=3), Stage(steps=2)]
    assert [stage_of(stages, s) for s in range(5)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    with pytest.raises(IndexError):
        stage_of(stages, 5)


@pytest.mark.slow
@pytest.mark.timeout(600)  # rollouts and an update, beside two other workers on 2 cores
async def test_one_update_changes_the_weights_and_raises_the_advantage_weighted_logprob_with_hand_set_rewards(
        tmp_path, tiny_smollm2):
    """Real rollouts from the real engine and a fresh sandbox; the rewards are set by hand (a graded batch of a
    model that solves none of these would carry no signal), so what is checked is the update's machinery: the
    2-layer SmolLM2 (conftest's tiny_smollm2). The ratio is against the learner's own old logprobs, so the loss
    itself is -mean(A) whatever the weights: what one update must raise is the advantage-weighted logprob of the
    batch under the learner."""
    from rstar2_agent.train.learner.update import UpdateItem, micro_batches, old_logprobs

    run = RLRun(tiny(tmp_path, model=tiny_smollm2, optim=OptimConfig(lr=1e-5, warmup_steps=0, schedule="constant"),
                     dtype="fp32"))
    try:
        await run.start()
        stage, rollouts, cfg = run.cfg.stages[0], run.rollouts, run.cfg
        groups = await rollouts.groups(draw(stage_pool(stage, cfg), cfg.prompts_per_step, cfg.seed, 0), 4, stage, 0)
        kept = [[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups]  # 2 "right", 2 "wrong" each
        items = [UpdateItem(t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, a) for g in kept
                 for (t, _), a in zip(g, grpo_advantages([r for _, r in g]), strict=True)]
        parts = micro_batches(items, run.cfg.micro_batch, run.fmt.tokenizer.pad_token_id or 0)

        def weighted_logprob() -> float:
            olds = old_logprobs(run.learner, parts, run.cfg.temperature)
            return sum(float((b["adv"][:, 1:] * b["mask"][:, 1:] * o).sum()) for b, o in zip(parts, olds, strict=True))

        score = weighted_logprob()
        before = {k: v.detach().clone() for k, v in run.learner.model.named_parameters()}
        first = run.update(kept)
        changed = sum(not torch.equal(before[k], v) for k, v in run.learner.model.named_parameters())
        assert changed > 0 and first["update_tokens"] > 0 and first["grad_norm"] > 0
        assert first["clip_frac"] == 0.0 and first["logprob_gap"] < 1e-4  # one optimizer step: the ratio is 1
        # the hf engine's logprobs (fp32, the learner's own weights, at the sampling temperature) agree with the
        # learner's to float noise: about 2e-6 per token on average, k3 about 1e-9
        assert first["logp_mismatch_abs"] < 1e-4 and first["logp_mismatch_kl"] < 1e-6
        assert first["logp_mismatch_out_of_range"] == 0.0
        assert weighted_logprob() > score
    finally:
        await run.close()


@pytest.mark.slow
def test_run_rl_stores_checkpoints_and_resumes_the_same_step(tmp_path, tiny_smollm2):
    # fp32 learner and hf engine alike, on any CPU; the tiny model: what is checked is the run's machinery
    cfg = tiny(tmp_path, model=tiny_smollm2, save_every=1, dtype="fp32")
    final, history = asyncio.run(run_rl(cfg))
    assert len(history) == 2 and final.name == "checkpoint-2" and (final.parent / "last").resolve() == final
    meta = json.loads((final / "rstar2.json").read_text())  # what eval reads back: the format and the reward's reading
    assert meta["format"] == "markdown" and meta["answer_extraction"] == default_extraction("markdown")
    assert {"accuracy", "response_tokens", "tool_error_ratio_positive", "time_rollout", "roc_dropped_groups",
            "grad_norm"} <= set(history[0])
    from rstar2_agent.store import Store

    store = Store(cfg.db)
    (run,) = store.runs("rl")
    samples = store.samples(run.id)
    assert len(samples) == 2 * 2 * 4 and all(s.problem_id.startswith("step0000") for s in samples[:8])
    step1 = sorted(s.problem_id for s in samples if s.problem_id.startswith("step00001"))
    import shutil

    shutil.rmtree(final)  # as if killed after step 1's checkpoint
    _, resumed = asyncio.run(run_rl(cfg, resume=True))
    assert len(resumed) == 1 and resumed[0]["lr"] == history[1]["lr"]  # the schedule continues where it was
    again = store.samples(run.id)
    assert len(again) == 16  # step 1's rollouts were replaced, not added
    assert sorted(s.problem_id for s in again if s.problem_id.startswith("step00001")) == step1  # same prompts

    from click.testing import CliRunner

    from rstar2_agent.cli import main

    report = CliRunner().invoke(main, ["train", "report", "rl", "--db", cfg.db, "--json"])
    assert report.exit_code == 0, report.output
    steps = json.loads(report.stdout)
    assert [s["step"] for s in steps] == [1, 2] and steps[1]["lr"] == resumed[0]["lr"]
    # the gap is measured on the kept rollouts: a step that keeps none (every group all right or all wrong) has none
    assert all(("logp_mismatch_kl" in s) == (s["update_tokens"] > 0) for s in steps)
    # the hf engine samples from the learner's own weights: the gap is float noise (KV-cached decoding against one
    # forward pass), and every token's engine/learner ratio is within [0.5, 2]
    assert all(0 <= s["logp_mismatch_kl"] < 1e-6 and s["logp_mismatch_out_of_range"] == 0 for s in steps
               if "logp_mismatch_kl" in s)


def test_rl_recipes_fill_the_stages():
    from rstar2_agent.train.recipe import load

    cpu = load(RLConfig, "rl-smollm2-cpu", ["stages=[{steps: 1, max_turns: 2}]"])
    assert cpu.stages == [Stage(steps=1, max_turns=2)]
    paper = load(RLConfig, "rl-qwen3-14b-base-mi300x")
    assert [s.steps for s in paper.stages] == [300, 85, 125] and paper.stages[2].filter_solved == 8
    assert paper.stages[2].reset_optimizer and paper.prompts_per_step == 512 and paper.group_size == 16
    assert paper.distributed == "ray" and paper.rollout_engine == "vllm" and paper.ray.learners == 16


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(900)  # Ray actors, two FSDP ranks, a local reference update, two more steps, on 2 shared cores
async def test_ray_path_with_two_local_actors_matches_one_process(tmp_path, tiny_smollm2):
    """`distributed: ray` on a local Ray cluster: two rollout workers behind the replica pool, two sandbox actors,
    two FSDP learner ranks (gloo on CPU). One update on hand-set rewards (packed by tokens, the head in chunks,
    checkpointed) gives the same loss and gradient norm as the single-process padded full-logits learner on the
    same rollouts, and after the weight push the rollout workers generate
    exactly what the saved checkpoint generates. Colocated (the rollout workers in the learner ranks' placement
    bundles, a step's sleep/wake order around the update). Resumed with separate placement and max_staleness 1, it
    trains two more steps, the last one version behind."""
    ray = pytest.importorskip("ray")
    from rstar2_agent.engines.base import SamplingParams
    from rstar2_agent.engines.hf import HFEngine
    from rstar2_agent.store import Store
    from rstar2_agent.train.config import RayConfig
    from rstar2_agent.train.learner.model import TorchLearner
    from rstar2_agent.train.learner.update import UpdateItem, policy_update
    from rstar2_agent.train.loss import grpo_advantages
    from rstar2_agent.train.push_check import PushChecker

    optim = OptimConfig(lr=1e-4, warmup_steps=0, schedule="constant")
    # the ranks pack their token-balanced shares, the head in chunks, every layer checkpointed; the reference below
    # is one process's padded full-logits update
    cfg = tiny(tmp_path, model=tiny_smollm2, distributed="ray", dtype="fp32", optim=optim, micro_batch_tokens=512,
               logprob_chunk_tokens=64, gradient_checkpointing=True, placement="colocated", sandbox_workers=1,
               ray=RayConfig(learners=2, cpus_per_learner=0.5, rollout_workers=2, cpus_per_rollout_worker=0.5,
                             sandbox_actors=2, cpus_per_sandbox_actor=0.25))
    run = RLRun(cfg)
    try:
        await run.start()
        stage, rollouts, cfg = run.cfg.stages[0], run.rollouts, run.cfg
        groups = await rollouts.groups(draw(stage_pool(stage, cfg), cfg.prompts_per_step, cfg.seed, 0), 4, stage, 0)
        assert {replica for _, replica in rollouts.engine.history} == {0, 1}  # trajectories spread over both workers
        assert all(t.logprobs and len(t.logprobs) == len(t.response_ids) for g in groups for t, _ in g)
        # colocated: the rollout workers are scheduled in the learner group's placement, each bundle sized for a rank
        # and its worker
        group = run.learner.placement.id.hex()
        assert await asyncio.gather(*(w.actor.placement_group.remote() for w in rollouts.engine.engines)) == [group] * 2
        bundles = ray.util.placement_group_table(run.learner.placement)["bundles"]
        assert [b["CPU"] for b in bundles.values()] == [1.0, 1.0]
        kept = [[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups]
        await run.colocation.sleep()  # a colocated step's order (the CPU engines stay awake)
        upd = run.update(kept)
        assert upd["update_tokens"] > 0 and run.learner.step == 1
        assert await run.sync_weights() > 0
        await run.colocation.wake()
        assert run.colocation.calls == ["sleep(1)", "release", "wake(weights)", "push", "release",
                                         "wake(kv_cache)"]
        probe = await PushChecker(run.cfg.push_check, run.fmt).check(rollouts.engine, run.learner, run.learner.step)
        assert probe["push_probe_max_abs_diff"] < 1e-3  # every replica scored the pushed weights as the FSDP ranks do
        checkpoint = run.save(1, 0)
        assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

        local = TorchLearner(run.resolved.path, optim, 2, dtype="fp32")
        items = [UpdateItem(t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, a) for g in kept
                 for (t, _), a in zip(g, grpo_advantages([r for _, r in g]), strict=True)]
        plain = dataclasses.replace(run.update_cfg, micro_batch_tokens=0, logprob_chunk_tokens=0)
        ref = policy_update(local, items, plain, upd["update_tokens"])
        ref |= local.optimizer_step()
        assert upd["loss"] == pytest.approx(ref["loss"], rel=1e-3, abs=1e-6)
        assert upd["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-3)
        # the ranks ran the old-logprob pass on their shares: the ratio is 1 there too, and the gap adds up
        assert upd["clip_frac"] == 0.0 and upd["logprob_gap"] < 1e-4
        assert upd["logp_mismatch_kl"] == pytest.approx(ref["logp_mismatch_kl"], rel=1e-3, abs=1e-7)
        assert upd["logp_mismatch_abs"] == pytest.approx(ref["logp_mismatch_abs"], rel=1e-3, abs=1e-6)

        prompt = run.fmt.render_prompt("What is 6 * 7?")
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        from_worker = await rollouts.engine.engines[1].generate(prompt, greedy)
        async with HFEngine(str(checkpoint), context_length=2048) as saved:
            from_checkpoint = await saved.generate(prompt, greedy)
        assert from_worker.token_ids == from_checkpoint.token_ids
        assert from_worker.logprobs == pytest.approx(from_checkpoint.logprobs, abs=1e-4)
        await run.close()
        assert not ray.is_initialized()  # the run started its local cluster, so it stopped it

        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)  # a user who connected Ray themselves
        resumed = RLRun(cfg, resume=True)  # each FSDP rank reads its shards of the optimizer state
        try:
            assert resumed.learner.step == 1 and resumed.state["stage"] == 0
            assert Path(resumed.resolved.path).resolve() == checkpoint.resolve()
        finally:
            await resumed.close()
        assert ray.is_initialized()  # ...stays connected after the run closes

        # bounded staleness on the Ray path: resumed at step 1 with max_staleness 1, the batches of steps 2 and 3
        # both generate on the pushed version 1 while the ranks update; step 3 trains one version behind
        stale = dataclasses.replace(cfg, max_staleness=1, placement="separate",
                                    stages=[dataclasses.replace(cfg.stages[0], steps=3)])
        _, history = await run_rl(stale, resume=True)
        assert [h["policy_lag_max"] for h in history] == [0, 1]
        assert all("tis_weight_mean" in h for h in history if h["update_tokens"])  # the decoupled loss
        store = Store(cfg.db)
        (row,) = store.runs("rl")
        assert store.last_step(row.id) == 3
        assert {(s.details["step"], s.details["version"]) for s in store.samples(row.id)} == {(1, 1), (2, 1)}
        assert ray.is_initialized()
    finally:
        await run.close()
        ray.shutdown()
