"""Click options shared by several commands."""

from __future__ import annotations

import click

from .engines import ENGINES
from .engines.replicas import POLICIES


def engine_option(fn):
    """--engine (chat, serve, eval): the same choices everywhere, resolved by engines.spec.EngineSpec.kind."""
    return click.option("--engine", type=click.Choice(["auto", *ENGINES]), default="auto", show_default=True,
                        help="auto: vllm on GPU machines, hf on CPU, openai when --url is given.")(fn)


def replica_options(fn):
    """--replicas and --replica-policy (serve, eval): several engines behind one replica pool."""
    fn = click.option("--replica-policy", type=click.Choice(POLICIES), default="kv_aware", show_default=True,
                      help="How trajectories are placed on replicas (each stays on its replica).")(fn)
    return click.option("--replicas", type=click.IntRange(1), default=1, show_default=True,
                        help="Local engine replicas behind one replica pool (CPU engines; on GPUs run one server "
                             "per GPU and pass several --url).")(fn)


def repetition_option(fn):
    """--repetition-stop (chat, serve): the loop detector of repetition.py, on by default."""

    def parse(ctx, param, value):
        from .repetition import RepetitionStop

        try:
            return RepetitionStop.parse(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from e

    return click.option("--repetition-stop", "repetition", default="on", show_default=True, callback=parse,
                        metavar="on|off|KEY=VALUE,...",
                        help="End an answer that loops (a pattern of at most max_pattern_size=128 tokens repeated "
                             "min_count=4 times over min_tokens=256 tokens) with the stop reason `repetition`; "
                             "off, or tune it: --repetition-stop min_tokens=512.")(fn)
