"""Nothing a command starts outlives it.

- `end_on_sigterm()`: SIGTERM is raised as `Terminated` (a KeyboardInterrupt, so asyncio and click treat it as
  Ctrl-C): every `finally` and `async with` of the command runs, and engines, servers and pools close.
- `FateShare`: for what a `finally` cannot reach, a SIGKILL of the command. A small sidecar process watches the
  command (a pipe only the command holds, and the parent-death signal) and, when the command dies without
  releasing it, ends the process trees it was given (SIGTERM, then SIGKILL after a grace period). vLLM's engine
  core and the servers `rstar2 bench serve` starts are put under one.
- `descendants(pid)`, `end_tree(pid)`: process trees read from /proc (Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """The command got SIGTERM."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"signal {signal.Signals(signum).name}")


def end_on_sigterm() -> None:
    """From now on SIGTERM unwinds this process like Ctrl-C (only the main thread can set handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
                parents.setdefault(ppid, []).append(int(entry))
    out, frontier = [], [pid]
    while frontier:
        kids = [k for p in frontier for k in parents.get(p, [])]
        out += kids
        frontier = kids
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def end_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM `pid` and everything below it; SIGKILL what is left after `grace` seconds."""
    tree = [pid, *descendants(pid)]
    for p in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.1)
    for p in tree + descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


class FateShare:
    """Ends the process trees under `pids` if this process dies without calling `release()` first."""

    def __init__(self, pids: list[int], grace: float = 10.0):
        self.pids = list(pids)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rstar2_agent.processes", str(os.getpid()), str(grace), *map(str, self.pids)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def add(self, pid: int) -> None:
        self.pids.append(pid)
        self._say(f"add {pid}\n")

    def release(self) -> None:
        """The trees were ended properly: the sidecar leaves them alone and exits."""
        self._say("release\n")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def _say(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()


def _sidecar(parent: int, grace: float, pids: list[int]) -> None:
    """Run by FateShare: wait for the parent's death (EOF on stdin, or the parent-death signal), then end the
    trees; exit quietly on `release`."""
    ended, eof = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: ended.set())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        ended.set()

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "release":
                os._exit(0)
            if line.startswith("add "):
                pids.append(int(line.split()[1]))
        eof.set()  # the parent is gone (or dropped its FateShare without releasing it)
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    while True:
        if ended.wait(0.5):
            # the parent-death signal also fires when the thread that started us ends: only a dead parent counts
            if eof.is_set() or not alive(parent) or os.getppid() != parent:
                break
            ended.clear()
    for pid in list(pids):
        end_tree(pid, grace)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the duration (what the processes started inside inherit), then as before."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    _sidecar(int(sys.argv[1]), float(sys.argv[2]), [int(p) for p in sys.argv[3:]])

