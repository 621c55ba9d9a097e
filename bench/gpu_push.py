"""The GPU check's probes of the weight push (bench/gpu_check.py runs them; torch and transformers only, no vLLM):

- ipc: CUDA IPC as the colocated push uses it. One process exports GPU tensors as IPC handles (torch's
  `reduce_tensor`, the tuple vLLM's IPC trainer engine sends), a second process (spawned) opens each handle
  (`rebuild_cuda_tensor`), checksums it and lets it go. Twice over the same `total_mb` of bf16 weights: unpacked
  (a copy of every tensor exported and kept until the push ends, as vLLM's unpacked mode does) and packed (one
  reusable buffer of `buffer_mb`, refilled and re-exported per chunk, as vLLM's packed producer does). Per mode:
  the checksums agree, seconds, GB/s, and the sender's peak GPU memory above its weights: packed should stay near
  `buffer_mb` (the bound the push relies on; an exported block is held until the receiver releases it), unpacked
  near `total_mb`.
- probe: the push check's calibration on a GPU (train/push_check.py): the learner's teacher-forced logprobs of a
  probe sequence in bf16 (autocast on the GPU, the update's path) against the same weights in fp32, over 64 and 256
  scored tokens: the gap a run calibrates at its first push, and the bound it would then use.

On CPU (no CUDA) `ipc` runs with the CPU stand-in of CUDA IPC (rstar2_agent.bench.cuda_ipc_on_cpu: the handles
become /dev/shm files; memory is not measured), so the code path is tested here; the figures mean something only
on a GPU.
"""

from __future__ import annotations

import pickle
import select
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

CHUNK_MB = 16.0  # the "model"'s tensors: each this size, as decoder weights are tens of MB


def _stand_in() -> Any:
    """The CPU stand-in of CUDA IPC, beside this file (script or package)."""
    import importlib

    return importlib.import_module(".cuda_ipc_on_cpu", __package__) if __package__ else \
        importlib.import_module("cuda_ipc_on_cpu")


def _opener(substitute: bool) -> None:
    """The receiving process (this file run with --opener): open each handle from stdin, checksum it, drop it,
    answer on stdout; an empty message ends it."""
    if substitute:
        _stand_in().install()
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        size = int.from_bytes(inp.read(8), "little")
        if not size:
            return
        func, args = pickle.loads(inp.read(size))
        t = func(*args)
        total = float(t.double().sum().item())
        del t
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
        out.write(struct.pack("<d", total))
        out.flush()


def _memory(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def ipc(device: torch.device, total_mb: float = 1024.0, buffer_mb: float = 128.0, timeout_s: float = 120.0
        ) -> dict[str, Any]:
    """Both modes over the same weights: {"unpacked": {...}, "packed": {...}, "substituted": bool}."""
    substitute = device.type != "cuda"
    stand_in = _stand_in() if substitute else None
    if stand_in is not None:
        stand_in.install()
    from torch.multiprocessing.reductions import reduce_tensor

    on = "cuda" if device.type == "cuda" else "cpu"
    per = int(CHUNK_MB * 2**20) // 2
    g = torch.Generator(device=on).manual_seed(0)
    weights = [torch.randn(per, generator=g, device=on).to(torch.bfloat16) for _ in range(int(total_mb / CHUNK_MB))]
    proc = subprocess.Popen([sys.executable, __file__, "--opener", *(["--substitute"] if substitute else [])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    answers = proc.stdout

    def send(t: torch.Tensor) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        message = pickle.dumps(reduce_tensor(t))
        proc.stdin.write(len(message).to_bytes(8, "little") + message)
        proc.stdin.flush()
        if not select.select([answers], [], [], timeout_s)[0]:
            raise TimeoutError(f"the receiving process opened no handle in {timeout_s:.0f} s")
        return struct.unpack("<d", answers.read(8))[0]

    def close(ok: bool) -> None:
        if ok:
            proc.stdin.write((0).to_bytes(8, "little"))
            proc.stdin.flush()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    out: dict[str, Any] = {"substituted": substitute, "total_mb": total_mb, "buffer_mb": buffer_mb}
    try:
        base = _memory(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0, copies, bad = time.perf_counter(), [], 0
        for w in weights:
            copies.append(w.clone())
            bad += not _same(send(copies[-1]), w)
        seconds = time.perf_counter() - t0
        out["unpacked"] = {"checksums_agree": bad == 0, "seconds": round(seconds, 3),
                           "gb_s": round(total_mb * 2**20 / seconds / 1e9, 2),
                           "sender_peak_mb": round((_peak(device) - base) / 2**20, 1)}
        del copies
        if device.type == "cuda":
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = _memory(device)
        buffer = torch.empty(int(buffer_mb * 2**20) // 2, dtype=torch.bfloat16, device=on)
        t0, bad, chunks, i = time.perf_counter(), 0, 0, 0
        while i < len(weights):
            fill, want = 0, 0.0
            while i < len(weights) and fill + weights[i].numel() <= buffer.numel():
                buffer[fill:fill + weights[i].numel()].copy_(weights[i])
                want += float(weights[i].double().sum().item())
                fill, i = fill + weights[i].numel(), i + 1
            if fill == 0:
                raise ValueError(f"a tensor of {CHUNK_MB} MB does not fit the {buffer_mb} MB buffer")
            bad += not _same(send(buffer[:fill]), None, want)
            chunks += 1
        seconds = time.perf_counter() - t0
        out["packed"] = {"checksums_agree": bad == 0, "chunks": chunks, "seconds": round(seconds, 3),
                         "gb_s": round(total_mb * 2**20 / seconds / 1e9, 2),
                         "sender_peak_mb": round((_peak(device) - base) / 2**20, 1)}
        if device.type == "cuda":
            out["packed"]["within_bound"] = out["packed"]["sender_peak_mb"] <= buffer_mb * 1.05
        close(True)
    except BaseException:
        close(False)
        raise
    finally:
        if stand_in is not None:
            stand_in.ipc_collect()
    return out


def _same(got: float, tensor: torch.Tensor | None, want: float | None = None) -> bool:
    want = float(tensor.double().sum().item()) if tensor is not None else want
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))


def probe(folder: Path, device: torch.device, tokens: tuple[int, ...] = (64, 256)) -> dict[str, Any]:
    """The learner's bf16 (autocast) scores of a probe against its fp32 scores, same weights, on `device`; per
    length the max and mean |difference| and the bound a run would calibrate to."""
    from rstar2_agent.train.config import OptimConfig, PushCheck
    from rstar2_agent.train.learner.local import LocalLearner
    from rstar2_agent.train.push_check import calibrated_bound

    factor = PushCheck().calibration_factor
    out: dict[str, Any] = {"device": str(device), "calibration_factor": factor}
    scores: dict[str, dict[int, list[float]]] = {}
    for dtype in ("bf16", "fp32"):
        learner = LocalLearner(str(folder), OptimConfig(), 1, dtype=dtype)  # on the GPU when there is one
        out[f"{dtype}_compute"] = learner.compute_dtype
        vocab = learner.model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab, (64 + max(tokens),), generator=g).tolist()
        scores[dtype] = {n: learner.score(ids[:64 + n], 64) for n in tokens}
        del learner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for n in tokens:
        diffs = [abs(a - b) for a, b in zip(scores["bf16"][n], scores["fp32"][n], strict=True)]
        out[f"tokens_{n}"] = {"max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / n,
                              "calibrated_bound": calibrated_bound(max(diffs), factor)}
    return out


if __name__ == "__main__" and "--opener" in sys.argv:
    _opener("--substitute" in sys.argv)
