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


def _count_in_child() -> int:
    """The device count from a fresh Python (NVML could not answer here): CUDA initializes there, not here."""
    code = "import torch; print(torch.cuda.device_count())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=COUNT_TIMEOUT_S,
                             check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        log.warning("could not count the GPUs in a child process (%s: %s); taking none", type(e).__name__, e)
        return 0
