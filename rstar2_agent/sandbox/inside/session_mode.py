"""The stateful tool: a control process (pid 1, it alone holds the control channel) and a kernel process it forks
once, which runs every cell in one namespace that persists across cells, like a notebook kernel. Cells reach the
kernel as descriptors over a socket; after each cell the control process kills whatever the cell left running."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import sys
import time

from .frames import result_frame
from .process import kill, kill_everything, outputs, place_fds, raise_oom_score, read_all, set_limits
from .program import STATUS, capture, execute, finish, fresh_namespace, parse_report

KERNEL_GRACE = 2.0  # seconds past a cell's wall limit before the control process gives up on the kernel


class _Timeout(KeyboardInterrupt):
    __module__ = "__main__"  # a traceback names it bare, as it names the program's own classes
    rstar2_timeout = True


def _on_alarm(signum, frame):
    raise _Timeout("the cell ran past its wall-time limit; the session state is kept")


def _on_cpu(signum, frame):
    raise _Timeout("the cell ran past its CPU-time limit; the session state is kept")


class SessionRunner:
    """The control process of a session: forks the kernel once, hands it each cell, returns its output."""

    def __init__(self, ctrl_in: int, ctrl_out: int, scratch: str):
        self.ctrl_in, self.ctrl_out, self.scratch = ctrl_in, ctrl_out, scratch
        self.is_init = os.getpid() == 1
        self.sock, kernel_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.kernel = os.fork()
        if self.kernel == 0:
            self.sock.close()
            for fd in (ctrl_in, ctrl_out):  # the program in the kernel cannot reach the control channel
                os.close(fd)
            _kernel(kernel_sock, scratch)
        kernel_sock.close()
        self.pidfd = os.pidfd_open(self.kernel)

    def handle(self, req: dict, code_fd: int, in_fd: int) -> tuple[dict, list[tuple[int, int]]]:
        lim = req["limits"]
        out_fd, err_fd = os.memfd_create("stdout", 0), os.memfd_create("stderr", 0)
        t0 = time.monotonic()
        self._drain()
        socket.send_fds(self.sock, [json.dumps(lim).encode()], [code_fd, in_fd, out_fd, err_fd])
        status, exit_code, dropped = self._wait(float(lim["wall_seconds"]) + KERNEL_GRACE)
        duration = time.monotonic() - t0
        self._kill_strays()
        bodies, over = outputs(out_fd, err_fd, lim)
        return result_frame(status or "error", exit_code, "", duration, None, bool(over or dropped)), bodies

    def _drain(self) -> None:
        """Drop what a program wrote to the kernel's socket itself (it holds it): a stale report would answer the
        next cell."""
        while True:
            try:
                if not self.sock.recv(STATUS.size + 1, socket.MSG_DONTWAIT):
                    return
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return

    def _wait(self, timeout: float) -> tuple[str | None, int | None, int]:
        """The kernel's report of the cell. A kernel that died, hung past its own timer, or a host that went
        away ends the session: everything is killed and the program exits (the host replaces the session)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._end()
            ready, _, _ = select.select([self.sock, self.pidfd, self.ctrl_in], [], [], left)
            if self.sock in ready:
                data = self.sock.recv(STATUS.size + 1)
                if len(data) == STATUS.size:
                    return parse_report(data)
                if not data:
                    self._end()
            if self.pidfd in ready or self.ctrl_in in ready:
                self._end()

    def _end(self) -> None:
        kill_everything(self.is_init, self.kernel, group=False)
        os._exit(1)

    def _kill_strays(self) -> None:
        """Kill every process but the kernel (and us): what a cell started in the background does not outlive
        it. Only inside the sandbox's pid namespace (without it /proc lists the host's processes)."""
        if not self.is_init:
            return
        for _ in range(100):
            strays = [pid for pid in _live_pids() if pid not in (1, self.kernel)]
            if not strays:
                break
            for pid in strays:
                kill(pid)
            self._reap()
            time.sleep(0.001)
        self._reap()

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.kernel:
                self._end()


def _live_pids() -> list[int]:
    """The processes in /proc that are not zombies (a zombie is killed already; its parent reaps it)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                out.append(int(name))
    return out


def _kernel(sock: socket.socket, scratch: str) -> None:
    """The session's kernel: runs each cell it is handed in one namespace. Never returns. Between cells it holds
    fds 0-2 (the last cell's streams) and 3 (the socket to the control process), nothing else."""
    os.chdir(scratch)
    os.setsid()
    raise_oom_score()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_cpu)
    namespace = fresh_namespace()
    limits_set = False
    while True:
        try:
            sock.setblocking(True)  # the last cell's program may have changed it (it holds the socket)
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        except OSError:
            os._exit(1)
        if not msg or len(fds) != 4:
            os._exit(0)
        lim = json.loads(msg)
        if not limits_set:  # the whole session's: its processes, files, memory, and CPU time in total
            set_limits(lim, cpu=False)
            total = lim.get("session_cpu_seconds")
            if total:
                resource.setrlimit(resource.RLIMIT_CPU, (int(total), int(total) + 1))
            limits_set = True
        _cell_cpu_limit(lim)
        code_fd, in_fd, out_fd, err_fd = fds
        source = read_all(code_fd).decode("utf-8", "surrogatepass")
        place_fds((in_fd, out_fd, err_fd, sock.detach()))
        os.closerange(4, 1 << 16)
        sock = socket.socket(fileno=3)
        out, err = capture(lim)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        signal.setitimer(signal.ITIMER_REAL, float(lim["wall_seconds"]))
        try:
            report = finish(out, err, execute(source, namespace, out, err))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        del source
        try:
            sock.setblocking(True)
            sock.send(report)
        except OSError:
            os._exit(1)


def _cell_cpu_limit(lim: dict) -> None:
    """A cell's CPU time: the soft RLIMIT_CPU moved to what the kernel used so far plus the cell's limit (SIGXCPU
    then interrupts the cell and keeps the state); the hard limit is the session's total."""
    if not lim.get("cpu_seconds"):
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    want = int(usage.ru_utime + usage.ru_stime + float(lim["cpu_seconds"])) + 1
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (want, hard))
    except (ValueError, OSError):
        pass
