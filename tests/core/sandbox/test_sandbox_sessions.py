"""The sandbox's sessions (a process per session, like a notebook kernel): state persists, a timeout keeps it,
limits and failures are reported; and the stateless tool."""

from __future__ import annotations

import pytest

from rstar2_agent.sandbox import LocalSandbox, SandboxConfig, SandboxError, Status
from rstar2_agent.sandbox.tools import STATELESS_TOOL, execute_python_code_with_standard_io

from conftest import until


@pytest.fixture
async def sid(sandbox):
    """A session of the session's sandbox, closed after the test."""
    session = await sandbox.open_session()
    yield session
    await sandbox.close_session(session)


async def test_state_persists_across_calls(sandbox, sid):
    assert (await sandbox.run_in_session(sid, "import sympy as sp\nx = sp.symbols('x')\nn = 21")).ok
    r = await sandbox.run_in_session(sid, "n * 2, sp.factor(x**2 - 1)")
    assert r.stdout == "(42, (x - 1)*(x + 1))\n"


async def test_timeout_interrupts_but_keeps_state(sandbox, sid):
    await sandbox.run_in_session(sid, "total = 7")
    r = await sandbox.run_in_session(sid, "while True:\n    pass", timeout=1)
    assert r.status == Status.TIMEOUT
    r = await sandbox.run_in_session(sid, "total")
    assert r.stdout == "7\n"


async def test_a_dead_session_is_replaced_and_says_so(sandbox, sid):
    await sandbox.run_in_session(sid, "v = 1")
    r = await sandbox.run_in_session(sid, "import os\nos._exit(1)")
    assert r.status == Status.KILLED and "variables are lost" in r.stderr
    r = await sandbox.run_in_session(sid, "print('v' in globals())")
    assert r.stdout == "False\n"


async def test_session_cap_and_unknown_session():
    async with LocalSandbox(SandboxConfig(workers=1, max_sessions=1)) as sb:
        sid = await sb.open_session()
        with pytest.raises(SandboxError, match="too many open sessions"):
            await sb.open_session()
        await sb.close_session(sid)
        r = await sb.run_in_session(sid, "1")
        assert r.status == Status.INTERNAL_ERROR and "unknown" in r.stderr
        await sb.close_session(await sb.open_session())


async def test_idle_sessions_are_closed():
    async with LocalSandbox(SandboxConfig(workers=1, session_idle_timeout=0.4)) as sb:
        sid = await sb.open_session()

        async def closed() -> bool:
            return (await sb.stats())["sessions"] == 0

        await until(closed, "the idle session to be closed", timeout=10)
        assert (await sb.run_in_session(sid, "1")).status == Status.INTERNAL_ERROR


async def test_stateless_tool_takes_input(sandbox):
    assert STATELESS_TOOL == "execute_python_code_with_standard_io"
    r = await execute_python_code_with_standard_io(sandbox, "print(input()[::-1])", input="abc")
    assert r.stdout == "cba\n"
