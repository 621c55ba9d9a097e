"""A small seccomp filter for the sandbox, as a classic BPF program that bubblewrap loads (--seccomp FD).

It refuses (EPERM) the system calls a Python program has no use for and that widen the kernel attack
surface: tracing other processes, mounting, namespaces, kernel modules and keyrings, bpf, perf, io_uring,
userfaultfd, POSIX message queues (they outlive a call, and no folder lists them for the runner to wipe).
Where no memory cgroup counts them, SysV shared memory and message queues are refused too (`sysv=False`):
rlimits cannot bound them. Everything else is allowed; the namespaces and rlimits do the rest. Built by hand (no
libseccomp needed); only x86_64 and aarch64 are known, elsewhere the sandbox runs without it.
"""

from __future__ import annotations

import platform
import struct

# name: (x86_64, aarch64), from the kernel's unistd headers
BLOCKED: dict[str, tuple[int, int]] = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsmount": (432, 432), "open_tree": (428, 428),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "sethostname": (170, 161), "setdomainname": (171, 162),
    "init_module": (175, 105), "delete_module": (176, 106), "finit_module": (313, 273),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "acct": (163, 89), "quotactl": (179, 60),
    "unshare": (272, 97), "setns": (308, 268),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "personality": (135, 92), "fanotify_init": (300, 262), "kcmp": (312, 272), "mq_open": (240, 180),
}
SYSV: dict[str, tuple[int, int]] = {"shmget": (29, 194), "msgget": (68, 186)}
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO, _EPERM = 0x7FFF0000, 0x00050000, 1
_X32_BIT = 0x40000000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None, *, sysv: bool = True) -> bytes | None:
    """The BPF program for this machine's architecture, or None where we do not know its syscall numbers.
    `sysv=False` also refuses creating SysV shared memory segments and message queues."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    column, audit_arch = ARCHES[machine]
    deny = _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)
    prog = [
        _insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_JEQ_K, 1, 0, audit_arch),
        deny,  # another ABI (i386 on x86_64): refuse every call
        _insn(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        prog += [_insn(_JGE_K, 0, 1, _X32_BIT), deny]  # the x32 ABI
    blocked = {**BLOCKED, **({} if sysv else SYSV)}
    for nr in sorted({v[column] for v in blocked.values()}):
        prog += [_insn(_JEQ_K, 0, 1, nr), deny]
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(prog)
