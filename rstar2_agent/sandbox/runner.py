"""The program that runs inside the sandbox. Standard library only; started as `python -I -S runner.py`.

Two modes:
- `fork` (the stateless tool): a template process that has imported the preload modules (numpy,
  sympy) answers each request by forking a child that runs the code in a fresh `__main__` namespace
  under rlimits, then kills whatever the child left behind and wipes the scratch directory.
- `session` (the stateful tool): runs each request in its own process, in one namespace that
  persists across requests, like a notebook kernel.

Protocol on fds 0/1 (moved to high fds at start): frames of a 4-byte big-endian length and a JSON
object. The host sends {"op": "run", ...} or {"op": "abort"}; the runner answers each run with
{"op": "started"} as soon as it has read it, then with one result object. Its first frame is {"op": "ready"}.
The receipt tells the host whether a runner that died had the program: one killed while idle never did, and
its call can go to another worker without running twice.
"""

from __future__ import annotations

import ast
import ctypes
import gc
import json
import linecache
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback

USER_FILE = "main.py"
_HDR = struct.Struct(">I")
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


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name, 0)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_capped(fd: int, limit: int) -> tuple[str, int]:
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while len(data) < min(size, limit):
        chunk = os.read(fd, min(size, limit) - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace"), max(0, size - limit)


def _wipe(path: str) -> None:
    """Remove everything inside `path` (the scratch directory), keep `path` itself."""
    for entry in os.scandir(path):
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


# ---------------------------------------------------------------- fork mode
class ForkRunner:
    def __init__(self, ctrl_in: int, ctrl_out: int, scratch: str):
        self.ctrl_in, self.ctrl_out, self.scratch = ctrl_in, ctrl_out, scratch
        self.is_init = os.getpid() == 1  # inside a pid namespace: kill(-1) reaches only our children
        # Made once here, never read here: each child dup2()s its own stdin onto fd 0 under it.
        self.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115

    def handle(self, req: dict) -> dict:
        lim = req["limits"]
        cap = int(lim.get("max_output_bytes", 1 << 20))
        in_fd = _memfd("stdin", req.get("stdin", "").encode())
        out_fd, err_fd, st_fd = _memfd("stdout"), _memfd("stderr"), _memfd("status")
        workdir = os.path.join(self.scratch, "work")
        os.makedirs(workdir, exist_ok=True)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(req, in_fd, out_fd, err_fd, st_fd, workdir, cap)
        outcome, rusage, raw_status = self._wait(pid, float(lim["wall_seconds"]))
        duration = time.monotonic() - t0
        self._cleanup(pid)
        stdout, out_over = _read_capped(out_fd, cap)
        stderr, err_over = _read_capped(err_fd, cap)
        child = _read_json(st_fd)
        for fd in (in_fd, out_fd, err_fd, st_fd):
            os.close(fd)
        status, exit_code, note = self._classify(outcome, raw_status, rusage, child, lim)
        if note:
            stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + note).lstrip("\n")
        return {
            "status": status,
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": exit_code,
            "duration": duration,
            "cpu_time": (rusage.ru_utime + rusage.ru_stime) if rusage else None,
            "truncated": bool(out_over or err_over or child.get("dropped")),
        }

    def _child(self, req, in_fd, out_fd, err_fd, st_fd, workdir, cap) -> None:
        code = 1
        try:
            os.setsid()
            os.dup2(in_fd, 0)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            os.dup2(st_fd, 3)
            os.closerange(4, 1 << 16)
            st_fd = 3
            os.chdir(workdir)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _set_limits(req, cpu=True)
            out, err = _Stream(_CappedRaw(1, cap)), _Stream(_CappedRaw(2, cap))
            sys.stdin = self.stdin
            sys.stdout, sys.stderr = out, err
            sys.__stdout__, sys.__stderr__ = out, err
            sys.argv = [USER_FILE]
            namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": USER_FILE}
            result = execute(req["code"], namespace, out, err)
            _finish(out, err)
            result["dropped"] = out.raw.dropped + err.raw.dropped
            os.write(st_fd, json.dumps(result).encode())
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
        """Kill whatever the call left running (daemons, fork bombs), reap it, wipe the scratch dir."""
        self._kill_all(pid)
        while self.is_init:  # we are init: every orphan of the call is our child, reap them all
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        _wipe(self.scratch)

    @staticmethod
    def _classify(outcome, raw_status, rusage, child: dict, lim: dict):
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
        if child.get("status"):
            return child["status"], exit_code, ""
        if exit_code == 0:
            return "ok", 0, ""
        return "error", exit_code, f"the program exited with code {exit_code}"


def _read_json(fd: int) -> dict:
    text, _ = _read_capped(fd, 1 << 16)
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


# ---------------------------------------------------------------- session mode
class _Timeout(KeyboardInterrupt):
    rstar2_timeout = True


def _on_alarm(signum, frame):
    raise _Timeout("the cell ran past its wall-time limit; the session state is kept")


class SessionRunner:
    def __init__(self, ctrl_in: int, ctrl_out: int, scratch: str):
        self.ctrl_in, self.ctrl_out, self.scratch = ctrl_in, ctrl_out, scratch
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": USER_FILE}
        self.limits_set = False
        os.chdir(scratch)
        signal.signal(signal.SIGALRM, _on_alarm)

    def handle(self, req: dict) -> dict:
        if not self.limits_set:
            _set_limits(req, cpu=False)
            self.limits_set = True
        lim = req["limits"]
        cap = int(lim.get("max_output_bytes", 1 << 20))
        in_fd = _memfd("stdin", req.get("stdin", "").encode())
        out_fd, err_fd = _memfd("stdout"), _memfd("stderr")
        saved = [os.dup(0), os.dup(1), os.dup(2)]
        os.dup2(in_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        out, err = _Stream(_CappedRaw(1, cap)), _Stream(_CappedRaw(2, cap))
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stdout, sys.stderr = out, err
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, float(lim["wall_seconds"]))
        try:
            result = execute(req["code"], self.namespace, out, err)
            _finish(out, err)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for i, fd in enumerate(saved):
                os.dup2(fd, i)
                os.close(fd)
        duration = time.monotonic() - t0
        stdout, o_over = _read_capped(out_fd, cap)
        stderr, e_over = _read_capped(err_fd, cap)
        for fd in (in_fd, out_fd, err_fd):
            os.close(fd)
        return {
            "status": result["status"],
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": result["exit_code"],
            "duration": duration,
            "cpu_time": None,
            "truncated": bool(o_over or e_over or out.raw.dropped or err.raw.dropped),
        }


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
        write_frame(ctrl_out, {"op": "started"})
        try:
            resp = runner.handle(req)
        except Exception as e:  # noqa: BLE001
            resp = {"status": "internal_error", "stdout": "", "stderr": f"sandbox runner error: {e!r}",
                    "exit_code": None, "duration": 0.0, "cpu_time": None, "truncated": False}
        write_frame(ctrl_out, resp)


if __name__ == "__main__":
    main()
