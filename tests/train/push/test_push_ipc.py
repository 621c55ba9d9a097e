"""The colocated push (weight_push: ipc) through vLLM's own code on a CPU: vLLM's trainer-side IPC engine and packed
producer, the real `AsyncLLM` and its engine-core client and msgpack encoder, the worker's `update_weights`, vLLM's
packed consumer and layerwise reload, into vLLM's CPU engine. Substituted, and named so in each test: CUDA IPC
itself (handle creation and opening, the device UUID, stream sync: rstar2_agent.bench.cuda_ipc_on_cpu, which makes
handles of the same Python types torch does, so the wire meets what it meets on a GPU).

Before this push layer, the first push died in vLLM's encoder ("Object of type torch._C._TensorMeta is not
serializable") and left the engine paused: no token for 30 s."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rstar2_agent import processes
from rstar2_agent.bench import cuda_ipc_on_cpu
from rstar2_agent.bench.push_all import MovedLearner, fail_at, greedy
from rstar2_agent.bench.push_all import engine_greedy as bench_engine_greedy
from rstar2_agent.train.push import PushError
from rstar2_agent.train.push.vllm import push_in_place

from conftest import timeout_scale

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("push_ipc")]
BUFFER_MB = 128.0  # several packed chunks for SmolLM2 (its embedding alone is 108 MiB in fp32)
RANKS_BUFFER_MB = 16.0  # the tiny model's (its embedding: 12 MiB in fp32)


@pytest.fixture(scope="module")
async def ipc_engine(smol):
    """vLLM's CPU engine started with the rstar2_ipc transfer, the CUDA IPC stand-in installed in its processes (by
    environment) and in this one (the trainer's side)."""
    from rstar2_agent.train.rollout.trainable import TrainableVLLMEngine

    cuda_ipc_on_cpu.install()
    with processes.environment(cuda_ipc_on_cpu.environment()):
        engine = TrainableVLLMEngine(smol.path, context_length=512, kv_cache_gib=0.1, max_num_seqs=4,
                                     dtype="float32", weight_transfer="ipc")
    assert engine.weight_transfer == "ipc"
    assert os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") is None  # vLLM's switch stays off (see CheckedIPCEngine)
    yield engine
    await engine.close()
    cuda_ipc_on_cpu.uninstall()


@pytest.fixture(scope="module")
def learner_model(smol):
    """The learner's weights: SmolLM2 moved well away from what the engine loaded at start."""
    return MovedLearner(smol.path).model


async def engine_greedy(engine, n: int = 8) -> list[int]:
    return await bench_engine_greedy(engine, n, timeout_s=30)


async def serves(engine) -> None:
    """The engine is not paused and answers within 30 s."""
    assert not await engine.engine.is_paused()
    assert len(await engine_greedy(engine, 2)) == 2


async def test_ipc_push_through_vllms_own_code_with_cuda_ipc_substituted(ipc_engine, learner_model):
    before = await engine_greedy(ipc_engine)
    want = greedy(learner_model, 8)
    assert before != want  # the learner's weights differ from the engine's, visibly
    guard = await push_in_place(learner_model, ipc_engine, buffer_mb=BUFFER_MB, timeout_s=60)
    assert guard.error is None and guard.chunks >= 2  # packed: several chunks through one bounded buffer
    assert len(set(guard.names)) == len(dict(learner_model.named_parameters()))
    assert await engine_greedy(ipc_engine) == want  # the engine generates what the learner's weights predict
    await serves(ipc_engine)


@pytest.mark.parametrize("phase,where", [("start", "start"), ("mid-send", "update (chunk 2)"),
                                         ("receiver", "update (chunk 2)"), ("finish", "finish")])
async def test_a_failed_ipc_push_aborts_resumes_and_the_next_push_succeeds(ipc_engine, learner_model, phase, where):
    t0 = time.perf_counter()
    with pytest.raises(PushError) as info:
        await push_in_place(learner_model, ipc_engine, buffer_mb=BUFFER_MB, timeout_s=60, wrap=fail_at(phase))
    assert time.perf_counter() - t0 < 60 * timeout_scale()
    err = info.value
    assert err.backend == "ipc" and err.phase == where and err.rank == 0, str(err)
    if phase in ("mid-send", "receiver"):
        assert err.parameter  # the first parameter of the failed chunk
        assert err.mixed > 0  # chunk 1 had loaded: said, and replaced whole by the next push
    await serves(ipc_engine)  # not paused, generating
    await push_in_place(learner_model, ipc_engine, buffer_mb=BUFFER_MB, timeout_s=60)
    assert await engine_greedy(ipc_engine) == greedy(learner_model, 8)


# ---- two learner ranks (gloo): a rank 0 that fails inside vLLM's trainer engine releases the other at once
GROUP_TIMEOUT_S = 12.0


class RecordingClient:
    """Substitute for the engines (named): the trainer's client records the calls; rank 0's fails mid-send."""

    def __init__(self, fail: bool):
        self.fail, self.updates = fail, 0

    def init_weight_transfer_engine(self, info):
        pass

    def start_weight_update(self):
        pass

    def update_weights(self, info):
        self.updates += 1
        if self.fail and self.updates == 1:
            raise RuntimeError("injected: the engine refused the chunk")

    def finish_weight_update(self, weight_version=None):
        pass

    def abort(self):
        return 0


class GatheredDtypes(TorchDispatchMode):
    """Records the dtype of every all-gather of a parameter shard (the functional collective FSDP2's
    `full_tensor()` runs), by dtype: {dtype: elements}."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather_into_tensor" in str(func) and isinstance(args[0], torch.Tensor):
            name = str(args[0].dtype).removeprefix("torch.")
            self.seen[name] = self.seen.get(name, 0) + args[0].numel()
        return func(*args, **(kwargs or {}))


def _rank(rank: int, port: int, path: str, guarded: bool, out) -> None:
    import datetime

    from transformers import AutoModelForCausalLM

    from rstar2_agent.train.learner.model import shard
    from rstar2_agent.train.push.vllm import Guard, GuardedClient, ipc_trainer, send, source

    cuda_ipc_on_cpu.install()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                         timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if guarded:  # the learner's FSDP2 (fp32 master shards): the source casts each shard, then gathers
        shard(model, bf16=False)
    inner = RecordingClient(fail=rank == 0)
    t0 = time.perf_counter()
    gathered = GatheredDtypes()
    try:
        if guarded:
            guard = Guard("ipc", rank)
            with gathered:
                send(ipc_trainer(GuardedClient(inner, guard), source(model, torch.bfloat16, guard=guard), rank,
                                 RANKS_BUFFER_MB), guard, inner.abort)
        else:  # vLLM's trainer engine driven as before this push layer
            ipc_trainer(inner, source(model, None), rank, RANKS_BUFFER_MB).send_weights()
        out.put((rank, "ok", time.perf_counter() - t0, "", gathered.seen))
    except Exception as e:  # noqa: BLE001
        out.put((rank, type(e).__name__, time.perf_counter() - t0, str(e)[:300], gathered.seen))
    finally:
        cuda_ipc_on_cpu.ipc_collect()
        out.close()
        out.join_thread()  # the result written before the hard exit below
        time.sleep(GROUP_TIMEOUT_S + 60)  # alive, as a Ray learner actor stays after a failed call: the parent kills it
        os._exit(0)  # a rank left in a broken gloo group cannot always destroy it


def two_ranks(path: str, guarded: bool) -> dict[int, tuple]:
    from conftest import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, path, guarded, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, *rest = out.get(timeout=GROUP_TIMEOUT_S + 90)
            results[rank] = tuple(rest)
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    return results


def test_a_rank_0_failure_releases_every_rank_within_seconds(tiny_smollm2):
    """Two gloo ranks run vLLM's real IPC trainer engine (CUDA IPC substituted; the engines substituted by a
    recording client, whose rank 0 fails at the first chunk). Guarded, both ranks raise the same PushError in
    seconds; driven as before, rank 1 waits in vLLM's post-chunk barrier for the whole group timeout."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # both pairs of ranks at once (each waits mostly on its own processes)
        guarded, unguarded = pool.submit(two_ranks, tiny_smollm2, True), pool.submit(two_ranks, tiny_smollm2, False)
        results, old = guarded.result(), unguarded.result()
    assert {r: results[r][0] for r in (0, 1)} == {0: "PushError", 1: "PushError"}, results
    for r in (0, 1):  # FSDP2's gathers of the push moved bf16 shards only (cast before the gather: half the bytes)
        assert set(results[r][3]) == {"bfloat16"} and results[r][3]["bfloat16"] > 0, results[r][3]
    assert all(results[r][1] < GROUP_TIMEOUT_S / 2 for r in (0, 1)), results
    print(f"guarded: rank 0 {results[0][1]:.2f} s, rank 1 {results[1][1]:.2f} s")  # docs/results.md (pytest -s)
    assert "update (chunk 1)" in results[0][2] and "rank 0" in results[0][2]
    assert old[0][0] == "RuntimeError" and old[0][1] < 5, old  # rank 0 raised at once ...
    assert old[1][0] != "ok" and old[1][1] >= GROUP_TIMEOUT_S * 0.9, old  # ... and rank 1 waited out the timeout
    print(f"as before: rank 0 {old[0][1]:.2f} s, rank 1 {old[1][1]:.2f} s")
