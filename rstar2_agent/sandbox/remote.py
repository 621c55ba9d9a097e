"""RemoteSandbox: the client for one or more `rstar2 sandbox serve` servers."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from .balance import LeastLoaded, striped
from .types import ExecRequest, ExecResult, Sandbox, SandboxError, Status, unknown_session
from .worker import GRACE_SECONDS

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT = 10.0


class RemoteSandbox(Sandbox):
    """Calls go to the server with the fewest calls in flight. A call is retried on another server only
    when it was never delivered (connection refused, connect timeout) or the server said it is overloaded
    (429/503): running the same code twice is harmless, but a call that may be running is not re-sent."""

    def __init__(self, urls: list[str] | str, *, max_connections: int = 512, queue_timeout: float = 300.0):
        urls = [urls] if isinstance(urls, str) else list(urls)
        self.balancer = LeastLoaded([u.rstrip("/") for u in urls])
        self.max_connections, self.queue_timeout = max_connections, queue_timeout
        self._client: httpx.AsyncClient | None = None
        self._session_home: dict[str, str] = {}

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
        self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=10.0))
        reachable = 0
        for url in self.balancer.backends:
            try:
                (await self._client.get(f"{url}/health", timeout=10.0)).raise_for_status()
                reachable += 1
            except httpx.HTTPError as e:
                log.warning("sandbox server %s is not healthy: %s", url, e)
        if not reachable:
            await self.close()
            raise SandboxError(f"no sandbox server answered at {self.balancer.backends}; start one with "
                               "`rstar2 sandbox serve` or check the URLs")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _post(self, path: str, payload: dict[str, Any], read_timeout: float,
                    url: str | None = None) -> tuple[httpx.Response | None, str, str]:
        """POST to one server (or the given one); returns (response, url, error)."""
        assert self._client is not None, "call start() first (or use `async with`)"
        order = [self.balancer.backends.index(url)] if url else self.balancer.order()
        error = ""
        for i in order:
            base = self.balancer.acquire(i)
            try:
                resp = await self._client.post(f"{base}{path}", json=payload,
                                               timeout=httpx.Timeout(read_timeout, connect=10.0))
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                error = f"{base}: {e!r}"
                continue  # never delivered: safe to try the next server
            except httpx.HTTPError as e:
                return None, base, f"{base}: {e!r}"
            finally:
                self.balancer.release(i)
            if resp.status_code in (429, 503):
                error = f"{base}: HTTP {resp.status_code}"
                continue
            return resp, base, ""
        return None, "", error or "no server"

    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        read_timeout = (timeout or DEFAULT_TIMEOUT) + GRACE_SECONDS + self.queue_timeout
        resp, url, error = await self._post("/run", {"code": code, "stdin": stdin, "timeout": timeout},
                                            read_timeout)
        return self._result(resp, url, error)

    async def run_batch(self, requests: list[ExecRequest]) -> list[ExecResult]:
        async def send(k: int, chunk: list[ExecRequest]) -> list[ExecResult]:
            longest = max((r.timeout or DEFAULT_TIMEOUT) for r in chunk)
            payload = {"requests": [{"code": r.code, "stdin": r.stdin, "timeout": r.timeout} for r in chunk]}
            resp, url, error = await self._post("/run_batch", payload, longest + GRACE_SECONDS + self.queue_timeout)
            if resp is not None and resp.status_code == 200:
                return [ExecResult.from_dict({**d, "backend": url}) for d in resp.json()["results"]]
            return [self._result(resp, url, error)] * len(chunk)

        return await striped(requests, len(self.balancer.backends), send)

    @staticmethod
    def _result(resp: httpx.Response | None, url: str, error: str) -> ExecResult:
        if resp is None:
            status = Status.QUEUE_TIMEOUT if "HTTP 429" in error or "HTTP 503" in error else Status.INTERNAL_ERROR
            return ExecResult.failure(status, f"sandbox server unavailable: {error}", backend=url)
        if resp.status_code != 200:
            return ExecResult.failure(Status.INTERNAL_ERROR, f"sandbox server {url} answered HTTP "
                                      f"{resp.status_code}: {resp.text[:500]}", backend=url)
        return ExecResult.from_dict({**resp.json(), "backend": url})

    async def open_session(self) -> str:
        resp, url, error = await self._post("/sessions", {}, 120.0)
        if resp is None or resp.status_code != 200:
            raise SandboxError(f"could not open a sandbox session: {error or resp.text}")
        sid = resp.json()["session_id"]
        self._session_home[sid] = url
        return sid

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        url = self._session_home.get(session_id)
        if url is None:
            return unknown_session(session_id)
        read_timeout = (timeout or DEFAULT_TIMEOUT) + GRACE_SECONDS + 120.0
        resp, url, error = await self._post(f"/sessions/{session_id}/run",
                                            {"code": code, "stdin": stdin, "timeout": timeout}, read_timeout, url)
        return self._result(resp, url, error)

    async def close_session(self, session_id: str) -> None:
        url = self._session_home.pop(session_id, None)
        if url and self._client is not None:
            try:
                await self._client.delete(f"{url}/sessions/{session_id}")
            except httpx.HTTPError as e:
                log.warning("closing session %s on %s failed: %s", session_id, url, e)

    async def stats(self) -> dict[str, Any]:
        assert self._client is not None
        servers = {}
        for url in self.balancer.backends:
            try:
                servers[url] = (await self._client.get(f"{url}/health", timeout=10.0)).json()
            except httpx.HTTPError as e:
                servers[url] = {"status": "unreachable", "error": str(e)}
        alive = sum(s.get("alive", 0) for s in servers.values())
        return {"alive": alive, "servers": servers}
