"""The GPU check's probes of what the GPU path meets in its first hour (bench/gpu_check.py runs them; torch and
transformers only):

- fork: whether a child forked after `rstar2_agent.devices.gpu_count()` (what `--engine auto` and the vllm engine
  call) can still use CUDA, against one forked after `torch.cuda.is_available()` (cudaGetDeviceCount initializes
  CUDA in the parent: vLLM's fork of its engine core then fails). Each in a fresh interpreter.
- sdpa: which attention kernels torch may choose for the masks the learner's batches give a Qwen3-14B-shaped
  attention at each --sdpa-seq length: right-padded rows (RL micro-batches; a 4-D mask), one unpadded row (the
  causal flag, no mask), and packed rows (a block-diagonal 4-D mask). Flash attention takes no explicit mask.
- fsdp: one NCCL rank (gloo on CPU) running FSDP2 as the learner ranks do (learner/model.py `shard`: bf16
  parameters for the forward, fp32 reductions), one policy update and optimizer step, then the full-state
  gather a weight push and a checkpoint use; seconds and peak memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

FORK_CHILD = """
import os, sys
sys.path.insert(0, {root!r})
import torch
if {probe!r} == "gpu_count":
    from rstar2_agent.devices import gpu_count
    n = gpu_count()
else:
    n = int(torch.cuda.is_available())
pid = os.fork()
if pid == 0:
    try:
        torch.zeros(1, device="cuda").add_(1)
        os._exit(0)
    except Exception as e:
        print(type(e).__name__, str(e).splitlines()[0][:200], flush=True)
        os._exit(3)
_, status = os.waitpid(pid, 0)
print("COUNT", n, "CHILD", os.waitstatus_to_exitcode(status), flush=True)
"""


def fork_poison(root: Path) -> dict[str, Any]:
    """Per probe: the GPUs it counted and whether a child forked after it could use CUDA."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    out: dict[str, Any] = {}
    for probe in ("gpu_count", "is_available"):
        p = subprocess.run([sys.executable, "-c", FORK_CHILD.format(root=str(root), probe=probe)],
                           capture_output=True, text=True, timeout=300)
        last = (p.stdout.strip().splitlines() or [""])[-1].split()
        ok = len(last) == 4 and last[0] == "COUNT"
        out[probe] = {"counted": int(last[1]) if ok else None, "fork_child_uses_cuda": ok and last[3] == "0",
                      "child_said": p.stdout.strip().splitlines()[0] if p.stdout.strip() else p.stderr[-300:]}
    return out


def sdpa_kernels(seq_lens: list[int], device: torch.device, heads: int = 40, kv_heads: int = 8,
                 head_dim: int = 128) -> dict[str, Any]:
    """{seq: {mask kind: {kernel: usable}}} for a Qwen3-14B attention (40 query heads, 8 KV heads, head dim 128)
    in bf16, GQA expanded as transformers does for SDPA. On a CPU only the math kernel exists: reported as is."""
    from torch.backends.cuda import (
        SDPAParams,
        can_use_cudnn_attention,
        can_use_efficient_attention,
        can_use_flash_attention,
    )

    out: dict[str, Any] = {}
    for seq in seq_lens:
        q = torch.empty(2, heads, seq, head_dim, dtype=torch.bfloat16, device=device)
        k = v = torch.empty(2, heads, seq, head_dim, dtype=torch.bfloat16, device=device)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
        padded = causal.expand(2, 1, seq, seq).clone()
        padded[1, :, :, seq // 2:] = False  # the shorter row's padding
        half = seq // 2
        packed = torch.zeros(seq, seq, dtype=torch.bool, device=device)
        packed[:half, :half], packed[half:, half:] = causal[:half, :half], causal[half:, half:]
        cases = {"padded rows (4-D mask)": (padded, False), "one row, no padding (is_causal)": (None, True),
                 "packed rows (block-diagonal mask)": (packed.expand(2, 1, seq, seq), False)}
        row: dict[str, Any] = {}
        for name, (mask, is_causal) in cases.items():
            params = SDPAParams(q, k, v, mask, 0.0, is_causal, False)
            row[name] = {"flash": bool(can_use_flash_attention(params)),
                         "efficient": bool(can_use_efficient_attention(params)),
                         "cudnn": bool(can_use_cudnn_attention(params))} if device.type == "cuda" else {"math": True}
            del params
        out[str(seq)] = row
        del q, k, v, causal, padded, packed
    return out


def fsdp_one_rank(folder: Path, device: torch.device, seq: int, batch: int) -> dict[str, Any]:
    """One FSDP2 rank over NCCL (gloo on CPU): a policy update of `batch` sequences of `seq` tokens, the optimizer
    step, and the full-state gather; seconds and peak memory of each."""
    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.model import TorchLearner
    from rstar2_agent.train.learner.update import UpdateConfig, UpdateItem, policy_update

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        learner = TorchLearner(str(folder), OptimConfig(lr=1e-6, warmup_steps=0), total_steps=1, fsdp=True)
        vocab = learner.model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        items = [UpdateItem(torch.randint(0, vocab, (16,), generator=g).tolist(),
                            torch.randint(0, vocab, (seq - 16,), generator=g).tolist(), [1] * (seq - 16),
                            [-1.0] * (seq - 16), 1.0 if i % 2 else -1.0) for i in range(batch)]
        out: dict[str, Any] = {"backend": torch.distributed.get_backend()}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        policy_update(learner, items, UpdateConfig(micro_batch=1), total_tokens=batch * (seq - 16))
        out["update_grad_norm"] = learner.optimizer_step()["grad_norm"]
        out["update_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        state = learner.full_state_dict()
        out["gather_s"] = round(time.perf_counter() - t, 3)
        out["gathered_tensors"] = len(state)
        out["gathered_on"] = sorted({str(v.device) for v in state.values()})
        if device.type == "cuda":
            out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return out
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
