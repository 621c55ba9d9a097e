"""Logging for the command line: one rich handler on the root logger, writing to stderr."""

from __future__ import annotations

import logging


def setup_logging(verbose: bool = False) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", datefmt="[%X]",
                        handlers=[handler], force=True)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
