"""Run a function on N ranks of a real gloo process group, each in a fresh process with the environment torchrun
gives its ranks (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), so `TorchLearner` shards with FSDP2 as
under torchrun on GPUs. The function must be importable (a module-level function) and its result picklable."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from conftest import free_port


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 600.0) -> list[Any]:
    """[fn(*args) on rank 0, ..., on rank world - 1]; a rank's exception, a rank that dies, or `timeout` seconds
    without all results fail the call (and the other ranks are killed)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(fn, rank, world, port, results, args), daemon=True)
             for rank in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead:
                    codes = [procs[r].exitcode for r in dead]
                    raise AssertionError(f"ranks {dead} died (exit codes {codes})") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks {sorted(set(range(world)) - set(out))} gave no result within "
                                         f"{timeout:.0f} s") from None
                continue
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world)]


def _rank(fn: Callable[..., Any], rank: int, world: int, port: int, results: Any, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        results.put((rank, True, fn(*args)))
    except BaseException:  # noqa: BLE001 - reported to the test with its traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
