"""Two ways a rollout goes wrong in RL. A turn cut by the engine's context (not the response budget) is a truncated
rollout: with the real hf engine and SmolLM2, the loop ends it as `max_tokens` and RL rewards it 0, though the answer
block it wrote grades right. A step whose every rollout failed in the engine (a rollout server that is gone) stops
the run with the engine's error, before any update."""

from __future__ import annotations

import pytest

from rstar2_agent.agent import AgentConfig, run_agent, stop_after_turn
from rstar2_agent.chat_format import ChatFormat, answer_blocks, extract_answer
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.engines.hf import HFEngine
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.problem import Problem
from rstar2_agent.train.config import RLConfig
from rstar2_agent.train.rollout.rollouts import Rollouts

# Greedy SmolLM2 copies the shots: an <answer> block first, then a sentence after it.
SHOTS = [{"role": "user", "content": "What is 1+1?"},
         {"role": "assistant",
          "content": "<answer>\\boxed{2}</answer> Because one plus one makes two, the answer is two."},
         {"role": "user", "content": "What is 3+3?"},
         {"role": "assistant",
          "content": "<answer>\\boxed{6}</answer> Because three plus three makes six, the answer is six."},
         {"role": "user", "content": "What is 2+2?"}]


def test_any_length_cut_is_max_tokens():
    block = "<answer>\\boxed{4}</answer> Because"
    assert stop_after_turn(block, has_calls=False, cut_off=True) == "max_tokens"  # budget left: the context cut it
    assert stop_after_turn(block, has_calls=False, cut_off=False) == "answer"
    assert stop_after_turn("thinking", has_calls=False, cut_off=False) == "no_tool_call"
    assert stop_after_turn("<tool_call>...", has_calls=True, cut_off=False) == ""


@pytest.mark.slow
async def test_a_turn_cut_by_the_context_mid_answer_is_truncated_and_rewarded_0(engine, sandbox):
    fmt = ChatFormat(engine.tokenizer, "markdown")
    cfg = AgentConfig(max_turns=2, max_response_tokens=200, sampling=SamplingParams(temperature=0.0, max_tokens=200))
    full = await run_agent(SHOTS, engine, sandbox, fmt, cfg)
    assert full.stop_reason == "answer" and full.turns[0].finish_reason == "stop"
    ids = full.response_ids
    block_end = next(i for i in range(1, len(ids) + 1) if answer_blocks(fmt.decode(ids[:i])))
    assert block_end + 3 < len(ids)  # the turn goes on after its answer block

    small = HFEngine(engine.model_path, model=engine.model, tokenizer=engine.tokenizer,
                     context_length=len(full.prompt_ids) + block_end + 2)
    try:
        cut = await run_agent(SHOTS, small, sandbox, fmt, cfg)
    finally:
        await small.close()
    assert cut.response_ids == ids[:block_end + 2]  # the same greedy text, cut by the context
    assert cut.turns[0].finish_reason == "length" and len(cut.response_ids) < cfg.max_response_tokens  # budget left
    assert answer_blocks(cut.text) and cut.stop_reason == "max_tokens"

    grader = MathGrader(workers=1)
    try:
        gold = extract_answer(cut.text)
        assert (await grader.grade(cut.text, gold)).correct  # the text holds a right answer...
        rollouts = Rollouts(RLConfig(), fmt, grader=grader)  # the reward needs no engine
        assert await rollouts.reward(cut, gold) == 0.0  # ...but a truncated rollout gets 0
        assert await rollouts.reward(full, gold) == 1.0
    finally:
        grader.close()


async def test_a_step_whose_every_rollout_failed_in_the_engine_stops_the_run_before_any_update(smol_tokenizer,
                                                                                                 sandbox):
    """A dead rollout engine (here: an OpenAI-compatible rollout server that is gone, so every request is refused)
    must stop RL with the engine's error, not grade the failures 0, update on nothing and save as if all went well."""
    from rstar2_agent.engines.base import EngineError
    from rstar2_agent.engines.openai import OpenAIEngine
    from rstar2_agent.train.config import Stage

    from conftest import free_port

    gone = OpenAIEngine(f"http://127.0.0.1:{free_port()}", model="m", tokenizer=smol_tokenizer, context_length=2048)
    rollouts = Rollouts(RLConfig(), ChatFormat(smol_tokenizer, "hermes"))  # the rollout phase needs no learner
    rollouts.attach(gone, sandbox, owns_engine=False)
    try:
        with pytest.raises(EngineError, match=r"all 4 rollouts of step 3 failed .*ConnectError.*--resume"):
            await rollouts.groups([Problem("p1", "What is 2+2?", "4"), Problem("p2", "What is 3+3?", "6")], 2,
                                 Stage(steps=1), step=3)
    finally:
        await gone.close()


@pytest.mark.parametrize("seeded", [True, False])
async def test_rollouts_are_seeded_by_their_key_unless_the_recipe_says_not(smol_tokenizer, sandbox, seeded):
    """`seeded_rollouts` (the default): each rollout's first generation is seeded from its key, so a rerun step
    samples the same rollouts; false: no seed at all (vLLM's batched sampler), at every turn."""
    from rstar2_agent.train.config import Stage

    from conftest import ScriptedEngine

    engine = ScriptedEngine(smol_tokenizer, ["<answer>4</answer>"] * 2)
    rollouts = Rollouts(RLConfig(seeded_rollouts=seeded), ChatFormat(smol_tokenizer, "hermes"))
    rollouts.attach(engine, sandbox, owns_engine=False)
    await rollouts.rollout("What is 2+2?", Stage(steps=1, max_turns=1), "s0/p1/0")
    await rollouts.rollout("What is 2+2?", Stage(steps=1, max_turns=1), "s0/p1/1")
    if seeded:
        assert None not in engine.seeds and len(set(engine.seeds)) == 2
    else:
        assert engine.seeds == [None, None]


def test_a_rollout_that_failed_in_the_engine_is_no_negative_for_roc(smol_tokenizer):
    """A group of 4 with 2 right answers, 1 wrong and 1 engine failure: RoC sees 2 positives and 1 negative (the
    failure, reward 0, would have been a second negative, a learning signal made of an infrastructure fault)."""
    from rstar2_agent.train.roc import Group, resample_on_correct
    from rstar2_agent.train.rollout.rollouts import rollout_stats, without_engine_errors
    from rstar2_agent.trajectory import Trajectory

    def traj(stop: str) -> Trajectory:
        return Trajectory(prompt_ids=[1], stop_reason=stop, error="EngineError: gone" if "error" in stop else None)

    group = [(traj("answer"), 1.0), (traj("answer"), 1.0), (traj("answer"), 0.0), (traj("engine_error"), 0.0)]
    (kept,) = without_engine_errors([group])
    assert [t.stop_reason for t, _ in kept] == ["answer"] * 3
    fmt = ChatFormat(smol_tokenizer, "rstar2-paper")
    _, roc = resample_on_correct([Group(kept, [rollout_stats(t, r, fmt) for t, r in kept])], 2, seed=0,
                                 min_positive=1, min_negative=1)
    assert (roc.positives, roc.negatives) == (2, 1)


async def test_an_engine_failure_is_neither_unsolved_for_the_stage_filter_nor_wrong_for_the_accuracy():
    """The stage filter drops a problem every rollout that ran solved, whatever failed in the engine beside them
    (a problem whose rollouts all failed is kept: nothing is known of it); the accuracy is over the rollouts that ran.
    The Rollouts' own filter and metrics; its generation substituted by fixed groups (no engine needed to filter)."""
    from rstar2_agent.train.config import Stage
    from rstar2_agent.train.rollout.rollouts import Batch, Rollouts
    from rstar2_agent.train.stage_filter import filter_solved
    from rstar2_agent.trajectory import Trajectory

    def traj(stop: str) -> Trajectory:
        return Trajectory(prompt_ids=[1], stop_reason=stop)

    ok, wrong, failed = (traj("answer"), 1.0), (traj("answer"), 0.0), (traj("engine_error"), 0.0)
    fixed = {"solved": [ok, ok, failed], "mixed": [ok, wrong, failed], "unknown": [failed, failed, failed]}
    rollouts = Rollouts.__new__(Rollouts)

    async def groups(problems, k, stage, step):
        return [fixed[p.id] for p in problems]

    rollouts.groups = groups
    pool = {pid: Problem(pid, pid, "1") for pid in fixed}
    assert await filter_solved(rollouts, pool, Stage(steps=1), 3) == ["mixed", "unknown"]
    batch = Batch(step=0, problems=[], groups=[fixed["mixed"]], versions=[], times={"time_rollout": 1.0})
    assert rollouts.metrics(batch, [[]], [])["accuracy"] == 0.5
