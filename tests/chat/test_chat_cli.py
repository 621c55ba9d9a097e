"""`rstar2 chat` as a user runs it: one-shot JSON, and an interactive session on piped input.

The CLI's machinery (the JSON trajectory, the session's prompt loop, Ctrl-C) does not depend on what the model
writes, so these run on the tiny SmolLM2 (its architecture and tokenizer at 2 narrow layers, random weights) in the
markdown format; the trained agent answering in chat is tested in tests/train/test_made_models.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))
pytestmark = pytest.mark.slow


def chat_args(model: str) -> list[str]:
    return [RSTAR2, "chat", "--model", model, "--format", "markdown", "--engine", "hf", "--temperature", "0"]


def run(model: str, args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*chat_args(model), *args],
                          input=stdin,
                          capture_output=True, text=True, timeout=600)


def test_one_shot_json_is_a_trajectory(tiny_smollm2):
    p = run(tiny_smollm2, ["-p", "What is 2**100? Use Python.", "--json", "--max-turns", "2", "--max-tokens", "120"])
    assert p.returncode == 0, p.stderr[-2000:]
    traj = json.loads(p.stdout)
    assert traj["stop_reason"] in ("answer", "no_tool_call", "max_turns", "max_tokens")
    assert len(traj["response_ids"]) == len(traj["response_mask"]) == len(traj["logprobs"])
    assert traj["num_tool_calls"] == len([c for t in traj["turns"] for c in t["tool_calls"]])


def test_interactive_session_answers_twice_resets_and_exits(tiny_smollm2):
    """Two questions in one conversation (the second continues the first's ids: tests/chat/test_chat_history.py), then
    /reset and /exit."""
    p = run(tiny_smollm2, ["--max-tokens", "40"], stdin="What is 3*7?\nAnd 4*5?\n/reset\n/exit\n")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "you>" in p.stdout and "(conversation forgotten)" in p.stdout
    assert p.stdout.count(" turns, ") == 2 and "<|im_end|>" not in p.stdout


def test_unknown_hub_model_fails_with_a_clear_message():
    p = run("no-such-org/no-such-model-xyz", ["-p", "hi"])
    assert p.returncode != 0
    assert "could not get the model" in p.stderr and "--model" in p.stderr


def test_ctrl_c_stops_the_answer_not_the_program(tiny_smollm2):
    import os
    import signal
    import time

    # Greedy decoding of the random tiny model runs to the token cap (the repetition stop off: it loops), so the
    # answer is still being written when the signal arrives, whatever the machine's speed.
    proc = subprocess.Popen([*chat_args(tiny_smollm2), "--max-tokens", "3000", "--repetition-stop", "off",
                             "--max-turns", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out = ""
        deadline = time.monotonic() + 120
        while "you>" not in out and time.monotonic() < deadline:  # engine started, prompt shown
            out += os.read(proc.stdout.fileno(), 4096).decode(errors="replace")
        proc.stdin.write("Count from 1 to 1000, separated by commas.\n")
        proc.stdin.flush()
        shown = len(out)
        while len(out) - shown < 20 and time.monotonic() < deadline:  # the answer is streaming
            out += os.read(proc.stdout.fileno(), 4096).decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        proc.stdin.write("/exit\n")
        proc.stdin.flush()
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "(stopped)" in out + rest
    assert proc.returncode == 0
