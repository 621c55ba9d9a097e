"""The sandbox attacked as a stranger's code would attack it, with the real sandbox (as root where the machine
allows: the usual case in a container image). Each test is one attack of issue 48 and asserts the hole is
closed: kernel settings, the host uid, bytes of one call in the next, the server's PYTHONPATH, memory outside
every limit, forged frames on the control channel, processes that outlive their call."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import time
import uuid

import pytest

from rstar2_agent.sandbox import Limits, LocalSandbox, SandboxConfig, SandboxError, Status
from rstar2_agent.sandbox.isolation import WorkerCgroup, uses_cgroups
from rstar2_agent.sandbox.worker import MAX_FRAME, Worker, WorkerDied

from conftest import children, timeout_scale, until

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop and the cgroups are what root gets")
SYSCTLS = ["kernel/core_pattern", "kernel/panic", "vm/swappiness", "fs/suid_dumpable", "net/ipv4/ip_forward"]
WRITE_SYSCTLS = f"""
import os
for name in {SYSCTLS!r}:
    try:
        os.close(os.open('/proc/sys/' + name, os.O_WRONLY))
        print(name, 'WRITABLE')
    except OSError as e:
        print(name, 'refused', e.errno)
"""


def _pool(**kw) -> LocalSandbox:
    """One small worker of the plain template (fast to start)."""
    kw.setdefault("workers", 1)
    kw.setdefault("templates", ((),))
    return LocalSandbox(SandboxConfig(**kw))


def _host_uids(pid: int) -> dict[int, int]:
    """The effective host uid of every process under `pid`, as the host's /proc says (inside the sandbox the
    uid map reads relative to bwrap's own namespaces, so only the host can tell)."""
    out = {}
    for p in children(pid):
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("Uid:"):
                    out[p] = int(line.split()[2])
        except OSError:
            continue
    return out


async def _uids_while_running(sb: LocalSandbox, run, pid: int) -> dict[int, int]:
    """The host uids of the worker's processes while `run` (a call that sleeps) is running user code."""
    idle = len(children(pid))
    call = asyncio.create_task(run)
    await until(lambda: len(children(pid)) > idle, "the runner to start the program")
    uids = _host_uids(pid)
    r = await call
    assert r.ok, r.stderr
    return uids


@ROOT_ONLY
async def test_sysctl_writes_are_refused_and_sandboxed_code_is_not_host_root():
    """Issue 48: bubblewrap mapped the sandbox's uid to host uid 0, and /proc/sys was writable."""
    async with _pool() as sb:
        sid = await sb.open_session()
        for r in (await sb.run(WRITE_SYSCTLS), await sb.run_in_session(sid, WRITE_SYSCTLS)):
            assert r.ok, r.stderr
            assert "WRITABLE" not in r.stdout and r.stdout.count("refused") == len(SYSCTLS), r.stdout
        sleep = "import time\ntime.sleep(1)"
        uids = await _uids_while_running(sb, sb.run(sleep), sb.worker_pids()[0])
        uids.update(_host_uids(sb._sessions[sid].worker.pid))  # the session's kernel runs its cells itself
        assert uids and 0 not in uids.values(), uids
        r = await sb.run("print(open('/proc/self/status').read())")
        assert "\nCapEff:\t0000000000000000" in r.stdout  # no capability either


# ---------------------------------------------------------------- no bytes of one call in the next
def _secrets() -> dict[str, str]:
    return {where: f"S{where.upper()}{uuid.uuid4().hex}{uuid.uuid4().hex}" for where in
            ("code", "stdin", "stdout", "shm", "sysv", "tmp")}


def _caller_a(s: dict[str, str]) -> str:
    """A client's program: its secrets in its code (many copies, big enough to stay in a freed heap), its stdin,
    its output, /dev/shm, /tmp and a SysV segment it leaves behind."""
    return f"""
import ctypes, sys
kept = [{s['code']!r} * 200 for _ in range(4)]
data = sys.stdin.read()
print({s['stdout']!r} * 300)
open('/dev/shm/left', 'w').write({s['shm']!r})
open('/tmp/left', 'w').write({s['tmp']!r})
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x5eed, 1 << 16, 0o1666)
if shm >= 0:
    at = libc.shmat(shm, None, 0)
    ctypes.memmove(at, {s['sysv']!r}.encode(), {len(s['sysv'])})
print(len(data))
"""


def _caller_b(s: dict[str, str]) -> str:
    """The next client's program: scans its own memory (forked from the same template), /dev/shm, /tmp and the
    SysV objects for any of A's secrets. The secrets are written here in halves, never whole."""
    halves = [(v[:20], v[20:]) for v in s.values()]
    return f"""
import glob, os
halves = {halves!r}
found = []
for line in open('/proc/self/maps'):
    parts = line.split()
    if 'r' not in parts[1] or (len(parts) > 5 and parts[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):
        continue
    start, end = (int(x, 16) for x in parts[0].split('-'))
    try:
        with open('/proc/self/mem', 'rb', buffering=0) as mem:
            mem.seek(start)
            data = mem.read(end - start)
    except (OSError, ValueError, OverflowError):
        continue
    for head, tail in halves:
        at = data.find(head.encode())
        while at >= 0:
            if data[at + len(head):at + len(head) + len(tail)] == tail.encode():
                found.append(('memory', head[:8], parts[5] if len(parts) > 5 else 'anon'))
                break
            at = data.find(head.encode(), at + 1)
for path in set(glob.glob('/dev/shm/*') + glob.glob('/tmp/*') + glob.glob('/tmp/work/*')) - {{'/tmp/work'}}:
    found.append(('file', path))
ipc = [line for line in open('/proc/sysvipc/shm').read().splitlines()[1:] if line.strip()]
found += [('sysv', line.split()[1]) for line in ipc]
print(found)
"""


async def test_no_bytes_of_a_call_reach_the_next_one_in_the_same_worker():
    """Issue 48: a later client's call found an earlier client's code and output in /proc/self/mem in 4 of 8
    tries, and /dev/shm and SysV segments were never wiped."""
    async with _pool() as sb:
        worker = sb._workers[0].name
        for _ in range(3):
            s = _secrets()
            a = await sb.run(_caller_a(s), stdin=s["stdin"] * 300)
            assert a.ok and a.stdout.startswith(s["stdout"]), a.stderr[-2000:]
            b = await sb.run(_caller_b(s))
            assert b.ok, b.stderr[-2000:]
            assert b.backend == a.backend == worker
            assert b.stdout == "[]\n", f"call B found call A's bytes: {b.stdout[:2000]}"


# ---------------------------------------------------------------- the server's PYTHONPATH
async def test_a_file_planted_in_a_pythonpath_folder_is_invisible(tmp_path, monkeypatch):
    """Issue 48: every absolute PYTHONPATH folder was bound whole (a planted `.env` was read). Only what imports
    use is bound now; and a root-only file inside a bound package stays unreadable (the sandbox is not kuid 0)."""
    target = tmp_path / "target"
    (target / "pkgx").mkdir(parents=True)
    (target / "pkgx" / "__init__.py").write_text("VALUE = 42\n")
    (target / "mod_y.py").write_text("NAME = 'y'\n")
    (target / ".env").write_text("OPENAI_API_KEY=sk-planted\n")
    (target / "notes.txt").write_text("private\n")
    (target / "secrets").mkdir()
    (target / "secrets" / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    private = target / "pkgx" / "private.key"
    private.write_text("root only\n")
    private.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("PYTHONPATH", str(target))
    code = """
import os, pkgx, mod_y
base = os.path.dirname(os.path.dirname(pkgx.__file__))
print(pkgx.VALUE, mod_y.NAME, sorted(os.listdir(base)))
try:
    print(open(os.path.join(os.path.dirname(pkgx.__file__), 'private.key')).read())
except OSError as e:
    print('unreadable', e.errno)
"""
    async with _pool() as sb:
        r = await sb.run(code)
    assert r.ok, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "42 y ['mod_y.py', 'pkgx']", first
    if os.geteuid() == 0:
        assert second == "unreadable 13", second


# ---------------------------------------------------------------- memory outside every limit
def _memory_counted() -> bool:
    if not uses_cgroups():
        return False
    probe = WorkerCgroup(f"probe-{os.getpid()}-{uuid.uuid4().hex[:6]}", max_pids=64, memory_bytes=1 << 30, cpus=1)
    try:
        return "memory" in probe.enforced
    finally:
        probe.remove()


LIMIT = 256 << 20
SYSV_FLOOD = f"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
chunk, total = 32 << 20, 0
while total < (5 << 30):             # 5 GiB of SysV shared memory, left behind by the call
    shm = libc.shmget(0, chunk, 0o1600)
    if shm < 0:
        print('shmget refused', ctypes.get_errno(), flush=True)
        break
    at = libc.shmat(shm, None, 0)
    ctypes.memset(at, 1, chunk)
    libc.shmdt(at)
    total += chunk
    print(total >> 20, flush=True)
    if total > 4 * {LIMIT}:           # far past the limit: it did not hold (stop before the host feels it)
        print('ESCAPED', flush=True)
        break
"""
FILE_FLOOD = f"""
import itertools
total = 0
block = b'x' * (16 << 20)
for folder in ('/dev/shm', '/tmp'):
    try:
        for k in itertools.count():  # files of 32 MiB (one file is capped by RLIMIT_FSIZE on its own)
            with open(f'{{folder}}/flood{{k}}', 'wb') as f:
                for _ in range(2):
                    f.write(block)
                    f.flush()
                    total += len(block)
            if total > 4 * {LIMIT}:
                print('ESCAPED', flush=True)
                raise SystemExit
    except OSError as e:
        print(folder, 'stopped', e.errno, total >> 20, flush=True)
"""


def _last_mib(stdout: str) -> int:
    numbers = [int(line) for line in stdout.split() if line.isdigit()]
    return numbers[-1] if numbers else 0


@ROOT_ONLY
async def test_five_gib_of_shared_memory_and_tmpfs_stop_at_the_limit_and_the_worker_survives():
    """Issue 48: one stateless call left 5 GiB of SysV shared memory owned by no process. The worker's memory
    cgroup counts it (and tmpfs pages); the call is killed at the limit, the template survives and removes what
    the call left."""
    if not _memory_counted():
        pytest.skip("no writable memory cgroup here (the fallback is tested on its own)")
    limits = Limits(memory_bytes=LIMIT, scratch_bytes=128 << 20, wall_seconds=30, cpu_seconds=30)
    async with _pool(limits=limits) as sb:
        pid = sb.worker_pids()[0]
        t0 = time.monotonic()
        r = await sb.run(SYSV_FLOOD)
        assert "ESCAPED" not in r.stdout, r
        assert r.status == Status.MEMORY and "memory limit" in r.stderr, r
        assert _last_mib(r.stdout) <= LIMIT >> 20, r.stdout[-200:]
        r = await sb.run(FILE_FLOOD)
        assert "ESCAPED" not in r.stdout and r.status in (Status.OK, Status.MEMORY), r
        assert time.monotonic() - t0 < 30 * timeout_scale()
        after = await sb.run("print(open('/proc/sysvipc/shm').read().count('\\n') - 1, __import__('os').listdir("
                             "'/dev/shm'))")
        assert after.stdout == "0 []\n", after
        assert sb.worker_pids() == [pid] and sb.restarted == 0  # the same worker, never restarted


async def test_without_a_memory_cgroup_sysv_segments_are_refused_and_tmpfs_is_capped():
    """The fallback where cgroups are not writable: rlimits cannot bound SysV memory, so making it is refused;
    /dev/shm and /tmp are size-capped tmpfs."""
    limits = Limits(memory_bytes=1 << 30, scratch_bytes=64 << 20, wall_seconds=30, cpu_seconds=30)
    async with _pool(limits=limits, cgroups=False) as sb:
        r = await sb.run(SYSV_FLOOD)
        assert r.stdout.startswith("shmget refused 1"), r
        r = await sb.run(FILE_FLOOD.replace(str(LIMIT), str(64 << 20)))
        assert "ESCAPED" not in r.stdout and "/dev/shm stopped 28" in r.stdout, r


@ROOT_ONLY
async def test_a_worker_gets_a_cpu_quota():
    """Containers had no CPU limit. With a quota of a quarter CPU a busy second gets about a quarter second."""
    probe = WorkerCgroup(f"probe-{os.getpid()}", max_pids=8, memory_bytes=1 << 30, cpus=0.25)
    probe.remove()
    if "cpu" not in probe.enforced:
        pytest.skip("no writable cpu cgroup here")
    async with _pool(limits=Limits(cpus=0.25)) as sb:
        r = await sb.run("import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.2:\n    pass")
        assert r.ok and r.cpu_time < 0.6, r


async def test_a_session_has_a_cpu_limit_per_cell_and_keeps_its_state():
    async with _pool(limits=Limits(wall_seconds=8, cpu_seconds=1)) as sb:
        sid = await sb.open_session()
        await sb.run_in_session(sid, "kept = 7")
        t0 = time.monotonic()
        r = await sb.run_in_session(sid, "while True:\n    pass")
        assert r.status == Status.TIMEOUT and "CPU" in r.stderr and time.monotonic() - t0 < 6 * timeout_scale(), r
        assert (await sb.run_in_session(sid, "kept")).stdout == "7\n"


# ---------------------------------------------------------------- forged frames
FORGE = """
import json, os, stat, struct
big = 'F' * (3 << 20)
body = json.dumps({'op': 'started'}).encode()
frames = struct.pack('>I', len(body)) + body
body = json.dumps({'status': 'ok', 'stdout': big, 'stderr': '', 'exit_code': 0, 'duration': 0.0,
                   'cpu_time': None, 'truncated': False, 'op': 'result', 'lengths': [len(big), 0]}).encode()
frames += struct.pack('>I', len(body)) + body + big.encode()
reached = []
for fd in range(3, 256):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        try:
            os.set_blocking(fd, False)
            os.write(fd, frames[:65536])
            reached.append(fd)
        except OSError:
            pass
print('done')
"""


async def test_code_cannot_write_frames_to_the_control_channel():
    """Issue 48: container code wrote a forged 200 MB stdout to its runner's control pipe and the server kept
    it. The program runs where the control channel is not open: what it writes goes nowhere the host reads."""
    async with _pool() as sb:
        sid = await sb.open_session()
        for r in (await sb.run_in_session(sid, FORGE), await sb.run(FORGE)):
            assert r.ok and r.stdout == "done\n", (r.status, r.stdout[:200], r.stderr[-500:])
        assert (await sb.run_in_session(sid, "print(6 * 7)")).stdout == "42\n"
        assert (await sb.run("print(6 * 7)")).stdout == "42\n"


FAKE_RUNNER = """
import os, struct, sys, json
def frame(obj):
    body = json.dumps(obj).encode()
    os.write(1, struct.pack('>I', len(body)) + body)
frame({'op': 'ready'})
head = os.read(0, 4)
os.read(0, struct.unpack('>I', head)[0])
frame({'op': 'started'})
if sys.argv[1] == 'header':
    os.write(1, struct.pack('>I', 1 << 31) + b'{' * 65536)   # a 2 GiB frame, of which 64 KiB arrive
else:
    frame({'op': 'result', 'status': 'ok', 'lengths': [200 << 20, 0]})
    os.write(1, b'x' * 65536)
import time; time.sleep(30)
"""


@pytest.mark.parametrize("forgery", ["header", "output"])
async def test_an_oversized_frame_is_refused_unread_with_a_clear_error(forgery):
    """Whatever a runner sends (a compromised one), the host reads a frame only up to the protocol's size: a
    2 GiB frame header or a 200 MB stdout is refused at once, not buffered, and the worker is killed."""
    w = Worker("fork", Limits(), isolation=False, preload=())
    w.proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAKE_RUNNER, forgery, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    assert (await w._read())["op"] == "ready"
    t0 = time.monotonic()
    with pytest.raises(WorkerDied) as e:
        await asyncio.wait_for(w.call("print(1)", "", 5), 20)
    assert time.monotonic() - t0 < 3 * timeout_scale()
    assert "refused" in str(e.value) and ("byte" in str(e.value)), e.value
    assert f"{MAX_FRAME:,}" in str(e.value) or f"{1 << 20:,}" in str(e.value)
    assert w.proc.returncode is not None  # killed, not left waiting
    assert struct.calcsize(">I") == 4


# ---------------------------------------------------------------- processes that outlive their call
BACKGROUND = """
import os, subprocess, time
child = subprocess.Popen(['sleep', '1000'])
if os.fork() == 0:              # a daemon: double fork, new session
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
time.sleep(0.2)
print(child.pid, flush=True)
"""
ALIVE = """
import os
alive = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in (1, os.getpid()):
        stat = open(f'/proc/{p}/stat').read()
        if stat[stat.rindex(')') + 2] != 'Z':
            alive.append((int(p), stat.split()[1]))
print(alive)
"""


async def test_background_processes_of_a_call_are_gone_after_it():
    """Issue 48: a container's background processes ran until its expiry (20 min). After each cell (and each
    stateless call) nothing but the session's kernel is left."""
    async with _pool() as sb:
        sid = await sb.open_session()
        r = await sb.run_in_session(sid, BACKGROUND)
        assert r.ok, r.stderr
        r = await sb.run_in_session(sid, ALIVE)  # runs in the kernel itself: nothing else but pid 1
        assert r.ok and r.stdout == "[]\n", r.stdout
        assert (await sb.run(BACKGROUND)).ok
        r = await sb.run(ALIVE)
        assert r.stdout == "[]\n", r.stdout


# ---------------------------------------------------------------- refusing root, and saying what isolation holds
@ROOT_ONLY
async def test_the_pool_refuses_to_run_sandboxed_code_as_root():
    with pytest.raises(SandboxError, match="uid and gid must not be 0"):
        await _pool(sandbox_uid=0).start()


def test_sandbox_check_says_which_isolation_it_got():
    p = subprocess.run([sys.executable, "-m", "rstar2_agent.cli", "sandbox", "check", "--json"], capture_output=True,
                       text=True, timeout=120)
    report = json.loads(p.stdout)
    assert p.returncode == 0 and report["problems"] == [], (p.stdout, p.stderr[-2000:])
    assert set(report["own_namespaces"]) == {"user", "pid", "net", "ipc", "uts", "mnt", "cgroup"}
    assert not report["proc_sys_writable"] and report["proc_sys_read_only_mount"] and report["seccomp"] == "2"
    if os.geteuid() == 0:
        assert 0 not in report["sandbox_uids"] and report["sandbox_uids"]


async def test_a_session_whose_caller_goes_away_while_it_starts_leaves_no_process():
    """Issue 48: a client that disconnected while its container started leaked a sandbox process (about 80 MB,
    never reaped). The start is cancelled at several points; nothing of it stays."""
    async with _pool() as sb:
        before = set(children(os.getpid()))
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
            task = asyncio.create_task(sb.open_session())
            await asyncio.sleep(delay)
            task.cancel()
            sid = (await asyncio.gather(task, return_exceptions=True))[0]
            if isinstance(sid, str):  # it finished before the cancel: the caller owns it and closes it
                await sb.close_session(sid)
        await until(lambda: set(children(os.getpid())) <= before,
                    lambda: f"no process left of the cancelled starts: {set(children(os.getpid())) - before}",
                    timeout=10)
