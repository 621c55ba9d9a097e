"""The stateless tool: the template answers each call by forking a child that runs the program in a fresh
namespace under rlimits, then kills whatever the child left behind and wipes what it wrote."""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from .frames import read_frame, result_frame
from .process import kill_everything, outputs, place_fds, raise_oom_score, read_all, remove_leftovers, set_limits
from .program import STATUS, USER_FILE, capture, execute, finish, fresh_namespace, parse_report


class ForkRunner:
    def __init__(self, ctrl_in: int, ctrl_out: int, scratch: str):
        self.ctrl_in, self.ctrl_out, self.scratch = ctrl_in, ctrl_out, scratch
        self.is_init = os.getpid() == 1  # inside a pid namespace: kill(-1) reaches only our children
        # Made once here, never read here: each child dup2()s its own stdin onto fd 0 under it.
        self.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115

    def handle(self, req: dict, code_fd: int, in_fd: int) -> tuple[dict, list[tuple[int, int]]]:
        lim = req["limits"]
        out_fd, err_fd, st_fd = (os.memfd_create(name, 0) for name in ("stdout", "stderr", "status"))
        workdir = os.path.join(self.scratch, "work")
        os.makedirs(workdir, exist_ok=True)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(lim, code_fd, in_fd, out_fd, err_fd, st_fd, workdir)
        outcome, rusage, raw_status = self._wait(pid, float(lim["wall_seconds"]))
        duration = time.monotonic() - t0
        self._cleanup(pid)
        child_status, _, dropped = parse_report(os.pread(st_fd, STATUS.size, 0))
        os.close(st_fd)
        bodies, over = outputs(out_fd, err_fd, lim)
        status, exit_code, note = self._classify(outcome, raw_status, rusage, child_status, lim)
        cpu_time = (rusage.ru_utime + rusage.ru_stime) if rusage else None
        return result_frame(status, exit_code, note, duration, cpu_time, bool(over or dropped)), bodies

    def _child(self, lim, code_fd, in_fd, out_fd, err_fd, st_fd, workdir) -> None:
        code = 1
        try:
            os.setsid()
            place_fds((in_fd, out_fd, err_fd, st_fd, code_fd))
            os.closerange(5, 1 << 16)  # the control channel among them: the program cannot reach it
            source = read_all(4).decode("utf-8", "surrogatepass")
            os.close(4)
            os.chdir(workdir)
            raise_oom_score()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            set_limits(lim, cpu=True)
            out, err = capture(lim)
            sys.stdin = self.stdin
            sys.__stdout__, sys.__stderr__ = out, err
            sys.argv = [USER_FILE]
            result = execute(source, fresh_namespace(), out, err)
            os.write(3, finish(out, err, result))
            code = result["exit_code"]
        except BaseException:  # noqa: BLE001
            code = 70
        finally:
            os._exit(code & 0xFF)

    def _wait(self, pid: int, timeout: float):
        """Wait for the child, watching the control fd for an abort. -> (outcome, rusage, wait status)."""
        pidfd = os.pidfd_open(pid)
        deadline = time.monotonic() + timeout
        outcome = "exited"
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    outcome = "timeout"
                    break
                ready, _, _ = select.select([pidfd, self.ctrl_in], [], [], left)
                if pidfd in ready:
                    break
                if self.ctrl_in in ready:
                    msg = read_frame(self.ctrl_in)
                    if msg is None:
                        outcome = "host_gone"
                        break
                    if msg.get("op") == "abort":
                        outcome = "aborted"
                        break
        finally:
            os.close(pidfd)
        if outcome != "exited":
            kill_everything(self.is_init, pid, group=True)
        _, raw_status, rusage = os.wait4(pid, 0)
        return outcome, rusage, raw_status

    def _cleanup(self, pid: int) -> None:
        """Kill whatever the call left running (daemons, fork bombs), reap it, and remove what it left."""
        kill_everything(self.is_init, pid, group=True)
        while self.is_init:  # we are init: every orphan of the call is our child, reap them all
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        remove_leftovers(self.scratch, namespaced=self.is_init)

    @staticmethod
    def _classify(outcome, raw_status, rusage, child_status: str | None, lim: dict):
        cpu_limit = lim.get("cpu_seconds")
        if outcome == "timeout":
            return "timeout", None, "TimeoutError: the program ran past its wall-time limit and was killed"
        if outcome in ("aborted", "host_gone"):
            return "killed", None, "the call was cancelled by the caller"
        if os.WIFSIGNALED(raw_status):
            sig = os.WTERMSIG(raw_status)
            used = (rusage.ru_utime + rusage.ru_stime) if rusage else 0.0
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_limit and used >= cpu_limit):
                return "timeout", None, f"TimeoutError: the program used more than {cpu_limit} s of CPU time"
            name = signal.Signals(sig).name
            return "killed", -sig, f"the program was killed by {name}"
        exit_code = os.WEXITSTATUS(raw_status)
        if child_status:
            return child_status, exit_code, ""
        if exit_code == 0:
            return "ok", 0, ""
        return "error", exit_code, f"the program exited with code {exit_code}"

