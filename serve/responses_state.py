"""What /v1/responses keeps between requests: the stored responses (for previous_response_id and GET) and the
code_interpreter containers (a sandbox session each, so that a variable one call sets is there in the next).

Containers live in this process: an idle one is closed after `idle_timeout` seconds (a sweep runs every half of it,
at most every 30 s), at most `cap` are open (a new one closes the least recently used idle one first; when all are
busy the request is refused with 429, before it runs), a container made for a request that never finished (its
client went away, or it failed) is closed as it ends, and all are closed when the server shuts down.

Stored responses are bounded by count and by bytes (their JSON), least recently used out first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rstar2_agent.sandbox.types import ExecResult, Sandbox, SandboxError, Status, unknown_session

from .protocol import OpenAIError, new_id

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- stored responses
@dataclass
class Stored:
    body: dict[str, Any]  # the response object, as returned
    messages: list[dict[str, Any]]  # its conversation as chat messages (instructions left out), for a continuation
    container: str | None = None  # the stateful container its code ran in (`{"type": "auto"}` reuses it)


def size_of(stored: Stored) -> int:
    """What a stored response weighs: the length of its JSON (body and conversation)."""
    return len(json.dumps(stored.body, ensure_ascii=False)) + len(json.dumps(stored.messages, ensure_ascii=False))


class ResponseStore:
    """The last `cap` stored responses, and at most `max_bytes` of them (size_of), least recently used dropped
    first; one larger than `max_bytes` alone is not kept."""

    def __init__(self, cap: int, max_bytes: int = 256 * 2**20):
        self.cap, self.max_bytes = cap, max_bytes
        self.items: OrderedDict[str, Stored] = OrderedDict()
        self.sizes: dict[str, int] = {}
        self.bytes = 0

    def put(self, stored: Stored) -> None:
        key, size = stored.body["id"], size_of(stored)
        self._drop(key)
        if size > self.max_bytes:
            log.warning("response %s is %d bytes, more than the store's %d: not stored", key, size, self.max_bytes)
            return
        self.items[key], self.sizes[key] = stored, size
        self.bytes += size
        while len(self.items) > self.cap or self.bytes > self.max_bytes:
            self._drop(next(iter(self.items)))

    def _drop(self, key: str) -> None:
        if self.items.pop(key, None) is not None:
            self.bytes -= self.sizes.pop(key)

    def get(self, response_id: str, param: str = "response_id") -> Stored:
        stored = self.items.get(response_id)
        if stored is None:
            code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
            raise OpenAIError(404, f"No response with id {response_id!r} is stored here (responses made with "
                                   f"store=false are not kept, and only the last {self.cap}, at most "
                                   f"{self.max_bytes / 2**20:g} MiB, are).", param, code)
        self.items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        self._drop(response_id)


# ---------------------------------------------------------------------------------------------- containers
@dataclass
class Container:
    id: str
    session: str | None = None  # the sandbox session, opened at the first call
    last_used: float = field(default_factory=time.monotonic)
    users: int = 0  # requests running with it: it is neither expired nor evicted while any is
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one call at a time: each sees the one before


class Containers:
    def __init__(self, sandbox: Sandbox, cap: int, idle_timeout: float):
        self.sandbox, self.cap, self.idle_timeout = sandbox, cap, idle_timeout
        self.open: dict[str, Container] = {}
        self.closing: set[asyncio.Task] = set()  # closes that run on after the request that started them

    def find(self, container_id: str, param: str) -> Container:
        """A container named by a request; 404 when it was never made, expired or was evicted."""
        c = self.open.get(container_id)
        if c is None or self._expired(c):
            raise OpenAIError(404, f"No open container {container_id!r}: containers close after "
                                   f"{self.idle_timeout:.0f} s idle (and when the server restarts). Send "
                                   '{"type": "auto"} for a new one.', param, "container_not_found")
        return c

    def alive(self, container_id: str | None) -> Container | None:
        c = self.open.get(container_id or "")
        return None if c is None or self._expired(c) else c

    async def new(self, container_id: str | None = None) -> Container:
        """A new container, held by the request that asks (users 1): made before the request runs, so that one
        past the cap is the request's 429, not a failed tool call."""
        await self.sweep()
        while len(self.open) >= self.cap:
            idle = [c for c in self.open.values() if c.users == 0]
            if not idle:
                raise OpenAIError(429, f"All {self.cap} code_interpreter containers are in use; retry when a "
                                       "request ends (or raise the server's max_containers).", "tools",
                                  "too_many_containers", kind="rate_limit_error")
            await self.close(min(idle, key=lambda c: c.last_used).id)
        c = Container(container_id or new_id("cntr"), users=1)
        self.open[c.id] = c
        return c

    def release(self, c: Container, reap: bool) -> None:
        """A request is done with `c`; `reap`: it was made for that request, which never finished (nothing refers
        to it): closed now, in a task of its own (the request's may be cancelled again)."""
        c.users -= 1
        c.last_used = time.monotonic()
        if reap and c.users == 0:
            self.in_background(self.close(c.id))

    def in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    async def _open_session(self, c: Container) -> str:
        """A sandbox session for `c`; if the request is cancelled while it opens, the session is closed once it is
        open (a sandbox process nobody tracks otherwise)."""
        opening = asyncio.ensure_future(self.sandbox.open_session())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            def close_opened(f: asyncio.Future) -> None:
                if not f.cancelled() and f.exception() is None:
                    self.in_background(self.sandbox.close_session(f.result()))
            opening.add_done_callback(close_opened)
            raise

    async def run(self, c: Container, code: str, stdin: str, timeout: float | None) -> ExecResult:
        """Run one call in the container's session (opened now if it has none yet, or again if the sandbox dropped
        it: its state is then gone, and the result says so)."""
        async with c.lock:
            c.last_used = time.monotonic()
            note = ""
            if c.session is not None:
                result = await self.sandbox.run_in_session(c.session, code, stdin, timeout)
                if result.stderr != unknown_session(c.session).stderr:
                    return result
                note = "[the container's sandbox session had expired: this call ran in a fresh one; earlier " \
                       "variables are gone]\n"
            try:
                c.session = await self._open_session(c)
                if self.open.get(c.id) is not c:  # closed (reaped, evicted, expired) while its session opened
                    self.in_background(self.sandbox.close_session(c.session))
                    c.session = None
                    return ExecResult.failure(Status.KILLED, f"container {c.id} was closed")
            except SandboxError as e:
                return ExecResult.failure(Status.INTERNAL_ERROR, f"could not open container {c.id}: {e}")
            result = await self.sandbox.run_in_session(c.session, code, stdin, timeout)
            result.stderr = note + result.stderr
            return result

    async def close(self, container_id: str) -> None:
        c = self.open.pop(container_id, None)
        if c is not None and c.session is not None:
            try:
                await self.sandbox.close_session(c.session)
            except Exception as e:  # noqa: BLE001 - a sandbox that is down has dropped the session anyway
                log.warning("closing container %s: %s", container_id, e)

    async def sweep(self) -> None:
        for c in [c for c in self.open.values() if self._expired(c)]:
            log.info("closing code_interpreter container %s after %.0f s idle", c.id, time.monotonic() - c.last_used)
            await self.close(c.id)

    async def close_all(self) -> None:
        for container_id in list(self.open):
            await self.close(container_id)
        if self.closing:
            await asyncio.gather(*self.closing, return_exceptions=True)

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.idle_timeout / 2))
            await self.sweep()

    def _expired(self, c: Container) -> bool:
        return c.users == 0 and not c.lock.locked() and time.monotonic() - c.last_used > self.idle_timeout


class ContainerSandbox(Sandbox):
    """The sandbox as one request's agent loop sees it: each program runs in the request's container (its session,
    opened at the first call: a request that runs no code opens none). The request holds the container (made or
    found before it runs) and releases it when it ends (Containers.release)."""

    def __init__(self, containers: Containers, container: Container):
        self.containers, self.container = containers, container

    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        return await self.containers.run(self.container, code, stdin, timeout)

    async def open_session(self) -> str:
        return await self.containers.sandbox.open_session()

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        return await self.containers.sandbox.run_in_session(session_id, code, stdin, timeout)

    async def close_session(self, session_id: str) -> None:
        await self.containers.sandbox.close_session(session_id)

    async def stats(self) -> dict[str, Any]:
        return await self.containers.sandbox.stats()
