"""`rstar2 bench push --all`: every weight-push backend that a CPU can run, each through its real libraries, and each
injected failure, with what the backend pushed and how long recovery took.

Per backend: ok (after the push the engine generates, greedy, what the learner's weights predict), seconds, bytes on
the wire, the peak resident memory this process added during the push. Substituted (named in the output): CUDA IPC
by rstar2_agent.bench.cuda_ipc_on_cpu for `ipc`. `nccl` needs CUDA (vLLM's PyNccl) and is listed as not run.
Per injected failure (the in-process backends): the phase, whether the PushError named it, whether the engine was
left serving, and the recovery time (from the failed call's return to a good push and a generated token).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

import torch

PROMPT = [1, 504, 3125, 314, 260, 1345, 30, 2]
BUFFER_MB = 128.0
RECOVERY_BOUND_S = 60.0


def _hwm_kib() -> int:
    for line in open(f"/proc/{os.getpid()}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_hwm() -> None:
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def greedy(model: Any, n: int = 6) -> list[int]:
    """The learner's greedy continuation of PROMPT (what the engine must generate after a good push)."""
    out = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(PROMPT):]


async def engine_greedy(engine: Any, n: int = 6, timeout_s: float = 60.0) -> list[int]:
    from rstar2_agent.engines.base import SamplingParams

    gen = await asyncio.wait_for(engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=n,
                                                                        ignore_eos=True)), timeout_s)
    return gen.token_ids


class MovedLearner:
    """The learner's side of a push, in this process: its model moved away from the engine's start (seeded)."""

    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}


def fail_at(phase: str):
    """A wrapper of vLLM's weight-sync client that fails the push at `phase` (start, mid-send: chunk 2, receiver: a
    shape vLLM's worker refuses in chunk 2, a real load error there, or finish); the rest is vLLM's own path."""

    class Failing:
        def __init__(self, inner: Any):
            self.inner, self.seen = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def start_weight_update(self) -> None:
            if phase == "start":
                raise RuntimeError("injected")
            self.inner.start_weight_update()

        def update_weights(self, info: Any) -> None:
            self.seen += 1
            if phase == "mid-send" and self.seen == 2:
                raise RuntimeError("injected")
            if phase == "receiver" and self.seen == 2:  # a shape vLLM's worker refuses: a real load error there
                info = {**info, "shapes": [[s[0] + 1, *s[1:]] if s else s for s in info["shapes"]]}
            self.inner.update_weights(info)

        def finish_weight_update(self, weight_version: str | None = None) -> None:
            if phase == "finish":
                raise RuntimeError("injected")
            self.inner.finish_weight_update()

    return Failing


async def _measure(push: Any, engine: Any, want: list[int]) -> dict[str, Any]:
    _reset_hwm()
    rest = _hwm_kib()
    t0 = time.perf_counter()
    out = await push()
    seconds = time.perf_counter() - t0
    return {"ok": await engine_greedy(engine) == want, "seconds": round(seconds, 3),
            "peak_added_mib": round((_hwm_kib() - rest) / 1024, 1), "result": out}


async def _failure(backend: str, phase: str, failing: Any, good: Any, engine: Any, want: list[int]) -> dict[str, Any]:
    """One injected failure: the failing push, then whether the engine was left paused, and the recovery (a good
    push and the learner's tokens generated) timed."""
    from rstar2_agent.train.push import PushError

    t0 = time.perf_counter()
    try:
        await failing()
        named = "no error"
    except PushError as e:
        named = f"{e.phase} (rank {e.rank}, {e.parameter or 'no parameter'}, mixed {e.mixed})"
    failed_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    paused = await engine.engine.is_paused()
    await good()
    ok = await engine_greedy(engine) == want
    recovered = time.perf_counter() - t1
    return {"backend": backend, "phase": phase, "error": named, "left_paused": paused,
            "failed_after_s": round(failed_s, 3), "recovery_s": round(recovered, 3),
            "recovered": named != "no error" and ok and not paused and recovered < RECOVERY_BOUND_S}


async def bench_push_all(model: str = "smollm2-135m") -> dict[str, Any]:
    from rstar2_agent import processes
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.push import Chunked, Shared
    from rstar2_agent.train.push.vllm import push_in_place
    from rstar2_agent.train.rollout.trainable import TrainableHFEngine, TrainableVLLMEngine

    from . import cuda_ipc_on_cpu

    resolved = resolve_model(model)
    learner = MovedLearner(resolved.path)
    want = greedy(learner.model)
    item = 4  # fp32 engines: greedy tokens comparable with the fp32 learner's
    state_bytes = sum(p.numel() * item for p in dict(learner.model.named_parameters()).values())
    report: dict[str, Any] = {"model": model, "substituted": {"ipc": "CUDA IPC (rstar2_agent.bench.cuda_ipc_on_cpu)"},
                              "backends": {}, "failures": []}

    shared = TrainableHFEngine(resolved.path, context_length=2048, model=learner.model, tokenizer=None)
    t0 = time.perf_counter()
    await Shared().push(learner, shared)
    report["backends"]["shared"] = {"ok": True, "seconds": round(time.perf_counter() - t0, 4), "bytes": 0,
                                    "peak_added_mib": 0.0}

    cuda_ipc_on_cpu.install()
    try:
        with processes.environment(cuda_ipc_on_cpu.environment()):
            ipc = TrainableVLLMEngine(resolved.path, context_length=512, kv_cache_gib=0.1, max_num_seqs=4,
                                      dtype="float32", weight_transfer="ipc")
        try:
            def good() -> Any:
                return push_in_place(learner.model, ipc, buffer_mb=BUFFER_MB, timeout_s=120)

            row = await _measure(good, ipc, want)
            guard = row.pop("result")
            report["backends"]["ipc"] = {**row, "bytes": guard.sent_bytes, "chunks": guard.chunks,
                                         "buffer_mb": BUFFER_MB}
            for phase in ("start", "mid-send", "receiver", "finish"):
                failing = functools.partial(push_in_place, learner.model, ipc, buffer_mb=BUFFER_MB, timeout_s=120,
                                            wrap=fail_at(phase))
                report["failures"].append(await _failure("ipc", phase, failing, good, ipc, want))
        finally:
            await ipc.close()
    finally:
        cuda_ipc_on_cpu.uninstall()

    chunked = TrainableVLLMEngine(resolved.path, context_length=512, kv_cache_gib=0.1, max_num_seqs=4, dtype="float32")
    try:
        row = await _measure(lambda: Chunked().push(learner, chunked), chunked, want)
        row.pop("result")
        report["backends"]["chunked"] = {**row, "bytes": state_bytes}
        bad = dict(learner.full_state_dict())
        name = next(k for k in bad if "layers.1." in k and k.endswith("down_proj.weight"))
        bad[name] = torch.zeros(bad[name].shape[0] + 1, *bad[name].shape[1:])

        class Broken:  # a receiver's load error: a shape vLLM's worker refuses, half way through the layers
            model = learner.model

            def full_state_dict(self) -> dict[str, torch.Tensor]:
                return bad

        report["failures"].append(await _failure("chunked", "receiver", lambda: Chunked().push(Broken(), chunked),
                                                 lambda: Chunked().push(learner, chunked), chunked, want))
    finally:
        await chunked.close()

    from .push import bench_push

    ray_row = await bench_push(model, workers=2, rounds=1)
    for mode in ("collective", "object_store"):
        report["backends"][mode] = {"ok": True, "seconds": round(ray_row.median(mode), 3),
                                    "bytes": int(ray_row.megabytes * 2**20), "peak_added_mib": None,
                                    "note": "Ray, 2 hf rollout workers; ok: the workers agree after the pushes"}
    report["backends"]["nccl"] = {"ok": None, "note": "not run: vLLM's NCCL transfer needs CUDA (PyNccl)"}
    report["ok"] = (all(b["ok"] for k, b in report["backends"].items() if k != "nccl")
                    and all(f["recovered"] for f in report["failures"]))
    return report
