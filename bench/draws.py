"""Random draws the simulators share (replicas_sim.py, step_sim.py, calibrate.py)."""

from __future__ import annotations

import math
import random


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw by Knuth's product of uniforms (0 for a mean <= 0, without drawing)."""
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
