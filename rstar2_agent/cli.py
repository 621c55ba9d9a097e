"""The `rstar2` command."""

from __future__ import annotations

import click

from . import __version__
from .logs import setup_logging
from .sandbox.cli import sandbox_group


@click.group()
@click.version_option(__version__, prog_name="rstar2")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rstar2-agent: serve, evaluate and train a math agent that thinks with a Python tool."""
    setup_logging(verbose)


main.add_command(sandbox_group)
