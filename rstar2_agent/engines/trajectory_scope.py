"""The trajectory scope: every engine request made inside one `run_agent` call belongs to one trajectory.

run_agent opens it; an engine that places trajectories (the replica pool) reads `current_trajectory` to keep a
trajectory's turns on one replica, registers itself in `scope.pools`, and is told by `end_trajectory` when the
trajectory ends. The agent loop needs only this module, not the pool.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol


class Placer(Protocol):
    def end_trajectory(self, scope_id: int) -> None: ...


@dataclass
class TrajectoryScope:
    id: int
    pools: list[Placer] = field(default_factory=list)  # engines that placed it; told when it ends


current_trajectory: ContextVar[TrajectoryScope | None] = ContextVar("current_trajectory", default=None)
_scope_ids = itertools.count()


@contextlib.contextmanager
def trajectory_scope() -> Iterator[TrajectoryScope]:
    """All engine requests made inside belong to one trajectory; pools release it on exit."""
    scope = TrajectoryScope(next(_scope_ids))
    token = current_trajectory.set(scope)
    try:
        yield scope
    finally:
        current_trajectory.reset(token)
        for pool in scope.pools:
            pool.end_trajectory(scope.id)


def one_trajectory(fn):
    """Decorator for an async function whose engine requests form one trajectory (run_agent)."""
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        with trajectory_scope():
            return await fn(*args, **kwargs)
    return wrapper
