"""The `rstar2` command."""

from __future__ import annotations

import click

from . import __version__
from .chat_format import FORMATS
from .cli_options import engine_option
from .logs import setup_logging
from .processes import end_on_sigterm
from .sandbox.sandbox_commands import sandbox_group


class FacesGroup(click.Group):
    """The faces' commands are imported only when one of them runs (or --help lists them): `rstar2 sandbox run`
    or `rstar2 chat` needs neither SQLAlchemy nor FastAPI."""

    FACES = {"serve": "rstar2_agent.serve.serve_command:serve_cmd",
             "eval": "rstar2_agent.eval.eval_commands:eval_group",
             "train": "rstar2_agent.train.train_commands:train_group"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.FACES})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.FACES:
            import importlib

            module, attr = self.FACES[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=FacesGroup)
@click.version_option(__version__, prog_name="rstar2")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rstar2-agent: serve, evaluate and train a math agent that thinks with a Python tool."""
    setup_logging(verbose)
    end_on_sigterm()  # SIGTERM unwinds like Ctrl-C: whatever the command started is closed


main.add_command(sandbox_group)


@main.command("chat")
@click.option("--model", default=None, help="Registry name (default smollm2-135m), local folder or Hugging Face id.")
@engine_option
@click.option("--url", default=None, help="An OpenAI-compatible server (vLLM, SGLang, rstar2 serve).")
@click.option("--served-model", default=None, help="The model name on that server (default: its first).")
@click.option("--api-key", envvar="RSTAR2_API_KEY", default=None)
@click.option("--temperature", type=click.FloatRange(0), default=0.6, show_default=True)
@click.option("--max-turns", type=click.IntRange(1), default=10, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=4096, show_default=True,
              help="Response budget per answer (generated and tool tokens).")
@click.option("--format", "format_name", type=click.Choice(FORMATS), default=None,
              help="Default: the model's (registry).")
@click.option("-p", "--prompt", "question", default=None, help="Answer this once and exit.")
@click.option("--json", "as_json", is_flag=True, help="With -p: print the trajectory as JSON.")
@click.option("--sandbox-url", "sandbox_urls", multiple=True, help="Use `rstar2 sandbox serve` servers.")
@click.option("--unsafe-no-isolation", "unsafe", is_flag=True, help="Run tool code without bubblewrap.")
def chat_cmd(model, engine, url, served_model, api_key, temperature, max_turns, max_tokens, format_name,
             question, as_json, sandbox_urls, unsafe) -> None:
    """Chat with the agent in the terminal."""
    import asyncio

    from rich.console import Console

    from .chat import ChatOptions, chat_loop, chat_once
    from .engines import EngineError
    from .models import ModelError
    from .sandbox import SandboxConfig, SandboxError, make_sandbox

    opts = ChatOptions(model=model, engine=engine, urls=(url,) if url else (), served_model=served_model,
                       api_key=api_key, temperature=temperature, max_turns=max_turns, max_tokens=max_tokens,
                       format=format_name)
    sandbox = make_sandbox(list(sandbox_urls), config=SandboxConfig(workers=1, isolation=not unsafe))
    console = Console(stderr=as_json)
    try:
        if question is not None:
            raise SystemExit(asyncio.run(chat_once(question, opts, sandbox, as_json, console)))
        asyncio.run(chat_loop(opts, sandbox, console))
    except (ModelError, EngineError, SandboxError) as e:
        raise click.ClickException(str(e)) from e


@main.group("engines")
def engines_group() -> None:
    """Inference engines (vllm, hf, openai)."""


@engines_group.command("bench")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--engine", "kinds", multiple=True, type=click.Choice(["hf", "vllm"]), default=("hf", "vllm"),
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(8), default=128, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
def engines_bench_cmd(model, kinds, max_tokens, rounds) -> None:
    """Tokens/s at 1 and 8 concurrent loops per engine, and the agent loop's overhead over the bare engine."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from .engines import make_engine
    from .engines.engine_bench import bench_engine
    from .models import resolve_model

    resolved = resolve_model(model)
    console = Console()

    async def go():
        rows = []
        for kind in kinds:
            with console.status(f"starting {kind} ..."):
                engine = make_engine(kind, resolved.path, context_length=min(resolved.spec.context_length, 4096))
            try:
                rows += await bench_engine(engine, kind, max_tokens=max_tokens, rounds=rounds)
            finally:
                await engine.close()
            console.log(f"{kind} done")
        return rows

    rows = asyncio.run(go())
    table = Table(title=f"engines on {resolved.spec.name}: generated tokens/s")
    for col in ("engine", "concurrent loops", "requests", "tokens", "bare engine tok/s", "agent loop tok/s",
                "wall-clock overhead", "loop's own time"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.engine, str(r.concurrency), str(r.requests), str(r.tokens), f"{r.bare_tok_s:.1f}",
                      f"{r.loop_tok_s:.1f}", f"{r.overhead * 100:+.1f}%", f"{r.loop_own * 100:.2f}%")
    console.print(table)



@engines_group.command("simulate")
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
def engines_simulate_cmd(replicas, rollouts, workload, db, kv_tokens, budget, reserve, quantile, seed,
                         json_out) -> None:
    """Simulate one RL step of multi-turn rollouts over engine replicas under each placement policy."""
    import json

    from rich.console import Console
    from rich.table import Table

    from .engines import rollout_sim as sim

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
