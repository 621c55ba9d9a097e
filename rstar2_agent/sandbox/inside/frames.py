"""The control channel between the host and the sandbox's program, on fds 0/1 (moved to high fds at start):
frames of a 4-byte big-endian length and a JSON object, some followed by raw bytes whose lengths the object gives.

The host sends {"op": "run", "limits", "lengths": [code, stdin]} then the code and stdin bytes, or {"op": "abort"};
the program answers each run with {"op": "started"} as soon as it has read it, then with {"op": "result", ...,
"lengths": [stdout, stderr]} and those bytes. Its first frame is {"op": "ready"}. The receipt tells the host whether
a program that died had the code: one killed while idle never did, and its call can go to another worker without
running twice. The child that runs user code never holds the control channel's descriptors.
"""

from __future__ import annotations

import errno
import json
import os
import struct

_HDR = struct.Struct(">I")


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
            if e.errno != errno.EINVAL or os.fstat(mfd).st_size:
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


def result_frame(status: str, exit_code: int | None, note: str, duration: float, cpu_time: float | None,
                 truncated: bool) -> dict:
    """The head of a run's answer (its "lengths" are added when the outputs are known)."""
    return {"op": "result", "status": status, "exit_code": exit_code, "note": note, "duration": duration,
            "cpu_time": cpu_time, "truncated": truncated}
