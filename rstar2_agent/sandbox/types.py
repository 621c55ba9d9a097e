"""Records shared by every sandbox backend: limits, a request, a result, and the backend interface."""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"  # ran to the end (exit code 0)
    ERROR = "error"  # an exception, a syntax error or a non-zero exit
    TIMEOUT = "timeout"  # past the wall-time or CPU-time limit
    MEMORY = "memory"  # past the memory limit (MemoryError)
    KILLED = "killed"  # killed by a signal, cancelled, or its worker died mid-call
    QUEUE_TIMEOUT = "queue_timeout"  # never reached a worker: queue full or queue wait too long
    INTERNAL_ERROR = "internal_error"  # the sandbox itself failed; the code may not have run


class SandboxError(RuntimeError):
    """A sandbox that cannot serve at all (no isolation, bad configuration, unreachable servers)."""


@dataclass
class Limits:
    """Per-call resource limits. The defaults suit math tool calls; raise them per call with `timeout=`."""

    wall_seconds: float = 10.0
    cpu_seconds: float | None = 10.0
    # address space of each process, and (where cgroups are writable) all the worker holds together: its
    # processes, /tmp, /dev/shm and SysV segments; numpy and sympy already map about 1 GiB
    memory_bytes: int = 4 << 30
    max_output_bytes: int = 1 << 20  # per stream; the rest is dropped and `truncated` is set
    file_size_bytes: int = 64 << 20  # any one file written, stdout included
    max_processes: int = 64
    max_open_files: int = 256
    scratch_bytes: int = 256 << 20  # the private /tmp and /dev/shm, each (bwrap tmpfs)
    cpus: float | None = 1.0  # CPUs a worker may use at once (cgroup cpu quota, where cgroups are writable)
    session_cpu_seconds: float | None = 600.0  # CPU time of a sandbox session's kernel in total (RLIMIT_CPU)

    def for_call(self, timeout: float | None) -> dict[str, Any]:
        d = asdict(self)
        if timeout is not None:
            d["wall_seconds"] = float(timeout)
            if d["cpu_seconds"] is not None:
                d["cpu_seconds"] = max(d["cpu_seconds"], float(timeout))
        return d


@dataclass
class ExecRequest:
    code: str
    stdin: str = ""
    timeout: float | None = None


@dataclass
class ExecResult:
    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration: float = 0.0  # seconds the program ran
    cpu_time: float | None = None
    truncated: bool = False
    queue_time: float = 0.0  # seconds the call waited for a worker
    backend: str = ""  # which worker, server or actor answered

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = str(self.status)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = Status(kw.get("status", "internal_error"))
        return cls(**kw)

    @classmethod
    def failure(cls, status: Status, message: str, **kw: Any) -> ExecResult:
        return cls(status=status, stderr=message, **kw)


def unknown_session(session_id: str) -> ExecResult:
    return ExecResult.failure(Status.INTERNAL_ERROR, f"unknown or expired session {session_id!r}; open a new one")


class Sandbox(abc.ABC):
    """What serve, eval and train use. Every call returns an ExecResult; none raises for bad code."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:  # noqa: B027 - optional hook
        pass

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass

    @abc.abstractmethod
    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult: ...

    async def run_batch(self, requests: list[ExecRequest]) -> list[ExecResult]:
        return list(await asyncio.gather(*(self.run(r.code, r.stdin, r.timeout) for r in requests)))

    @abc.abstractmethod
    async def open_session(self) -> str: ...

    @abc.abstractmethod
    async def run_in_session(
        self, session_id: str, code: str, stdin: str = "", timeout: float | None = None
    ) -> ExecResult: ...

    @abc.abstractmethod
    async def close_session(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def stats(self) -> dict[str, Any]: ...
