"""Training reports from the store: metrics per step as a table (the few a user reads, or all of them), and their
curves as a PNG."""

from __future__ import annotations

import math
from collections import defaultdict

from sqlalchemy import select

from rstar2_agent.store import Metric, Store

CURVES = ("loss", "accuracy", "response_tokens", "tool_calls", "tool_error_ratio_positive", "clip_frac",
          "logprob_gap", "logp_mismatch_kl", "logp_mismatch_out_of_range", "entropy", "grad_norm", "lr",
          "tokens_per_s", "rollout_tokens_per_s")

# The table's columns without --all, by run kind: (metric, header). An RL step logs about 36 metrics; these are
# the ones a step is read by. `mismatch` is the learner/rollout-engine logprob gap (`rollout_mismatch`'s k3 KL).
SHORT = {"rl": (("accuracy", "accuracy"), ("tool_error_ratio_positive", "tool errors"),
                ("response_tokens", "resp tokens"), ("loss", "loss"), ("logp_mismatch_kl", "mismatch"),
                ("step_time", "step s")),
         "sft": (("loss", "loss"), ("grad_norm", "grad norm"), ("lr", "lr"), ("tokens_per_s", "tokens/s"))}


def metrics_by_step(store: Store, run_id: int) -> dict[int, dict[str, float]]:
    with store.session() as s:
        rows = s.execute(select(Metric.step, Metric.name, Metric.value).where(Metric.run_id == run_id)
                         .order_by(Metric.step, Metric.id))
        out: dict[int, dict[str, float]] = defaultdict(dict)
        for step, name, value in rows:
            out[step][name] = value
    return dict(out)


def columns(steps: dict[int, dict[str, float]], kind: str, every: bool = False) -> list[tuple[str, str]]:
    """(metric, header) of the table: `SHORT[kind]`'s that the run has, or, with `every` (or none of them
    there), every metric it logged, by name."""
    logged = sorted({k for m in steps.values() for k in m})
    short = [] if every else [(n, h) for n, h in SHORT.get(kind, ()) if n in logged]
    return short or [(n, n.replace("_", " ")) for n in logged]


def print_table(steps: dict[int, dict[str, float]], title: str, kind: str, every: bool = False) -> None:
    """The table on stdout: by default the short columns at the terminal's width; with `every` all of them, on
    a console as wide as they are (rich squeezes nothing: pipe it into `less -S`)."""
    from rich.console import Console
    from rich.table import Table

    if not steps:
        Console().print(f"{title}: no step recorded yet")
        return
    cols = columns(steps, kind, every)
    logged = {k for m in steps.values() for k in m}
    hidden = len(logged) - len(cols)
    notes = [f"{h}: {n}" for n, h in cols if h != n.replace("_", " ")]
    if hidden:
        notes.append(f"{hidden} more metrics with --all or --json")
    table = Table(title=title, caption="; ".join(notes) or None)
    rows = [[str(step), *[f"{m[n]:.4g}" if n in m else "" for n, _ in cols]] for step, m in steps.items()]
    headers = ["step", *(h for _, h in cols)]
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i else "left")
    for row in rows:
        table.add_row(*row)
    # each column: its widest cell and a space either side, and a rule
    wide = sum(3 + max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)) + 1
    Console(width=max(120, wide) if every else None).print(table)


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
