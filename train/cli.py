"""`rstar2 train sft|data`. Run as `python -m rstar2_agent.train.cli` under torchrun for several GPUs."""

from __future__ import annotations

import json
import logging

import click

from .recipe import RecipeError

log = logging.getLogger(__name__)


@click.group("train")
def train_group() -> None:
    """Train: the non-reasoning SFT stage (`rstar2 train sft`); GRPO-RoC RL follows."""


@train_group.command("sft", context_settings={"ignore_unknown_options": True})
@click.option("--recipe", default="sft-smollm2-cpu", show_default=True,
              help="A YAML file, or a recipe name in train/recipes/.")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in the recipe's `out` folder.")
@click.argument("overrides", nargs=-1)
def sft_cmd(recipe, resume, overrides) -> None:
    """Supervised fine-tuning; OVERRIDES are key=value (e.g. optim.lr=2e-5 max_steps=10 out=runs/x)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from rstar2_agent.models import ModelError

    from . import recipe as recipes
    from .chat_data import DataError
    from .sft import SFTConfig, run_sft

    try:
        cfg = recipes.load(SFTConfig, recipe, overrides)
    except RecipeError as e:
        raise click.UsageError(str(e)) from e
    bar = Progress(TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
    task = bar.add_task("sft", total=None, info="preparing data and model")

    def on_step(step: int, total: int, m: dict[str, float]) -> None:
        bar.update(task, total=total, completed=step, info=f"loss {m['loss']:.4f} lr {m['lr']:.2e} "
                   f"gnorm {m['grad_norm']:.2f} {m['tokens_per_s']:.0f} tok/s")

    try:
        with bar:
            final, history = run_sft(cfg, resume=resume, on_step=on_step)
    except (DataError, ModelError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"checkpoint: {final}  (use it anywhere with --model {final})")
    if history:
        click.echo(f"loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f} over {len(history)} steps")


@train_group.command("data")
@click.argument("source")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Write chat JSONL here.")
def data_cmd(source, out) -> None:
    """Write SOURCE as chat JSONL: synthetic:N[:SEED], FORMAT:path (sharegpt, glaive_v2, toolace, openai) or
    hub:ORG/NAME (a converter exists for ToolACE, APIGen-MT, Glaive v2, Tulu 3)."""
    from .chat_data import DataError, DataStats
    from .converters import load_records

    stats = DataStats()
    try:
        records = load_records(source, "skip", stats)
    except DataError as e:
        raise click.ClickException(str(e)) from e
    with open(out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    click.echo(f"{len(records)} conversations -> {out}" + (f" ({len(stats.bad_lines)} bad rows skipped: "
                                                          f"{stats.bad_lines[:10]})" if stats.bad_lines else ""))


if __name__ == "__main__":
    train_group()
