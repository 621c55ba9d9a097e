"""Faults on the `distributed: ray` path of `rstar2 train rl`, on a local Ray cluster with the 2-layer SmolLM2
(conftest's tiny_smollm2): a rollout worker whose process is killed (SIGKILL) in the middle of a step's rollouts is
replaced holding the last pushed weights, the turns it had in flight rerun there, and the step ends with every
rollout, none failed and none twice; the next push by the collective reaches the replacement; a worker killed while
idle is found and replaced by the next push. (A killed sandbox actor: test_sandbox_ray.py.)"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from rstar2_agent.train.config import OptimConfig
from rstar2_agent.train.data.pool import draw, stage_pool
from rstar2_agent.train.rl import RLRun

from conftest import tiny, until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.mark.timeout(900)  # four updates and pushes, two replacements, on a local cluster sharing 2 cores
async def test_a_killed_rollout_worker_is_replaced_with_the_pushed_weights_and_its_turns_rerun(tmp_path, tiny_smollm2):
    ray = pytest.importorskip("ray")
    from rstar2_agent.engines.base import SamplingParams
    from rstar2_agent.train.config import RayConfig
    from rstar2_agent.train.push import ThroughGroup

    cfg = tiny(tmp_path, model=tiny_smollm2, distributed="ray", dtype="fp32", optim=OptimConfig(lr=1e-4, warmup_steps=0,
                                                                            schedule="constant"),
               sandbox_workers=1,
               ray=RayConfig(learners=1, cpus_per_learner=0.5, rollout_workers=2, cpus_per_rollout_worker=0.5,
                             sandbox_actors=1, cpus_per_sandbox_actor=0.25,
                             weight_push_timeout_s=60, max_worker_restarts=1), weight_push="collective")
    run = RLRun(cfg)
    try:
        await run.start()
        stage, rollouts = run.cfg.stages[0], run.rollouts
        pool = rollouts.engine
        workers = pool.engines
        prompt = run.fmt.render_prompt("What is 6 * 7?")
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        base = await workers[1].generate(prompt, greedy)

        prompts = draw(stage_pool(stage, run.cfg), run.cfg.prompts_per_step, run.cfg.seed, 0)
        groups = await rollouts.groups(prompts, 4, stage, 0)
        run.update([[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups])
        await run.sync_weights()  # by the collective: the workers now hold the learner's step-1 weights
        pushed = await workers[1].generate(prompt, greedy)
        assert max(abs(a - b) for a, b in zip(pushed.logprobs, base.logprobs, strict=False)) > 1e-4  # moved

        pid = await workers[0].pid()
        task = asyncio.create_task(rollouts.groups(prompts, 4, stage, 1))
        await until(lambda: pool.loads[0].in_flight > 0, "a turn in flight on rollout worker 0", timeout=300)
        in_flight = pool.loads[0].in_flight
        os.kill(pid, signal.SIGKILL)
        groups = await asyncio.wait_for(task, 600)

        assert workers[0].restarts == 1 and workers[0].incarnation == 1 and await workers[0].pid() != pid
        trajs = [t for g in groups for t, _ in g]
        assert len(groups) == len(prompts) and all(len(g) == 4 for g in groups)  # every rollout, none twice
        assert len({id(t) for t in trajs}) == len(trajs) and in_flight >= 1
        assert not [t.error for t in trajs if t.stop_reason == "engine_error"]
        assert all(t.response_ids and len(t.logprobs) == len(t.response_ids) for t in trajs)
        assert workers[0].reruns >= 1  # the turns in flight at the kill ran again, on the replacement

        # the replacement holds the pushed weights: it answers as the live worker does, not as the base model
        again = await workers[0].generate(prompt, greedy)
        assert again.token_ids == pushed.token_ids
        assert again.logprobs == pytest.approx(pushed.logprobs, abs=1e-4)

        # the next push by the collective rebuilds the group with the replacement, and reaches it
        run.update([[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups])
        await run.sync_weights()
        second = [await w.generate(prompt, greedy) for w in workers]
        assert second[0].token_ids == second[1].token_ids
        assert second[0].logprobs == pytest.approx(second[1].logprobs, abs=1e-4)
        assert max(abs(a - b) for a, b in zip(second[0].logprobs, pushed.logprobs, strict=False)) > 1e-4

        # the object store path still pushes (weight_push=object_store), and a replacement would load its reference
        run.push = ThroughGroup("object_store")
        run.update([[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups])
        await run.sync_weights()
        third = [await w.generate(prompt, greedy) for w in workers]
        assert third[0].logprobs == pytest.approx(third[1].logprobs, abs=1e-4)
        assert max(abs(a - b) for a, b in zip(third[0].logprobs, second[0].logprobs, strict=False)) > 1e-4
        assert all(isinstance(w.weights, ray.ObjectRef) for w in workers)

        # a worker that dies while idle is found by the next push by the collective before its broadcast (on NCCL
        # a broadcast to a dead member would end in the watchdog's teardown of rank 0): replaced, the group rebuilt,
        # no broadcast failed; both workers then hold the new weights
        run.push = ThroughGroup("collective")
        idle = await workers[1].pid()
        os.kill(idle, signal.SIGKILL)
        run.update([[(t, float(k % 2)) for k, (t, _) in enumerate(g)] for g in groups])
        failed = run.learner.failed_broadcasts
        await run.sync_weights()
        assert workers[1].restarts == 1 and await workers[1].pid() != idle
        assert run.learner.failed_broadcasts == failed
        fourth = [await w.generate(prompt, greedy) for w in workers]
        assert fourth[0].logprobs == pytest.approx(fourth[1].logprobs, abs=1e-4)
        assert max(abs(a - b) for a, b in zip(fourth[0].logprobs, third[0].logprobs, strict=False)) > 1e-4

        # a worker that keeps dying stops the run with what to do (max_worker_restarts=1 is spent)
        os.kill(await workers[0].pid(), signal.SIGKILL)
        with pytest.raises(Exception, match="max_worker_restarts"):
            await workers[0].generate(prompt, greedy)
    finally:
        await run.close()
        ray.shutdown()


def test_a_learner_group_the_cluster_cannot_place_fails_in_time_and_leaves_nothing(tiny_smollm2):
    """One GPU per learner on a cluster without GPUs: the placement group is never granted. The start fails after
    ray.start_timeout_s, naming what was asked and what the cluster has, instead of waiting forever, and removes
    its placement group; the cluster it joined stays up."""
    ray = pytest.importorskip("ray")
    from ray.util import placement_group_table

    from rstar2_agent.train.config import RayConfig
    from rstar2_agent.train.learner.ray_group import LearnerGroup

    cfg = RayConfig(learners=2, gpus_per_learner=1, cpus_per_learner=0.5, rollout_workers=0, sandbox_actors=0,
                    start_timeout_s=5)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(TimeoutError, match=r"did not grant the learner group 2 x \{'CPU': 0.5, 'GPU': 1\}.*"
                                               r"lower ray.learners"):
            LearnerGroup(cfg, tiny_smollm2, OptimConfig(), total_steps=1)
        groups = placement_group_table().values()
        assert groups and all(g["state"] == "REMOVED" for g in groups)
        assert ray.is_initialized()
    finally:
        ray.shutdown()
