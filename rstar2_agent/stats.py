"""Small statistics shared by eval (confidence intervals) and train (paired tests over seeds); no scipy."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def student_t_cdf(x: float, df: int, steps: int = 4000) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom: Simpson's rule on the density over atan(t)
    (du = sec^2 v dv keeps the tail finite); accurate to about 1e-6."""
    if x < 0:
        return 1 - student_t_cdf(-x, df, steps)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    top = math.atan(x)
    h = top / steps
    total = 0.0
    for i in range(steps + 1):
        v = i * h
        u = math.tan(v)
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * c * (1 + u * u / df) ** (-(df + 1) / 2) / math.cos(v) ** 2
    return 0.5 + total * h / 3


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for 0.5 < p < 1, by bisection on the CDF."""
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion."""
    if trials <= 0:
        raise ValueError("Wilson's interval needs at least one trial")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)
