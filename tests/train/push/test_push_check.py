"""The checked weight push (train/push_check.py): the bound is calibrated on the run's own first look (or the
dtypes' constants uncalibrated); after a real push the engine and the learner score the probe alike (an hf engine on
its own weights, the hf engine sharing the learner's model, a replica pool, vLLM in this process); a no-op, a half
and a healthy push are told apart at that push by the move; an engine on other weights is refused before any
update; an engine that cannot be trained is refused by name; and the figures are in a real RL run. The 2-layer
SmolLM2 (conftest's tiny_smollm2) where the numbers are the machinery's; vLLM against SmolLM2 for the bf16 figure."""

from __future__ import annotations

import re

import pytest

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.train.config import OptimConfig, PushCheck
from rstar2_agent.train.learner.local import LocalLearner
from rstar2_agent.train.learner.update import UpdateConfig, UpdateItem
from rstar2_agent.train.push import Chunked, Shared
from rstar2_agent.train.push_check import (
    BF16_BOUND,
    FP32_BOUND,
    PushChecker,
    PushCheckError,
    auto_bound,
    calibrated_bound,
    probe_ids,
)
from rstar2_agent.train.rollout.trainable import TrainableHFEngine

from conftest import tiny

CHECK = PushCheck()


def learner(path: str, lr: float) -> LocalLearner:
    return LocalLearner(path, OptimConfig(lr=lr, warmup_steps=0, schedule="constant"), 100, dtype="fp32")


def train(model: LocalLearner, fmt: ChatFormat, steps: int = 1) -> None:
    """`steps` optimizer steps on the probe itself as one rollout (advantage 1): the weights move."""
    ids, start = probe_ids(fmt, 32)
    n = len(ids) - start
    for _ in range(steps):
        model.update([UpdateItem(ids[:start], ids[start:], [1] * n, [0.0] * n, 1.0)], UpdateConfig(micro_batch=1), n)


def test_the_bound_follows_the_calibration_or_the_dtypes():
    assert calibrated_bound(0.0, 3.0) == FP32_BOUND == 1e-3  # fp32 on the same kernels calibrates at 0
    assert calibrated_bound(0.2, 2.5) == pytest.approx(0.5)  # bf16's measured gap on SmolLM2 is 0.18-0.21
    assert auto_bound("fp32", "fp32") == FP32_BOUND  # uncalibrated: the dtypes' constants
    assert auto_bound("bf16", "fp32") == auto_bound("fp32", "bf16") == auto_bound("bf16", "bf16") == BF16_BOUND
    assert auto_bound("fp16", "fp32") == auto_bound(None, "fp32") == BF16_BOUND  # unknown: the larger bound
    for bad, field in [({"probe_tokens": 0}, "probe_tokens"), ({"bound": 0.0}, "positive"),
                       ({"calibration_factor": 0.5}, "calibration_factor"), ({"max_move_residual": 1.0}, "between")]:
        with pytest.raises(ValueError, match=field):
            PushCheck(**bad)


def half(state: dict) -> dict:
    """The first half of the learner's parameters by name: a push that sent (or loaded) half."""
    names = sorted(state)
    return {k: state[k] for k in names[: len(names) // 2]}


async def test_a_real_push_checks_out_and_a_skipped_one_stops_the_run(tiny_smollm2, monkeypatch):
    """fp32 learner, hf engine on its own weights: calibrated at 0 (the same kernels), so the bound is 1e-3; after an
    update (lr 1e-2) and its push the figure is 0 and the engine made the learner's whole move; then the engine's
    load does nothing, and the next push is caught by the gap, naming the causes."""
    model = learner(tiny_smollm2, lr=1e-2)
    fmt = ChatFormat(model.tokenizer, "markdown")
    engine = TrainableHFEngine(tiny_smollm2, context_length=2048)
    assert engine.compute_dtype == model.compute_dtype == "fp32"
    checker = PushChecker(CHECK, fmt)
    calibration = await checker.calibrate(engine, model)
    assert calibration["push_probe_calibration_max_abs_diff"] == 0.0 and calibration["push_probe_bound"] == FP32_BOUND
    train(model, fmt)
    await Chunked().push(model, engine)
    figures = await checker.check(engine, model, 1)
    assert figures["push_probe_max_abs_diff"] < 1e-5 and figures["push_probe_mean_abs_diff"] <= 1e-5
    assert figures["push_probe_move_decided"] == 1.0 and figures["push_probe_move_share"] == pytest.approx(1, abs=1e-3)
    print(f"fp32 learner -> hf engine of its own, a real push: {figures}")  # docs/results.md (pytest -s)

    async def nothing(state_dict):  # a push that silently does nothing
        return None

    monkeypatch.setattr(engine, "load_weights", nothing)
    train(model, fmt)
    await Chunked().push(model, engine)
    with pytest.raises(PushCheckError, match=r"after update 2 .* over the bound 0\.001 \(2.5 x the calibrated gap\)"):
        await checker.check(engine, model, 2)

    shared = TrainableHFEngine(tiny_smollm2, context_length=2048, model=model.model, tokenizer=model.tokenizer)
    await Shared().push(model, shared)  # the hf engine on the learner's own model: no push, the check holds trivially
    assert (await check_uncalibrated(fmt, shared, model, 2))["push_probe_max_abs_diff"] == 0.0


async def check_uncalibrated(fmt: ChatFormat, engine, model, step: int) -> dict:
    return await PushChecker(CHECK, fmt).check(engine, model, step)


async def test_a_no_op_a_half_and_a_healthy_push_are_told_apart_at_that_push(tiny_smollm2):
    """At the paper's lr 1e-6 in fp32 one update moves the probe by less than the gap bound, so the gap alone passes
    a push that loaded nothing. The move tells them apart at that push: healthy (the engine made ~100% of the
    learner's move), half (half the parameters: part of it), nothing (0%), each under the gap bound."""
    model = learner(tiny_smollm2, lr=1e-6)
    fmt = ChatFormat(model.tokenizer, "markdown")
    engine = TrainableHFEngine(tiny_smollm2, context_length=2048)
    checker = PushChecker(CHECK, fmt)
    await checker.calibrate(engine, model)
    seen = {}

    train(model, fmt)
    await engine.load_weights(model.full_state_dict())
    healthy = await checker.check(engine, model, 1)
    assert healthy["push_probe_move_decided"] == 1.0 and healthy["push_probe_move_residual"] < 1e-2
    seen["healthy"] = healthy["push_probe_move_share"]

    train(model, fmt)
    await engine.load_weights(half(model.full_state_dict()))
    assert 0 < await gap(checker, engine, model) < FP32_BOUND  # the gap alone would pass it
    with pytest.raises(PushCheckError, match=r"after update 2 loaded part of the weights .* made (\d+)% of that move"
                       ) as caught:
        await checker.check(engine, model, 2)
    seen["half"] = str(caught.value)
    await engine.load_weights(model.full_state_dict())  # the retry pushes it all: the anchor held, the move checks out
    assert (await checker.check(engine, model, 2))["push_probe_move_share"] == pytest.approx(1, abs=1e-2)

    train(model, fmt)  # and no push
    assert 0 < await gap(checker, engine, model) < FP32_BOUND
    with pytest.raises(PushCheckError, match=r"after update 3 loaded nothing: .* made 0% of that move"):
        await checker.check(engine, model, 3)
    print(f"lr 1e-6, fp32: healthy share {seen['healthy']:.4f}; half: {re.search('made .*? move', seen['half'])[0]}")


async def gap(checker: PushChecker, engine, model) -> float:
    now = await checker.scores(engine, model)
    return max(abs(a - b) for a, b in zip(now.replicas[0], now.learner, strict=True))


async def test_engine_and_learner_on_other_weights_are_refused_at_the_calibration(tiny_smollm2):
    """Before any update the two sides must hold the same model: an engine on other weights (the learner trained
    hard on the probe first, as a wrong checkpoint would be) is refused at once, naming what to check."""
    model = learner(tiny_smollm2, lr=1e-2)
    fmt = ChatFormat(model.tokenizer, "markdown")
    train(model, fmt, steps=5)
    with pytest.raises(PushCheckError, match="before any update.* do not hold the same model"):
        await PushChecker(CHECK, fmt).calibrate(TrainableHFEngine(tiny_smollm2, context_length=2048), model)


async def test_a_pool_checks_every_replica_and_names_the_stale_one(tiny_smollm2):
    from rstar2_agent.engines.replicas import ReplicaPool

    model = learner(tiny_smollm2, lr=1e-2)
    fmt = ChatFormat(model.tokenizer, "markdown")
    fresh, stale = (TrainableHFEngine(tiny_smollm2, context_length=2048),
                    TrainableHFEngine(tiny_smollm2, context_length=2048))
    pool = ReplicaPool([fresh, stale], "static")
    checker = PushChecker(CHECK, fmt)
    await checker.calibrate(pool, model)
    train(model, fmt)
    await fresh.load_weights(model.full_state_dict())  # the push reached replica 0 only
    ids, start = probe_ids(fmt, CHECK.probe_tokens)
    assert len(await pool.score_each(ids, start)) == 2 and pool.compute_dtype == "fp32"
    with pytest.raises(PushCheckError, match="on replica 1 of 2"):
        await checker.check(pool, model, 1)
    await pool.load_weights(model.full_state_dict())
    assert (await checker.check(pool, model, 1))["push_probe_max_abs_diff"] < 1e-5


async def test_an_engine_that_cannot_be_trained_is_refused_by_name_before_the_run_loads(tiny_smollm2):
    """A remote server scores nothing, sleeps not and takes no weights: the run refuses it (alone, or as a replica
    of a pool) before it loads a model, naming it and what to give instead; a disabled check looks at nothing."""
    from rstar2_agent.engines.base import EngineError, trainable
    from rstar2_agent.engines.openai import OpenAIEngine
    from rstar2_agent.engines.replicas import ReplicaPool
    from rstar2_agent.train.config import RLConfig
    from rstar2_agent.train.rl import RLRun

    model = learner(tiny_smollm2, lr=1e-2)
    engine = TrainableHFEngine(tiny_smollm2, context_length=2048)
    remote = OpenAIEngine("http://127.0.0.1:9", tokenizer=model.tokenizer, context_length=2048)
    try:
        for given in (remote, ReplicaPool([engine, remote])):
            with pytest.raises(EngineError, match=r"the openai engine cannot be trained: .*\(rollout_engine: hf or"):
                RLRun(RLConfig(model="no-such-model"), engine=given)
        assert trainable(ReplicaPool([engine, engine])).untrainable() == []
        off = PushChecker(PushCheck(enabled=False), ChatFormat(model.tokenizer, "markdown"))
        assert await off.calibrate(engine, model) == {} and await off.check(engine, model, 1) == {}
    finally:
        await remote.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_vllm_scores_the_probe_as_the_learner_after_a_real_push(vllm_engine, smol):
    """vLLM in this process (bf16 on this CPU) against an fp32 learner on the same SmolLM2: its prompt logprobs line
    up with the learner's token for token, and after a real push of the learner's (unchanged) weights the largest
    gap is bf16's rounding, under the bf16 bound (measured: ~0.18 over 64 tokens, mean ~0.03)."""
    model = LocalLearner(smol.path, OptimConfig(), 1, dtype="fp32")
    fmt = ChatFormat(model.tokenizer, "markdown")
    assert vllm_engine.compute_dtype == "bf16"
    await Chunked().push(model, vllm_engine)
    checker = PushChecker(CHECK, fmt)
    calibration = await checker.calibrate(vllm_engine, model)
    assert 1e-3 < calibration["push_probe_calibration_max_abs_diff"] < 0.5
    assert calibration["push_probe_bound"] == pytest.approx(2.5 * calibration["push_probe_calibration_max_abs_diff"])
    await Chunked().push(model, vllm_engine)
    figures = await checker.check(vllm_engine, model, 1)
    assert 1e-3 < figures["push_probe_max_abs_diff"] < calibration["push_probe_bound"]
    assert figures["push_probe_mean_abs_diff"] < 0.1 and figures["push_probe_move_decided"] == 0.0  # nothing moved
    print(f"fp32 learner -> vLLM (bf16), SmolLM2-135M: {calibration} {figures}")  # docs/results.md (pytest -s)
    ids, start = probe_ids(fmt, CHECK.probe_tokens)
    assert len(await vllm_engine.score(ids, start)) == CHECK.probe_tokens


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_real_rl_step_records_the_probe_figure(tmp_path, tiny_smollm2):
    """One step of a real run on the 2-layer model (the hf engine on the learner's model, fp32), its rollouts graded
    by hand so a group is kept and the weights are pushed: the step's metrics hold the probe's figure, 0."""
    from rstar2_agent.train.config import Stage
    from rstar2_agent.train.data.pool import draw, stage_pool
    from rstar2_agent.train.rl import RLRun

    cfg = tiny(tmp_path, model=tiny_smollm2, dtype="fp32", prompts_per_step=1,
               stages=[Stage(steps=1, max_response_tokens=16, max_turns=1, data_size=4)])
    run = RLRun(cfg)
    try:
        await run.start()
        stage, rollouts = cfg.stages[0], run.rollouts
        batch = await rollouts.batch(draw(stage_pool(stage, cfg), cfg.prompts_per_step, cfg.seed, 0), 4, stage, 0)
        batch.groups = [[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in batch.groups]
        metrics = await run.learn(batch, None, None)
    finally:
        await run.close()
    assert run.calibration["push_probe_calibration_max_abs_diff"] == 0.0 and run.calibration["push_probe_bound"] == 1e-3
    assert metrics["update_tokens"] > 0 and metrics["push_probe_max_abs_diff"] == 0.0
    assert metrics["push_probe_s"] >= 0 and cfg.push_check == PushCheck()
