"""How a sandbox worker process is started: the bubblewrap command line, the environment, the cgroup.

Isolation (on by default) uses bubblewrap with new user, pid, net, ipc, uts and cgroup namespaces:
no network, a read-only view of only the system directories and the Python installation, a private
size-capped tmpfs as /tmp, no home, no project checkout, no host environment variables. The runner
is pid 1 of its namespace, so user code cannot signal it and it can kill everything a call leaves.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .seccomp import build_filter
from .types import SandboxError

log = logging.getLogger(__name__)

PROGRAM = Path(__file__).with_name("inside")  # the program run inside the sandbox: `python -I -S PROGRAM MODE DIR`
LAUNCHER = Path(__file__).with_name("launcher.py")
SANDBOX_PROGRAM = "/opt/rstar2/inside"
INSTALL_HINT = (
    "The sandbox needs bubblewrap for isolation. Install it (Debian/Ubuntu: `apt-get install bubblewrap`, "
    "Fedora: `dnf install bubblewrap`) or, only on a machine where running untrusted code unisolated is "
    "acceptable, pass --unsafe-no-isolation (SandboxConfig(isolation=False))."
)
_ETC = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf"]
_CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}


def _existing(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        p = os.path.realpath(p)
        if os.path.isdir(p) and p not in out:
            out.append(p)
    return out


def stdlib_paths() -> list[str]:
    """Where the interpreter finds its standard library (it finds them itself, given its binary)."""
    stdlib = sysconfig.get_path("platstdlib")
    return _existing([sysconfig.get_path("stdlib"), stdlib, os.path.join(stdlib, "lib-dynload")])


def package_paths() -> list[str]:
    """The site-packages folders the sandboxed code imports installed packages from (numpy, sympy, ...): the
    environment's and the user site (`pip install --user`), each bound whole. The runner starts with -I -S, so
    these are put on its sys.path by hand (.pth files are not read)."""
    paths = site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return [p for p in _existing(paths) if p != "/"]


def pythonpath_dirs() -> list[str]:
    """Absolute PYTHONPATH folders (`pip install --target`). Never bound whole: only what is importable in them
    (see importable_entries), so a `.env`, a checkout or a key beside the packages stays out of the sandbox."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    return [p for p in _existing(paths) if p != "/"]


_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_PACKAGE_DIR_SUFFIXES = (".libs", ".dist-info", ".egg-info")  # vendored shared libraries, package metadata


def importable_entries(folder: str) -> list[str]:
    """The entries of a PYTHONPATH folder an import can use: regular packages (a folder with __init__.py),
    modules and extension modules, wheels' vendored libraries (`numpy.libs`) and metadata. Hidden entries and
    anything else (namespace packages included) are left out."""
    out = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.name.startswith("."):
            continue
        try:
            if e.is_dir(follow_symlinks=True):
                if e.name.endswith(_PACKAGE_DIR_SUFFIXES) or (
                        e.name.isidentifier() and os.path.isfile(os.path.join(e.path, "__init__.py"))):
                    out.append(e.path)
            elif e.is_file(follow_symlinks=True) and e.name.endswith(_MODULE_SUFFIXES):
                out.append(e.path)
        except OSError:
            continue
    return out


def python_binary() -> str:
    return os.path.realpath(sys.executable)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class HostView:
    """Which host paths the sandbox sees read-only, and where. A directory stays at its own path unless the
    sandbox mounts its own filesystem over that path (/tmp, /dev/shm, /dev, /proc): an environment in /tmp would
    be hidden by the sandbox's private /tmp, so it is bound under /opt/rstar2/host/N instead. `dirs` are bound
    whole; of each `picked` folder (PYTHONPATH) only its importable entries are bound."""

    OWN_MOUNTS = ("/tmp", "/dev", "/proc")
    ALIAS_ROOT = "/opt/rstar2/host"

    def __init__(self, dirs: list[str], picked: list[str] = ()):
        self.binds: dict[str, str] = {}  # host path -> its path inside the sandbox
        self.folders: dict[str, str] = {}  # picked folder -> its path inside (only its entries are bound)
        self._aliases = 0
        for d in dirs:
            if not self._visible(d):
                self.binds[d] = self._place(d)
        for folder in picked:
            if self._visible(folder) or folder in self.folders:
                continue
            mnt = self.folders[folder] = self._place(folder)
            for entry in importable_entries(folder):
                self.binds[entry] = mnt + entry[len(folder):]

    def _visible(self, path: str) -> bool:
        """/usr is bound whole; a path inside a bound directory is visible already."""
        return _under(path, "/usr") or any(_under(path, host) for host in self.binds)

    def _place(self, path: str) -> str:
        if not any(_under(path, m) for m in self.OWN_MOUNTS):
            return path
        self._aliases += 1
        return f"{self.ALIAS_ROOT}/{self._aliases - 1}"

    def inside(self, path: str) -> str:
        """The sandbox's path for a host path inside one of the bound directories (or /usr)."""
        for host, mnt in (*self.binds.items(), *self.folders.items()):
            if _under(path, host):
                return mnt + path[len(host):]
        return path


def bwrap_path(explicit: str | None = None) -> str | None:
    return explicit if explicit and os.access(explicit, os.X_OK) else (None if explicit else shutil.which("bwrap"))


@dataclass
class Launch:
    """Everything needed to start one worker: argv, env, and the host-side folders to remove."""

    argv: list[str]
    env: dict[str, str]
    host_scratch: str | None = None
    pass_fds: tuple[int, ...] = ()  # the seccomp program, read by bwrap at start; close after spawning
    stage: str | None = None  # where the launcher staged the bound folders for the unprivileged uid (empty dirs)


def build_launch(mode: str, *, isolation: bool, scratch_bytes: int, preload: tuple[str, ...],
                 bwrap: str | None = None, seccomp: bool = True, user: tuple[int, int] | None = None,
                 cgroup: WorkerCgroup | None = None, sysv: bool = True,
                 command: list[str] | None = None) -> Launch:
    """The command that starts a runner in `mode` ('fork' or 'session'). `user`: the unprivileged (uid, gid) the
    worker runs as when this process is root; `cgroup`: the worker's cgroup, joined before anything runs;
    `sysv`: False refuses SysV shared memory and message queues (no memory cgroup counts them); `command`
    replaces the runner (the isolation check)."""
    env = dict(_CHILD_ENV)
    env["RSTAR2_SANDBOX_PRELOAD"] = ",".join(preload)
    packages = package_paths()
    joins = cgroup.procs if cgroup is not None else []
    if not isolation:
        scratch = tempfile.mkdtemp(prefix="rstar2-sandbox-")
        extra = packages + pythonpath_dirs()
        env.update(HOME=scratch, TMPDIR=scratch, RSTAR2_SANDBOX_PATH=os.pathsep.join(extra))
        argv = [python_binary(), "-I", "-S", str(PROGRAM), mode, scratch]
        return Launch(_launcher(joins, None, []) + argv if joins else argv, env, scratch)
    exe = bwrap_path(bwrap)
    if exe is None:
        raise SandboxError(INSTALL_HINT)
    env.update(HOME="/tmp", TMPDIR="/tmp")
    argv = [exe, "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",
            "--hostname", "sandbox", "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv",
            "--disable-userns"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):
        p = Path("/") / name
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), str(p)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in _ETC:
        p = Path("/etc") / name
        if p.exists():
            argv += ["--ro-bind", str(p), str(p)]
    py_bin = python_binary()
    picked = pythonpath_dirs()
    view = HostView([os.path.realpath(sys.base_prefix), *stdlib_paths(), os.path.dirname(py_bin), *packages], picked)
    binds = [*view.binds.items(), (str(PROGRAM), SANDBOX_PROGRAM)]
    stage, staged = None, []
    if user is not None:  # the unprivileged uid may not reach them (a venv under a 0700 /root): stage them
        stage = tempfile.mkdtemp(prefix="rstar2-stage-")
        os.chmod(stage, 0o755)
        for k, (host, mnt) in enumerate(binds):
            at = os.path.join(stage, str(k))
            if os.path.isdir(host):
                os.mkdir(at)
            else:
                open(at, "w").close()  # noqa: SIM115 - an empty file to bind a file onto
            staged.append([host, at])
            binds[k] = (at, mnt)
    for host, mnt in binds:
        argv += ["--ro-bind", host, mnt]
    env["RSTAR2_SANDBOX_PATH"] = os.pathsep.join(view.inside(p) for p in packages + picked)
    # /proc/sys is read-only (and unwritable by the uid anyway); /dev holds only the device nodes bwrap makes
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if os.path.exists("/proc/sysrq-trigger"):
        argv += ["--ro-bind", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    argv += ["--dev", "/dev", "--size", str(scratch_bytes), "--tmpfs", "/dev/shm",
             "--size", str(scratch_bytes), "--tmpfs", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", "/tmp"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    pass_fds: tuple[int, ...] = ()
    program = build_filter(sysv=sysv) if seccomp else None
    if program is not None:
        fd = os.memfd_create("rstar2-seccomp", 0)
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        argv += ["--seccomp", str(fd)]
        pass_fds = (fd,)
    argv += command or [view.inside(py_bin), "-I", "-S", SANDBOX_PROGRAM, mode, "/tmp"]
    if user is not None or joins:
        argv = _launcher(joins, user, staged) + argv
    return Launch(argv, {}, None, pass_fds, stage)


def _launcher(joins: list[Path], user: tuple[int, int] | None, stage: list[list[str]]) -> list[str]:
    spec = {"cgroups": [str(p) for p in joins], "user": list(user) if user else None, "stage": stage}
    return [python_binary(), "-I", "-S", str(LAUNCHER), json.dumps(spec)]


def sandbox_user(uid: int, gid: int) -> tuple[int, int] | None:
    """The (uid, gid) the workers drop to: only when this process is root (else they already run as its uid)."""
    return (uid, gid) if os.geteuid() == 0 else None


def check_isolation(bwrap: str | None = None, user: tuple[int, int] | None = None) -> str | None:
    """None when bubblewrap can start a sandbox here (as `user`, where given), else what is wrong and how to fix
    it."""
    exe = bwrap_path(bwrap)
    if exe is None:
        return INSTALL_HINT
    if user is not None and 0 in user:
        return ("the sandbox's uid and gid must not be 0: sandboxed code would run as host root. Set "
                "SandboxConfig(sandbox_uid=..., sandbox_gid=...) to an unprivileged id (default 65534, nobody).")
    import subprocess

    launch = build_launch("fork", isolation=True, scratch_bytes=1 << 20, preload=(), bwrap=exe, user=user,
                          command=[os.path.realpath("/bin/true") if os.path.exists("/bin/true") else "true"])
    try:
        proc = subprocess.run(launch.argv, capture_output=True, timeout=30, pass_fds=launch.pass_fds)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to run ({e}). {INSTALL_HINT}"
    finally:
        for fd in launch.pass_fds:
            os.close(fd)
        if launch.stage:
            shutil.rmtree(launch.stage, ignore_errors=True)
    if proc.returncode != 0:
        who = f"as uid {user[0]}" if user else "here"
        return (f"bubblewrap cannot create its namespaces {who}: {proc.stderr.decode().strip()}. Enable unprivileged "
                f"user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone=1, or an "
                f"AppArmor profile for bwrap where apparmor_restrict_unprivileged_userns=1). {INSTALL_HINT}")
    return None


class WorkerCgroup:
    """A cgroup per worker where this process may make them (root): pids (a fork bomb stops at the cap; needed
    as root, where RLIMIT_NPROC is not enforced), memory (everything the worker holds together: its processes,
    the pages of its /tmp and /dev/shm and its SysV segments; no swap) and cpu (a quota of `cpus` CPUs).
    cgroup v2, else the v1 hierarchies; `enforced` names what took, the rest falls back to rlimits."""

    V2_ROOT = Path("/sys/fs/cgroup")
    V1_ROOT = Path("/sys/fs/cgroup")
    PERIOD_US = 100_000

    def __init__(self, name: str, *, max_pids: int, memory_bytes: int, cpus: float | None):
        self.version: int | None = None
        self.dirs: dict[str, Path] = {}  # controller -> the worker's cgroup folder that enforces it
        self.enforced: set[str] = set()
        self._made: list[Path] = []
        limits = {"pids": max_pids, "memory": memory_bytes, "cpu": cpus}
        if (self.V2_ROOT / "cgroup.controllers").exists():
            self._make_v2(name, limits)
        else:
            self._make_v1(name, limits)

    @property
    def procs(self) -> list[Path]:
        """The cgroup.procs files a worker's first process writes its pid to."""
        return sorted({d / "cgroup.procs" for d in self.dirs.values()})

    def _make_v2(self, name: str, limits: dict) -> None:
        root = self.V2_ROOT
        try:
            available = set((root / "cgroup.controllers").read_text().split())
            parent = root / "rstar2"
            parent.mkdir(exist_ok=True)
            for folder in (root, parent):
                for c in ("pids", "memory", "cpu"):
                    if c in available:
                        _write(folder / "cgroup.subtree_control", f"+{c}")
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            me = parent / name
            me.mkdir(exist_ok=True)
        except OSError:
            return
        self.version = 2
        self._made.append(me)
        files = {"pids": [("pids.max", limits["pids"])],
                 "memory": [("memory.max", limits["memory"]), ("memory.swap.max", 0)],
                 "cpu": [("cpu.max", _quota(limits["cpu"], self.PERIOD_US))]}
        for c in ("pids", "memory", "cpu"):
            if c in enabled and (c != "cpu" or limits["cpu"]) and _write(me / files[c][0][0], files[c][0][1]):
                for f, v in files[c][1:]:
                    _write(me / f, v)
                self.enforced.add(c)
                self.dirs[c] = me

    def _make_v1(self, name: str, limits: dict) -> None:
        files = {"pids": [("pids.max", limits["pids"])],
                 "memory": [("memory.limit_in_bytes", limits["memory"]),
                            ("memory.memsw.limit_in_bytes", limits["memory"])],
                 "cpu": [("cpu.cfs_period_us", self.PERIOD_US),
                         ("cpu.cfs_quota_us", int((limits["cpu"] or 0) * self.PERIOD_US))]}
        for c in ("pids", "memory", "cpu"):
            base = self.V1_ROOT / c
            if not (base / "cgroup.procs").exists() or (c == "cpu" and not limits["cpu"]):
                continue
            me = base / _own_v1_path(c).lstrip("/") / "rstar2" / name
            try:
                me.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            self._made.append(me)
            if all(_write(me / f, v) or f.endswith("memsw.limit_in_bytes") for f, v in files[c]):
                self.version = 1
                self.enforced.add(c)
                self.dirs[c] = me

    def oom_kills(self) -> int | None:
        """How many processes the memory limit has killed so far (None without a memory cgroup)."""
        d = self.dirs.get("memory")
        if d is None:
            return None
        try:
            text = (d / ("memory.events" if self.version == 2 else "memory.oom_control")).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def describe(self) -> str:
        if not self.enforced:
            return "none (cgroups not writable here: rlimit fallback)"
        return f"v{self.version}: " + ", ".join(sorted(self.enforced))

    def remove(self) -> None:
        for d in self._made:
            try:
                d.rmdir()
            except OSError:
                pass


def _quota(cpus: float | None, period: int) -> str:
    return f"{max(1000, int(cpus * period))} {period}" if cpus else f"max {period}"


def _write(path: Path, value: object) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


def _own_v1_path(controller: str) -> str:
    """This process's cgroup in a v1 hierarchy: the workers' cgroups nest under it, so they count against
    whatever limits the server itself runs under (a container's)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path
    except OSError:
        pass
    return "/"


def uses_cgroups() -> bool:
    """Whether workers get cgroups: only as root (a user's processes can rarely make them)."""
    return os.geteuid() == 0
