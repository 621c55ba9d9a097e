"""Spread calls over several backends (HTTP servers, Ray actors): least outstanding calls first."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def striped(items: list[T], n: int, send: Callable[[int, list[T]], Awaitable[list[R]]]) -> list[R]:
    """A batch over n backends: item i goes to backend i % n (so every backend gets a share), `send(k, chunk)`
    answers chunk k in order, and the answers come back in the items' order."""
    chunks = [items[k::n] for k in range(n)]
    answers = await asyncio.gather(*(send(k, c) for k, c in enumerate(chunks) if c))
    by_backend = dict(zip([k for k, c in enumerate(chunks) if c], answers, strict=True))
    return [by_backend[i % n][i // n] for i in range(len(items))]


class LeastLoaded(Generic[T]):
    def __init__(self, backends: list[T]):
        if not backends:
            raise ValueError("need at least one backend")
        self.backends = list(backends)
        self.outstanding = [0] * len(backends)

    def order(self) -> list[int]:
        """Backend indexes, least loaded first (ties broken at random), for one call and its retries."""
        idx = list(range(len(self.backends)))
        random.shuffle(idx)
        return sorted(idx, key=lambda i: self.outstanding[i])

    def acquire(self, i: int) -> T:
        self.outstanding[i] += 1
        return self.backends[i]

    def release(self, i: int) -> None:
        self.outstanding[i] -= 1
