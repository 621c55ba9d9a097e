"""The memory plan's formulas, at the bottom of the plan package: bytes per token of one micro-batch's activations
(`activations`, checked against measured peak memory: tests/train/test_train_plan.py on CPU, bench/gpu_check.py's memory
probe on a GPU), GiB per learner GPU (`learner_parts`) and per vLLM rollout GPU (`engine_parts`), and what makes a
learner fit (`learner_advice`). The formulas and what they leave out are in docs/memory.md.

Learner (train/learner/model.py): fp32 master weights, fp32 gradients and AdamW's two fp32 moments, FSDP2-sharded
over the learner ranks (a Ray group's `ray.learners`, or torchrun's processes for SFT), plus the bf16 copies the
compute uses (FSDP2 all-gathers each layer in bf16 and keeps the root's embedding and lm_head unsharded through
forward and backward; one process under autocast caches a bf16 copy of every weight), plus the activations of
one micro-batch. Engine: vLLM takes `gpu_memory_utilization` of its GPU (weights, KV cache, its activations), and
the collective push receives the new weights beside it, one bucket at a time (or, as it did before, the whole model).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model_shape import Shape

GIB = 2**30

PROMPT_TOKENS = 1024  # a system prompt and a competition problem, with room to spare (a plan option)

FRAGMENTATION = 0.10  # of the learner's tensors: the caching allocator's slack between blocks of varied sizes

RUNTIME_GIB = 1.5  # per GPU process: the CUDA/ROCm context, NCCL/RCCL buffers, the kernels' workspaces

VLLM_RESERVE_GIB = 2.0  # vLLM's CUDA graphs and sampler buffers beyond its profiled forward

VLLM_BATCHED_TOKENS = 8192  # max_num_batched_tokens when engine_options does not set it

DEFAULT_UTILIZATION = 0.85  # vLLM's gpu_memory_utilization in this project when a recipe does not set it

# a sleeping vLLM (colocated): its CUDA context, CUDA graphs, NCCL and sampler buffers stay; only what its cumem pool
# tagged (weights, KV cache) is released. vLLM's log says what stayed ("Sleep mode freed X GiB, Y GiB still in use")
VLLM_ASLEEP_GIB = RUNTIME_GIB + VLLM_RESERVE_GIB

PRECISIONS = ("autocast", "bf16", "fp32")

RECEIVE = ("model", "bucket", "host")


class PlanError(ValueError):
    """A recipe that cannot fit its GPUs (or cannot be planned); the message says what to change."""


# ------------------------------------------------------------------------------------------------ activations
def layer_bytes(s: Shape, precision: str, mask_len: int = 0) -> dict[str, float]:
    """Bytes per token that one decoder layer saves for its backward under SDPA (a flash or memory-efficient kernel:
    no [S, S] scores), by what holds them. `precision`: autocast (fp32 weights and residual stream, bf16 matmuls:
    one process), bf16 (bf16 weights and activations: FSDP2's MixedPrecisionPolicy), fp32. `mask_len`: with a 4D
    attention mask (padded or packed rows) each token's mask row is this long; SDPA converts the boolean mask to the
    query's dtype in every layer and keeps it, and transformers then repeats K and V to every query head."""
    r = 2 if precision == "bf16" else 4  # residual stream
    c = 4 if precision == "fp32" else 2  # matmul outputs
    w = 2 if precision == "bf16" else 4  # weights (the norms' outputs take their dtype)
    d, q, kv, inter = s.hidden, s.q, s.kv, s.intermediate

    def norm(width: int, inp: int) -> int:  # RMSNorm: the fp32 input (or its fp32 copy) and the normalized tensor
        return 4 * width + inp * width

    def inputs(width: int, n: int) -> int:  # what n linears on one input save: autocast casts it once per linear
        return n * 2 * width if precision == "autocast" else c * width

    parts: dict[str, float] = {"norms": norm(d, r) * 2, "linear_inputs": inputs(d, 3) + inputs(d, 2)}
    qn = (norm(q, c) + norm(kv, c)) if s.qk_norm else 0
    rope = w if s.qk_norm else max(c, r)  # the dtype RoPE's output ends in (cos/sin are the residual's dtype)
    cast = 2 if precision == "autocast" else rope  # SDPA's input: autocast casts it to bf16
    k_width = q if mask_len else kv  # a mask: K and V repeated to every query head (repeat_kv)
    parts["qk_norm"] = qn
    parts["attention"] = cast * q + cast * k_width + c * k_width + c * q + 4 * s.heads  # q, k, v, out, logsumexp
    parts["o_proj_input"] = c * q
    parts["mlp"] = 4 * c * inter  # gate, silu(gate), up, silu(gate) * up
    parts["mask"] = c * mask_len
    return parts


def backward_transient(s: Shape, precision: str) -> float:
    """Bytes per token a layer's backward holds beyond what was saved: the gradients of its MLP intermediates and of
    the residual stream."""
    r = 2 if precision == "bf16" else 4
    c = 4 if precision == "fp32" else 2
    return 4 * c * s.intermediate + 4 * r * s.hidden


def head_bytes(s: Shape, precision: str) -> float:
    """Bytes per token of the final norm and the lm_head's input."""
    r = 2 if precision == "bf16" else 4
    c = 4 if precision == "fp32" else 2
    return 4 * s.hidden + r * s.hidden + c * s.hidden


def logits_bytes(s: Shape, tokens: int, kind: str, chunk: int = 0) -> tuple[float, float]:
    """(peak, kept) bytes of the output head's [tokens x vocab] tensors. With the full fp32 logits (RL with
    `logprob_chunk_tokens: 0`, learner/update.py, and SFT): the log-softmax's output and the two gradients of the
    backward are fp32 [tokens x vocab] at once, 12 bytes per entry, nothing kept (RL's entropy is taken without
    gradients before the backward). `chunk` > 0: log-probabilities computed `chunk` tokens at a time, 16 bytes
    per entry of one chunk, nothing kept."""
    if chunk:
        return 16.0 * min(chunk, tokens) * s.vocab, 0.0
    return 12.0 * tokens * s.vocab, 0.0


@dataclass
class Activations:
    """One micro-batch's activation peak: `tokens` in rows of `seq` (`rows` of them), by component, in bytes."""
    tokens: int
    seq: int
    rows: int
    masked: bool
    checkpointing: bool
    precision: str
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def activations(s: Shape, tokens: int, seq: int, *, precision: str, checkpointing: bool, masked: bool,
                kind: str = "rl", logits_chunk: int = 0) -> Activations:
    """The activation peak of one forward and backward of `tokens` in rows of `seq`. Without checkpointing every
    layer's saved tensors (`layer_bytes`) are alive at the start of the backward, beside the head's logits at their
    peak. With checkpointing (transformers' per-layer `torch.utils.checkpoint`) only each layer's input is kept, and
    the backward recomputes one layer at a time: the peak is the larger of the logits' peak and one layer's recompute
    with its backward (beside what the logits keep)."""
    if precision not in PRECISIONS:
        raise PlanError(f"precision is one of {', '.join(PRECISIONS)}, not {precision!r}")
    rows = max(1, tokens // seq)
    mask_len = seq if masked else 0
    layer = sum(layer_bytes(s, precision, mask_len).values())
    r = 2 if precision == "bf16" else 4
    peak, kept = logits_bytes(s, tokens, kind, logits_chunk)
    parts: dict[str, float] = {}
    if checkpointing:
        parts["layer_inputs"] = s.layers * r * s.hidden * tokens
        extra = (layer + backward_transient(s, precision)) * tokens
    else:
        parts["layers"] = s.layers * layer * tokens
        extra = backward_transient(s, precision) * tokens
    parts["head"] = head_bytes(s, precision) * tokens
    parts["mask"] = float(rows * seq * seq) if masked else 0.0  # the boolean 4D mask, once
    parts["rope"] = 2.0 * r * s.head_dim * tokens  # cos and sin
    if peak >= kept + extra:
        parts["logits"] = peak
    else:
        parts["logits"], parts["backward" if not checkpointing else "recompute"] = kept, extra
    return Activations(tokens, seq, rows, masked, checkpointing, precision, parts)


# ------------------------------------------------------------------------------------------------ a GPU's parts
@dataclass
class LearnerSpec:
    """What sizes a learner GPU: the ranks the state is sharded over, the precision, one micro-batch."""
    world: int
    precision: str
    tokens: int
    seq: int
    masked: bool
    checkpointing: bool
    kind: str
    logits_chunk: int = 0


def learner_parts(s: Shape, spec: LearnerSpec) -> tuple[dict[str, float], Activations]:
    """GiB per learner GPU, by component; and the activations behind them."""
    p, n = s.params(), max(1, spec.world)
    act = activations(s, spec.tokens, spec.seq, precision=spec.precision, checkpointing=spec.checkpointing,
                      masked=spec.masked, kind=spec.kind, logits_chunk=spec.logits_chunk)
    parts = {"weights_fp32_shard": 4 * p / n}
    copies = compute_copies(s, spec.precision, spec.checkpointing, n)
    if copies:
        parts["weights_bf16_gathered" if n > 1 else "weights_bf16_autocast"] = copies
    parts["gradients_fp32_shard"] = 4 * p / n
    if n > 1:  # the unsharded gradients of the root and of one layer (bf16, and the fp32 its reduce-scatter sends)
        parts["gradients_unsharded"] = 2 * s.root_params() + 6 * s.layer_params()
    parts["optimizer_adamw"] = 8 * p / n
    parts["activations"] = act.total
    parts["fragmentation"] = FRAGMENTATION * sum(parts.values())
    parts["runtime"] = RUNTIME_GIB * GIB
    return {k: v / GIB for k, v in parts.items()}, act


def compute_copies(s: Shape, precision: str, checkpointing: bool, world: int) -> float:
    """Bytes of the weights' compute copies beside the fp32 masters. FSDP2 (world > 1): the root unit (embedding,
    lm_head) unsharded in bf16 through forward and backward, a layer computing and the next prefetched. One process
    under autocast: its cache keeps a bf16 copy of every weight a matmul used until the backward frees it (with
    checkpointing the cache ends with the forward: the head's copy and one recomputed layer's)."""
    if world > 1:
        b = 4 if precision == "fp32" else 2
        return b * s.root_params() + 2 * b * s.layer_params()
    if precision == "autocast":
        return 2 * (s.params() if not checkpointing else s.root_params() + s.layer_params())
    return 0.0


def engine_parts(s: Shape, options: dict[str, Any], capacity_gib: float, receive: str, bucket_mb: float,
                 context_length: int) -> tuple[dict[str, float], list[str], bool]:
    """GiB on a vLLM rollout GPU: vLLM's share (its weights, its forward, the KV cache it is left), and the push's
    receive buffers beside it. False when the KV cache cannot hold one sequence of the model's length (vLLM then
    refuses to start)."""
    tp = int(options.get("tensor_parallel_size", 1))
    util = float(options.get("gpu_memory_utilization", DEFAULT_UTILIZATION))
    batched = int(options.get("max_num_batched_tokens", VLLM_BATCHED_TOKENS))
    weights = 2 * s.params() / tp / GIB
    forward = batched * (4 * s.vocab + 2 * (2 * s.intermediate + 4 * s.hidden)) / tp / GIB + VLLM_RESERVE_GIB
    vllm = util * capacity_gib
    kv = vllm - weights - forward
    one = context_length * s.kv_bytes_per_token() / tp / GIB
    parts = {"(vllm: weights)": weights, "(vllm: forward and graphs)": forward, "(vllm: kv_cache)": max(kv, 0.0),
             "(vllm: kv for one sequence)": one, "vllm_gpu_memory_utilization": vllm}
    if receive == "model":
        parts["receive_buffers"] = weights
    elif receive == "bucket":  # a bucket holds whole layers: at least the largest, the bf16 embedding
        parts["receive_buffers"] = max(bucket_mb * 2**20, 2 * s.vocab * s.hidden) / GIB
    if receive != "host":
        parts["runtime"] = RUNTIME_GIB  # the receiving process's own context, beside vLLM's
    kv_tokens = int(kv * GIB / (s.kv_bytes_per_token() / tp)) if kv > 0 else 0
    notes = [f"KV cache {max(kv, 0):.1f} GiB = {kv_tokens:,} tokens (one sequence of {context_length:,}: "
             f"{one:.1f} GiB)"]
    return parts, notes, kv_tokens >= context_length


def host_memory_here() -> float:
    """This machine's memory in GiB (a CPU plan's capacity; a colocated node's host memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / GIB


# --------------------------------------------------------------------------------------------- what makes a learner fit
def _learner_fits(s: Shape, spec: LearnerSpec, capacity: float) -> bool:
    return sum(learner_parts(s, spec)[0].values()) <= capacity


def learner_advice(s: Shape, spec: LearnerSpec, cfg: Any, share: float, kind: str, colocated: bool = False
                    ) -> list[str]:
    if _learner_fits(s, spec, share):
        return []
    out = []
    if not spec.checkpointing and _learner_fits(s, dataclasses.replace(spec, checkpointing=True), share):
        out.append("set gradient_checkpointing: true (the learner then fits)")
    ckpt = dataclasses.replace(spec, checkpointing=True)
    if kind == "rl":
        budget = _largest_budget(s, ckpt, share)
        if budget:
            out.append(f"set micro_batch_tokens: {budget} (with gradient_checkpointing: true; the largest power of "
                       f"two that fits, at least one {spec.seq}-token trajectory)")
    else:
        rows = max((m for m in range(1, cfg.micro_batch) if _learner_fits(
            s, dataclasses.replace(ckpt, tokens=m * spec.seq), share)), default=0)
        if rows:
            out.append(f"set micro_batch: {rows} (raise grad_accum to keep the batch) with gradient_checkpointing")
    for n in (2, 4, 8, 16, 32, 64, 128):  # what sharding alone does, at this micro-batch
        if n > spec.world and _learner_fits(s, dataclasses.replace(spec, world=n, precision="bf16"), share):
            where = "ray.learners and as many engines, one GPU each" if colocated else \
                "ray.learners" if kind == "rl" else "torchrun processes"
            out.append(f"use more learner ranks: {n} ({where}; FSDP2 shards the weights, gradients and AdamW state)")
            break
    if not out and colocated:
        out.append(f"no setting fits this learner in the {share:.0f} GiB the sleeping engine and the push leave it: "
                   f"a bigger GPU, or placement: separate (the engines on GPUs of their own)")
    elif not out:
        out.append(f"no setting fits this learner in {share:.0f} GiB: a bigger GPU, or log-probabilities in chunks")
    return out


def _largest_budget(s: Shape, spec: LearnerSpec, share: float) -> int:
    best, t = 0, 1024
    while t <= 1 << 20:
        tokens = max(t, spec.seq)
        if _learner_fits(s, dataclasses.replace(spec, tokens=tokens, masked=True), share):
            best = tokens
        t *= 2
    return best
