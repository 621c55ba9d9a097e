"""Starting sandbox workers from a busy, multi-threaded host (an engine's threads, uvicorn, libraries with
at-fork handlers) must not hang. The hang once seen after the serve tests: the worker's cgroup join ran as a
preexec_fn, so the forked child ran Python, and with it every os.register_at_fork child handler of every
library loaded (huggingface_hub closes its httpx client, torch's inductor resets its pools). A handler that
waits on a lock another thread held at the fork never returns in the child, and the worker's hello never
comes. Reproduced here in isolation, in a fresh interpreter so the handler does not stay in this one; a control
start with a preexec_fn in the same host shows that the host does hang such a start (so the test holds where no
pids cgroup is used, and the worker start would run no Python in the child anyway)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

HOST = """
import asyncio, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from rstar2_agent.sandbox.isolation import uses_cgroups
from rstar2_agent.sandbox.types import Limits
from rstar2_agent.sandbox.worker import Worker

# A library's pool lock, held by a thread that is busy when the host forks (an HTTP client mid-request)...
pool_lock = threading.Lock()
held = threading.Event()

def busy():
    with pool_lock:
        held.set()
        time.sleep(3600)

threading.Thread(target=busy, daemon=True).start()
held.wait()
# ...and that library's child handler, which takes the lock (as closing a client takes its pool's lock).
os.register_at_fork(after_in_child=lambda: pool_lock.acquire())

async def main():
    w = Worker("fork", Limits(), isolation=True, preload=(), startup_timeout=20)
    t0 = time.monotonic()
    await w.start()
    started = time.monotonic() - t0
    r = await w.call("print(6 * 7)", "", 5)
    in_cap = None
    if w.cgroup is not None and w.cgroup.procs:  # root: the worker's processes live in their cgroups
        in_cap = all(str(w.pid) in p.read_text().split() for p in w.cgroup.procs)
    await w.close()
    # The control: the old start's way, Python between fork and exec (a preexec_fn), hangs in this host
    # (Popen waits for the exec that never comes).
    import signal, subprocess
    control = threading.Thread(target=subprocess.Popen, args=(["/bin/true"],), kwargs={"preexec_fn": lambda: 0},
                               daemon=True)
    control.start()
    control.join(3)
    print(f"started {started:.2f} output {r.stdout.strip()} cap {uses_cgroups()} in_cap {in_cap} "
          f"control_hung {control.is_alive()}", flush=True)
    for pid in os.listdir("/proc"):  # the hung child
        try:
            if pid.isdigit() and open(f"/proc/{pid}/stat").read().split()[3] == str(os.getpid()):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)

asyncio.run(main())
"""


def test_a_worker_starts_while_another_thread_holds_a_lock_an_at_fork_handler_needs():
    p = subprocess.run([sys.executable, "-c", HOST, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    words = p.stdout.split()
    assert words[words.index("output") + 1] == "42"
    assert float(words[words.index("started") + 1]) < 20
    assert words[words.index("control_hung") + 1] == "True"  # the host does hang a start that runs Python
    if words[words.index("cap") + 1] == "True":
        assert words[words.index("in_cap") + 1] == "True"  # the fork-bomb cap still applies
