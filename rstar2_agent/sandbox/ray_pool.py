"""RaySandbox: sandbox actors spread over a Ray cluster's CPU nodes, behind the same interface.

Each actor owns a LocalSandbox (its own warm, isolated workers) on the node it was placed on; the
client sends each call to the actor with the fewest calls in flight. `ray.init()` with no address
starts a local cluster, so the same code runs on one machine.
"""

from __future__ import annotations

import asyncio
import logging
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

    async def run_batch(self, requests: list[ExecRequest]) -> list[ExecResult]:
        assert self.balancer is not None

        async def send(k: int, chunk: list[ExecRequest]) -> list[ExecResult]:
            try:
                ds, _ = await self._call("run_batch", [(r.code, r.stdin, r.timeout) for r in chunk], index=k)
            except Exception as e:  # noqa: BLE001
                return [ExecResult.failure(Status.KILLED, f"sandbox actor failed: {e}")] * len(chunk)
            return [ExecResult.from_dict({**d, "backend": f"ray-actor-{k}"}) for d in ds]

        return await striped(requests, len(self.balancer.backends), send)

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
                 num_cpus_per_actor: float = 1.0, actor_options: dict[str, Any] | None = None):
        """`actor_options` go to Ray as they are, e.g. {"resources": {"sandbox": 1}} to keep the actors on
        nodes that advertise a `sandbox` resource (the CPU nodes). Actors are spread across nodes."""
        self.n_actors, self.address, self.num_cpus = actors, address, num_cpus_per_actor
        self.actor_options = {"scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.config = config or SandboxConfig(workers=1)
        self.balancer: LeastLoaded | None = None
        self._session_home: dict[str, int] = {}

    async def start(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False)
        actor_cls = ray.remote(num_cpus=self.num_cpus, max_concurrency=100_000)(SandboxActor)
        cfg = asdict(self.config)
        actors = [actor_cls.options(**self.actor_options).remote(cfg) for _ in range(self.n_actors)]
        try:
            await asyncio.gather(*(a.start.remote() for a in actors))
        except Exception as e:  # noqa: BLE001 - Ray wraps the actor's exception
            raise SandboxError(f"sandbox actors failed to start on the Ray cluster: {e}") from e
        self.balancer = LeastLoaded(actors)

    async def close(self) -> None:
        if self.balancer is None:
            return
        import ray

        actors, self.balancer = self.balancer.backends, None
        await asyncio.gather(*(a.shutdown.remote() for a in actors), return_exceptions=True)
        for a in actors:
            ray.kill(a)

    async def _call(self, method: str, *args: Any, index: int | None = None) -> Any:
        assert self.balancer is not None, "call start() first (or use `async with`)"
        i = index if index is not None else self.balancer.order()[0]
        actor = self.balancer.acquire(i)
        try:
            return await getattr(actor, method).remote(*args), i
        finally:
            self.balancer.release(i)

    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        try:
            d, i = await self._call("run", code, stdin, timeout)
        except Exception as e:  # noqa: BLE001 - an actor died (node lost): the call may or may not have run
            return ExecResult.failure(Status.KILLED, f"sandbox actor failed: {e}")
        return ExecResult.from_dict({**d, "backend": f"ray-actor-{i}:{d.get('backend', '')}"})

    async def run_batch(self, requests: list[ExecRequest]) -> list[ExecResult]:
        assert self.balancer is not None
        n = len(self.balancer.backends)
        out: list[ExecResult | None] = [None] * len(requests)

        async def send(k: int) -> None:
            chunk = requests[k::n]
            if not chunk:
                return
            try:
                ds, _ = await self._call("run_batch", [(r.code, r.stdin, r.timeout) for r in chunk], index=k)
                results = [ExecResult.from_dict({**d, "backend": f"ray-actor-{k}"}) for d in ds]
            except Exception as e:  # noqa: BLE001
                results = [ExecResult.failure(Status.KILLED, f"sandbox actor failed: {e}")] * len(chunk)
            for j, r in enumerate(results):
                out[k + j * n] = r

        await asyncio.gather(*(send(k) for k in range(n)))
        return [r for r in out if r is not None]

    async def open_session(self) -> str:
        sid, i = await self._call("open_session")
        self._session_home[sid] = i
        return sid

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        i = self._session_home.get(session_id)
        if i is None:
            return unknown_session(session_id)
        d, _ = await self._call("run_in_session", session_id, code, stdin, timeout, index=i)
        return ExecResult.from_dict(d)

    async def close_session(self, session_id: str) -> None:
        i = self._session_home.pop(session_id, None)
        if i is not None:
            await self._call("close_session", session_id, index=i)

    async def stats(self) -> dict[str, Any]:
        assert self.balancer is not None
        per_actor = await asyncio.gather(*(a.stats.remote() for a in self.balancer.backends))
        return {"alive": sum(s["alive"] for s in per_actor), "actors": per_actor}
