"""Logging for the command line: one rich handler on the root logger, writing to stderr.

At the default verbosity the libraries under an engine (vLLM, torch, Triton, transformers) reach the terminal
with their errors only: an engine start would otherwise print a screen of their warnings (CPU build notes,
dtype casts, deprecations). `-v` shows everything. vLLM configures its own logger in each of its processes
from the environment, so the levels go there too (a variable the user set wins)."""

from __future__ import annotations

import logging
import os

# loggers whose records below ERROR are noise in a terminal app at the default verbosity ("py.warnings": the
# `warnings` module's, captured)
LIBRARIES = ("vllm", "torch", "triton", "py.warnings")


def setup_logging(verbose: bool = False) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", datefmt="[%X]",
                        handlers=[handler], force=True)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # torch's and Triton's FutureWarnings become records, leveled like the rest
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    # vLLM's engine core and workers are processes of their own: its level (read when an engine starts, and
    # handed to them), its stream (stdout by default, where `--json` prints), and torch's C++ warnings
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if verbose else "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "INFO" if verbose else "ERROR")
    if not verbose:  # the one Python warning they print: vLLM's kernel scan touching torch's deprecated alias
        os.environ.setdefault("PYTHONWARNINGS", "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning")
    try:  # transformers' per-weight progress bars are noise in a terminal app
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_warning() if verbose else hf_logging.set_verbosity_error()
    except ImportError:
        pass
