"""One sandbox worker: a runner process (usually inside bubblewrap) and the framed JSON channel to it."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import signal
import struct
from typing import Any

from .isolation import ProcessCap, build_launch, needs_process_cap
from .types import ExecResult, Limits, Status

log = logging.getLogger(__name__)
_HDR = struct.Struct(">I")
_ids = itertools.count()
GRACE_SECONDS = 5.0  # how long past the call's own timeout before the host gives up on the runner


class WorkerDied(RuntimeError):
    pass


class NotDelivered(WorkerDied):
    """The worker was gone before the program reached it: running the call elsewhere is safe."""


class Worker:
    """Owns one runner process. Not safe for concurrent calls: the pool hands it to one call at a time."""

    def __init__(self, mode: str, limits: Limits, *, isolation: bool, preload: tuple[str, ...],
                 bwrap: str | None = None, startup_timeout: float = 120.0):
        self.mode, self.limits, self.isolation, self.preload = mode, limits, isolation, preload
        self.bwrap, self.startup_timeout = bwrap, startup_timeout
        self.name = f"{mode}-{os.getpid()}-{next(_ids)}"
        self.proc: asyncio.subprocess.Process | None = None
        self.cap: ProcessCap | None = None
        self.host_scratch: str | None = None
        self._stderr_task: asyncio.Task | None = None
        self._stderr_tail = b""
        self.broken = False  # set once the channel failed, before the process is reaped

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self.broken

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        launch = build_launch(self.mode, isolation=self.isolation, scratch_bytes=self.limits.scratch_bytes,
                              preload=self.preload, bwrap=self.bwrap)
        self.host_scratch = launch.host_scratch
        argv = launch.argv
        if needs_process_cap():
            self.cap = ProcessCap(self.name, self.limits.max_processes + 8)
            argv = self.cap.wrap(argv)
        try:
            # No preexec_fn: Python code between fork and exec in this multi-threaded process (engine threads,
            # uvicorn) runs every library's at-fork handler in the child, and one that waits on a lock another
            # thread held at the fork hangs the child before exec (see ProcessCap.wrap).
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=launch.env or None,
                limit=1 << 26, start_new_session=True, pass_fds=launch.pass_fds)
        finally:
            for fd in launch.pass_fds:
                os.close(fd)
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        try:
            hello = await asyncio.wait_for(self._read(), self.startup_timeout)
        except (TimeoutError, WorkerDied) as e:
            state = process_states(self.proc.pid)
            await self.kill()
            raise WorkerDied(f"sandbox worker failed to start: {e!r} after at most {self.startup_timeout:.0f} s; "
                             f"its processes: {state or 'gone'}; its stderr: {self._last_stderr()}") from e
        if hello.get("op") != "ready":
            await self.kill()
            raise WorkerDied(f"sandbox worker sent {hello!r} instead of ready")

    async def call(self, code: str, stdin: str, timeout: float | None) -> ExecResult:
        """Run one program. Raises WorkerDied when the runner is gone (the caller restarts it)."""
        if not self.alive:
            raise NotDelivered("worker is not running")
        limits = self.limits.for_call(timeout)
        await self._write({"op": "run", "code": code, "stdin": stdin, "limits": limits})
        reply = asyncio.ensure_future(self._reply())
        try:
            resp = await asyncio.wait_for(asyncio.shield(reply), limits["wall_seconds"] + GRACE_SECONDS)
        except asyncio.CancelledError:
            await self._abort_after_cancel(reply)
            raise
        except TimeoutError:
            reply.cancel()
            await self.kill()
            raise WorkerDied("the sandbox worker stopped answering and was restarted") from None
        return ExecResult.from_dict({**resp, "backend": self.name})

    async def _reply(self) -> dict[str, Any]:
        """The runner's receipt, then its result. Gone before the receipt: the program never started, so the
        caller may run it elsewhere (NotDelivered); gone after it: the call died with the worker."""
        try:
            receipt = await self._read()
        except WorkerDied as e:
            raise NotDelivered(f"the runner exited before it read the program ({e})") from e
        if receipt.get("op") != "started":
            self.broken = True
            raise WorkerDied(f"the sandbox runner sent {receipt!r} instead of its receipt")
        return await self._read()

    async def _abort_after_cancel(self, reply: asyncio.Future) -> None:
        """The caller went away mid-call: tell the runner to kill the program, and consume its answer."""
        try:
            if self.mode == "fork":
                await self._write({"op": "abort"})
                await asyncio.wait_for(reply, GRACE_SECONDS)
            else:
                reply.cancel()
                await self.kill()
        except (Exception, asyncio.CancelledError):  # noqa: BLE001
            await self.kill()

    async def _write(self, obj: dict[str, Any]) -> None:
        assert self.proc and self.proc.stdin
        body = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(_HDR.pack(len(body)) + body)
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as e:
            self.broken = True
            raise NotDelivered(f"worker pipe closed: {e}") from e

    async def _read(self) -> dict[str, Any]:
        assert self.proc and self.proc.stdout
        try:
            head = await self.proc.stdout.readexactly(_HDR.size)
            body = await self.proc.stdout.readexactly(_HDR.unpack(head)[0])
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self.broken = True
            raise WorkerDied("the sandbox worker process exited") from e
        return json.loads(body)

    async def _drain_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        while True:
            chunk = await self.proc.stderr.read(4096)
            if not chunk:
                return
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _last_stderr(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace").strip()

    async def kill(self) -> None:
        self.broken = True
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                log.warning("sandbox worker %s did not exit after SIGKILL", self.name)
        await self.close()

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.stdin.close()  # the runner exits on EOF
                await asyncio.wait_for(self.proc.wait(), 5)
            except Exception:  # noqa: BLE001 - a stuck or broken runner is killed
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await self.proc.wait()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
        if self.cap is not None:
            self.cap.remove()
        if self.host_scratch:
            shutil.rmtree(self.host_scratch, ignore_errors=True)
            self.host_scratch = None


def died_result(worker: Worker, message: str) -> ExecResult:
    return ExecResult.failure(Status.KILLED, message, backend=worker.name)


def process_states(pid: int) -> str:
    """`pid` and its descendants as "pid name state wchan", for an error about a process that stalled: a D state
    or the kernel function it waits in says where (disk, memory reclaim, a cgroup) far better than a timeout."""
    out, todo = [], [pid]
    while todo and len(out) < 16:
        p = todo.pop()
        try:
            stat = open(f"/proc/{p}/stat").read()
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            wchan = open(f"/proc/{p}/wchan").read().strip() or "-"
            children = open(f"/proc/{p}/task/{p}/children").read().split()
        except (OSError, ValueError):
            continue
        out.append(f"{p} {name} {rest[0]} {wchan}")
        todo.extend(int(c) for c in children)
    return ", ".join(out)
