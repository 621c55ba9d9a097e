"""LocalSandbox: a pool of warm sandbox workers on this machine, with back-pressure and sessions."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .isolation import check_isolation, sandbox_user
from .templates import DEFAULT_TEMPLATES, TemplateRouter
from .types import ExecResult, Limits, Sandbox, SandboxError, Status, unknown_session
from .worker import NotDelivered, Worker, WorkerDied, died_result

log = logging.getLogger(__name__)


@dataclass
class SandboxConfig:
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    limits: Limits = field(default_factory=Limits)
    isolation: bool = True  # False only with --unsafe-no-isolation
    # Each template is a set of modules a worker imports once; `workers` workers per template. Sessions use
    # the largest. See templates.py for how a program is routed.
    templates: tuple[tuple[str, ...], ...] = DEFAULT_TEMPLATES
    max_queue: int = 65536  # calls waiting for a worker; past this a call fails at once with queue_timeout
    queue_timeout: float = 300.0  # seconds a call may wait for a worker
    max_sessions: int = 32
    session_idle_timeout: float = 900.0
    bwrap: str | None = None  # path to bwrap; default: found on PATH
    # When the server is root, workers drop to this unprivileged uid/gid before bubblewrap starts, so sandboxed
    # code is never host uid 0 (65534 is `nobody`; a dedicated id owned by nothing else is better)
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    cgroups: bool = True  # a cgroup per worker (memory, pids, cpu) where writable; False: the rlimit fallback


@dataclass
class _Session:
    worker: Worker
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class LocalSandbox(Sandbox):
    def __init__(self, config: SandboxConfig | None = None, **overrides: Any):
        self.config = config or SandboxConfig(**overrides)
        self._idle: dict[tuple[str, ...], asyncio.Queue[Worker]] = {}
        self.router = TemplateRouter(self.config.templates)
        self._workers: list[Worker] = []
        self._waiting = 0
        self._running = 0
        self._restarts: set[asyncio.Task] = set()
        self._sessions: dict[str, _Session] = {}
        self._reaper: asyncio.Task | None = None
        self._closed = False
        self.counts: Counter[str] = Counter()
        self.restarted = 0

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.config
        if cfg.isolation:
            problem = check_isolation(cfg.bwrap, self._user())
            if problem:
                raise SandboxError(problem)
        else:
            log.warning("sandbox isolation is OFF (--unsafe-no-isolation): code runs with this user's rights")
        templates = self.router.templates
        self._idle = {t: asyncio.Queue() for t in templates}
        workers = [self._new_worker("fork", t) for t in templates for _ in range(max(1, cfg.workers))]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        failed = [k for k, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:  # one more try for each, with a fresh process: a start can stall on a loaded host
            log.warning("%d sandbox worker(s) failed to start (%s); starting fresh ones once more", len(failed),
                        results[failed[0]])
            for k in failed:
                workers[k] = self._new_worker("fork", workers[k].preload)
            again = await asyncio.gather(*(workers[k].start() for k in failed), return_exceptions=True)
            errors = [r for r in again if isinstance(r, BaseException)]
            if errors:
                await asyncio.gather(*(w.close() for w in workers))
                raise SandboxError(f"could not start the sandbox workers (twice): {errors[0]}")
        root_run = [w for w in workers if cfg.isolation and w.host_uid() == 0]
        if root_run:
            await asyncio.gather(*(w.close() for w in workers))
            raise SandboxError("a sandbox worker runs as host uid 0: refusing to run untrusted code as root. Check "
                               "`rstar2 sandbox check`; only where that is acceptable pass --unsafe-no-isolation.")
        for w in workers:
            self._workers.append(w)
            self._idle[w.preload].put_nowait(w)
        self._reaper = asyncio.create_task(self._reap_idle_sessions())

    async def close(self) -> None:
        self._closed = True
        if self._reaper:
            self._reaper.cancel()
        for t in list(self._restarts):
            t.cancel()
        sessions = [s.worker for s in self._sessions.values()]
        self._sessions.clear()
        await asyncio.gather(*(w.close() for w in self._workers + sessions), return_exceptions=True)
        self._workers.clear()

    def _user(self) -> tuple[int, int] | None:
        cfg = self.config
        return sandbox_user(cfg.sandbox_uid, cfg.sandbox_gid) if cfg.isolation else None

    def _new_worker(self, mode: str, preload: tuple[str, ...] | None = None) -> Worker:
        cfg = self.config
        preload = self.router.largest if preload is None else preload
        return Worker(mode, cfg.limits, isolation=cfg.isolation, preload=preload, bwrap=cfg.bwrap,
                      user=self._user(), cgroups=cfg.cgroups)

    # ------------------------------------------------------------ stateless calls
    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        cfg = self.config
        if self._closed:
            return self._count(ExecResult.failure(Status.INTERNAL_ERROR, "the sandbox is closed"))
        if self._waiting >= cfg.max_queue:
            return self._count(ExecResult.failure(
                Status.QUEUE_TIMEOUT, f"sandbox queue is full ({cfg.max_queue} calls waiting); retry later "
                "or add workers (--workers) or servers"))
        t0 = time.monotonic()
        for attempt in range(2):  # a second try only when the first worker never received the program
            self._waiting += 1
            try:
                left = max(0.0, cfg.queue_timeout - (time.monotonic() - t0))
                worker = await asyncio.wait_for(self._idle[self.router.pick(code)].get(), left)
            except TimeoutError:
                return self._count(ExecResult.failure(
                    Status.QUEUE_TIMEOUT, f"no sandbox worker was free within {cfg.queue_timeout:.0f} s",
                    queue_time=time.monotonic() - t0))
            finally:
                self._waiting -= 1
            queued = time.monotonic() - t0
            self._running += 1
            try:
                result = await worker.call(code, stdin, timeout)
            except NotDelivered as e:
                result = died_result(worker, f"the sandbox worker was gone before the call reached it ({e})")
                if attempt == 0:
                    continue
            except WorkerDied as e:
                result = died_result(worker, f"the sandbox worker died during the call ({e}); it was restarted")
            finally:
                self._running -= 1
                self._release(worker)
            result.queue_time = queued
            return self._count(result)
        raise AssertionError("unreachable")

    def _count(self, result: ExecResult) -> ExecResult:
        self.counts[str(result.status)] += 1
        return result

    def _release(self, worker: Worker) -> None:
        if worker.alive:
            self._idle[worker.preload].put_nowait(worker)
        elif not self._closed:
            task = asyncio.create_task(self._replace(worker))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)

    async def _replace(self, dead: Worker) -> None:
        await dead.close()
        delay = 0.1
        while not self._closed:
            fresh = self._new_worker("fork", dead.preload)
            try:
                await fresh.start()
            except (WorkerDied, SandboxError, OSError) as e:
                log.error("restarting a sandbox worker failed (%s); retrying in %.1f s", e, delay)
                await fresh.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self.restarted += 1
            self._workers[self._workers.index(dead)] = fresh
            self._idle[fresh.preload].put_nowait(fresh)
            return

    # ------------------------------------------------------------ sessions
    async def open_session(self) -> str:
        if len(self._sessions) >= self.config.max_sessions:
            raise SandboxError(f"too many open sessions ({self.config.max_sessions}); close one or raise "
                               "--max-sessions")
        worker = self._new_worker("session")
        await worker.start()  # a caller cancelled mid-start leaves no process: start() kills what it began
        sid = uuid.uuid4().hex
        self._sessions[sid] = _Session(worker)
        return sid

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        session = self._sessions.get(session_id)
        if session is None:
            return unknown_session(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            worker = session.worker
            try:
                return self._count(await worker.call(code, stdin, timeout))
            except WorkerDied as e:
                session.worker = self._new_worker("session")
                await session.worker.start()
                await worker.close()
                return self._count(died_result(
                    worker, f"the session process died or hung ({e}); a fresh session replaced it and the "
                    "earlier variables are lost"))

    async def close_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await session.worker.close()

    async def _reap_idle_sessions(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.config.session_idle_timeout / 2))
            now = time.monotonic()
            for sid, s in list(self._sessions.items()):
                if not s.lock.locked() and now - s.last_used > self.config.session_idle_timeout:
                    log.info("closing sandbox session %s after %.0f s idle", sid, now - s.last_used)
                    await self.close_session(sid)

    # ------------------------------------------------------------ introspection
    async def stats(self) -> dict[str, Any]:
        return {
            "workers": len(self._workers),
            "alive": sum(w.alive for w in self._workers),
            "idle": sum(q.qsize() for q in self._idle.values()),
            "running": self._running,
            "waiting": self._waiting,
            "sessions": len(self._sessions),
            "restarted": self.restarted,
            "results": dict(self.counts),
            "isolation": self.config.isolation,
        }

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w.pid]
