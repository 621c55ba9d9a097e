"""Click options shared by several commands."""

from __future__ import annotations

import click

from .engines.replicas import POLICIES


def replica_options(fn):
    """--replicas and --replica-policy (serve, eval): several engines behind one replica pool."""
    fn = click.option("--replica-policy", type=click.Choice(POLICIES), default="kv_aware", show_default=True,
                      help="How trajectories are placed on replicas (each stays on its replica).")(fn)
    return click.option("--replicas", type=click.IntRange(1), default=1, show_default=True,
                        help="Local engine replicas behind one replica pool (CPU engines; on GPUs run one server "
                             "per GPU and pass several --url).")(fn)
