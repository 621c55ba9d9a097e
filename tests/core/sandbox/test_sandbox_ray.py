"""Sandbox actors on a local Ray cluster (the same code path as a multi-node cluster)."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_agent.sandbox import SandboxConfig, Status
from rstar2_agent.sandbox.ray_pool import RaySandbox
from rstar2_agent.sandbox.types import ExecRequest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


async def test_two_local_actors_share_the_calls():
    ray = pytest.importorskip("ray")
    sb = RaySandbox(actors=2, config=SandboxConfig(workers=1), num_cpus_per_actor=0.5)
    try:
        await sb.start()
        results = await asyncio.gather(*(sb.run(f"print({i} + 1)") for i in range(30)))
        assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(30)]
        assert {r.backend.split(":")[0] for r in results} == {"ray-actor-0", "ray-actor-1"}
        assert (await sb.run("1/0")).status == Status.ERROR
        batch = await sb.run_batch([ExecRequest(f"print({i} * 2)") for i in range(5)])  # striped over both actors
        assert [r.stdout for r in batch] == [f"{i * 2}\n" for i in range(5)]
        assert {r.backend.split(":")[0] for r in batch} == {"ray-actor-0", "ray-actor-1"}
        sid = await sb.open_session()
        await sb.run_in_session(sid, "z = 3")
        assert (await sb.run_in_session(sid, "z * 3")).stdout == "9\n"
        stats = await sb.stats()
        assert stats["alive"] == 6  # per actor: one worker per template
    finally:
        await sb.close()
        ray.shutdown()


async def programs_running(sb: RaySandbox, k: int) -> bool:
    """Whether actor `k`'s pool is running a program now."""
    return (await sb.stats())["actors"][k]["running"] > 0


async def test_a_killed_sandbox_actor_is_replaced_and_its_calls_rerun_once(smol_tokenizer):
    """Six trajectories through the real agent loop (scripted model turns: one slow tool call each, then the
    answer) on two sandbox actors; one actor's process is killed (SIGKILL) while its calls run. It is replaced,
    its calls run once more there, and every trajectory gets its own call's output, once. A session opened in
    the dead actor is answered that it was lost; an actor that keeps dying ends in an error that says what to do."""
    ray = pytest.importorskip("ray")
    import json
    import os
    import signal

    from rstar2_agent.agent import AgentConfig, run_agent
    from rstar2_agent.chat_format import ChatFormat
    from rstar2_agent.sandbox.tools import STATELESS_TOOL

    from conftest import ScriptedEngine, until

    def turns(i: int) -> list[str]:
        code = f"import time\ntime.sleep(2)\nprint({i} * 7)"
        call = json.dumps({"name": STATELESS_TOOL, "arguments": {"code": code, "input": ""}})
        return [f"Let me compute.\n<tool_call>\n{call}\n</tool_call>", f"So it is {i * 7}."]

    fmt = ChatFormat(smol_tokenizer, "hermes")
    sb = RaySandbox(actors=2, config=SandboxConfig(workers=3), num_cpus_per_actor=0.5, max_restarts=1)
    try:
        await sb.start()
        sid = await sb.open_session()
        await sb.run_in_session(sid, "z = 3")
        pids, k = await sb.pids(), sb._session_home[sid][0]  # kill the actor the session lives in
        trajs = [asyncio.create_task(run_agent(f"What is {i} * 7?", ScriptedEngine(smol_tokenizer, turns(i)), sb,
                                               fmt, AgentConfig(max_turns=3, tool_timeout=30))) for i in range(6)]
        await until(lambda: sb.balancer.outstanding[0] > 0 and sb.balancer.outstanding[1] > 0,
                    "calls in flight on both actors", timeout=60)
        await until(lambda: programs_running(sb, k), f"programs running in actor {k}")  # they sleep 2 s
        os.kill(pids[k], signal.SIGKILL)
        done = await asyncio.gather(*trajs)
        assert sb.restarts[k] == 1 and sum(sb.restarts) == 1 and (await sb.pids())[k] != pids[k]
        for i, t in enumerate(done):
            assert t.stop_reason != "engine_error" and len(t.tool_calls) == 1, t.error
            call = t.tool_calls[0]
            assert not call.failed and json.loads(call.response)["stdout"] == f"{i * 7}\n", call.response
        assert (await sb.run_in_session(sid, "z * 3")).stderr.startswith(f"session {sid!r} was lost")

        os.kill((await sb.pids())[k], signal.SIGKILL)  # max_restarts=1 is spent
        results = await asyncio.gather(*(sb.run(f"print({i})") for i in range(6)))
        failed = [r for r in results if r.status == Status.INTERNAL_ERROR]
        assert failed and all("max_restarts=1" in r.stderr and "raise max_worker_restarts" in r.stderr
                              for r in failed)
        assert all(r.stdout == f"{i}\n" for i, r in enumerate(results) if r not in failed)
    finally:
        await sb.close()
        ray.shutdown()
