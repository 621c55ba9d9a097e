"""`rstar2 sandbox serve` over real HTTP (uvicorn on loopback) and the RemoteSandbox client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rstar2_agent.sandbox import ExecRequest, LocalSandbox, SandboxConfig, SandboxError, Status
from rstar2_agent.sandbox.remote import RemoteSandbox
from rstar2_agent.sandbox.server import create_app

from conftest import free_port, uvicorn_app


def serving(workers: int = 1):
    return uvicorn_app(create_app(LocalSandbox(SandboxConfig(workers=workers))))


@pytest.fixture(scope="module")
async def two_servers():
    async with serving() as a, serving() as b:
        yield a, b


async def test_calls_spread_over_servers_and_skip_a_dead_one(two_servers):
    dead = f"http://127.0.0.1:{free_port()}"
    async with RemoteSandbox([*two_servers, dead]) as sb:
        results = await asyncio.gather(*(sb.run(f"print({i} ** 2)") for i in range(40)))
        assert [r.stdout for r in results] == [f"{i ** 2}\n" for i in range(40)]
        assert {r.backend for r in results} == set(two_servers)
        batch = await sb.run_batch([ExecRequest("print(input())", stdin=str(i)) for i in range(10)])
        assert [r.stdout for r in batch] == [f"{i}\n" for i in range(10)]


async def test_remote_results_keep_their_status(two_servers):
    async with RemoteSandbox(two_servers[0]) as sb:
        r = await sb.run("while True: pass", timeout=1)
        assert r.status == Status.TIMEOUT
        sid = await sb.open_session()
        await sb.run_in_session(sid, "k = 5")
        assert (await sb.run_in_session(sid, "k + 1")).stdout == "6\n"
        await sb.close_session(sid)


async def test_health_metrics_and_bad_requests(two_servers):
    url = two_servers[0]
    async with httpx.AsyncClient() as c:
        health = (await c.get(f"{url}/health")).json()
        assert health["status"] == "ok" and health["workers"] == 3 and health["isolation"] is True
        assert (await c.post(f"{url}/run", json={"code": "print(1)"})).json()["stdout"] == "1\n"
        metrics = (await c.get(f"{url}/metrics")).text
        assert 'rstar2_sandbox_calls_total{status="ok"}' in metrics
        assert "rstar2_sandbox_call_seconds_bucket" in metrics
        bad = await c.post(f"{url}/run", json={"code": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "code"
        bad = await c.post(f"{url}/run", json={"code": "1", "timeout": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "timeout"
        bad = await c.post(f"{url}/run", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400


async def test_no_reachable_server_is_a_clear_error():
    with pytest.raises(SandboxError, match="rstar2 sandbox serve"):
        async with RemoteSandbox([f"http://127.0.0.1:{free_port()}"]):
            pass
