"""Starts a sandbox worker as root without leaving it root: `python -I -S launcher.py SPEC ARGV...`.

Run (exec'd, not forked from the host: no Python runs between the host's fork and exec) when the server is
root. In order it:
1. joins the worker's cgroups (writes its own pid to each `cgroup.procs`), so that every process of the worker
   is counted from its first instruction;
2. in a private mount namespace, bind-mounts each host directory the sandbox needs at a staging path that
   the unprivileged uid can reach (the Python installation may live under a 0700 /root); the mounts vanish
   with the worker;
3. drops every group and switches to the unprivileged uid/gid, then execs bubblewrap, whose user namespace
   then maps the sandbox's uid to that uid: sandboxed code is never host uid 0.
SPEC is JSON: {"cgroups": [paths of cgroup.procs], "user": [uid, gid] or null, "stage": [[src, dst], ...]}.
Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def _fail(what: str, err: int) -> None:
    sys.stderr.write(f"rstar2 sandbox launcher: {what}: {os.strerror(err)}\n")
    os._exit(126)


def main() -> None:
    spec, argv = json.loads(sys.argv[1]), sys.argv[2:]
    for procs in spec.get("cgroups", []):
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            _fail(f"cannot join the cgroup {procs}", e.errno or 0)
    stage = spec.get("stage", [])
    if stage:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        if libc.unshare(CLONE_NEWNS) != 0:
            _fail("cannot make a private mount namespace", ctypes.get_errno())
        if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            _fail("cannot make the mounts private", ctypes.get_errno())
        for src, dst in stage:
            if libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None) != 0:
                _fail(f"cannot stage {src} at {dst}", ctypes.get_errno())
    user = spec.get("user")
    if user:
        uid, gid = user
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.geteuid() == 0 or os.getegid() == 0 or os.getgroups():
            _fail("the uid drop did not take", 1)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
