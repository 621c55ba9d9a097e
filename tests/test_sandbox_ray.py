"""Sandbox actors on a local Ray cluster (the same code path as a multi-node cluster)."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_agent.sandbox import SandboxConfig, Status
from rstar2_agent.sandbox.ray_pool import RaySandbox

pytestmark = pytest.mark.slow


async def test_two_local_actors_share_the_calls():
    ray = pytest.importorskip("ray")
    sb = RaySandbox(actors=2, config=SandboxConfig(workers=1), num_cpus_per_actor=0.5)
    try:
        await sb.start()
        results = await asyncio.gather(*(sb.run(f"print({i} + 1)") for i in range(30)))
        assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(30)]
        assert {r.backend.split(":")[0] for r in results} == {"ray-actor-0", "ray-actor-1"}
        assert (await sb.run("1/0")).status == Status.ERROR
        sid = await sb.open_session()
        await sb.run_in_session(sid, "z = 3")
        assert (await sb.run_in_session(sid, "z * 3")).stdout == "9\n"
        stats = await sb.stats()
        assert stats["alive"] == 6  # per actor: one worker per template
    finally:
        await sb.close()
        ray.shutdown()
