"""The stage filter (paper section 2.3, stage 3): at a stage's start, keep only the problems the current policy
does not solve k out of k. The stage owns which problems it trains on; the rollouts only generate and grade."""

from __future__ import annotations

import logging
from typing import Protocol

from rstar2_agent.problem import Problem

from .config import Stage
from .rollout.rollouts import Graded, without_engine_errors

log = logging.getLogger(__name__)


class Generates(Protocol):
    """What the filter needs of the rollouts (train/rollout/rollouts.py: Rollouts.groups)."""

    async def groups(self, problems: list[Problem], n: int, stage: Stage, step: int) -> list[Graded]: ...


async def filter_solved(rollouts: Generates, pool: dict[str, Problem], stage: Stage, k: int) -> list[str]:
    """The ids of the pool's problems (in id order) the policy does not solve k of k: k rollouts each, at step -1.
    A rollout that failed in the engine says nothing of the policy: a problem is solved when every rollout that ran
    is right (and one ran)."""
    problems = [pool[i] for i in sorted(pool)]
    groups = without_engine_errors(await rollouts.groups(problems, k, stage, step=-1))
    kept = [p.id for p, g in zip(problems, groups, strict=True) if not (g and all(r for _, r in g))]
    log.info("stage filter: %d of %d problems kept (solved %d/%d dropped)", len(kept), len(pool), k, k)
    return kept
