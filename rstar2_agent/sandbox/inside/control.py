"""The sandbox program's process: moves the control channel off fds 0/1, hardens itself, imports the preload
modules once, then answers each run frame with the mode's result (the protocol is in frames.py)."""

from __future__ import annotations

import builtins
import ctypes
import gc
import os
import signal
import sys

from .fork_mode import ForkRunner
from .frames import read_frame, read_payload, result_frame, send_payload, write_frame
from .process import libc
from .session_mode import SessionRunner

PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _collapse_heap_into_huge_pages() -> None:
    """Back the template's large anonymous regions (the preloaded heap) with 2 MiB pages, so that each fork
    copies a few page-table entries instead of thousands. Best effort: needs Linux 6.1+ and THP enabled."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
    except OSError:
        return
    for line in maps:
        parts = line.split()
        start, end = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5] if len(parts) > 5 else ""
        if parts[1].startswith("rw") and path in ("", "[heap]") and end - start >= 2 << 20:
            libc.madvise(start, end - start, MADV_HUGEPAGE)
            libc.madvise(start, end - start, MADV_COLLAPSE)


class _Quitter:
    """`exit()` and `quit()`, which `site` adds to builtins and `-S` leaves out: programs call them."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def main() -> None:
    mode, scratch = sys.argv[1], sys.argv[2]
    extra_paths = [p for p in os.environ.get("RSTAR2_SANDBOX_PATH", "").split(os.pathsep) if p]
    sys.path[:0] = extra_paths
    # Move the control channel off 0/1 so that nothing the user runs can reach it by accident.
    ctrl_in, ctrl_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if os.getpid() != 1:  # no pid namespace (unsafe mode): die with the host
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, _Quitter(name))
    for name in filter(None, os.environ.get("RSTAR2_SANDBOX_PRELOAD", "").split(",")):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module is not fatal
            pass
    gc.collect()
    gc.freeze()  # keep the preloaded heap out of the children's collections: fewer copy-on-write faults
    if mode == "fork":
        _collapse_heap_into_huge_pages()
    runner = (ForkRunner if mode == "fork" else SessionRunner)(ctrl_in, ctrl_out, scratch)
    write_frame(ctrl_out, {"op": "ready", "pid": os.getpid()})
    while True:
        req = read_frame(ctrl_in)
        if req is None:
            return
        if req.get("op") != "run":
            continue
        code_len, stdin_len = req["lengths"]
        code_fd, in_fd = read_payload(ctrl_in, code_len, "code"), read_payload(ctrl_in, stdin_len, "stdin")
        write_frame(ctrl_out, {"op": "started"})
        bodies: list[tuple[int, int]] = []
        try:
            head, bodies = runner.handle(req, code_fd, in_fd)
        except Exception as e:  # noqa: BLE001
            head = result_frame("internal_error", None, f"sandbox runner error: {e!r}", 0.0, None, False)
        finally:
            os.close(code_fd)
            os.close(in_fd)
        head["lengths"] = [n for _, n in bodies] or [0, 0]
        write_frame(ctrl_out, head)
        for fd, n in bodies:
            send_payload(ctrl_out, fd, n)
            os.close(fd)
