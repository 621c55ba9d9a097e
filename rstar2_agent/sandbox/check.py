"""`rstar2 sandbox check`: which isolation a sandbox worker really got on this machine, probed from inside one.

It starts one real worker with the given configuration and reports: the host uid its processes run as (never 0
unless isolation is off), which namespaces are its own, which cgroup controls took (memory, pids, cpu) or that
the rlimit fallback applies, whether /proc/sys is a read-only mount and unwritable, the seccomp filter and the
capabilities left. `problems` lists what falls short; the command exits non-zero when there is any.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from typing import Any

from .pool import LocalSandbox, SandboxConfig

NAMESPACES = ("user", "pid", "net", "ipc", "uts", "mnt", "cgroup")
PROBE = f"""
import json, os
def writable(path):
    try:
        os.close(os.open(path, os.O_WRONLY))
        return True
    except OSError:
        return False
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines() if ':' in line)
ro = any(line.split()[4] == '/proc/sys' and 'ro' in line.split()[5].split(',')
         for line in open('/proc/self/mountinfo'))
print(json.dumps({{'ns': {{n: os.readlink('/proc/self/ns/' + n) for n in {NAMESPACES!r}}},
                  'proc_sys_writable': writable('/proc/sys/kernel/core_pattern'), 'proc_sys_read_only_mount': ro,
                  'seccomp': status.get('Seccomp', '').strip(), 'capabilities': status.get('CapEff', '').strip()}}))
"""


def _uids_under(pid: int) -> set[int]:
    """The effective host uids of `pid` and every process under it."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
                parents[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
    todo, seen, uids = [pid], set(), set()
    while todo:
        p = todo.pop()
        seen.add(p)
        try:
            uids |= {int(line.split()[2]) for line in open(f"/proc/{p}/status") if line.startswith("Uid:")}
        except OSError:
            pass
        todo += [c for c, pp in parents.items() if pp == p and c not in seen]
    return uids


async def isolation_report(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Start one worker with `config` and probe it. Raises SandboxError where the pool refuses to start (root
    without a working uid drop, no bubblewrap)."""
    cfg = dataclasses.replace(config or SandboxConfig(), workers=1, templates=((),))
    report: dict[str, Any] = {"isolation": cfg.isolation, "server_uid": os.geteuid(), "problems": []}
    problems = report["problems"]
    async with LocalSandbox(cfg) as sb:
        worker = sb._workers[0]
        result = await sb.run(PROBE)
        report["sandbox_uids"] = sorted(_uids_under(worker.pid)) if worker.pid else []
        cgroup = worker.cgroup
        report["cgroup"] = cgroup.describe() if cgroup else "none (not root: rlimit fallback)"
        report["memory_counted"] = bool(cgroup and "memory" in cgroup.enforced)
    if not result.ok:
        problems.append(f"the probe failed: {result.status} {result.stderr[-500:]}")
        return report
    inside = json.loads(result.stdout)
    ours = {n: os.readlink(f"/proc/self/ns/{n}") for n in NAMESPACES}
    report["own_namespaces"] = [n for n in NAMESPACES if inside["ns"][n] != ours[n]]
    report.update({k: inside[k] for k in ("proc_sys_writable", "proc_sys_read_only_mount", "seccomp",
                                          "capabilities")})
    if not cfg.isolation:
        problems.append("isolation is off (--unsafe-no-isolation): code runs with this user's rights")
        return report
    if 0 in report["sandbox_uids"]:
        problems.append("sandboxed code runs as host uid 0")
    if missing := [n for n in NAMESPACES if n not in report["own_namespaces"]]:
        problems.append(f"namespaces shared with the host: {', '.join(missing)}")
    if inside["proc_sys_writable"]:
        problems.append("/proc/sys/kernel/core_pattern is writable from the sandbox")
    if int(inside["capabilities"] or "0", 16):
        problems.append(f"sandboxed code holds capabilities {inside['capabilities']}")
    return report


def bwrap_version(path: str | None) -> str:
    exe = path or shutil.which("bwrap")
    if not exe:
        return "not installed"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = "?"
    return f"{exe} ({out})"


def render(report: dict[str, Any], cfg: SandboxConfig) -> str:
    """The report as the lines `rstar2 sandbox check` prints."""
    lim = cfg.limits
    uids = ", ".join(map(str, report.get("sandbox_uids", []))) or "?"
    rows = [
        ("isolation", f"bubblewrap {bwrap_version(cfg.bwrap)}" if report["isolation"] else "OFF"),
        ("host uid", f"{uids} (this process: {report['server_uid']})"),
        ("namespaces", " ".join(report.get("own_namespaces", [])) or "none of its own"),
        ("cgroup", report.get("cgroup", "?")),
        ("memory", f"{lim.memory_bytes >> 20} MiB per worker, everything counted" if report.get("memory_counted")
         else f"{lim.memory_bytes >> 20} MiB of address space per process; /tmp and /dev/shm "
              f"{lim.scratch_bytes >> 20} MiB each; SysV shared memory refused (fallback)"),
        ("/proc/sys", ("read-only mount" if report.get("proc_sys_read_only_mount") else "not a read-only mount")
         + (", WRITABLE" if report.get("proc_sys_writable") else ", not writable")),
        ("seccomp", f"mode {report.get('seccomp') or '?'} (2 = filter)"),
        ("capabilities", report.get("capabilities", "?")),
        ("verdict", "ok" if not report["problems"] else "; ".join(report["problems"])),
    ]
    return "\n".join(f"{k:<13} {v}" for k, v in rows)
