"""The agent loop with the real hf engine, the real SmolLM2 and the real sandbox."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig
from rstar2_agent.trajectory import STOP_REASONS, Trajectory

pytestmark = pytest.mark.slow
QUESTION = "What is 2**100? Use Python."


def check_structure(traj: Trajectory, fmt: ChatFormat) -> None:
    """Invariants that hold whatever the model wrote."""
    assert traj.stop_reason in STOP_REASONS
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.logprobs)
    assert sum(1 - m for m in traj.response_mask) == sum(t.inserted_tokens for t in traj.turns)
    generated = [i for i, m in zip(traj.response_ids, traj.response_mask, strict=True) if m]
    assert fmt.decode(generated) == traj.text  # the mask-1 tokens are exactly the model's turns
    assert all(lp <= 0.0 for lp, m in zip(traj.logprobs, traj.response_mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.response_mask, strict=True) if not m)


async def test_markdown_loop_runs_the_tool_and_masks_its_output(engine, sandbox):
    fmt = ChatFormat(engine.tokenizer, "markdown")
    cfg = AgentConfig(max_turns=2, max_response_tokens=160, sampling=SamplingParams(temperature=0.0, max_tokens=80))
    traj = await run_agent(QUESTION, engine, sandbox, fmt, cfg)
    check_structure(traj, fmt)
    # Greedy SmolLM2 writes a python block first; the loop runs it and inserts an output block.
    first = traj.turns[0]
    assert len(first.tool_calls) == 1 and first.tool_calls[0].status == "ok"
    assert first.inserted_tokens > 0 and 0 in traj.response_mask
    start = first.num_tokens
    inserted = fmt.decode(traj.response_ids[start:start + first.inserted_tokens])
    assert inserted.startswith("```output\n") and inserted.endswith("```\n")


async def test_hermes_loop_and_concurrent_loops_share_batches(engine, sandbox):
    fmt = ChatFormat(engine.tokenizer, "hermes")
    cfg = AgentConfig(max_turns=2, max_response_tokens=48,
                      sampling=SamplingParams(temperature=0.8, max_tokens=48, seed=3))
    before = engine.batches
    trajs = await asyncio.gather(*(run_agent(QUESTION, engine, sandbox, fmt, cfg) for _ in range(4)))
    for t in trajs:
        check_structure(t, fmt)
    calls = sum(len(t.turns) for t in trajs)
    assert engine.batches - before < calls  # concurrent requests were decoded together


async def test_a_failing_sandbox_ends_in_the_trajectory_not_an_exception(engine):
    fmt = ChatFormat(engine.tokenizer, "markdown")
    closed = LocalSandbox(SandboxConfig(workers=1))  # never started, then closed: every call fails
    await closed.close()
    cfg = AgentConfig(max_turns=2, max_response_tokens=120, sampling=SamplingParams(temperature=0.0, max_tokens=60))
    traj = await run_agent(QUESTION, engine, closed, fmt, cfg)
    check_structure(traj, fmt)
    call = traj.turns[0].tool_calls[0]
    assert call.status == "internal_error" and "closed" in call.stderr
    assert "closed" in call.response  # the model is told


async def test_a_prompt_longer_than_the_context_ends_with_max_tokens(engine, sandbox):
    fmt = ChatFormat(engine.tokenizer, "markdown")
    traj = await run_agent("x " * 9000, engine, sandbox, fmt, AgentConfig(max_turns=2))
    assert traj.stop_reason == "max_tokens" and traj.response_ids == []


async def test_trainable_hf_engine_loads_new_weights(tiny_smollm2):
    """The trainable hf engine (training's, train/rollout/trainable.py) on the 2-layer SmolLM2: new weights change
    what it generates, the old ones bring it back."""
    from rstar2_agent.train.rollout.trainable import TrainableHFEngine

    engine = TrainableHFEngine(tiny_smollm2, context_length=2048)
    ids = engine.tokenizer.encode("The capital of France is")
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    before = await engine.generate(ids, greedy)
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    await engine.load_weights({k: v * 1.5 for k, v in original.items()})
    changed = await engine.generate(ids, greedy)
    await engine.load_weights(original)
    restored = await engine.generate(ids, greedy)
    await engine.close()
    assert changed.token_ids != before.token_ids and restored.token_ids == before.token_ids


async def test_an_engine_failure_is_kept_as_the_exception_and_stored_as_its_text(smol_tokenizer, sandbox):
    """The loop keeps what the engine raised (serve maps it to a status by its type) and its text, which is what a
    trajectory's record holds; the record reads back with the text and no exception."""
    from rstar2_agent.engines.base import EngineError

    from conftest import ScriptedEngine

    class Stalled(EngineError):
        pass

    class Failing(ScriptedEngine):
        async def generate(self, prompt_ids, sampling, on_tokens=None):
            raise Stalled("no token for 5 s")

    fmt = ChatFormat(smol_tokenizer, "markdown")
    traj = await run_agent(QUESTION, Failing(smol_tokenizer, []), sandbox, fmt, AgentConfig(max_turns=1))
    assert traj.stop_reason == "engine_error" and isinstance(traj.failure, Stalled)
    assert traj.error == "Stalled: no token for 5 s"
    record = traj.to_dict()
    assert "failure" not in record and record["error"] == traj.error
    back = Trajectory.from_dict(record)
    assert back.error == traj.error and back.failure is None
