"""ProgressWatch: no generation waits forever for a token that is not coming.

Wraps any engine. A generation that receives no token for `stall_timeout` seconds (the engine idle, or busy
with others while this request is never scheduled) is cancelled, which makes the engine abort it and free its
KV blocks and its slot, and raises `EngineStalled` naming the request; the stall is logged and counted. The
wrapper also keeps the engine-wide picture that /health reports: requests in flight and the seconds since any
of them last received a token.

An engine that cannot report tokens as they are produced (`streams = False`: the Ray proxy delivers a
generation whole) is not watched: silence there says nothing about progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from rstar2_agent.engines.base import Engine, EngineError, Generation, OnTokens, SamplingParams

log = logging.getLogger(__name__)

# The id a caller knows the request by (the HTTP request's id in `rstar2 serve`), for errors and logs.
current_request: ContextVar[str | None] = ContextVar("current_request", default=None)


class EngineStalled(EngineError):
    """A generation made no progress for the stall timeout and was aborted."""


class ProgressWatch(Engine):
    def __init__(self, inner: Engine, stall_timeout: float | None, *, on_stall: Callable[[], None] | None = None,
                 poll: float = 1.0):
        self.inner, self.stall_timeout, self.on_stall, self.poll = inner, stall_timeout, on_stall, poll
        self.streams = getattr(inner, "streams", True)
        self.constrains = getattr(inner, "constrains", False)
        self.tokenizer, self.name = inner.tokenizer, getattr(inner, "name", "engine")
        self.model_path = getattr(inner, "model_path", None)
        self.context_length = inner.context_length
        self.max_batch, self.endpoint = getattr(inner, "max_batch", 1), getattr(inner, "endpoint", None)
        self.stalled = 0  # generations aborted for making no progress
        self.live: dict[int, float] = {}  # generation -> when it last made progress (started or got a token)
        self.last_token = time.monotonic()
        self.last_stall = float("-inf")
        self._ids = itertools.count()

    @property
    def kv_capacity(self) -> int | None:  # type: ignore[override]
        return getattr(self.inner, "kv_capacity", None)

    async def probe(self) -> None:
        if hasattr(self.inner, "probe"):
            await self.inner.probe()
        self.context_length = self.inner.context_length

    def stats(self) -> dict[str, Any]:
        return self.inner.stats() if hasattr(self.inner, "stats") else {}

    def progress(self) -> dict[str, Any]:
        """Requests in flight, the seconds since any of them got a token, and whether the engine is stalled: it
        has had to abort a request and produced no token since, or requests are in flight and none has had a
        token for the stall timeout."""
        now = time.monotonic()
        quiet = now - max(self.last_token, min(self.live.values(), default=now))
        stalled = self.last_stall > self.last_token or (
            bool(self.live) and self.stall_timeout is not None and quiet > self.stall_timeout)
        return {"in_flight": len(self.live), "seconds_since_token": round(quiet, 1) if self.live else 0.0,
                "stalled": stalled, "aborted_stalls": self.stalled}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if not self.stall_timeout or not self.streams:
            return await self.inner.generate(prompt_ids, sampling, on_tokens)
        key = next(self._ids)
        self.live[key] = time.monotonic()

        def tokens(ids: list[int], logprobs: list[float]) -> None:
            self.live[key] = self.last_token = time.monotonic()
            if on_tokens is not None:
                on_tokens(ids, logprobs)

        task = asyncio.ensure_future(self.inner.generate(prompt_ids, sampling, tokens))
        try:
            while True:
                left = self.live[key] + self.stall_timeout - time.monotonic()
                if left <= 0:
                    raise self._stall(len(prompt_ids))
                done, _ = await asyncio.wait({task}, timeout=min(left, self.poll) + 0.01)
                if done:
                    return task.result()
        finally:
            del self.live[key]
            if not task.done():  # stalled, or our caller went away: the engine aborts and frees the request
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def _stall(self, prompt_tokens: int) -> EngineStalled:
        self.stalled += 1
        self.last_stall = time.monotonic()
        if self.on_stall is not None:
            self.on_stall()
        rid = current_request.get() or "(no id)"
        load = ", ".join(f"{k} {v}" for k, v in self.stats().items() if not isinstance(v, list | dict))
        quiet = time.monotonic() - self.last_token
        msg = (f"request {rid} made no progress for {self.stall_timeout:.0f} s (no token; prompt of {prompt_tokens} "
               f"tokens, {len(self.live)} requests in flight, the last token of any {quiet:.0f} s ago"
               f"{'; engine: ' + load if load else ''}): aborted, its engine resources freed. Retry it; if this "
               "repeats, the engine is wedged: check /health and restart the server")
        log.error(msg)
        return EngineStalled(msg)

    async def close(self) -> None:
        if hasattr(self.inner, "close"):
            await self.inner.close()
