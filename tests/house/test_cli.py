"""`rstar2 sandbox run` as a user runs it: a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


def rstar2(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RSTAR2, *args], input=stdin, capture_output=True, text=True, timeout=120, env=env)


def test_run_json_has_every_field():
    p = rstar2("sandbox", "run", "--json", "--stdin", "5", "-", stdin="n = int(input())\nn * 2\n")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and d["stdout"] == "10\n" and d["exit_code"] == 0
    assert {"stderr", "duration", "truncated", "cpu_time"} <= set(d)


def test_run_file_with_timeout_exits_nonzero(tmp_path):
    f = tmp_path / "loop.py"
    f.write_text("while True:\n    pass\n")
    p = rstar2("sandbox", "run", "--timeout", "1", str(f))
    assert p.returncode != 0 and "timeout" in p.stderr


def test_run_refuses_without_bubblewrap_and_says_how_to_fix():
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    p = rstar2("sandbox", "run", "-", stdin="print(1)", env=env)
    assert p.returncode != 0
    assert "apt-get install bubblewrap" in p.stderr and "--unsafe-no-isolation" in p.stderr
    p = rstar2("sandbox", "run", "--unsafe-no-isolation", "-", stdin="print(1)", env=env)
    assert p.returncode == 0 and p.stdout == "1\n"
