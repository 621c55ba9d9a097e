"""`placement: colocated` (train/learner/colocated.py): the order of a colocated step's calls, the same training as
the one-process path, the engines' sleep on vLLM's CPU build (which has none: a warning, and generation goes on), and
the refusals."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.train import rl
from rstar2_agent.train.config import OptimConfig, RayConfig, Stage
from rstar2_agent.train.learner.colocated import Colocation
from rstar2_agent.train.rl import run_rl
from rstar2_agent.train.rollout.rollouts import Rollouts

from conftest import tiny

STEP = ["sleep(1)", "wake(weights)", "push", "wake(kv_cache)"]


def test_colocated_trains_as_the_one_process_path_with_the_hf_engine_on_weights_of_its_own(
        tmp_path, tiny_smollm2, monkeypatch):
    """The one-process path's hf engine shares the learner's model; colocated, the engine holds weights of its own
    that sleep through each update and get the new weights pushed: the same rollouts and the same losses."""
    seen: list[Colocation] = []
    monkeypatch.setattr(rl, "Colocation", lambda *a, **k: seen.append(Colocation(*a, **k)) or seen[-1])

    async def parity(self, traj, gold):  # a hand-set reward with signal: the random tiny model answers nothing
        return float(sum(traj.response_ids) % 2)

    monkeypatch.setattr(Rollouts, "reward", parity)
    kw = dict(model=tiny_smollm2, dtype="fp32", optim=OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant"),
              stages=[Stage(steps=2, max_response_tokens=16, max_turns=2, data_size=8)])
    _, shared = asyncio.run(run_rl(tiny(tmp_path / "shared", **kw)))
    _, colocated = asyncio.run(run_rl(tiny(tmp_path / "colocated", placement="colocated", **kw)))
    (colocation,) = seen
    pushes = sum(1 for m in colocated if m["update_tokens"] > 0)
    assert pushes >= 1  # the weights moved, so equal rollouts after a step mean the push reached the engine
    # the learner's cached memory released before the weights wake and again before the KV cache does; a step that
    # kept nothing leaves the engine awake (at sleep level 2 a wake without a push would leave it without weights)
    step = ["sleep(1)", "release", "wake(weights)", "push", "release", "wake(kv_cache)"]
    expected = [c for m in colocated if m["update_tokens"] > 0 for c in step]
    assert colocation.calls == expected and not colocation.asleep
    for a, b in zip(shared, colocated, strict=True):
        assert a["response_tokens"] == b["response_tokens"] and a["update_tokens"] == b["update_tokens"]
        for key in ("loss", "grad_norm", "accuracy"):
            assert a.get(key) == pytest.approx(b.get(key), rel=1e-4, abs=1e-6), key
    assert all(m["time_push"] >= 0 for m in colocated)


@pytest.mark.slow
async def test_vllms_cpu_build_stays_awake_with_a_warning_and_generates_after_the_colocated_calls(
        vllm_engine, caplog):
    colocation = Colocation(vllm_engine, level=1)
    prompt = vllm_engine.tokenizer.encode("Count: 1, 2, 3,")
    before = await vllm_engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4))
    with caplog.at_level(logging.WARNING):
        await colocation.sleep()
        await colocation.push(lambda: asyncio.sleep(0))
        await colocation.wake()
        await colocation.sleep()
        await colocation.wake()
    assert colocation.calls == [*STEP, "sleep(1)", "wake(all)"]
    assert sum("no sleep mode" in r.getMessage() for r in caplog.records) <= 1  # once per engine
    after = await vllm_engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4))
    assert after.token_ids == before.token_ids


@pytest.mark.parametrize("change, fragment", [
    (dict(max_staleness=1, rollout_engine="vllm"), "synchronous"),
    (dict(partial_rollouts=True, rollout_engine="vllm"), "synchronous"),
    (dict(sleep_level=3), "sleep_level"),
    (dict(placement="shared"), "placement must be"),
    (dict(distributed="ray", ray=RayConfig(learners=2, rollout_workers=1)), "rollout_workers to ray.learners"),
    (dict(distributed="ray", ray=RayConfig(learners=1, rollout_workers=1, gpus_per_learner=1)), "CUDA IPC"),
])
def test_colocated_recipes_that_cannot_run_are_refused_by_name(tmp_path, change, fragment):
    cfg = tiny(tmp_path, placement=change.pop("placement", "colocated"), **change)
    with pytest.raises(ValueError, match=fragment):
        rl.check_recipe(cfg)
