from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rstar2_agent.sandbox import Limits, LocalSandbox, SandboxConfig

if TYPE_CHECKING:
    from rstar2_agent.train.config import RLConfig

ROOT = Path(__file__).resolve().parents[1]
HOST_SECRET = "RSTAR2_TEST_HOST_SECRET"


def children(pid: int) -> list[int]:
    """All descendants of `pid`, read from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def pytest_configure(config) -> None:
    """The 40 slowest tests are listed after every run (CI's log shows where the suite's time goes), unless the
    command line asks for another number (`--durations=0`: all)."""
    if config.option.durations is None:
        config.option.durations = 40
    # pytest-xdist's loadgroup marks a group in the test ids (`id@group`) through an attribute pytest 9 no longer
    # reads: every group would be spread over the workers, each building the shared engines and the SFT checkpoint
    # itself (minutes of CPU, twice the memory)
    if getattr(config.option, "dist", None) == "loadgroup" and pytest.version_tuple[0] >= 9:
        raise pytest.UsageError(f"pytest {pytest.__version__} breaks pytest-xdist's --dist loadgroup (the shared "
                                "fixtures would be built on every worker): install the pinned pytest<9 (make install)")
    # On pytest-xdist workers torch gets its share of the cores (at least 1: 1 each for 3 workers on 2 cores), unless
    # the environment says: workers whose torch each spins 2 threads on 2 cores slow each other down several times.
    # Subprocesses and Ray actors inherit it.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    # Ray starts its worker processes (every actor) at nice 15, below the other pytest workers at 0: on a busy
    # 2-core machine the actors get a small fraction of the CPU and a Ray test runs 5-8 times longer than beside
    # processes of its own niceness (Ray's `worker_niceness`; the raylet reads it when the local cluster starts)
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray's memory monitor kills actors once the node is at 95% of its memory; beside the other workers' peaks the
    # suite brushes that on 24 GiB (22.7 GB seen), so the Ray tests' actors are killed while the kernel would have
    # coped: the monitor steps in at 99% here (Ray's `memory_usage_threshold`)
    os.environ.setdefault("RAY_memory_usage_threshold", "0.99")
    # the timeouts were set on one machine; a slower one gets them scaled (the workers inherit the figure)
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(TIMEOUT_SCALE_ENV, f"{machine_slowness():.2f}")
        # vLLM names its engine's IPC sockets /tmp/UUID and leaves them there when the engine ends: the suite's go
        # in a folder of its own, removed when the run ends (the workers inherit it)
        if "VLLM_RPC_BASE_PATH" not in os.environ:
            config.stash[RPC_DIR] = os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="rstar2-vllm-rpc-")


def _cpu_s() -> float:
    """CPU-seconds of this process (every thread) and of the children it has waited for."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# On 2 cores the suite is bound by CPU, not by waits, so its time goes where its CPU goes: each test's CPU-seconds
# (setup, call and teardown; the worker and the children it reaped: a daemon reaped by another, as Ray's raylet reaps
# its actors, is not counted) ride on its teardown report, and the costliest are listed after the run
CPU_KEY = "cpu_s"
COSTLIEST = 25


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[CPU_AT] = _cpu_s()
    item.stash[CPU_LAST] = nextitem is None
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The CPU since the test's setup began, on its teardown report; a worker's last test stops at its call: its
    teardown ends the session's fixtures and reaps their processes (a vLLM engine's whole session)."""
    outcome = yield
    if CPU_AT not in item.stash:
        return
    if call.when == "teardown" or call.when == "call" and item.stash[CPU_LAST]:
        item.stash.setdefault(CPU_DONE, round(_cpu_s() - item.stash[CPU_AT], 2))
    if call.when == "teardown":
        outcome.get_result().user_properties.append((CPU_KEY, item.stash[CPU_DONE]))


def pytest_runtest_logreport(report) -> None:
    cpu = dict(report.user_properties).get(CPU_KEY) if report.when == "teardown" else None
    if cpu is not None:
        CPU_SPENT[report.nodeid] = cpu


def pytest_terminal_summary(terminalreporter) -> None:
    if not CPU_SPENT:
        return
    costliest = sorted(CPU_SPENT.items(), key=lambda kv: -kv[1])[:COSTLIEST]
    terminalreporter.write_sep("=", f"CPU-seconds: {sum(CPU_SPENT.values()):,.0f} in {len(CPU_SPENT)} tests; "
                                    f"the {len(costliest)} costliest")
    for nodeid, cpu in costliest:
        terminalreporter.write_line(f"{cpu:8.1f}  {nodeid}")


CPU_AT, CPU_DONE = pytest.StashKey[float](), pytest.StashKey[float]()
CPU_LAST = pytest.StashKey[bool]()
CPU_SPENT: dict[str, float] = {}


def pytest_unconfigure(config) -> None:
    if RPC_DIR in config.stash:
        shutil.rmtree(config.stash[RPC_DIR], ignore_errors=True)


RPC_DIR = pytest.StashKey[str]()


# Every timeout of the suite (pytest-timeout's per test, and `until`'s) is multiplied by the machine's slowness: the
# CPU time of a fixed pure-Python loop against its time on the machine the timeouts were set on (2 cores, where
# `make test` takes the time docs/results.md gives), at least 1 and at most 4. RSTAR2_TEST_TIMEOUT_SCALE sets it.
# A 2-core machine 2-4 times slower otherwise fails the first test of a shared fixture (the fixture's setup counts
# in that test's timeout) with nothing wrong but the clock.
TIMEOUT_SCALE_ENV = "RSTAR2_TEST_TIMEOUT_SCALE"
PROBE_REFERENCE_S = 0.25


def machine_slowness() -> float:
    best = float("inf")
    for _ in range(3):
        started, x = time.process_time(), 0
        for i in range(2_000_000):
            x += i * i % 7
        best = min(best, time.process_time() - started)
    return min(4.0, max(1.0, best / PROBE_REFERENCE_S))


def timeout_scale() -> float:
    return float(os.environ.get(TIMEOUT_SCALE_ENV, "1"))


def pytest_report_header(config) -> str:
    return f"timeouts x{timeout_scale():.2f} for this machine's speed ({TIMEOUT_SCALE_ENV} sets it)"


# `make test` runs the suite on 3 pytest-xdist workers on 2 cores (--dist loadgroup): the tests wait on processes,
# servers and the sandbox for part of their time, and the other workers fill it. A session fixture is made once per
# worker, so the tests of the costly ones run on one worker, as a group: the in-process vLLM engines (SmolLM2's and
# the tiny model's, together), the SFT checkpoint. Ray's tests form a group of their own
# (pytest.mark.xdist_group("ray")): one local cluster at a time.
SHARED_FIXTURES = {"vllm_engine": "vllm-engine", "tiny_vllm_engine": "vllm-engine",
                   "sft_checkpoint": "sft-checkpoint"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config, items) -> None:
    """Each test of a costly shared fixture joins its group; then the longest groups go first, then the other grouped
    and slow tests (the longest work is handed out first, and the many short tests fill the end), in file order
    otherwise (the sort is stable)."""
    for item in items:
        group = next((g for f, g in SHARED_FIXTURES.items() if f in getattr(item, "fixturenames", ())), None)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
        if timeout_scale() > 1.0:
            marker = item.get_closest_marker("timeout")
            base = float(marker.args[0]) if marker and marker.args else float(config.getini("timeout") or 0)
            if base:
                item.add_marker(pytest.mark.timeout(base * timeout_scale()), append=False)
    items.sort(key=_order)


# xdist hands out work units (a group, else a test module) in the order of their first test, two to a worker at the
# start: the longest chains first, so that none starts last and runs alone at the end
LONGEST_GROUPS = ("ray", "sft-checkpoint", "vllm-engine")


def _order(item) -> tuple[int, float]:
    """The longest groups; then the other grouped and slow tests, those that declare the longest timeouts first (a
    long test handed out late runs alone at the end, on one of the cores); then the short ones."""
    group = item.get_closest_marker("xdist_group")
    name = group.args[0] if group and group.args else group.kwargs.get("name") if group else None
    if name in LONGEST_GROUPS:
        return 0, LONGEST_GROUPS.index(name)
    if group or item.get_closest_marker("slow"):
        timeout = item.get_closest_marker("timeout")
        return 1, -float(timeout.args[0]) if timeout and timeout.args else 0.0
    return 2, 0


def run_until_paused(args: list[str], pause: str, env: dict[str, str], sig: int = 9, within: float = 30.0,
                     seen: list[str] | None = None) -> str:
    """Run `args` (an `rstar2` command line) under the test hook of tests/pause_hook.py with
    RSTAR2_TEST_PAUSE_AT=`pause` and, once it says it stopped there, SIGKILL its process group (`sig` 9), or send
    `sig` to the command alone, as `kill` does, and fail unless it ends by itself within `within` seconds; its
    stdout so far (`seen` gets its last stderr lines and its exit status). Fails the test if it ends before
    pausing."""
    import signal
    import subprocess
    import tempfile

    args = [sys.executable, str(ROOT / "tests" / "pause_hook.py"), *args[1:]]
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: a full unread pipe would block the command
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.PIPE, text=True,
                                env={**env, "RSTAR2_TEST_PAUSE_AT": pause}, start_new_session=True)
        tail: list[str] = []
        try:
            for line in proc.stderr:
                tail = (tail + [line])[-40:]
                if f"test hook: paused at {pause}" in line:
                    break
            else:
                proc.wait(timeout=30)
                pytest.fail(f"the command ended (status {proc.returncode}) before pausing at {pause}:\n"
                            f"{''.join(tail)}")
            if sig != signal.SIGKILL:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=within)
                except subprocess.TimeoutExpired:
                    threads = _threads(proc.pid)
                    os.killpg(proc.pid, signal.SIGKILL)
                    pytest.fail(f"the command was still running {within:.0f} s after signal {sig}; its threads:\n"
                                f"{threads}\nits stderr:\n" + "".join(tail + proc.stderr.readlines()[-60:]))
                tail += proc.stderr.readlines()[-40:]
                left = [pid for pid in _group(proc.pid) if pid != proc.pid]
                assert not left, f"processes of the command's group outlived it: {left}"
        finally:
            with contextlib.suppress(ProcessLookupError):  # with sig != 9 the group is gone (checked above)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if seen is not None:
            seen += [*tail, f"exit status {proc.returncode}"]
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        out.seek(0)
        return out.read()

def _threads(pid: int) -> str:
    """Each thread of `pid`: name, state, kernel wait and signal masks (for a command that ignores a signal)."""
    lines = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        with contextlib.suppress(OSError):
            status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/task/{tid}/status").read().splitlines()
                          if ":\t" in line)
            wchan = open(f"/proc/{pid}/task/{tid}/wchan").read()
            lines.append(f"{tid} {status.get('Name')} {status.get('State')} {wchan} blk {status.get('SigBlk')} "
                         f"pnd {status.get('SigPnd')} shd {status.get('ShdPnd')} cgt {status.get('SigCgt')}")
    return "\n".join(lines)


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                out.append(int(entry))
    return out


async def until(condition, what, timeout: float = 20.0) -> None:
    """Wait for `condition()` (a plain or an async callable) to hold, polling every 20 ms; fail after `timeout`
    seconds naming what was awaited (`what`: a string, or a callable that says it at the timeout, e.g. naming what
    is left). For waits on a state the test can observe, instead of a fixed sleep."""
    import inspect
    import time

    timeout *= timeout_scale()
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.02)


def until_sync(condition, what, timeout: float = 20.0, every: float = 0.02) -> None:
    """`until` for a synchronous test: wait for `condition()` to hold, polling every `every` seconds; fail after
    `timeout` seconds naming what was awaited (`what`: as for `until`)."""
    import time

    timeout *= timeout_scale()
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(every)


def push_group_members(world: int, timeout_s: float) -> list:
    """`world` members of one push group (train/push/collective.py) on a free loopback port, joined from threads
    (rank 0 hosts the store; all meet at once)."""
    import threading

    from rstar2_agent.train.push.collective import WeightGroup

    port, groups, errors = free_port(), [None] * world, []

    def join(rank: int) -> None:
        try:
            groups[rank] = WeightGroup("127.0.0.1", port, rank, world, timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return groups


def tiny(tmp_path, **kw) -> RLConfig:
    """A small RL run of SmolLM2 writing under `tmp_path`: 2 steps of 2 prompts x 2 rollouts, 48 response tokens,
    2 turns, markdown format; `kw`: RLConfig fields to change. The base SmolLM2 and the tiny random model write no
    answer the reward reads, so the start check is off (tests/train/test_start_check.py has its own)."""
    from rstar2_agent.train.config import RLConfig, Stage, StartCheck

    base = dict(model="smollm2-135m", stages=[Stage(steps=2, max_response_tokens=48, max_turns=2, data_size=8)],
                prompts_per_step=2, group_size=2, roc_min_positive=1, roc_min_negative=1, micro_batch=4,
                out=str(tmp_path / "rl"), db=str(tmp_path / "s.db"), format="markdown",
                start_check=StartCheck(min_answer_share=0.0))
    return RLConfig(**{**base, **kw})


def hang_grade(text: str, gold: str, extraction: str = "paper"):
    """A math comparison that never ends (it stands in for the grader's `_grade` in its worker processes)."""
    import time

    time.sleep(60)


def chat_prompt_ids(question: str, format_name: str, model: str) -> list[int]:
    """`rstar2 chat -p QUESTION --json --format F --model MODEL` (hf engine, 8 tokens): its prompt ids. The prompt is
    the tokenizer's and the format's, so the tiny SmolLM2 (SmolLM2's tokenizer) gives SmolLM2's."""
    import json
    import subprocess
    import sys

    p = subprocess.run([str(Path(sys.executable).with_name("rstar2")), "chat", "--model", model, "--engine",
                        "hf", "-p", question,
                        "--json", "--format", format_name, "--max-turns", "1", "--max-tokens", "8", "--temperature",
                        "0"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["prompt_ids"]


def count_prompt(tokenizer) -> list[int]:
    """A short chat prompt's ids ("Count from 1 to 20."), for the engine tests."""
    return tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 20."}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)


class ScriptedEngine:
    """A fake engine: answers each generate() with the next scripted text (SmolLM2's tokenizer) and the end of
    turn, so the real agent loop, chat format, parser and sandbox run on known model output (SmolLM2 does not
    write these calls by itself). `seeds` and `prompts`: the sampling seed and the prompt ids of every call, in
    order."""

    name, model_path = "scripted", "scripted"

    def __init__(self, tokenizer, texts: list[str], context_length: int = 8192):
        self.tokenizer, self.texts, self.context_length = tokenizer, list(texts), context_length
        self.seeds: list[int | None] = []
        self.prompts: list[list[int]] = []

    def prompt_text(self, k: int) -> str:
        return self.tokenizer.decode(self.prompts[k])

    async def probe(self) -> None:  # the Engine interface: a local engine knows its limits
        pass

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        from rstar2_agent.engines.base import Generation

        self.seeds.append(sampling.seed)
        self.prompts.append(list(prompt_ids))

        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


class StreamingScriptedEngine(ScriptedEngine):
    """The scripted engine, handing its ids on one token at a time (`delay` seconds apart), as a real engine
    streams them; `last_token_at` is when it produced its last token."""

    def __init__(self, tokenizer, texts, delay: float = 0.0):
        super().__init__(tokenizer, texts)
        self.delay, self.last_token_at = delay, 0.0

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        from rstar2_agent.engines.base import Generation

        self.seeds.append(sampling.seed)
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        for i in ids:
            await asyncio.sleep(self.delay)
            if on_tokens is not None:
                on_tokens([i], [0.0])
        self.last_token_at = time.monotonic()
        return Generation(ids, [0.0] * len(ids), "stop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def uvicorn_app(app):
    """Serve an ASGI app with a real uvicorn on a free loopback port, in this event loop."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            raise RuntimeError(f"server did not start: {task.exception()}")
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture(scope="session")
async def sandbox():
    """One isolated pool for the tests that only run code (faults that break workers use their own)."""
    os.environ[HOST_SECRET] = "do-not-leak"
    sb = LocalSandbox(SandboxConfig(workers=2, limits=Limits(wall_seconds=5, cpu_seconds=5)))
    await sb.start()
    yield sb
    await sb.close()


@pytest.fixture(scope="session")
def smol():
    """The embedded SmolLM2-135M-Instruct, converted from its packaged GGUF once (into $RSTAR2_HOME)."""
    from rstar2_agent.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer(smol):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol.path)


@pytest.fixture(scope="session")
def tiny_smollm2(smol, tmp_path_factory):
    """SmolLM2's config cut to 2 narrow layers, random weights (seeded), saved with SmolLM2's tokenizer: the real
    architecture, tokenizer, engines and learner, in seconds. For the tests of machinery that any policy exercises
    (the learner's passes, Ray's faults, kills and resumes); what the trained SmolLM2 itself must do is tested on
    SmolLM2."""
    from rstar2_agent.models import tiny_variant

    return str(tiny_variant(smol.path, tmp_path_factory.mktemp("tiny") / "tiny-smollm2"))


@pytest.fixture(scope="session")
def engine(smol):
    """One hf engine with SmolLM2 for the whole session (the agent loop, eval, serve and validation tests)."""
    from rstar2_agent.engines.hf import HFEngine

    return HFEngine(smol.path, context_length=smol.spec.context_length)


@pytest.fixture(scope="session")
def tiny_engine(tiny_smollm2):
    """One hf engine with the tiny SmolLM2 for the session: for the serving and client machinery under load (retries,
    replica pools, many concurrent requests), where what the model writes does not matter."""
    from rstar2_agent.engines.hf import HFEngine

    return HFEngine(tiny_smollm2, context_length=2048)


async def metrics_once_idle(client, url: str, tries: int = 60) -> str:
    """/metrics, read again every 0.25 s (at most `tries` times) until no request is in flight: a cancelled
    request leaves the server a moment after its client."""
    for _ in range(tries):
        metrics = (await client.get(f"{url}/metrics")).text
        if "rstar2_requests_in_flight 0.0" in metrics:
            break
        await asyncio.sleep(0.25)
    return metrics


VLLM_CONTEXT = 2048


@pytest.fixture(scope="session")
async def vllm_engine(smol):
    """One in-process vLLM engine (CPU build, about half a minute to start) for the session: the engine tests
    and the serve soak share it."""
    from rstar2_agent.train.rollout.trainable import TrainableVLLMEngine

    engine = TrainableVLLMEngine(smol.path, context_length=VLLM_CONTEXT, kv_cache_gib=1.0)
    yield engine
    await engine.close()


@pytest.fixture(scope="session")
async def tiny_vllm_engine(tiny_smollm2):
    """The same on the tiny SmolLM2, on the same worker: for bounded staleness, whose cost is the rollouts and
    learner updates between pushes and whose properties hold for any policy (what it saves: docs/results.md, the
    test suite)."""
    from rstar2_agent.train.rollout.trainable import TrainableVLLMEngine

    engine = TrainableVLLMEngine(tiny_smollm2, context_length=VLLM_CONTEXT, kv_cache_gib=0.25)
    yield engine
    await engine.close()


@contextlib.asynccontextmanager
async def serving(engine, sandbox, **cfg):
    """A `rstar2 serve` app (markdown tool protocol, serving "smollm2-135m") on loopback; `cfg`: ServeConfig
    fields to change."""
    from rstar2_agent.serve.app import create_app
    from rstar2_agent.serve.server import ServeConfig, Server

    server = Server(engine, sandbox, ServeConfig(**{"model_name": "smollm2-135m", "format": "markdown", **cfg}))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        yield url


@pytest.fixture(scope="session")
async def serve_url(engine, sandbox):
    """One `rstar2 serve` app on loopback for the session, over the shared engine and sandbox."""
    async with serving(engine, sandbox) as url:
        yield url


def sft_config(out, **kw):
    """A small SFT run of SmolLM2 writing under `out`: 6 synthetic conversations, one epoch, lr 1e-4."""
    from rstar2_agent.train.config import OptimConfig, SFTConfig

    base = dict(data=["synthetic:6:0"], seq_len=1024, micro_batch=1, grad_accum=1, epochs=1, out=str(out / "sft"),
                optim=OptimConfig(lr=1e-4, warmup_steps=0), db=str(out / "store.db"))
    return SFTConfig(**{**base, **kw})


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory):
    """One SFT run (sft_config on 4 conversations, 2 epochs = 8 steps), made once: (final folder, loss history). The
    SFT tests check it; vLLM's own server serves it in test_vllm_server.py."""
    from rstar2_agent.train.sft import run_sft

    return run_sft(sft_config(tmp_path_factory.mktemp("sft-checkpoint"), epochs=2, data=["synthetic:4:0"]))
