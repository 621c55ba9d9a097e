"""Nothing a command starts outlives it: FateShare ends a killed process's trees, and `rstar2 bench serve` ended
by SIGTERM mid-run leaves no server, engine or sandbox process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rstar2_agent.processes import alive, descendants

from conftest import until_sync

PARENT = """
import subprocess, sys, time
from rstar2_agent.processes import FateShare
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
fate = FateShare([child.pid], grace=2)
print(child.pid, fate.proc.pid, flush=True)
if sys.argv[1] == "release":
    fate.release()
    sys.exit(0)
time.sleep(300)
"""


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still alive once every one has ended; fails after `seconds`, naming the living."""
    until_sync(lambda: not any(alive(p) for p in pids),
               lambda: f"processes to end (still alive: {[p for p in pids if alive(p)]})", seconds, every=0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("how", ["sigkill", "release"])
def test_fate_share_ends_a_killed_parents_trees_and_only_then(how):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True)
    child, sidecar = map(int, parent.stdout.readline().split())
    try:
        assert alive(child)
        if how == "sigkill":
            parent.kill()
            parent.wait()
            assert wait_gone([child], 10) == []  # a SIGKILL runs no `finally`: the sidecar ended the tree
        else:
            assert parent.wait(30) == 0
            # once the released sidecar has exited, nothing is left that could end the child
            until_sync(lambda: not alive(sidecar), "the released sidecar to exit", 10)
            assert alive(child)  # released: left alone
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(600)  # two vLLM servers start (its wait for them allows 420 s) beside two other workers
def test_serve_bench_ended_by_sigterm_mid_run_leaves_no_process(tmp_path):
    rstar2 = str(Path(sys.executable).with_name("rstar2"))
    bench = subprocess.Popen([rstar2, "bench", "serve", "--rounds", "1", "--requests", "2", "--max-tokens", "8"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        up: set[str] = set()

        def both_up() -> bool:  # both servers (vLLM's and ours) answer: the bench is measuring
            assert bench.poll() is None, bench.stderr.read()[-2000:]
            for pid in descendants(bench.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except FileNotFoundError:  # a short-lived child (a compiler, a probe) ended since it was listed
                    continue
                port = re.search(r"--port (\d+)", cmd)
                if port and ("serve" in cmd or "api_server" in cmd):
                    try:
                        if httpx.get(f"http://127.0.0.1:{port[1]}/health", timeout=2).status_code == 200:
                            up.add(port[1])
                    except httpx.HTTPError:
                        pass
            return len(up) >= 2

        until_sync(both_up, "the servers to come up (vLLM's and ours answering /health)", timeout=420, every=1)
        tree = descendants(bench.pid)
        assert len(tree) >= 4  # two servers, their engine processes, our sandbox workers
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(120) != 0
        assert wait_gone(tree, 30) == []
    finally:
        if bench.poll() is None:
            bench.kill()
