"""What the sandbox's program does to processes, descriptors and files: rlimits, memory files, descriptor
placement, and the cleanup after a call (stray processes, the scratch folder, SysV IPC objects)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import signal

libc = ctypes.CDLL(None, use_errno=True)
IPC_RMID = 0
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
libc.msgctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
libc.semctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]


def set_limits(lim: dict, *, cpu: bool) -> None:
    """The call's rlimits (memory, file size, processes, open files, no core; CPU time when `cpu`)."""
    pairs = [
        (resource.RLIMIT_AS, lim.get("memory_bytes")),
        (resource.RLIMIT_FSIZE, lim.get("file_size_bytes")),
        (resource.RLIMIT_NPROC, lim.get("max_processes")),
        (resource.RLIMIT_NOFILE, lim.get("max_open_files")),
        (resource.RLIMIT_CORE, 0),
    ]
    if cpu and lim.get("cpu_seconds"):
        cpu_s = int(lim["cpu_seconds"]) + 1
        pairs.append((resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)))
    for which, value in pairs:
        if value is None:
            continue
        soft, hard = value if isinstance(value, tuple) else (value, value)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass


def output_cap(lim: dict) -> int:
    """How many bytes of each of stdout and stderr a call keeps."""
    return int(lim.get("max_output_bytes", 1 << 20))


def read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def outputs(out_fd: int, err_fd: int, lim: dict) -> tuple[list[tuple[int, int]], bool]:
    """What goes back of the two output files, at most the output cap each, and whether any was cut."""
    cap = output_cap(lim)
    sizes = (os.fstat(out_fd).st_size, os.fstat(err_fd).st_size)
    return [(out_fd, min(sizes[0], cap)), (err_fd, min(sizes[1], cap))], max(sizes) > cap


def place_fds(fds: tuple[int, ...]) -> None:
    """fds[k] onto fd k, whatever their numbers were (first moved above them all, so none is overwritten)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16 + len(fds)) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)


def kill(pid: int) -> None:
    """SIGKILL to `pid` (-1: every process but us), or to the process group -`pid`; gone already is fine."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_everything(is_init: bool, pid: int, *, group: bool) -> None:
    """Inside a pid namespace (we are its init) every process but us; else `pid`, or its process group."""
    kill(-1 if is_init else -pid if group else pid)


def wipe(path: str) -> None:
    """Remove everything inside `path` (the scratch directory), keep `path` itself."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                _rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _rmtree(path: str) -> None:
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    wipe(path)
    os.rmdir(path)


def remove_leftovers(scratch: str, *, namespaced: bool) -> None:
    """Remove what a call left: the scratch dir and, in the sandbox's own namespaces (without them these are the
    host's, not the call's), /dev/shm and every SysV IPC object."""
    wipe(scratch)
    if namespaced:
        wipe("/dev/shm")
        remove_ipc_objects()


def remove_ipc_objects() -> int:
    """Remove every SysV shared memory segment, message queue and semaphore set of this IPC namespace (the
    sandbox's own): a segment outlives the processes that made it. Returns how many were removed."""
    removed = 0
    for kind, rm in (("shm", lambda i: libc.shmctl(i, IPC_RMID, None)),
                     ("msg", lambda i: libc.msgctl(i, IPC_RMID, None)),
                     ("sem", lambda i: libc.semctl(i, 0, IPC_RMID))):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                ids = [int(line.split()[1]) for line in f.read().splitlines()[1:] if line.strip()]
        except (OSError, ValueError, IndexError):
            continue
        removed += sum(rm(i) == 0 for i in ids)
    return removed


def raise_oom_score() -> None:
    """Make the process running user code the first the memory cgroup's OOM killer picks, before the template."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
