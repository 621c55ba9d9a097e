"""RaySandbox: sandbox actors spread over a Ray cluster's CPU nodes, behind the same interface.

Each actor owns a LocalSandbox (its own warm, isolated workers) on the node it was placed on; the
client sends each call to the actor with the fewest calls in flight. `ray.init()` with no address
starts a local cluster, so the same code runs on one machine.

An actor that dies (its process killed, its node lost) is replaced by a new one in its place, and the calls
that were in flight on it run once more there (a program is a pure function of its code and stdin; a call
that fails again is answered with its failure, not retried twice). A session lives in one actor's worker, so
its state dies with the actor: the session's later calls are answered that it was lost. At most
`max_restarts` replacements per actor; past that the calls fail with an error that says what to do.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import asdict
from typing import Any

from .balance import LeastLoaded, striped
from .pool import LocalSandbox, SandboxConfig
from .types import ExecRequest, ExecResult, Limits, Sandbox, SandboxError, Status, unknown_session

log = logging.getLogger(__name__)


class SandboxActor:
    """The Ray actor body (wrapped with ray.remote at runtime so that importing this file needs no Ray)."""

    def __init__(self, config: dict[str, Any]):
        config = dict(config)
        config["limits"] = Limits(**config["limits"])
        config["templates"] = tuple(tuple(t) for t in config["templates"])
        self.sandbox = LocalSandbox(SandboxConfig(**config))
        self.started = False

    async def start(self) -> bool:
        if not self.started:
            await self.sandbox.start()
            self.started = True
        return True

    async def run(self, code: str, stdin: str, timeout: float | None) -> dict[str, Any]:
        return (await self.sandbox.run(code, stdin, timeout)).to_dict()

    async def run_batch(self, requests: list[tuple[str, str, float | None]]) -> list[dict[str, Any]]:
        results = await self.sandbox.run_batch([ExecRequest(*r) for r in requests])
        return [r.to_dict() for r in results]

    def pid(self) -> int:
        return os.getpid()

    async def open_session(self) -> str:
        return await self.sandbox.open_session()

    async def run_in_session(self, sid: str, code: str, stdin: str, timeout: float | None) -> dict[str, Any]:
        return (await self.sandbox.run_in_session(sid, code, stdin, timeout)).to_dict()

    async def close_session(self, sid: str) -> None:
        await self.sandbox.close_session(sid)

    async def stats(self) -> dict[str, Any]:
        return await self.sandbox.stats()

    async def shutdown(self) -> None:
        await self.sandbox.close()


class RaySandbox(Sandbox):
    def __init__(self, actors: int = 2, config: SandboxConfig | None = None, *, address: str | None = None,
                 num_cpus_per_actor: float = 1.0, actor_options: dict[str, Any] | None = None,
                 max_restarts: int = 3):
        """`actor_options` go to Ray as they are, e.g. {"resources": {"sandbox": 1}} to keep the actors on
        nodes that advertise a `sandbox` resource (the CPU nodes). Actors are spread across nodes; a dead one is
        replaced at most `max_restarts` times."""
        self.n_actors, self.address, self.num_cpus = actors, address, num_cpus_per_actor
        self.actor_options = {"scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.config = config or SandboxConfig(workers=1)
        self.max_restarts = max_restarts
        self.balancer: LeastLoaded | None = None
        self._session_home: dict[str, tuple[int, Any]] = {}  # session id -> (actor index, the actor it lives in)
        self.restarts: list[int] = []
        self._replacing: list[asyncio.Lock] = []
        self._actor_cls: Any = None

    async def start(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False)
        self._actor_cls = ray.remote(num_cpus=self.num_cpus, max_concurrency=100_000)(SandboxActor)
        actors = [self._spawn() for _ in range(self.n_actors)]
        try:
            await asyncio.gather(*(a.start.remote() for a in actors))
        except Exception as e:  # noqa: BLE001 - Ray wraps the actor's exception
            for a in actors:
                ray.kill(a)
            raise SandboxError(f"sandbox actors failed to start on the Ray cluster: {e}") from e
        self.balancer = LeastLoaded(actors)
        self.restarts = [0] * len(actors)
        self._replacing = [asyncio.Lock() for _ in actors]

    def _spawn(self) -> Any:
        return self._actor_cls.options(**self.actor_options).remote(asdict(self.config))

    async def _replace(self, i: int, dead: Any, cause: BaseException) -> None:
        """Put a new actor in place of actor `i` (unless another call did already)."""
        import ray

        assert self.balancer is not None
        async with self._replacing[i]:
            if self.balancer.backends[i] is not dead:
                return
            if self.restarts[i] >= self.max_restarts:
                raise SandboxError(
                    f"sandbox actor {i} died ({_cause(cause)}) after {self.restarts[i]} replacements "
                    f"(max_restarts={self.max_restarts}): its node is failing or the sandbox runs out of memory "
                    f"there; see `ray logs` for the actor, lower sandbox_workers or the limits, or raise "
                    f"max_worker_restarts")
            self.restarts[i] += 1
            log.warning("sandbox actor %d died (%s): starting a replacement (%d/%d)", i, _cause(cause),
                        self.restarts[i], self.max_restarts)
            try:
                ray.kill(dead)
            except Exception:  # noqa: BLE001 - gone already
                pass
            actor = self._spawn()
            try:
                await actor.start.remote()
            except Exception as e:  # noqa: BLE001
                ray.kill(actor)
                raise SandboxError(f"sandbox actor {i} died and its replacement could not start: {e}") from e
            self.balancer.backends[i] = actor

    async def close(self) -> None:
        if self.balancer is None:
            return
        import ray

        actors, self.balancer = self.balancer.backends, None
        await asyncio.gather(*(a.shutdown.remote() for a in actors), return_exceptions=True)
        for a in actors:
            ray.kill(a)

    async def _call(self, method: str, *args: Any, index: int | None = None, retry: bool = True) -> Any:
        """(the actor's answer, the actor's index); when the actor dies under the call, it is replaced and the
        call sent once more to the replacement (with `retry`)."""
        import ray

        assert self.balancer is not None, "call start() first (or use `async with`)"
        i = index if index is not None else self.balancer.order()[0]
        for attempt in range(2 if retry else 1):
            actor = self.balancer.acquire(i)
            try:
                return await getattr(actor, method).remote(*args), i
            except ray.exceptions.RayActorError as e:
                await self._replace(i, actor, e)
                if attempt or not retry:
                    raise
                log.info("sandbox actor %d was replaced: its %s call runs again", i, method)
            finally:
                self.balancer.release(i)
        raise AssertionError("unreachable")

    async def pids(self) -> list[int]:
        """The actors' process ids (the fault tests kill one)."""
        assert self.balancer is not None
        return list(await asyncio.gather(*(a.pid.remote() for a in self.balancer.backends)))

    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        try:
            d, i = await self._call("run", code, stdin, timeout)
        except SandboxError as e:  # actors keep dying: the message says what to do
            return ExecResult.failure(Status.INTERNAL_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - it died twice under this call, or Ray failed otherwise
            return ExecResult.failure(Status.KILLED, f"sandbox actor failed: {_cause(e)}")
        return ExecResult.from_dict({**d, "backend": f"ray-actor-{i}:{d.get('backend', '')}"})

    async def run_batch(self, requests: list[ExecRequest]) -> list[ExecResult]:
        assert self.balancer is not None

        async def send(k: int, chunk: list[ExecRequest]) -> list[ExecResult]:
            try:
                ds, _ = await self._call("run_batch", [(r.code, r.stdin, r.timeout) for r in chunk], index=k)
            except Exception as e:  # noqa: BLE001
                return [ExecResult.failure(Status.KILLED, f"sandbox actor failed: {_cause(e)}")] * len(chunk)
            return [ExecResult.from_dict({**d, "backend": f"ray-actor-{k}:{d.get('backend', '')}"}) for d in ds]

        return await striped(requests, len(self.balancer.backends), send)

    async def open_session(self) -> str:
        sid, i = await self._call("open_session")
        assert self.balancer is not None
        self._session_home[sid] = (i, self.balancer.backends[i])
        return sid

    def _session_actor(self, session_id: str) -> tuple[int, bool] | None:
        """(its actor's index, whether that actor is still the one the session was opened in)."""
        home = self._session_home.get(session_id)
        if home is None:
            return None
        assert self.balancer is not None
        return home[0], self.balancer.backends[home[0]] is home[1]

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        home = self._session_actor(session_id)
        if home is None:
            return unknown_session(session_id)
        i, alive = home
        lost = ExecResult.failure(Status.INTERNAL_ERROR, f"session {session_id!r} was lost with its sandbox actor "
                                                         f"(the actor died); open a new one")
        if not alive:
            return lost
        try:
            d, _ = await self._call("run_in_session", session_id, code, stdin, timeout, index=i, retry=False)
        except Exception:  # noqa: BLE001 - its actor died: the session's state is gone (the actor is replaced)
            return lost
        return ExecResult.from_dict(d)

    async def close_session(self, session_id: str) -> None:
        home = self._session_actor(session_id)
        self._session_home.pop(session_id, None)
        if home is not None and home[1]:
            try:
                await self._call("close_session", session_id, index=home[0], retry=False)
            except Exception:  # noqa: BLE001 - died with its actor
                pass

    async def stats(self) -> dict[str, Any]:
        assert self.balancer is not None
        per_actor = await asyncio.gather(*(a.stats.remote() for a in self.balancer.backends))
        return {"alive": sum(s["alive"] for s in per_actor), "actors": per_actor}


def _cause(e: BaseException) -> str:
    """The innermost message of a Ray-wrapped exception, on one line."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[-1][:300] if text else ''}"
