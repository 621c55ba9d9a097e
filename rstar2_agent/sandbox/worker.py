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

from .isolation import WorkerCgroup, build_launch, uses_cgroups
from .types import ExecResult, Limits, Status

log = logging.getLogger(__name__)
_HDR = struct.Struct(">I")
_ids = itertools.count()
GRACE_SECONDS = 5.0  # how long past the call's own timeout before the host gives up on the runner
MAX_FRAME = 1 << 16  # a control frame from the runner is small (the output follows it, capped on its own)


class WorkerDied(RuntimeError):
    pass


class FrameRefused(WorkerDied):
    """The runner sent more than the protocol allows (a forged frame): refused unread, the worker restarted."""


class NotDelivered(WorkerDied):
    """The worker was gone before the program reached it: running the call elsewhere is safe."""


class Worker:
    """Owns one runner process. Not safe for concurrent calls: the pool hands it to one call at a time."""

    def __init__(self, mode: str, limits: Limits, *, isolation: bool, preload: tuple[str, ...],
                 bwrap: str | None = None, startup_timeout: float = 120.0, user: tuple[int, int] | None = None,
                 cgroups: bool = True):
        self.mode, self.limits, self.isolation, self.preload = mode, limits, isolation, preload
        self.bwrap, self.startup_timeout = bwrap, startup_timeout
        self.user = user  # the unprivileged (uid, gid) the worker drops to (the host is root), else None
        self.use_cgroups = cgroups
        self.name = f"{mode}-{os.getpid()}-{next(_ids)}"
        self.proc: asyncio.subprocess.Process | None = None
        self.cgroup: WorkerCgroup | None = None
        self.host_scratch: str | None = None
        self.stage: str | None = None
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
        lim = self.limits
        if self.use_cgroups and uses_cgroups():
            self.cgroup = WorkerCgroup(self.name, max_pids=lim.max_processes + 8, memory_bytes=lim.memory_bytes,
                                       cpus=lim.cpus)
        memory_counted = self.cgroup is not None and "memory" in self.cgroup.enforced
        launch = build_launch(self.mode, isolation=self.isolation, scratch_bytes=lim.scratch_bytes,
                              preload=self.preload, bwrap=self.bwrap, user=self.user, cgroup=self.cgroup,
                              sysv=memory_counted)
        self.host_scratch, self.stage = launch.host_scratch, launch.stage
        argv = launch.argv
        try:
            # No preexec_fn: Python code between fork and exec in this multi-threaded process (engine threads,
            # uvicorn) runs every library's at-fork handler in the child, and one that waits on a lock another
            # thread held at the fork hangs the child before exec (see launcher.py).
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=launch.env or None,
                limit=1 << 26, start_new_session=True, pass_fds=launch.pass_fds)
        except BaseException:  # not spawned, or cancelled (asyncio then kills what it spawned): undo the rest
            await asyncio.shield(self.close())
            raise
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
        except asyncio.CancelledError:  # the caller went away mid-start (a client that disconnected): no orphan
            await asyncio.shield(self.kill())
            raise
        if hello.get("op") != "ready":
            await self.kill()
            raise WorkerDied(f"sandbox worker sent {hello!r} instead of ready")
        self._remove_stage()  # bwrap has made its mounts: the host's empty staging folders are not needed

    def _remove_stage(self) -> None:
        if self.stage:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    async def call(self, code: str, stdin: str, timeout: float | None) -> ExecResult:
        """Run one program. Raises WorkerDied when the runner is gone (the caller restarts it)."""
        if not self.alive:
            raise NotDelivered("worker is not running")
        limits = self.limits.for_call(timeout)
        ooms = self.cgroup.oom_kills() if self.cgroup else None
        body = [code.encode("utf-8", "surrogatepass"), stdin.encode("utf-8", "surrogatepass")]
        await self._write({"op": "run", "limits": limits, "lengths": [len(b) for b in body]}, *body)
        reply = asyncio.ensure_future(self._reply(int(limits["max_output_bytes"])))
        try:
            resp = await asyncio.wait_for(asyncio.shield(reply), limits["wall_seconds"] + GRACE_SECONDS)
        except asyncio.CancelledError:
            await self._abort_after_cancel(reply)
            raise
        except TimeoutError:
            reply.cancel()
            await self.kill()
            raise WorkerDied("the sandbox worker stopped answering and was restarted") from None
        except FrameRefused:
            await self.kill()
            raise
        if ooms is not None and resp["status"] == "killed" and (self.cgroup.oom_kills() or 0) > ooms:
            resp["status"] = "memory"
            resp["stderr"] = _with_note(resp["stderr"], f"MemoryError: the sandbox ran out of its memory limit "
                                        f"({self.limits.memory_bytes >> 20} MiB for everything it holds: its "
                                        "processes, /tmp, /dev/shm and shared memory) and the program was killed")
        return ExecResult.from_dict({**resp, "backend": self.name})

    async def _reply(self, cap: int) -> dict[str, Any]:
        """The runner's receipt, then its result. Gone before the receipt: the program never started, so the
        caller may run it elsewhere (NotDelivered); gone after it: the call died with the worker."""
        try:
            receipt = await self._read()
        except FrameRefused:
            raise
        except WorkerDied as e:
            raise NotDelivered(f"the runner exited before it read the program ({e})") from e
        if receipt.get("op") != "started":
            self.broken = True
            raise WorkerDied(f"the sandbox runner sent {receipt!r} instead of its receipt")
        head = await self._read()
        lengths = head.pop("lengths", None)
        if (head.pop("op", None) != "result" or not isinstance(lengths, list) or len(lengths) != 2
                or not all(type(n) is int and 0 <= n <= cap for n in lengths)):
            self.broken = True
            raise FrameRefused(f"the sandbox runner sent a result with outputs of {lengths!r} bytes, past the "
                               f"{cap:,}-byte cap of each stream: refused unread, and the worker is restarted")
        note = str(head.pop("note", "") or "")
        out, err = [(await self._read_exactly(n)).decode("utf-8", "replace") for n in lengths]
        return {**head, "stdout": out, "stderr": _with_note(err, note)}

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

    async def _write(self, obj: dict[str, Any], *payload: bytes) -> None:
        assert self.proc and self.proc.stdin
        body = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(_HDR.pack(len(body)) + body)
            for data in payload:
                self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as e:
            self.broken = True
            raise NotDelivered(f"worker pipe closed: {e}") from e

    async def _read(self) -> dict[str, Any]:
        """One control frame, refused unread when it claims more than MAX_FRAME bytes."""
        size = _HDR.unpack(await self._read_exactly(_HDR.size))[0]
        if size > MAX_FRAME:
            self.broken = True
            raise FrameRefused(f"the sandbox runner sent a frame of {size:,} bytes, past the {MAX_FRAME:,}-byte "
                               "limit of a control frame: refused unread, and the worker is restarted")
        try:
            obj = json.loads(await self._read_exactly(size))
        except ValueError as e:
            self.broken = True
            raise FrameRefused(f"the sandbox runner sent a frame that is not JSON ({e})") from e
        if not isinstance(obj, dict):
            self.broken = True
            raise FrameRefused(f"the sandbox runner sent {type(obj).__name__} instead of an object")
        return obj

    async def _read_exactly(self, n: int) -> bytes:
        assert self.proc and self.proc.stdout
        try:
            return await self.proc.stdout.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self.broken = True
            raise WorkerDied("the sandbox worker process exited") from e

    def host_uid(self) -> int | None:
        """The host uid the worker's processes run as (read from /proc), None when it is not running."""
        if self.proc is None:
            return None
        try:
            for line in open(f"/proc/{self.proc.pid}/status"):
                if line.startswith("Uid:"):
                    return int(line.split()[2])  # the effective uid
        except OSError:
            return None
        return None

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
        if self.cgroup is not None:
            self.cgroup.remove()
        self._remove_stage()
        if self.host_scratch:
            shutil.rmtree(self.host_scratch, ignore_errors=True)
            self.host_scratch = None


def _with_note(stderr: str, note: str) -> str:
    if not note:
        return stderr
    return (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + note).lstrip("\n")


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
