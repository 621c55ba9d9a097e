"""Spread calls over several backends (HTTP servers, Ray actors): least outstanding calls first."""

from __future__ import annotations

import random
from typing import Generic, TypeVar

T = TypeVar("T")


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
