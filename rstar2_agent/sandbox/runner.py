"""The program that runs inside the sandbox. Standard library only; started as `python -I -S runner.py`.

Two modes:
- `fork` (the stateless tool): a template process that has imported the preload modules (numpy,
  sympy) answers each request by forking a child that runs the code in a fresh `__main__` namespace
  under rlimits, then kills whatever the child left behind and wipes /tmp, /dev/shm and the SysV IPC
  objects. The template never holds a request's code or stdin, nor a result's bytes, in its heap: they
  are spliced from the control pipe into memory files that the child reads, and the child's output is
  spliced from its memory files to the pipe, so a later call, forked from the template, finds none of them.
- `session` (the stateful tool): a control process (pid 1, it alone holds the control channel) and a
  kernel process it forks once, which runs every cell in one namespace that persists across cells, like a
  notebook kernel. Cells reach the kernel as descriptors over a socket; after each cell the control
  process kills whatever the cell left running.

Protocol on fds 0/1 (moved to high fds at start): frames of a 4-byte big-endian length and a JSON
object, some followed by raw bytes whose lengths the object gives. The host sends {"op": "run", "limits",
"lengths": [code, stdin]} then the code and stdin bytes, or {"op": "abort"}; the runner answers each run
with {"op": "started"} as soon as it has read it, then with {"op": "result", ..., "lengths": [stdout,
stderr]} and those bytes. Its first frame is {"op": "ready"}. The receipt tells the host whether a runner
that died had the program: one killed while idle never did, and its call can go to another worker without
running twice. The child that runs user code never holds the control channel's descriptors.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import fcntl
import gc
import json
import linecache
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback

USER_FILE = "main.py"
_HDR = struct.Struct(">I")
# what the child reports about its run, fixed-size so the template parses no text the program could shape:
# status (an index into STATUSES), exit code, output bytes dropped past the cap
STATUS = struct.Struct("=Biq")
STATUSES = ("ok", "error", "timeout", "memory")
KERNEL_GRACE = 2.0  # seconds past a cell's wall limit before the control process gives up on the kernel
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


# ---------------------------------------------------------------- framing
def read_frame(fd: int) -> dict | None:
    head = _read_exact(fd, _HDR.size)
    if head is None:
        return None
    body = _read_exact(fd, _HDR.unpack(head)[0])
    return None if body is None else json.loads(body)


def write_frame(fd: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    data = _HDR.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def read_payload(fd: int, n: int, name: str) -> int:
    """A memory file holding the next `n` bytes of `fd`, moved by the kernel (splice, through a pipe of our own
    when `fd` is a socket, as uvloop's are): they never enter this process's heap."""
    mfd = os.memfd_create(name, 0)
    try:
        try:
            _splice_exactly(fd, mfd, n)
        except OSError as e:
            if e.errno != errno.EINVAL or _size(mfd):
                raise
            r, w = os.pipe()
            try:
                left = n
                while left:
                    moved = _splice_some(fd, w, min(left, 1 << 16))
                    _splice_exactly(r, mfd, moved)
                    left -= moved
            finally:
                os.close(r)
                os.close(w)
    except BaseException:
        os.close(mfd)
        raise
    os.lseek(mfd, 0, os.SEEK_SET)
    return mfd


def _splice_some(src: int, dst: int, n: int) -> int:
    moved = os.splice(src, dst, n)
    if moved == 0:
        raise EOFError("the control channel closed mid-request")
    return moved


def _splice_exactly(src: int, dst: int, n: int) -> None:
    while n:
        n -= _splice_some(src, dst, n)


def send_payload(fd: int, mfd: int, n: int) -> None:
    """The first `n` bytes of the memory file `mfd` onto `fd` (a pipe or a socket), moved by the kernel."""
    offset = 0
    while offset < n:
        moved = os.sendfile(fd, mfd, offset, n - offset)
        if moved == 0:
            raise EOFError("the output memory file is shorter than it said")
        offset += moved


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# ---------------------------------------------------------------- running user code
class _CappedRaw:
    """A binary sink on an fd that keeps the first `limit` bytes and counts the rest."""

    def __init__(self, fd: int, limit: int):
        self.fd, self.limit, self.written, self.dropped = fd, limit, 0, 0

    def write(self, b: bytes) -> None:
        room = self.limit - self.written
        if room <= 0:
            self.dropped += len(b)
            return
        keep = b[:room]
        self.dropped += len(b) - len(keep)
        while keep:
            n = os.write(self.fd, keep)
            self.written += n
            keep = keep[n:]


class _Stream:
    """sys.stdout/sys.stderr replacement: text in, capped bytes out through a small buffer."""

    encoding = "utf-8"
    errors = "replace"
    BUF = 8192

    def __init__(self, raw: _CappedRaw):
        self.raw = raw
        self.closed = False
        self.buffer = self
        self._buf: list[bytes] = []
        self._size = 0

    def write(self, s) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.raw.written >= self.raw.limit:  # full: count, do not encode megabytes for nothing
            self.raw.dropped += len(s)
            return len(s)
        if isinstance(s, str):
            data = s[: self.raw.limit].encode("utf-8", "replace")
            self.raw.dropped += len(s) - min(len(s), self.raw.limit)
        else:
            data = bytes(s)
        self._buf.append(data)
        self._size += len(data)
        if self._size >= self.BUF:
            self.flush()
        return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self._buf:
            data, self._buf, self._size = b"".join(self._buf), [], 0
            self.raw.write(data)

    def close(self) -> None:
        if not self.closed:
            self.flush()
        self.closed = True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.raw.fd

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False


def _short_traceback(exc: BaseException) -> str:
    """The traceback from the user's first frame on, without the runner's own frames."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != USER_FILE:
        tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(tb, limit=-12 if tb else 0) if f.filename != __file__]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _compile(code: str):
    """Compile the program; a final bare expression is compiled separately so its value can be echoed."""
    tree = ast.parse(code, USER_FILE, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        last = compile(last, USER_FILE, "eval")
    return compile(tree, USER_FILE, "exec"), last


def execute(code: str, namespace: dict, out: _Stream, err: _Stream) -> dict:
    """Run `code` in `namespace`. Returns {"status", "exit_code"}; output goes to out/err."""
    linecache.cache[USER_FILE] = (len(code), None, code.splitlines(True), USER_FILE)
    status, exit_code = "ok", 0
    try:
        body, last = _compile(code)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value), file=out)
    except SystemExit as e:
        code_ = e.code
        if code_ is None or code_ == 0:
            exit_code = 0
        elif isinstance(code_, int):
            exit_code = code_
        else:
            print(code_, file=err)
            exit_code = 1
        status = "ok" if exit_code == 0 else "error"
    except MemoryError as e:
        status, exit_code = "memory", 1
        _safe_print(err, _short_traceback(e))
    except KeyboardInterrupt as e:  # session mode turns a wall timeout into this
        status, exit_code = ("timeout" if getattr(e, "rstar2_timeout", False) else "error"), 1
        _safe_print(err, _short_traceback(e))
    except BaseException as e:  # noqa: BLE001 - any user exception is a result, not a crash
        status, exit_code = "error", 1
        _safe_print(err, _short_traceback(e))
    return {"status": status, "exit_code": exit_code}


def _safe_print(stream: _Stream, text: str) -> None:
    try:
        stream.closed = False
        stream.write(text)
        stream.flush()
    except Exception:  # noqa: BLE001
        pass


def _finish(out: _Stream, err: _Stream) -> None:
    """Flush what the program printed, even if it closed or broke its streams."""
    for stream in (out, err):
        try:
            stream.closed = False
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _set_limits(req: dict, *, cpu: bool) -> None:
    lim = req["limits"]
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


def _memfd(name: str) -> int:
    return os.memfd_create(name, 0)


def _size(fd: int) -> int:
    return os.fstat(fd).st_size


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_status(fd: int) -> tuple[str | None, int | None, int]:
    """The child's fixed-size report -> (status, exit code, bytes dropped); Nones when it wrote none."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, STATUS.size)
    if len(data) != STATUS.size:
        return None, None, 0
    index, exit_code, dropped = STATUS.unpack(data)
    return (STATUSES[index] if index < len(STATUSES) else "error"), exit_code, max(0, dropped)


def _report(result: dict, dropped: int) -> bytes:
    return STATUS.pack(STATUSES.index(result["status"]), result["exit_code"] & 0x7FFFFFFF, dropped)


def _outputs(out_fd: int, err_fd: int, cap: int) -> tuple[list[tuple[int, int]], bool]:
    """What goes back of the two output files, at most `cap` bytes each, and whether any was cut."""
    sizes = (_size(out_fd), _size(err_fd))
    return [(out_fd, min(sizes[0], cap)), (err_fd, min(sizes[1], cap))], max(sizes) > cap


def _place_fds(fds: tuple[int, ...]) -> None:
    """fds[k] onto fd k, whatever their numbers were (first moved above them all, so none is overwritten)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16 + len(fds)) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)


def _wipe(path: str) -> None:
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
    _wipe(path)
    os.rmdir(path)


IPC_RMID = 0
_libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
_libc.msgctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
_libc.semctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]


def remove_ipc_objects() -> int:
    """Remove every SysV shared memory segment, message queue and semaphore set of this IPC namespace (the
    sandbox's own): a segment outlives the processes that made it. Returns how many were removed."""
    removed = 0
    for kind, rm in (("shm", lambda i: _libc.shmctl(i, IPC_RMID, None)),
                     ("msg", lambda i: _libc.msgctl(i, IPC_RMID, None)),
                     ("sem", lambda i: _libc.semctl(i, 0, IPC_RMID))):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                ids = [int(line.split()[1]) for line in f.read().splitlines()[1:] if line.strip()]
        except (OSError, ValueError, IndexError):
            continue
        removed += sum(rm(i) == 0 for i in ids)
    return removed


def _raise_oom_score() -> None:
    """Make the process running user code the first the memory cgroup's OOM killer picks, before the template."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


# ---------------------------------------------------------------- fork mode
class ForkRunner:
    SHARED = "/dev/shm"

    def __init__(self, ctrl_in: int, ctrl_out: int, scratch: str):
        self.ctrl_in, self.ctrl_out, self.scratch = ctrl_in, ctrl_out, scratch
        self.is_init = os.getpid() == 1  # inside a pid namespace: kill(-1) reaches only our children
        # Made once here, never read here: each child dup2()s its own stdin onto fd 0 under it.
        self.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115

    def handle(self, req: dict, code_fd: int, in_fd: int) -> tuple[dict, list[tuple[int, int]]]:
        lim = req["limits"]
        cap = int(lim.get("max_output_bytes", 1 << 20))
        out_fd, err_fd, st_fd = _memfd("stdout"), _memfd("stderr"), _memfd("status")
        workdir = os.path.join(self.scratch, "work")
        os.makedirs(workdir, exist_ok=True)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(req, code_fd, in_fd, out_fd, err_fd, st_fd, workdir, cap)
        outcome, rusage, raw_status = self._wait(pid, float(lim["wall_seconds"]))
        duration = time.monotonic() - t0
        self._cleanup(pid)
        child_status, child_exit, dropped = _read_status(st_fd)
        os.close(st_fd)
        bodies, over = _outputs(out_fd, err_fd, cap)
        status, exit_code, note = self._classify(outcome, raw_status, rusage, child_status, lim)
        return {
            "op": "result",
            "status": status,
            "exit_code": exit_code,
            "note": note,
            "duration": duration,
            "cpu_time": (rusage.ru_utime + rusage.ru_stime) if rusage else None,
            "truncated": bool(over or dropped),
        }, bodies

    def _child(self, req, code_fd, in_fd, out_fd, err_fd, st_fd, workdir, cap) -> None:
        code = 1
        try:
            os.setsid()
            _place_fds((in_fd, out_fd, err_fd, st_fd, code_fd))
            os.closerange(5, 1 << 16)  # the control channel among them: the program cannot reach it
            source = _read_all(4).decode("utf-8", "surrogatepass")
            os.close(4)
            os.chdir(workdir)
            _raise_oom_score()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _set_limits(req, cpu=True)
            out, err = _Stream(_CappedRaw(1, cap)), _Stream(_CappedRaw(2, cap))
            sys.stdin = self.stdin
            sys.stdout, sys.stderr = out, err
            sys.__stdout__, sys.__stderr__ = out, err
            sys.argv = [USER_FILE]
            namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": USER_FILE}
            result = execute(source, namespace, out, err)
            _finish(out, err)
            os.write(3, _report(result, out.raw.dropped + err.raw.dropped))
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
            self._kill_all(pid)
        _, raw_status, rusage = os.wait4(pid, 0)
        return outcome, rusage, raw_status

    def _kill_all(self, pid: int) -> None:
        try:
            if self.is_init:
                os.kill(-1, signal.SIGKILL)
            else:
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _cleanup(self, pid: int) -> None:
        """Kill whatever the call left running (daemons, fork bombs), reap it, and remove what it left: the
        scratch dir and, in the sandbox's own namespaces, /dev/shm and every SysV IPC object."""
        self._kill_all(pid)
        while self.is_init:  # we are init: every orphan of the call is our child, reap them all
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        _wipe(self.scratch)
        if self.is_init:  # without namespaces these are the host's, not the call's
            _wipe(self.SHARED)
            remove_ipc_objects()

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


# ---------------------------------------------------------------- session mode
class _Timeout(KeyboardInterrupt):
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
        cap = int(lim.get("max_output_bytes", 1 << 20))
        out_fd, err_fd = _memfd("stdout"), _memfd("stderr")
        t0 = time.monotonic()
        self._drain()
        socket.send_fds(self.sock, [json.dumps(lim).encode()], [code_fd, in_fd, out_fd, err_fd])
        report = self._wait(float(lim["wall_seconds"]) + KERNEL_GRACE)
        duration = time.monotonic() - t0
        self._kill_strays()
        status, exit_code, dropped = report
        bodies, over = _outputs(out_fd, err_fd, cap)
        return {
            "op": "result",
            "status": status or "error",
            "exit_code": exit_code,
            "note": "",
            "duration": duration,
            "cpu_time": None,
            "truncated": bool(over or dropped),
        }, bodies

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
        away ends the session: everything is killed and the runner exits (the host replaces the session)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._end()
            ready, _, _ = select.select([self.sock, self.pidfd, self.ctrl_in], [], [], left)
            if self.sock in ready:
                data = self.sock.recv(STATUS.size + 1)
                if len(data) == STATUS.size:
                    index, exit_code, dropped = STATUS.unpack(data)
                    return (STATUSES[index] if index < len(STATUSES) else "error"), exit_code, max(0, dropped)
                if not data:
                    self._end()
            if self.pidfd in ready or self.ctrl_in in ready:
                self._end()

    def _end(self) -> None:
        if self.is_init:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            os.kill(self.kernel, signal.SIGKILL)
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
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
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
    _raise_oom_score()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_cpu)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": USER_FILE}
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
            _set_limits({"limits": lim}, cpu=False)
            total = lim.get("session_cpu_seconds")
            if total:
                resource.setrlimit(resource.RLIMIT_CPU, (int(total), int(total) + 1))
            limits_set = True
        _cell_cpu_limit(lim)
        code_fd, in_fd, out_fd, err_fd = fds
        source = _read_all(code_fd).decode("utf-8", "surrogatepass")
        _place_fds((in_fd, out_fd, err_fd, sock.detach()))
        os.closerange(4, 1 << 16)
        sock = socket.socket(fileno=3)
        cap = int(lim.get("max_output_bytes", 1 << 20))
        out, err = _Stream(_CappedRaw(1, cap)), _Stream(_CappedRaw(2, cap))
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stdout, sys.stderr = out, err
        signal.setitimer(signal.ITIMER_REAL, float(lim["wall_seconds"]))
        try:
            result = execute(source, namespace, out, err)
            _finish(out, err)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        del source
        try:
            sock.setblocking(True)
            sock.send(_report(result, out.raw.dropped + err.raw.dropped))
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
            _libc.madvise(start, end - start, MADV_HUGEPAGE)
            _libc.madvise(start, end - start, MADV_COLLAPSE)


# ---------------------------------------------------------------- main
class _Quitter:
    """`exit()` and `quit()`, which `site` adds to builtins and `-S` leaves out: programs call them."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def _add_exit_builtins() -> None:
    import builtins

    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, _Quitter(name))


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
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if os.getpid() != 1:  # no pid namespace (unsafe mode): die with the host
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _add_exit_builtins()
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
            head = {"op": "result", "status": "internal_error", "note": f"sandbox runner error: {e!r}",
                    "exit_code": None, "duration": 0.0, "cpu_time": None, "truncated": False}
        finally:
            os.close(code_fd)
            os.close(in_fd)
        head["lengths"] = [n for _, n in bodies] or [0, 0]
        write_frame(ctrl_out, head)
        for fd, n in bodies:
            send_payload(ctrl_out, fd, n)
            os.close(fd)


if __name__ == "__main__":
    main()
