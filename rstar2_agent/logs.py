"""Logging for the command line: one rich handler on the root logger."""

from __future__ import annotations

import logging


def setup_logging(verbose: bool = False) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        datefmt="[%X]", handlers=[RichHandler(rich_tracebacks=False, show_path=False)], force=True)
