"""The suite's timeouts follow the machine: conftest.py multiplies pytest-timeout's per-test limits (a fixture's
setup counted in its first test's) and `until`'s by the measured slowness, so a slower 2-core machine runs the same
suite green; checked on a throwaway test run by pytest itself, with the scale forced each way."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, machine_slowness

SLOW_TEST = """
import time
import pytest

@pytest.mark.timeout(2)
def test_takes_three_seconds():
    time.sleep(3)
"""


def _run(tmp_path, scale: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_slow.py").write_text(SLOW_TEST)
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {**os.environ, "RSTAR2_TEST_TIMEOUT_SCALE": scale}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tmp_path / "test_slow.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_slower_machine_gets_longer_timeouts(tmp_path):
    fast = _run(tmp_path, "1")
    assert fast.returncode == 1 and "Timeout" in fast.stdout + fast.stderr and "timeouts x1.00" in fast.stdout
    slow = _run(tmp_path, "2")
    assert slow.returncode == 0 and "timeouts x2.00" in slow.stdout, slow.stdout[-2000:]
    assert 1.0 <= machine_slowness() <= 4.0
