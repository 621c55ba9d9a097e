"""What keeps `rstar2 serve` up for everyone when one client misbehaves (issue 48): the connection guard (header and
body deadlines, connections per address), the request body limit, the constant-time key check, the route label of a
request, and the per-client budgets (slots of the generation gate, seconds of sandbox time).

A client is its address (`scope["client"]`; behind a reverse proxy named by `--forwarded-allow-ips`, the address
the proxy puts in X-Forwarded-For, which no other sender can set). There is one API key, so one key is one tenant: a
per-key budget would be the global one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.routing import Match

current_client: ContextVar[str] = ContextVar("current_client", default="-")  # the request's client (its address)
MAX_JSON_DEPTH = 64  # nesting of a request body (a chat request is 6 deep; a tool's JSON Schema a few more)
UNMATCHED = "<unmatched>"  # the one metrics label of every path that is not a route


# ---------------------------------------------------------------------------------------------- connections
def guarded_protocol(header_timeout: float, body_timeout: float, per_client: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) with what uvicorn lacks: a request whose headers are not all in
    `header_timeout` seconds after the connection opened (or after its first byte on a kept-alive connection), or
    whose body is not all in `body_timeout` seconds after its headers, is answered 408 and its connection closed;
    an address that already holds `per_client` connections gets 429 and its new connection closed. uvicorn keeps
    a connection open for as long as its headers trickle in (20,000 such exhausted the descriptors)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Guarded(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        deadline: asyncio.TimerHandle | None = None
        phase: str | None = None  # what the deadline waits for: "headers" or "body"
        seen: Any = None  # the request cycle whose headers were accounted for
        address: str | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            counts = self.server_state.__dict__.setdefault("rstar2_per_client", {})
            self.address = self.client[0] if self.client else ""
            held = counts.get(self.address, 0)
            counts[self.address] = held + 1
            if held >= per_client:
                self._refuse(429, b"Too many connections from this address")
            else:
                self._arm(header_timeout, "headers")

        def connection_lost(self, exc) -> None:
            self._disarm()
            counts = self.server_state.__dict__.get("rstar2_per_client", {})
            if self.address is not None and self.address in counts:
                counts[self.address] -= 1
                if counts[self.address] <= 0:
                    del counts[self.address]
            self.address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self.seen:  # a request's headers are complete
                self.seen = cycle
                if cycle.more_body:
                    self._arm(body_timeout, "body")
                else:
                    self._disarm()
            elif self.phase == "body" and not cycle.more_body:
                self._disarm()  # its body is complete
            elif self.phase is None and (cycle is None or cycle.response_complete):
                self._arm(header_timeout, "headers")  # the first bytes of the next request on a kept-alive connection

        def _arm(self, seconds: float, phase: str) -> None:
            self._disarm()
            self.deadline, self.phase = self.loop.call_later(seconds, self._expired), phase

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.deadline = self.phase = None

        def _expired(self) -> None:
            phase, cycle = self.phase, self.cycle
            self.deadline = self.phase = None
            if self.transport.is_closing():
                return
            if phase == "body" and self.flow.read_paused:
                self._arm(body_timeout, "body")  # the app, not the client, is slow to read the body
            elif cycle is None or cycle.response_complete or not cycle.response_started:
                self._refuse(408, f"Request {phase} not received in time".encode())
            else:
                self.transport.close()

        def _refuse(self, status: int, text: bytes) -> None:
            reason = {408: b"Request Timeout", 429: b"Too Many Requests"}[status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, reason, len(text), text))
            self.transport.close()

    return Guarded


def uvicorn_config(app: Any, host: str, port: int, cfg: Any, **kw: Any) -> Any:
    """The uvicorn.Config of `rstar2 serve` (and of the tests and benchmarks that start its app): the guarded
    protocol, the keep-alive timeout, h11's header size cap."""
    import uvicorn

    protocol = guarded_protocol(cfg.header_timeout, cfg.body_timeout, cfg.max_connections_per_client)
    proxies = cfg.forwarded_allow_ips  # X-Forwarded-For names the client only when a trusted proxy sends it
    return uvicorn.Config(app, host=host, port=port, http=protocol, timeout_keep_alive=5,
                          h11_max_incomplete_event_size=64 * 1024, proxy_headers=bool(proxies),
                          forwarded_allow_ips=proxies, **{"log_level": "warning", **kw})


# ---------------------------------------------------------------------------------------------- requests
class BodyTooLarge(Exception):
    pass


async def read_body(receive: Any, limit: int) -> bytes | None:
    """The request body, refused (BodyTooLarge) as soon as it passes `limit` bytes: never buffered past it. None
    when the client went away."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def replay(body: bytes, receive: Any) -> Any:
    """A receive that hands the app the body already read, then the client's own messages (its disconnect)."""
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON `body` nests arrays and objects more than `limit` deep, counted without parsing (Python's parser
    and the checks after it recurse: ~1,000 levels raise RecursionError) and in time linear in its length, whatever
    it holds: quotes not escaped by an odd run of backslashes open and close strings; the brackets outside strings
    count up and down."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    a = np.frombuffer(body, np.uint8)
    quotes, slashes = np.flatnonzero(a == 0x22), np.flatnonzero(a == 0x5C)
    if len(quotes) and len(slashes):  # a quote right after an odd run of backslashes is escaped
        run_starts = slashes[np.r_[True, np.diff(slashes) != 1]]
        k = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
        start = run_starts[np.maximum(np.searchsorted(run_starts, quotes - 1, side="right") - 1, 0)]
        run = np.where(slashes[k] == quotes - 1, quotes - start, 0)
        quotes = quotes[run % 2 == 0]
    opens, closes = np.flatnonzero((a == 0x5B) | (a == 0x7B)), np.flatnonzero((a == 0x5D) | (a == 0x7D))
    if len(quotes):  # outside strings: an even number of quotes before
        opens, closes = opens[np.searchsorted(quotes, opens) % 2 == 0], closes[np.searchsorted(quotes, closes) % 2 == 0]
    step = np.zeros(len(a), np.int8)
    step[opens], step[closes] = 1, -1
    return bool(np.cumsum(step, dtype=np.int32).max() > limit)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_matches(authorization: bytes | None, digest: bytes) -> bool:
    """The Authorization header against the key's digest, in constant time (hashes of equal length compared with
    hmac.compare_digest, as vLLM since CVE-2025-59425): how long it takes says nothing of how much matched."""
    given = (authorization or b"").decode("latin-1")
    token = given[7:] if given[:7].lower() == "bearer " else ""
    return hmac.compare_digest(hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest(), digest)


def route_label(routes: list[Any], scope: dict[str, Any]) -> str:
    """The metrics label of a request: its route's template (`/v1/responses/{response_id}`), the same for every id;
    `<unmatched>` for every path that is no route (never the raw path: 6,000 random paths made 29.5 MB of
    /metrics)."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route.path
        if match == Match.PARTIAL and partial is None:
            partial = route.path
    return partial or UNMATCHED


def printable(text: Any, limit: int = 64) -> str:
    """A client-provided name for a log line: its repr (control characters and newlines escaped), cut to `limit`."""
    shown = repr(str(text))
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


# ---------------------------------------------------------------------------------------------- budgets
@dataclass
class Client:
    slots: asyncio.Semaphore
    tool_seconds: float  # what is left of the sandbox-time budget (refilled continuously)
    refilled: float = field(default_factory=time.monotonic)
    users: int = 0  # requests holding or awaiting this record


class Budgets:
    """Per-client shares: at most `slots` of the server's generation gate held by a client's tool loops at once (the
    rest wait on their own client's queue, not on the gate), and `tool_seconds` of sandbox wall time a minute (a
    token bucket: a call is charged what it took; a client past its budget gets 429 for new requests and a refused
    tool call)."""

    def __init__(self, slots: int, tool_seconds: float):
        self.slots, self.tool_seconds = slots, tool_seconds
        self.clients: dict[str, Client] = {}
        self.prune_at = 1024

    def _client(self, name: str) -> Client:
        c = self.clients.get(name)
        if c is None:
            if len(self.clients) >= self.prune_at:
                self._prune()
            c = self.clients[name] = Client(asyncio.Semaphore(self.slots), self.tool_seconds)
        return c

    def _prune(self) -> None:
        """Forget the clients with nothing running whose budget is full again (a scan from many addresses leaves
        no record behind); the next prune when twice as many are kept."""
        now = time.monotonic()
        for name, c in list(self.clients.items()):
            if c.users == 0 and (not self.tool_seconds or c.tool_seconds + (now - c.refilled) * self.tool_seconds
                                 / 60.0 >= self.tool_seconds):
                del self.clients[name]
        self.prune_at = max(1024, 2 * len(self.clients))

    @contextlib.asynccontextmanager
    async def slot(self, gate: asyncio.Semaphore, name: str | None = None) -> AsyncIterator[None]:
        """One slot of `gate` for the current client, within its share."""
        name = name or current_client.get()
        c = self._client(name)
        c.users += 1
        try:
            async with c.slots, gate:
                yield
        finally:
            c.users -= 1
            if c.users == 0 and not self.tool_seconds:
                self.clients.pop(name, None)

    def tool_time_left(self, name: str | None = None) -> float:
        """Seconds of sandbox time the client may still spend now (inf without a budget)."""
        if not self.tool_seconds:
            return math.inf
        c = self._client(name or current_client.get())
        now = time.monotonic()
        c.tool_seconds = min(self.tool_seconds, c.tool_seconds + (now - c.refilled) * self.tool_seconds / 60.0)
        c.refilled = now
        if c.users == 0 and c.tool_seconds >= self.tool_seconds:
            self.clients.pop(name or current_client.get(), None)  # full again: nothing to remember
        return c.tool_seconds

    def charge(self, seconds: float, name: str | None = None) -> None:
        if self.tool_seconds:
            self.tool_time_left(name)
            self._client(name or current_client.get()).tool_seconds -= seconds

    def retry_after(self, name: str | None = None) -> int:
        """Seconds until the client's tool budget is positive again."""
        left = self.tool_time_left(name)
        return max(1, math.ceil(-left * 60.0 / self.tool_seconds)) if self.tool_seconds else 0


class FairGate:
    """Sandbox calls running at once, at most the sandbox's capacity (asked of `sizing` at the first call), handed
    out fairly: the last free worker is kept for a client with no call running (one client's calls, however many,
    never hold every worker: a newcomer's call starts at once), and when a call ends the next worker goes to the
    waiting client with the fewest calls running (first come, first served would queue a newcomer behind every
    call of the client that filled the pool)."""

    def __init__(self, sizing: Callable[[], Awaitable[int]]):
        self.sizing, self.capacity = sizing, 0
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future]] = {}
        self.total = 0

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        if not self.capacity:
            self.capacity = max(1, await self.sizing())
        turn = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append(turn)
        self._grant()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(client)  # granted as it was cancelled: pass it on
            else:
                queue = self.waiting.get(client)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self.waiting[client]
            raise
        try:
            yield
        finally:
            self._release(client)

    def _may_take(self, client: str) -> bool:
        free = self.capacity - self.total
        return free > 1 or (free == 1 and (self.capacity == 1 or not self.running.get(client)))

    def _take(self, client: str) -> None:
        self.running[client] = self.running.get(client, 0) + 1
        self.total += 1

    def _release(self, client: str) -> None:
        self.total -= 1
        self.running[client] -= 1
        if not self.running[client]:
            del self.running[client]
        self._grant()

    def _grant(self) -> None:
        """Hand the free workers to the waiting clients that may take one, fewest calls running first."""
        while True:
            ready = [c for c in self.waiting if self._may_take(c)]
            if not ready:
                return
            nxt = min(ready, key=lambda c: self.running.get(c, 0))
            turn = self.waiting[nxt].popleft()
            if not self.waiting[nxt]:
                del self.waiting[nxt]
            if not turn.done():
                self._take(nxt)
                turn.set_result(None)
