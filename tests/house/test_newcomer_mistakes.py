"""A newcomer's usual mistakes, each as the user meets it: the command exits non-zero with one message that says
what went wrong and what to type instead, and no traceback (issue 51, "Mistakes get an answer")."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, run_until_paused, timeout_scale

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


def rstar2(*args: str, env: dict[str, str] | None = None, stdin: str = "", cwd: str | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([RSTAR2, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def said(p: subprocess.CompletedProcess, *phrases: str) -> str:
    """The message the user reads (stderr), checked: no traceback, every phrase in it."""
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    for phrase in phrases:
        assert phrase in p.stderr, f"{phrase!r} not in:\n{p.stderr[-3000:]}"
    return p.stderr


def test_a_misspelled_model_name_gets_the_close_name():
    p = rstar2("chat", "--model", "smollm-135m", "-p", "hi", timeout=120)
    assert p.returncode == 1
    said(p, "unknown model 'smollm-135m'", "did you mean --model smollm2-135m?")


def test_a_misspelled_benchmark_gets_the_close_names():
    p = rstar2("eval", "aime2", timeout=120)
    assert p.returncode == 2
    said(p, "unknown benchmark(s) aime2", "did you mean aime25 or aime24", "rstar2 eval aime25")


def test_serve_on_a_port_already_taken_says_so_before_loading_anything():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.monotonic()
        p = rstar2("serve", "--model", "smollm2-135m", "--port", str(port), timeout=120)
    assert p.returncode == 1 and time.monotonic() - t0 < 60 * timeout_scale()  # no model loaded first
    said(p, f"cannot listen on 127.0.0.1:{port}", "pick another port: --port ")


def test_eval_with_a_url_where_nothing_listens_fails_once_and_fast(smol, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    p = rstar2("eval", "synth", "--url", url, "--limit", "1", "--model", "smollm2-135m",
               "--db", str(tmp_path / "store.db"), cwd=str(tmp_path), timeout=300)
    assert p.returncode == 1 and time.monotonic() - t0 < 120 * timeout_scale()  # not a retried failure per sample
    said(p, f"the server at {url} did not answer", "ConnectError", "Start it (`rstar2 serve`")
    assert "retry" not in p.stderr


def test_no_bubblewrap_says_how_to_install_it(tmp_path):
    bare = tmp_path / "bin"  # a PATH with python but no bwrap
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    p = rstar2("sandbox", "run", "-", stdin="print(1)\n", env={"PATH": str(bare)}, timeout=120)
    assert p.returncode == 1
    said(p, "The sandbox needs bubblewrap", "apt-get install bubblewrap", "--unsafe-no-isolation")


@pytest.mark.skipif(sys.platform != "linux", reason="the pause hook's signals")
def test_ctrl_c_during_the_first_conversion_keeps_nothing_of_it(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "RSTAR2_HOME": str(home)}
    seen: list[str] = []
    run_until_paused([RSTAR2, "chat", "--model", "smollm2-135m", "-p", "hi"], "convert:1", env, sig=signal.SIGINT,
                     seen=seen)
    stderr = "".join(seen)
    assert seen[-1] == "exit status 1" and "Traceback" not in stderr, stderr
    assert "converting the embedded smollm2-135m" in stderr and "nothing of it is kept" in stderr
    assert "Aborted" in stderr
    models = home / "models"
    assert not (models / "smollm2-135m").exists()  # the half-written folder was never moved into place
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []  # nor left beside it
