"""`rstar2 bench simulate`: the simulators, one RL step at the paper's scale (`step`, with its calibration on
measured runs) and rollout placement over engine replicas (`replicas`). Figures and their commands: docs/results.md."""

from __future__ import annotations

import json

import click


@click.group("simulate")
def simulate_group() -> None:
    """Simulators: one RL step at the paper's scale (`step`), rollout placement over engine replicas (`replicas`)."""


@simulate_group.command("step")
@click.option("--stage", type=click.Choice(["1", "2", "3"]), default="1", show_default=True,
              help="The paper's RL stage whose budget (8K or 12K tokens, 10 or 15 turns) the table simulates.")
@click.option("--steps", type=click.IntRange(2), default=7, show_default=True,
              help="Learner steps simulated per row; the first --warmup are left out of the means.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the drawn rollouts.")
@click.option("--shard", type=click.Choice(["1", "2", "4", "8", "16"]), default="8", show_default=True,
              help="Simulate 1/SHARD of the GPUs and prompts (the scheduler spreads them evenly); 1: all of them.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Also write the table here.")
@click.option("--calibrate", "sync_run", default=None,
              help="Instead: fit the model on this synchronous run (a history.json, a run folder, or a run name in "
                   "the store) and predict --measured runs.")
@click.option("--measured", multiple=True,
              help="A run to predict with the fitted model (repeatable); its schedule from its recipe.yaml or below.")
@click.option("--db", default=None, help="The store (SQLite file or SQLAlchemy URL) of the runs' metrics and rollouts.")
@click.option("--contention", default="auto", show_default=True,
              help="Slow-down when learner and engine overlap on one machine: a number (0 none, 1 half speed each), "
                   "or auto to measure it here.")
@click.option("--skip", type=click.IntRange(0), default=1, show_default=True,
              help="Leave out each run's first steps (start-up) from the fit and the comparison.")
@click.option("--rollouts-per-step", type=click.IntRange(1), default=None,
              help="When neither a recipe.yaml nor the store tells it.")
@click.option("--max-staleness", type=click.IntRange(0), default=None, help="The --measured runs' schedule.")
@click.option("--partial/--no-partial", default=None, help="The --measured runs' partial rollouts.")
def step_cmd(stage, steps, warmup, seed, shard, json_out, sync_run, measured, db, contention, skip,
                 rollouts_per_step, max_staleness, partial) -> None:
    """One RL step of the paper's setup (64 MI300X, Qwen3-14B, 512 x 32 rollouts), simulated under the synchronous
    schedule and bounded staleness, with and without partial rollouts: step time, throughput, ratio to sync. With
    --calibrate: fit the model on a measured synchronous run and report how well it predicts the --measured runs."""
    from rich.console import Console

    from . import step_sim as sim

    console = Console(width=160)
    if sync_run:
        result = _calibrate(console, sync_run, measured, db, contention, skip, rollouts_per_step, max_staleness,
                            partial, steps, warmup)
    else:
        rows = sim.paper_table(int(stage), steps, warmup, seed, int(shard))
        _paper_table(console, rows, int(stage), int(shard))
        result = sim.as_json(rows, int(stage), {"steps": steps, "warmup": warmup, "seed": seed, "shard": int(shard)})
    if json_out:
        from pathlib import Path

        Path(json_out).write_text(json.dumps(result, indent=1))
        console.print(f"wrote {json_out}")


def _paper_table(console, rows, stage: int, shard: int) -> None:
    from rich.table import Table

    from . import step_sim as sim

    grid = Table(title=f"One RL step at the paper's scale, stage {stage} (simulated; assumptions below)")
    for col in ("schedule", "GPUs", "step s", "rollouts/s", "tokens/s", "vs sync", "rollout s", "update s",
                "push s", "learner wait s", "lag max/mean"):
        grid.add_column(col, justify="right")
    for r in rows:
        grid.add_row(r.schedule, r.setup, f"{r.step_time:.0f}", f"{r.rollouts_per_s:.2f}", f"{r.tokens_per_s:.0f}",
                     f"{r.vs_sync:.2f}x", f"{r.time_rollout:.0f}", f"{r.time_update:.0f}",
                     f"{r.time_push:.1f}", f"{r.learner_wait_s:.0f}",
                     f"{r.policy_lag_max}/{r.policy_lag_mean:.2f}")
    console.print(grid)
    for key, text in sim.assumptions(stage, shard).items():
        console.print(f"  {key}: {text}")
    console.print("  published async/sync throughput: " + "; ".join(f"{k} {v}" for k, v in sim.PUBLISHED) +
                  " (each on its own model, lengths and GPUs)")


def _calibrate(console, sync_run, measured, db, contention, skip, rollouts_per_step, max_staleness, partial, steps,
               warmup) -> dict:
    import dataclasses

    from rich.table import Table

    from . import calibrate as cal
    from . import step_sim as sim

    try:
        c = cal.measure_contention() if contention == "auto" else float(contention)
    except ValueError as e:
        raise click.UsageError(f"--contention takes a number or auto, not {contention!r}") from e
    try:
        base = cal.load_run(sync_run, db)
        fit = cal.fit_sync(base, c, skip, rollouts_per_step)
        preds = [cal.predict(fit, base)]
        for spec in measured:
            run = cal.load_run(spec, db)
            sched = run.schedule()
            sched = sim.Schedule(sched.max_staleness if max_staleness is None else max_staleness,
                                 sched.partial if partial is None else partial)
            preds.append(cal.predict(fit, run, sched))
    except cal.CalibrationError as e:
        raise click.ClickException(str(e)) from e
    params = fit.describe()
    console.print(f"fitted on {base.name} (steps {skip + 1}-{len(base.history)}; contention "
                  f"{'measured here' if contention == 'auto' else 'given'}): " +
                  ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in params.items()))
    grid = Table(title="calibration: predicted against measured mean step time")
    for col in ("run", "schedule", "steps", "measured s", "predicted s", "error", "contention that fits"):
        grid.add_column(col, justify="right")
    for p in preds:
        grid.add_row(p.run, p.schedule, str(p.steps), f"{p.measured_step_time:.2f}", f"{p.predicted_step_time:.2f}",
                     f"{p.error_pct:+.1f}%", "-" if p.contention_that_fits is None else f"{p.contention_that_fits:.2f}")
    console.print(grid)
    what_if = []
    sync_time = None
    for sched in (sim.Schedule(), *sim.SCHEDULES):
        r = sim.simulate(fit.setup, sched, steps, warmup)
        sync_time = sync_time or r.step_time
        what_if.append({"schedule": sched.label, "step_time": r.step_time, "vs_sync": sync_time / r.step_time})
    console.print("the fitted model under each schedule: " +
                  "; ".join(f"{w['schedule']} {w['step_time']:.1f} s ({w['vs_sync']:.2f}x)" for w in what_if))
    return {"fit": params, "predictions": [dataclasses.asdict(p) for p in preds], "what_if": what_if}


@simulate_group.command("replicas")
@click.option("--replicas", default="8,64", show_default=True, help="Replica counts, comma-separated.")
@click.option("--rollouts", type=click.IntRange(1), default=16384, show_default=True,
              help="Rollouts in the step (paper: 512 prompts x 32, RoC's oversampling of 2 x 16).")
@click.option("--workload", type=click.Choice(["longtail", "recorded"]), default="longtail", show_default=True,
              help="longtail: shaped like the paper's; recorded: resampled from --db (default: a SmolLM2 sample).")
@click.option("--db", default=None, help="A store (path or SQLAlchemy URL) for --workload recorded.")
@click.option("--kv-tokens", type=click.IntRange(1), default=500_000, show_default=True, help="KV cache per replica.")
@click.option("--budget", type=click.IntRange(1), default=12_288, show_default=True,
              help="Max response tokens of a rollout.")
@click.option("--reserve", type=click.IntRange(1), default=None,
              help="Also run kv_aware overbooked: each rollout reserves prompt + this many tokens.")
@click.option("--quantile", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.9,
              show_default=True, help="Adaptive kv_aware: reserve up to this quantile of the learned lengths.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def replicas_cmd(replicas, rollouts, workload, db, kv_tokens, budget, reserve, quantile, seed,
                         json_out) -> None:
    """Simulate one RL step of multi-turn rollouts over engine replicas under each placement policy."""
    from rich.console import Console
    from rich.table import Table

    from . import replicas_sim as sim

    counts = [int(x) for x in replicas.split(",") if x.strip()]
    try:
        def step(s: int) -> list:
            return sim.longtail(rollouts, s, budget=budget) if workload == "longtail" else sim.recorded(rollouts, s, db)

        # "later step": the adaptive pool has learned from the step before (the same workload, another seed)
        rows = sim.compare(step(seed), counts, sim.SimConfig(kv_tokens=kv_tokens, budget=budget), reserve, quantile,
                           prior=step(seed + 1))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    table = Table(title=f"one step of {rollouts} {workload} rollouts, {kv_tokens} KV tokens a replica")
    for col in ("replicas", "policy", "makespan s", "vs static", "idle %", "preemptions", "recomputed tokens",
                "pool waits", "overflows"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    static = {r.replicas: r.makespan for label, r in rows if label == "static"}
    for label, r in rows:
        table.add_row(str(r.replicas), label, f"{r.makespan:.0f}", f"{r.makespan / static[r.replicas] - 1:+.0%}",
                      f"{r.idle * 100:.1f}", str(r.preemptions), str(r.recomputed), str(r.waits), str(r.overflows))
    Console().print(table)
    if json_out:
        with open(json_out, "w") as f:
            json.dump([{"label": label, **r.to_dict()} for label, r in rows], f, indent=1)
