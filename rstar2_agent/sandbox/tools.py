"""The Python tool the agent calls: `execute_python_code_with_standard_io(code, input)`, rStar2-Agent's tool (the
one the paper trains with). Every call is a fresh program: nothing carries over, which keeps RL rollouts
independent, reproducible and cheap to run in parallel. (The sandbox's sessions, whose variables persist
across calls, are a sandbox API, not a tool the agent is offered.)
"""

from __future__ import annotations

from typing import Any

from .types import ExecResult, Sandbox

STATELESS_TOOL = "execute_python_code_with_standard_io"

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

async def execute_python_code_with_standard_io(sandbox: Sandbox, code: str, input: str = "",  # noqa: A002
                                               timeout: float | None = None) -> ExecResult:
    return await sandbox.run(code, stdin=input, timeout=timeout)
