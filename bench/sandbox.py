"""`rstar2 bench sandbox`: our pool against a fresh interpreter per call, side by side in one run.

(a) baseline: what code-judge does, a new `python3` process per call (the program in a file, rlimits set
    between fork and exec, output captured); (b) the LocalSandbox pool with isolation on.
Workloads: trivial code, a numpy snippet, a 0.5 s CPU-bound loop; at concurrency 1 and 256.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rstar2_agent.sandbox.pool import LocalSandbox, SandboxConfig
from rstar2_agent.sandbox.types import ExecResult, Limits, Status

NUMPY_CODE = """import numpy as np
a = np.random.default_rng(0).random((120, 120))
print(float(np.linalg.det(a @ a.T + np.eye(120))))"""


def cpu_code(seconds: float) -> str:
    """A pure-Python loop that runs about `seconds` on this machine (calibrated here, in this process)."""
    body = "s = 0\nfor i in range({n}):\n    s += i * i\nprint(s)"
    n = 1_000_000
    for _ in range(3):  # the cost per iteration grows with the integers' size, so refine
        t0 = time.process_time()
        exec(body.format(n=n), {"print": lambda *a: None})
        n = int(n * seconds / max(1e-6, time.process_time() - t0))
    return body.format(n=n)


@dataclass
class Row:
    system: str
    workload: str
    concurrency: int
    calls: int
    ok: int
    median_ms: float
    p99_ms: float
    calls_per_s: float


async def _measure(call: Callable[[str], Awaitable[ExecResult]], code: str, calls: int, conc: int,
                   system: str, workload: str) -> Row:
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    ok = 0

    async def one() -> None:
        nonlocal ok
        async with sem:
            t = time.perf_counter()
            r = await call(code)
            lat.append(time.perf_counter() - t)
            ok += r.status == Status.OK

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall = time.perf_counter() - t0
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return Row(system, workload, conc, calls, ok, statistics.median(lat) * 1e3, p99 * 1e3, calls / wall)


class FreshProcess:
    """Baseline (a): a fresh interpreter per call."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.dir = tempfile.mkdtemp(prefix="rstar2-bench-")

    def _preexec(self) -> None:
        lim = self.limits
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_bytes, lim.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_size_bytes, lim.file_size_bytes))
        cpu = int(lim.cpu_seconds or 10) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        os.setsid()

    async def run(self, code: str) -> ExecResult:
        fd, path = tempfile.mkstemp(suffix=".py", dir=self.dir)
        with os.fdopen(fd, "w") as f:
            f.write(code)
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, path, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=self.dir, preexec_fn=self._preexec)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.limits.wall_seconds)
            status = Status.OK if proc.returncode == 0 else Status.ERROR
        except TimeoutError:
            proc.kill()
            await proc.wait()
            out, err, status = b"", b"", Status.TIMEOUT
        finally:
            os.unlink(path)
        return ExecResult(status, out.decode(), err.decode(), proc.returncode, time.perf_counter() - t0)


async def run_bench(quick: bool = False, workers: int | None = None,
                    concurrencies: tuple[int, ...] = (1, 256), progress: Callable[[Row], None] | None = None
                    ) -> list[Row]:
    scale = 0.1 if quick else 1.0
    workloads = [
        ("trivial", "print(1+1)", {1: 200, 256: 2000}),
        ("numpy", NUMPY_CODE, {1: 50, 256: 400}),
        ("cpu 0.5s", cpu_code(0.5), {1: 4, 256: 24}),
    ]
    limits = Limits(wall_seconds=60, cpu_seconds=60)
    baseline = FreshProcess(limits)
    rows: list[Row] = []
    cfg = SandboxConfig(workers=workers or os.cpu_count() or 1, limits=limits)
    async with LocalSandbox(cfg) as pool:
        systems = [("fresh python3 per call (a)", baseline.run), ("rstar2 pool, isolated (b)", pool.run)]
        for name, code, sizes in workloads:
            for conc in concurrencies:
                calls = max(2, int(sizes.get(conc, 100) * scale))
                for system, call in systems:
                    await call(code)  # warm-up
                    row = await _measure(call, code, calls, conc, system, name)
                    rows.append(row)
                    if progress:
                        progress(row)
    return rows


def ratios(rows: list[Row]) -> list[dict[str, float | str | int]]:
    """For each (workload, concurrency): (b)/(a) for calls/s and median latency."""
    out = []
    for a in (r for r in rows if r.system.endswith("(a)")):
        key = (a.workload, a.concurrency)
        b = next(r for r in rows if r.system.endswith("(b)") and (r.workload, r.concurrency) == key)
        out.append({"workload": a.workload, "concurrency": a.concurrency,
                    "throughput_ratio": b.calls_per_s / a.calls_per_s,
                    "median_latency_ratio": b.median_ms / a.median_ms})
    return out
