"""How many GPUs this process sees, counted without initializing CUDA in it.

`torch.cuda.is_available()` calls cudaGetDeviceCount, which initializes the CUDA driver in this process; vLLM then
forks its engine core (its default start method, kept while torch has not itself initialized CUDA), and the child's
first CUDA call fails ("Cannot re-initialize CUDA in forked subprocess"). NVML (amdsmi on ROCm) counts the devices
without touching CUDA, as vLLM's own platform detection does; where it cannot, a short-lived child process counts
them, so this one stays clean."""

from __future__ import annotations

import logging
import subprocess
import sys

log = logging.getLogger(__name__)
COUNT_TIMEOUT_S = 120.0


def gpu_count() -> int:
    """The GPUs visible to this process (CUDA_VISIBLE_DEVICES honoured); 0 on a CPU build of torch."""
    import torch

    if not torch.cuda._is_compiled():
        return 0
    if torch.cuda.is_initialized():  # already initialized here (a learner): counting costs nothing more
        return torch.cuda.device_count()
    counted = torch.cuda._device_count_amdsmi() if torch.version.hip else torch.cuda._device_count_nvml()
    return counted if counted >= 0 else _count_in_child()


def on_gpu() -> bool:
    return gpu_count() > 0


def gpu_memory_bytes() -> int:
    """The first GPU's total memory in bytes (0 without one), asked without initializing CUDA here."""
    import torch

    if not gpu_count():
        return 0
    if torch.cuda.is_initialized():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return _ask_child("torch.cuda.get_device_properties(0).total_memory", "the GPU's memory")


def _count_in_child() -> int:
    """The device count from a fresh Python (NVML could not answer here)."""
    return _ask_child("torch.cuda.device_count()", "the GPUs")


def _ask_child(expression: str, what: str) -> int:
    """An integer torch gives in a fresh Python: CUDA initializes there, not here. 0 (with a warning) when it
    cannot answer."""
    try:
        out = subprocess.run([sys.executable, "-c", f"import torch; print({expression})"], capture_output=True,
                             text=True, timeout=COUNT_TIMEOUT_S, check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        log.warning("could not ask a child process for %s (%s: %s); taking none", what, type(e).__name__, e)
        return 0
