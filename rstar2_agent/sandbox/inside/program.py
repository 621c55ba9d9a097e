"""Running the user's program: its output captured into capped streams, a final bare expression echoed like
IPython, its traceback cut to its own frames, and the fixed-size report of how it ended."""

from __future__ import annotations

import ast
import builtins
import linecache
import os
import struct
import sys
import traceback

from .process import output_cap

USER_FILE = "main.py"
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this program's frames stay out of tracebacks
# what the program's process reports about its run, fixed-size so the receiver parses no text the program could
# shape: status (an index into STATUSES), exit code, output bytes dropped past the cap
STATUS = struct.Struct("=Biq")
STATUSES = ("ok", "error", "timeout", "memory")


class Stream:
    """sys.stdout/sys.stderr replacement: text in, bytes out on `fd` through a small buffer, of which it keeps the
    first `limit` bytes and counts the rest (`dropped`)."""

    encoding = "utf-8"
    errors = "replace"
    BUF = 8192

    def __init__(self, fd: int, limit: int):
        self.fd, self.limit, self.written, self.dropped = fd, limit, 0, 0
        self.closed = False
        self.buffer = self
        self._buf: list[bytes] = []
        self._size = 0

    def write(self, s) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.written >= self.limit:  # full: count, do not encode megabytes for nothing
            self.dropped += len(s)
            return len(s)
        if isinstance(s, str):
            data = s[: self.limit].encode("utf-8", "replace")
            self.dropped += len(s) - min(len(s), self.limit)
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
            keep = data[: max(0, self.limit - self.written)]
            self.dropped += len(data) - len(keep)
            while keep:
                n = os.write(self.fd, keep)
                self.written += n
                keep = keep[n:]

    def close(self) -> None:
        if not self.closed:
            self.flush()
        self.closed = True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False


def capture(lim: dict) -> tuple[Stream, Stream]:
    """sys.stdout and sys.stderr onto fds 1 and 2, each capped at the call's output cap."""
    sys.stdout, sys.stderr = Stream(1, output_cap(lim)), Stream(2, output_cap(lim))
    return sys.stdout, sys.stderr


def fresh_namespace() -> dict:
    return {"__name__": "__main__", "__builtins__": builtins, "__file__": USER_FILE}


def _short_traceback(exc: BaseException) -> str:
    """The traceback from the user's first frame on, without this program's own frames."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != USER_FILE:
        tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(tb, limit=-12 if tb else 0) if not f.filename.startswith(_HERE)]
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


def execute(code: str, namespace: dict, out: Stream, err: Stream) -> dict:
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


def _safe_print(stream: Stream, text: str) -> None:
    try:
        stream.closed = False
        stream.write(text)
        stream.flush()
    except Exception:  # noqa: BLE001
        pass


def finish(out: Stream, err: Stream, result: dict) -> bytes:
    """Flush what the program printed, even if it closed or broke its streams; -> the run's report."""
    for stream in (out, err):
        try:
            stream.closed = False
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    dropped = out.dropped + err.dropped
    return STATUS.pack(STATUSES.index(result["status"]), result["exit_code"] & 0x7FFFFFFF, dropped)


def parse_report(data: bytes) -> tuple[str | None, int | None, int]:
    """A run's report -> (status, exit code, bytes dropped); Nones when it is not one."""
    if len(data) != STATUS.size:
        return None, None, 0
    index, exit_code, dropped = STATUS.unpack(data)
    return (STATUSES[index] if index < len(STATUSES) else "error"), exit_code, max(0, dropped)
