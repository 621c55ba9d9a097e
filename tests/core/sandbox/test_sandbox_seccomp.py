"""The hand-built seccomp program: syscall numbers match the kernel headers, the program is well formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rstar2_agent.sandbox.seccomp import BLOCKED, SYSV, build_filter

HEADERS = {0: "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", 1: "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("column", [0, 1])
def test_numbers_match_the_kernel_headers(column):
    path = Path(HEADERS[column])
    if not path.exists():
        pytest.skip(f"{path} not installed (Debian: linux-libc-dev)")
    defined = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)", path.read_text()))
    for name, numbers in {**BLOCKED, **SYSV}.items():
        assert int(defined[name]) == numbers[column], name


def test_program_shape():
    prog = build_filter("x86_64")
    assert prog is not None and len(prog) % 8 == 0
    assert len(prog) // 8 == 4 + 2 + 2 * len({v[0] for v in BLOCKED.values()}) + 1
    assert build_filter("riscv64") is None
