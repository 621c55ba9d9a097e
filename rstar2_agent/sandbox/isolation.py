"""How a sandbox worker process is started: the bubblewrap command line, the environment, the cgroup.

Isolation (on by default) uses bubblewrap with new user, pid, net, ipc, uts and cgroup namespaces:
no network, a read-only view of only the system directories and the Python installation, a private
size-capped tmpfs as /tmp, no home, no project checkout, no host environment variables. The runner
is pid 1 of its namespace, so user code cannot signal it and it can kill everything a call leaves.
"""

from __future__ import annotations

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

RUNNER = Path(__file__).with_name("runner.py")
SANDBOX_RUNNER = "/opt/rstar2/runner.py"
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
    """Where the sandboxed code imports installed packages from (numpy, sympy, ...): the environment's
    site-packages, the user site (`pip install --user`) and PYTHONPATH (`pip install --target`). The runner
    starts with -I -S, so these are put on its sys.path by hand (.pth files are not read)."""
    paths = site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    return [p for p in _existing(paths) if p != "/"]


def python_binary() -> str:
    return os.path.realpath(sys.executable)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class HostView:
    """Which host directories the sandbox sees read-only, and where. A directory stays at its own path unless
    the sandbox mounts its own filesystem over that path (/tmp, /dev/shm, /dev, /proc): an environment in
    /tmp would be hidden by the sandbox's private /tmp, so it is bound under /opt/rstar2/host/N instead."""

    OWN_MOUNTS = ("/tmp", "/dev", "/proc")
    ALIAS_ROOT = "/opt/rstar2/host"

    def __init__(self, dirs: list[str]):
        self.binds: dict[str, str] = {}  # host dir -> its path inside the sandbox
        for d in dirs:
            if _under(d, "/usr") or any(_under(d, host) for host in self.binds):
                continue  # /usr is bound whole; a directory inside a bound one is visible already
            hidden = any(_under(d, m) for m in self.OWN_MOUNTS)
            self.binds[d] = f"{self.ALIAS_ROOT}/{len(self.binds)}" if hidden else d

    def inside(self, path: str) -> str:
        """The sandbox's path for a host path inside one of the bound directories (or /usr)."""
        for host, mnt in self.binds.items():
            if _under(path, host):
                return mnt + path[len(host):]
        return path


def bwrap_path(explicit: str | None = None) -> str | None:
    return explicit if explicit and os.access(explicit, os.X_OK) else (None if explicit else shutil.which("bwrap"))


@dataclass
class Launch:
    """Everything needed to start one worker: argv, env, and the host-side scratch dir to remove."""

    argv: list[str]
    env: dict[str, str]
    host_scratch: str | None = None
    pass_fds: tuple[int, ...] = ()  # the seccomp program, read by bwrap at start; close after spawning


def build_launch(mode: str, *, isolation: bool, scratch_bytes: int, preload: tuple[str, ...],
                 bwrap: str | None = None, seccomp: bool = True) -> Launch:
    """The command that starts a runner in `mode` ('fork' or 'session')."""
    env = dict(_CHILD_ENV)
    env["RSTAR2_SANDBOX_PRELOAD"] = ",".join(preload)
    packages = package_paths()
    if not isolation:
        scratch = tempfile.mkdtemp(prefix="rstar2-sandbox-")
        env.update(HOME=scratch, TMPDIR=scratch, RSTAR2_SANDBOX_PATH=os.pathsep.join(packages))
        return Launch([python_binary(), "-I", "-S", str(RUNNER), mode, scratch], env, scratch)
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
    view = HostView([os.path.realpath(sys.base_prefix), *stdlib_paths(), os.path.dirname(py_bin), *packages])
    for host, mnt in view.binds.items():
        argv += ["--ro-bind", host, mnt]
    env["RSTAR2_SANDBOX_PATH"] = os.pathsep.join(view.inside(p) for p in packages)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_bytes), "--tmpfs", "/dev/shm",
             "--size", str(scratch_bytes), "--tmpfs", "/tmp",
             "--ro-bind", str(RUNNER), SANDBOX_RUNNER, "--remount-ro", "/", "--chdir", "/tmp"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    pass_fds: tuple[int, ...] = ()
    program = build_filter() if seccomp else None
    if program is not None:
        fd = os.memfd_create("rstar2-seccomp", 0)
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        argv += ["--seccomp", str(fd)]
        pass_fds = (fd,)
    argv += [view.inside(py_bin), "-I", "-S", SANDBOX_RUNNER, mode, "/tmp"]
    return Launch(argv, {}, None, pass_fds)


def check_isolation(bwrap: str | None = None) -> str | None:
    """None when bubblewrap can start a sandbox here, else what is wrong and how to fix it."""
    exe = bwrap_path(bwrap)
    if exe is None:
        return INSTALL_HINT
    import subprocess

    try:
        proc = subprocess.run([exe, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--proc", "/proc",
                               "--dev", "/dev", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to run ({e}). {INSTALL_HINT}"
    if proc.returncode != 0:
        return (f"bubblewrap cannot create namespaces here: {proc.stderr.decode().strip()}. Enable unprivileged "
                f"user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root. {INSTALL_HINT}")
    return None


class ProcessCap:
    """A pids cgroup per worker. Needed when we run as root: RLIMIT_NPROC is not enforced for
    processes owned by host uid 0, so a fork bomb would otherwise exhaust the host's pids."""

    ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")

    def __init__(self, name: str, max_pids: int):
        self.path: Path | None = None
        for root in self.ROOTS:
            r = Path(root)
            if not (r / "cgroup.procs").exists() or (not root.endswith("pids") and not self._has_pids(r)):
                continue
            try:
                p = r / "rstar2" / name
                p.mkdir(parents=True, exist_ok=True)
                (p / "pids.max").write_text(str(max_pids))
                self.path = p
                break
            except OSError:
                continue

    @staticmethod
    def _has_pids(root: Path) -> bool:
        try:
            return "pids" in (root / "cgroup.controllers").read_text().split()
        except OSError:
            return False

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started by a shell that first moves itself into the cgroup, then execs it. The join used to be a
        preexec_fn, which made the forked child run Python, and with it every library's os.register_at_fork
        child handler (huggingface_hub closes its httpx client, torch's inductor drops its pools, ...): in a
        multi-threaded host one of them can wait on a lock a thread held at the fork, and the worker never
        starts (tests/test_sandbox_start.py; the likely cause of a start hang once seen in a test session)."""
        if self.path is None:
            return argv
        return ["/bin/sh", "-c", '{ echo $$ > "$0"; } 2>/dev/null; exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


def needs_process_cap() -> bool:
    return os.geteuid() == 0
