"""Small statistics shared by eval (confidence intervals) and train (paired tests over seeds, a paired bootstrap);
no scipy."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # the point estimate: arm a's pooled value / arm b's
    lo: float
    hi: float
    log_sd: float  # the bootstrap standard deviation of log(ratio) (what a power estimate scales)
    reps: int  # replicates with a defined ratio (a replicate whose arm b sums to 0 has none)


Cells = Sequence[Sequence[float]]  # [seed][prompt]


def paired_ratio_bootstrap(a_num: Cells, a_den: Cells, b_num: Cells, b_den: Cells, *, resample: str = "both",
                           reps: int = 2000, level: float = 0.95, seed: int = 0) -> RatioInterval:
    """The ratio of two arms' pooled values, (sum a_num / sum a_den) / (sum b_num / sum b_den), with a percentile
    interval from a paired bootstrap over a crossed design: every seed saw every prompt in both arms, cell
    [s][p] of each list. A replicate draws prompts with replacement (one draw for all seeds and both arms: a
    prompt's arms stay together) and, with `resample` "both", seeds with replacement too ("prompts" or "seeds":
    only those). A pooled value per arm (a ratio of sums) weighs cells by their denominators, as the tool error
    ratio among positive rollouts does (failed calls / calls, over the positive rollouts)."""
    if resample not in ("both", "prompts", "seeds"):
        raise ValueError(f"resample must be both, prompts or seeds, not {resample!r}")
    shapes = {(len(x), *(len(row) for row in x)) for x in (a_num, a_den, b_num, b_den)}
    if len(shapes) != 1 or not a_num or not a_num[0]:
        raise ValueError("the four arrays must share one non-empty [seed][prompt] shape (the pairing)")
    n_seeds, n_prompts = len(a_num), len(a_num[0])

    def ratio(seed_w: list[int], prompt_w: list[int]) -> float | None:
        sums = [sum(ws * wp * x[s][p] for s, ws in enumerate(seed_w) if ws for p, wp in enumerate(prompt_w) if wp)
                for x in (a_num, a_den, b_num, b_den)]
        if sums[1] == 0 or sums[2] == 0 or sums[3] == 0:
            return None
        return (sums[0] / sums[1]) / (sums[2] / sums[3])

    point = ratio([1] * n_seeds, [1] * n_prompts)
    if point is None:
        raise ValueError("the ratio is undefined: arm b's value (or a denominator) sums to 0")
    rng = random.Random(seed)

    def weights(n: int, draw: bool) -> list[int]:
        w = [0] * n
        for _ in range(n):
            w[rng.randrange(n)] += 1
        return w if draw else [1] * n

    values = []
    for _ in range(reps):
        r = ratio(weights(n_seeds, resample != "prompts"), weights(n_prompts, resample != "seeds"))
        if r is not None:
            values.append(r)
    if not values:
        raise ValueError("no bootstrap replicate has a defined ratio")
    values.sort()
    tail = (1 - level) / 2
    lo, hi = values[int(tail * (len(values) - 1))], values[math.ceil((1 - tail) * (len(values) - 1))]
    logs = [math.log(v) for v in values if v > 0]
    log_sd = statistics.stdev(logs) if len(logs) > 1 else math.inf
    return RatioInterval(point, lo, hi, log_sd, len(values))
