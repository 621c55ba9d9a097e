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
    try:  # transformers' per-weight progress bars are noise in a terminal app
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
