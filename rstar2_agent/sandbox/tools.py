"""The two Python tools the agent can call, both on top of the same sandbox.

- `execute_python_code_with_standard_io(code, input)`: rStar2-Agent's tool (the one the paper trains
  with). Every call is a fresh program: nothing carries over, which keeps RL rollouts independent,
  reproducible and cheap to run in parallel.
- `python` (stateful): a notebook-like session whose variables persist across calls, for chat users
  who build on earlier results. It costs a dedicated process per session, so it is capped.
"""

from __future__ import annotations

from typing import Any

from .types import ExecResult, Sandbox

STATELESS_TOOL = "execute_python_code_with_standard_io"
SESSION_TOOL = "python"

STATELESS_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": STATELESS_TOOL,
        "description": "Execute a Python program with the given standard input and return its standard output "
        "and standard error. Each call runs a fresh program; the value of a final bare expression is printed.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python program to run."},
                "input": {"type": "string", "description": "Text given to the program on standard input."},
            },
            "required": ["code"],
        },
    },
}

SESSION_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SESSION_TOOL,
        "description": "Run Python code in a persistent session (like a notebook): variables, functions and "
        "imports stay defined for later calls. Returns standard output, standard error and the value of a "
        "final bare expression.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


async def execute_python_code_with_standard_io(sandbox: Sandbox, code: str, input: str = "",  # noqa: A002
                                               timeout: float | None = None) -> ExecResult:
    return await sandbox.run(code, stdin=input, timeout=timeout)


class PythonSession:
    """The stateful tool for one conversation. Opens its sandbox session on first use."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.session_id: str | None = None

    async def __call__(self, code: str, timeout: float | None = None) -> ExecResult:
        if self.session_id is None:
            self.session_id = await self.sandbox.open_session()
        return await self.sandbox.run_in_session(self.session_id, code, timeout=timeout)

    async def close(self) -> None:
        if self.session_id is not None:
            await self.sandbox.close_session(self.session_id)
            self.session_id = None
