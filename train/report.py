"""Training reports from the store: metrics per step, and their curves as a PNG."""

from __future__ import annotations

import math
from collections import defaultdict

from sqlalchemy import select

from rstar2_agent.store import Metric, Store

CURVES = ("loss", "accuracy", "response_tokens", "tool_calls", "tool_error_ratio_positive", "clip_frac",
          "logprob_gap", "logp_mismatch_kl", "logp_mismatch_out_of_range", "entropy", "grad_norm", "lr",
          "tokens_per_s", "rollout_tokens_per_s")


def metrics_by_step(store: Store, run_id: int) -> dict[int, dict[str, float]]:
    with store.session() as s:
        rows = s.execute(select(Metric.step, Metric.name, Metric.value).where(Metric.run_id == run_id)
                         .order_by(Metric.step, Metric.id))
        out: dict[int, dict[str, float]] = defaultdict(dict)
        for step, name, value in rows:
            out[step][name] = value
    return dict(out)


def curves(steps: dict[int, dict[str, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in CURVES if any(n in m for m in steps.values())]
    cols = 3
    fig, axes = plt.subplots(math.ceil(len(names) / cols), cols, figsize=(12, 3 * math.ceil(len(names) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        xs = [s for s, m in steps.items() if name in m]
        ax.plot(xs, [steps[s][name] for s in xs], marker="o", markersize=3)
        ax.set_title(name.replace("_", " "), fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
