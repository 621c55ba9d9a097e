"""Nothing a command starts outlives it: FateShare ends a killed process's trees, and `rstar2 serve bench` ended
by SIGTERM mid-run leaves no server, engine or sandbox process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rstar2_agent.processes import alive, descendants

PARENT = """
import subprocess, sys, time
from rstar2_agent.processes import FateShare
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
fate = FateShare([child.pid], grace=2)
print(child.pid, flush=True)
if sys.argv[1] == "release":
    fate.release()
    sys.exit(0)
time.sleep(300)
"""


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("how", ["sigkill", "release"])
def test_fate_share_ends_a_killed_parents_trees_and_only_then(how):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        if how == "sigkill":
            parent.kill()
            parent.wait()
            assert wait_gone([child], 10) == []  # a SIGKILL runs no `finally`: the sidecar ended the tree
        else:
            assert parent.wait(30) == 0
            time.sleep(1.5)
            assert alive(child)  # released: left alone
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_serve_bench_ended_by_sigterm_mid_run_leaves_no_process(tmp_path):
    rstar2 = str(Path(sys.executable).with_name("rstar2"))
    bench = subprocess.Popen([rstar2, "serve", "bench", "--rounds", "1", "--requests", "2", "--max-tokens", "8"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, up = time.monotonic() + 420, set()
        while len(up) < 2:  # both servers (vLLM's and ours) answer: the bench is measuring
            assert bench.poll() is None, bench.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the servers did not come up"
            for pid in descendants(bench.pid):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                port = re.search(r"--port (\d+)", cmd)
                if port and ("serve" in cmd or "api_server" in cmd):
                    try:
                        if httpx.get(f"http://127.0.0.1:{port[1]}/health", timeout=2).status_code == 200:
                            up.add(port[1])
                    except httpx.HTTPError:
                        pass
            time.sleep(1)
        tree = descendants(bench.pid)
        assert len(tree) >= 4  # two servers, their engine processes, our sandbox workers
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(120) != 0
        assert wait_gone(tree, 30) == []
    finally:
        if bench.poll() is None:
            bench.kill()
