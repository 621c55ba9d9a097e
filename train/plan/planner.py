"""The memory plan (`rstar2 train plan`): what each GPU of a recipe's placement holds at its peak, and whether it
fits, before a GPU is rented. The formulas and what they leave out are in docs/memory.md; `activations` was checked
against measured peak memory of a scaled-down model of the same shape (tests/test_train_plan.py, CPU;
bench/gpu_check.py's memory probe, GPU).

Learner (train/learner/model.py): fp32 master weights, fp32 gradients and AdamW's two fp32 moments, FSDP2-sharded
over the learner ranks (a Ray group's `ray.learners`, or torchrun's processes for SFT), plus the bf16 copies the
compute uses (FSDP2 all-gathers each layer in bf16 and keeps the root's embedding and lm_head unsharded through
forward and backward; one process under autocast caches a bf16 copy of every weight), plus the activations of
one micro-batch. Engine: vLLM takes `gpu_memory_utilization` of its GPU (weights, KV cache, its activations), and
the collective push receives the new weights beside it, one bucket at a time (or, as it did before, the whole model).
This module holds those parts, the separate and one-process placements, the advice, the rendering and the check
before a run. The colocated placement (`placement: colocated`: a learner rank and an engine shard on each GPU, in two
phases) and its host memory are planned in plan_colocated.py, which builds on this module; imported where used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .shapes import Shape, ShapeError, model_shape

if TYPE_CHECKING:
    from .plan_colocated import Host

log = logging.getLogger(__name__)
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


# ------------------------------------------------------------------------------------------------ the plan
@dataclass
class GPU:
    """One kind of GPU in the placement: `count` of them, each holding `parts` (GiB)."""
    role: str
    count: int
    capacity_gib: float
    parts: dict[str, float]
    notes: list[str] = field(default_factory=list)
    ok: bool = True  # beyond the sum: e.g. the KV cache holds one sequence of the model's length

    @property
    def total_gib(self) -> float:
        return sum(v for k, v in self.parts.items() if not k.startswith("("))

    @property
    def fits(self) -> bool:
        return self.ok and self.total_gib <= self.capacity_gib

    def as_json(self) -> dict[str, Any]:
        return {"role": self.role, "count": self.count, "capacity_gib": round(self.capacity_gib, 2),
                "total_gib": round(self.total_gib, 2), "fits": self.fits,
                "components_gib": {k.strip("()"): round(v, 3) for k, v in self.parts.items()}, "notes": self.notes}


@dataclass
class Plan:
    recipe: str
    kind: str
    model: str
    shape: Shape
    placement: str
    gpus: list[GPU]
    gpus_needed: int
    gpus_given: int | None
    settings: dict[str, Any]
    activations_gib: dict[str, float]
    advice: list[str] = field(default_factory=list)
    host: Host | None = None  # colocated: the sleeping engines' weights in host memory

    @property
    def fits(self) -> bool:
        return (all(g.fits for g in self.gpus) and (self.gpus_given is None or self.gpus_given >= self.gpus_needed)
                and (self.host is None or self.host.fits))

    def as_json(self) -> dict[str, Any]:
        out = {"recipe": self.recipe, "kind": self.kind, "model": self.model, "shape": self.shape.as_json(),
               "placement": self.placement, "gpus_needed": self.gpus_needed, "gpus_given": self.gpus_given,
               "fits": self.fits, "settings": self.settings, "activations_gib": self.activations_gib,
               "gpus": [g.as_json() for g in self.gpus], "advice": self.advice}
        if self.host is not None:
            out["host"] = self.host.as_json()
        return out


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


def _precision(dtype: str, world: int, on_gpu: bool) -> str:
    if dtype == "fp32" or (dtype == "auto" and not on_gpu and not _cpu_bf16()):
        return "fp32"
    return "bf16" if world > 1 else "autocast"


def _cpu_bf16() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()  # as learner/model.py's bf16_supported
    except OSError:
        return False


def _rl_micro_batch(cfg: Any, seq: int) -> tuple[int, bool]:
    """(tokens, masked) of the RL learner's largest micro-batch: a token budget packs trajectories into one row (at
    least one whole trajectory), else `micro_batch` trajectories right-padded to the longest."""
    if cfg.micro_batch_tokens:
        return max(int(cfg.micro_batch_tokens), seq), True
    return cfg.micro_batch * seq, cfg.micro_batch > 1


def plan_rl(cfg: Any, *, recipe: str = "", gpu_memory_gib: float | None = None, gpus: int | None = None,
            prompt_tokens: int = PROMPT_TOKENS, logits_chunk: int | None = None, receive: str = "bucket",
            shape: Shape | None = None, host_memory_gib: float | None = None) -> Plan:
    """The plan of an RL recipe (`RLConfig`) on its placement: `distributed: ray` puts learners and rollout workers
    on separate GPUs; one process with `rollout_engine: vllm` holds both on one GPU (vLLM takes its
    `gpu_memory_utilization` of it); `rollout_engine: hf` generates on the learner's own weights; `placement:
    colocated` with the vllm engine plans each GPU's two phases (`colocated_phases`). `receive`: what the push
    receives on a rollout GPU: bucket (one at a time, each loaded before the next: the push), model (every bucket
    kept there until the engine loads them, the push before buckets were loaded one by one), host (in-process pushes
    through host memory). `host_memory_gib`: the node's memory, against which a colocated plan checks the sleeping
    engines' weights (None: shown, not checked)."""
    from .plan_colocated import _colocated, colocated_phases

    if receive not in RECEIVE:
        raise PlanError(f"receive is one of {', '.join(RECEIVE)}, not {receive!r}")
    s = shape or model_shape(cfg.model)
    seq = prompt_tokens + max(st.max_response_tokens for st in cfg.stages)
    tokens, masked = _rl_micro_batch(cfg, seq)
    chunk = int(getattr(cfg, "logprob_chunk_tokens", 0) or 0) if logits_chunk is None else logits_chunk
    ray = cfg.distributed == "ray"
    on_gpu = (cfg.ray.gpus_per_learner > 0) if ray else gpu_memory_gib is not None
    world = cfg.ray.learners if ray else 1
    capacity = _capacity(gpu_memory_gib, on_gpu)
    spec = LearnerSpec(world, _precision(cfg.dtype, world, on_gpu), tokens, seq, masked,
                       bool(cfg.gradient_checkpointing), "rl", chunk)
    learner, _ = learner_parts(s, spec)
    context = min(s.context_length, _context(cfg.model, s))
    host = None
    if _colocated(cfg) and on_gpu:
        gpus_list, needed, placement, host = colocated_phases(cfg, s, learner, capacity, receive, context,
                                                              host_memory_gib)
    elif ray:
        gpus_list, needed, placement = _separate(cfg, s, learner, capacity, receive, context)
    else:
        gpus_list, needed, placement = _one_process(cfg, s, spec, learner, capacity, on_gpu, seq, context)
    plan = Plan(recipe, "rl", cfg.model, s, placement, gpus_list, needed, gpus, _settings(spec, cfg, receive),
                _both(s, spec), [], host)
    plan.advice = _advice(plan, s, spec, cfg, capacity, "rl")
    return plan


def _separate(cfg: Any, s: Shape, learner: dict[str, float], capacity: float, receive: str, context: int
              ) -> tuple[list[GPU], int, str]:
    """`distributed: ray`, separate placement: learner GPUs, and vLLM rollout GPUs receiving the push."""
    world = cfg.ray.learners
    options = dict(cfg.ray.engine_options)
    tp = int(options.get("tensor_parallel_size", 1))
    gpus_list = [GPU("learner", world, capacity, learner)]
    needed = int(world * cfg.ray.gpus_per_learner)
    if cfg.ray.rollout_engine == "vllm" and cfg.ray.gpus_per_rollout_worker > 0:
        parts, notes, ok = engine_parts(s, options, capacity, receive, cfg.ray.weight_bucket_mb, context)
        gpus_list.append(GPU("rollout", cfg.ray.rollout_workers * tp, capacity, parts, notes, ok))
        needed += int(cfg.ray.rollout_workers * cfg.ray.gpus_per_rollout_worker)
    placement = (f"ray: {world} learner ranks (FSDP2) and {cfg.ray.rollout_workers} {cfg.ray.rollout_engine} "
                 f"rollout workers, on separate devices")
    return gpus_list, needed, placement


def _one_process(cfg: Any, s: Shape, spec: LearnerSpec, learner: dict[str, float], capacity: float, on_gpu: bool,
                 seq: int, context: int) -> tuple[list[GPU], int, str]:
    """`distributed: none`: the learner and its rollout engine in one process, on one GPU or on the host."""
    parts = dict(learner)
    notes: list[str] = []
    ok = True
    if cfg.rollout_engine == "vllm" and on_gpu:
        options = {"gpu_memory_utilization": DEFAULT_UTILIZATION, **cfg.engine_options}
        eparts, notes, ok = engine_parts(s, options, capacity, "host", 0, context)
        parts.update(eparts)
    elif cfg.rollout_engine == "vllm":  # CPU: vLLM's KV cache is the kv_cache_gib it is given
        kv = float({"kv_cache_gib": 1.0, **cfg.engine_options}["kv_cache_gib"])
        parts.update({"engine_weights": 2 * s.params() / GIB, "engine_kv_cache": kv})
    else:  # the hf engine: the learner's weights, a KV cache per concurrent rollout
        rollouts = min(cfg.prompts_per_step * cfg.rollouts_per_prompt, 32)
        parts["engine_kv_cache"] = rollouts * seq * s.kv_bytes_per_token(4 if spec.precision == "fp32" else 2) / GIB
    gpu = GPU("learner+rollout" if on_gpu else "cpu", 1, capacity, parts, notes, ok)
    placement = f"one process: the learner and the {cfg.rollout_engine} rollout engine on one " \
                f"{'GPU' if on_gpu else 'machine (host memory)'}"
    return [gpu], 1 if on_gpu else 0, placement


def plan_sft(cfg: Any, *, recipe: str = "", gpu_memory_gib: float | None = None, gpus: int | None = None,
             shape: Shape | None = None) -> Plan:
    """The plan of an SFT recipe (`SFTConfig`): `gpus` FSDP2 ranks under torchrun (default: $WORLD_SIZE, else 1),
    each with `micro_batch` packed rows of `seq_len` tokens and their block-diagonal 4D mask."""
    s = shape or model_shape(cfg.model)
    world = gpus or int(os.environ.get("WORLD_SIZE", "1"))
    on_gpu = gpu_memory_gib is not None
    capacity = _capacity(gpu_memory_gib, on_gpu)
    spec = LearnerSpec(world, _precision(cfg.dtype, world, on_gpu), cfg.micro_batch * cfg.seq_len, cfg.seq_len,
                       True, bool(cfg.gradient_checkpointing), "sft")
    parts, _ = learner_parts(s, spec)
    g = GPU("learner" if on_gpu else "cpu", world, capacity, parts)
    plan = Plan(recipe, "sft", cfg.model, s, f"{world} FSDP2 rank(s), one device each" if world > 1
                else "one process", [g], world if on_gpu else 0, gpus, _settings(spec, cfg, None), _both(s, spec))
    plan.advice = _advice(plan, s, spec, cfg, capacity, "sft")
    return plan


def _capacity(gpu_memory_gib: float | None, on_gpu: bool) -> float:
    if on_gpu and gpu_memory_gib:
        return float(gpu_memory_gib)
    if on_gpu:
        raise PlanError("the GPUs' memory is unknown: give --gpu-memory-gib (or gpu_memory_gib in the recipe)")
    return _host_memory_gib()


def _host_memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / GIB


def _context(model: str, s: Shape) -> int:
    from rstar2_agent.models import REGISTRY

    spec = REGISTRY.get(model.lower())
    return spec.context_length if spec else s.context_length


def _settings(spec: LearnerSpec, cfg: Any, receive: str | None) -> dict[str, Any]:
    from .plan_colocated import _colocated

    out = {"learner_ranks": spec.world, "precision": spec.precision, "micro_batch_tokens": spec.tokens,
           "sequence_tokens": spec.seq, "attention_mask_4d": spec.masked, "gradient_checkpointing": spec.checkpointing,
           "logits": f"chunks of {spec.logits_chunk} tokens" if spec.logits_chunk else "full fp32 [tokens x vocab]"
           + (" (the cross-entropy's)" if spec.kind == "sft" else "")}
    if receive is not None and _colocated(cfg):
        out |= {"placement": "colocated", "sleep_level": cfg.sleep_level, "push_transient": receive}
    elif receive is not None and getattr(cfg, "distributed", "none") == "ray":
        out["receive_buffers"] = receive
    return out


def _both(s: Shape, spec: LearnerSpec) -> dict[str, float]:
    """The activations with and without checkpointing, GiB."""
    out = {}
    for ckpt in (False, True):
        a = activations(s, spec.tokens, spec.seq, precision=spec.precision, checkpointing=ckpt, masked=spec.masked,
                        kind=spec.kind, logits_chunk=spec.logits_chunk)
        out["with_checkpointing" if ckpt else "without_checkpointing"] = round(a.total / GIB, 2)
    return out


def _learner_fits(s: Shape, spec: LearnerSpec, capacity: float) -> bool:
    return sum(learner_parts(s, spec)[0].values()) <= capacity


def _advice(plan: Plan, s: Shape, spec: LearnerSpec, cfg: Any, capacity: float, kind: str) -> list[str]:
    """What to change so that the plan fits, each checked against the plan itself."""
    from .plan_colocated import _colocated_advice

    out: list[str] = []
    if plan.gpus_given is not None and plan.gpus_given < plan.gpus_needed:
        out.append(f"the placement needs {plan.gpus_needed} GPUs and {plan.gpus_given} are given: lower "
                   f"ray.learners or ray.rollout_workers, or add GPUs")
    if plan.host is not None:  # colocated: two phases of one GPU
        return out + _colocated_advice(plan, s, spec, cfg, capacity)
    for g in plan.gpus:
        if g.fits:
            continue
        engine = _engine_advice(g, capacity, cfg) if g.role in ("rollout", "learner+rollout") else []
        if g.role in ("learner", "cpu") or (g.role == "learner+rollout" and not _util_is_enough(g, capacity)):
            share = capacity - sum(v for k, v in g.parts.items() if k not in learner_parts(s, spec)[0]
                                   and not k.startswith("("))
            out += _learner_advice(s, spec, cfg, share, kind)
        out += engine
    return out


def _util_is_enough(g: GPU, capacity: float) -> bool:
    """A lower gpu_memory_utilization fits the GPU and still leaves vLLM a KV cache for one sequence."""
    others = g.total_gib - g.parts.get("vllm_gpu_memory_utilization", 0.0)
    fixed = g.parts.get("(vllm: weights)", 0.0) + g.parts.get("(vllm: forward and graphs)", 0.0)
    return capacity - others - fixed >= g.parts.get("(vllm: kv for one sequence)", 0.0) > 0


def _learner_advice(s: Shape, spec: LearnerSpec, cfg: Any, share: float, kind: str, colocated: bool = False
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


def _engine_advice(g: GPU, capacity: float, cfg: Any) -> list[str]:
    vllm = g.parts.get("vllm_gpu_memory_utilization", 0.0)
    others = g.total_gib - vllm
    util = vllm / capacity
    room = (capacity - others) / capacity
    if not g.ok:
        return [f"vLLM's KV cache cannot hold one sequence of the model's length: raise gpu_memory_utilization "
                f"(now {util:.2f}), or lower the engine's max_model_len"]
    if room <= 0:
        return ["the learner leaves vLLM nothing on this GPU: use distributed: ray (separate GPUs)"]
    where = "ray.engine_options" if cfg.distributed == "ray" else "engine_options"
    return [f"set {where}.gpu_memory_utilization: {int(room * 100) / 100:.2f} (now {util:.2f}): vLLM's share and "
            f"the {others:.1f} GiB beside it must fit the GPU"]


# ------------------------------------------------------------------------------------------------ output
def render(plan: Plan) -> str:
    lines = [f"{plan.kind} recipe {plan.recipe or '(given)'}: {plan.model} ({plan.shape.name or 'from config.json'}, "
             f"{plan.shape.params() / 1e9:.2f}B parameters)", f"placement: {plan.placement}"]
    st = plan.settings
    lines.append(f"learner micro-batch: {st['micro_batch_tokens']:,} tokens in rows of {st['sequence_tokens']:,}"
                 f"{' with a 4D mask' if st['attention_mask_4d'] else ''}, {st['precision']}, gradient "
                 f"checkpointing {'on' if st['gradient_checkpointing'] else 'off'}, logits {st['logits']}")
    a = plan.activations_gib
    lines.append(f"activations: {a['without_checkpointing']:.1f} GiB without checkpointing, "
                 f"{a['with_checkpointing']:.1f} GiB with")
    for g in plan.gpus:
        lines.append(f"{g.role} x{g.count}: {g.total_gib:.1f} of {g.capacity_gib:.1f} GiB "
                     f"{'fits' if g.fits else 'DOES NOT FIT'}")
        for k, v in g.parts.items():
            lines.append(f"  {k:<32} {v:8.2f} GiB")
        lines += [f"  {n}" for n in g.notes]
    if plan.host is not None:
        where = f"of {plan.host.capacity_gib:.0f} GiB here" if plan.host.capacity_gib is not None else \
            "not checked: the plan checks it on the node, before a run"
        lines.append(f"host memory for the sleeping engines' weights: {plan.host.offload_gib:.1f} GiB ({where})"
                     f"{'' if plan.host.fits else ' DOES NOT FIT'}")
    given = f" of {plan.gpus_given} given" if plan.gpus_given is not None else ""
    lines.append(f"GPUs needed: {plan.gpus_needed}{given}; fits: {'yes' if plan.fits else 'no'}")
    lines += [f"to fit: {x}" for x in plan.advice]
    return "\n".join(lines)


def to_json(plan: Plan) -> str:
    return json.dumps(plan.as_json(), indent=1)


# ------------------------------------------------------------------------------------------------ before a run
def gpu_memory_here() -> float | None:
    """This machine's first GPU in GiB, or None without one (counted without initializing CUDA here: it would break
    vLLM's fork of its engine core later in this process)."""
    from rstar2_agent.devices import gpu_memory_bytes

    total = gpu_memory_bytes()
    return total / GIB if total else None


def check_before_run(cfg: Any, kind: str, recipe: str = "") -> Plan | None:
    """The plan of a recipe about to run on GPUs, raising `PlanError` (what to change) when it does not fit. It runs
    where the learner is on a GPU: `distributed: ray` with gpus_per_learner > 0, or a process on a machine with a
    GPU (SFT under torchrun included); a CPU run is not checked (`rstar2 train plan` shows its plan against the
    host's memory). Off with memory_check: false. The GPUs' memory: the recipe's gpu_memory_gib, else this
    machine's GPU; unknown (a Ray driver without a GPU): a warning, no check. A GPU visible here wins over the
    recipe's figure: vLLM takes `gpu_memory_utilization` of the device's real total (an 80 GB H100 reports 79.1
    GiB, not the recipe's 74.5), so the plan sizes vLLM's share as vLLM will."""
    from .plan_colocated import _node_host_memory

    if not getattr(cfg, "memory_check", True):
        return None
    ray = getattr(cfg, "distributed", "none") == "ray"
    if ray and cfg.ray.gpus_per_learner <= 0:
        return None
    here, given = gpu_memory_here(), getattr(cfg, "gpu_memory_gib", 0)
    if here and given and abs(here - given) > 0.02 * here:
        log.info("memory plan: this GPU has %.1f GiB, the recipe says gpu_memory_gib %.1f: planning with the device's "
                 "own total, as vLLM sizes its share from it", here, given)
    memory = here or given or None
    if memory is None:
        if ray:
            log.warning("the memory plan cannot check this recipe: the GPUs' memory is unknown here (set "
                        "gpu_memory_gib in the recipe)")
        return None
    try:
        plan = plan_rl(cfg, recipe=recipe, gpu_memory_gib=memory, host_memory_gib=_node_host_memory(cfg)) \
            if kind == "rl" else plan_sft(cfg, recipe=recipe, gpu_memory_gib=memory)
    except ShapeError as e:
        log.warning("the memory plan cannot size this model (%s); starting without it", e)
        return None
    if not plan.fits:
        raise PlanError(f"the memory plan says this recipe does not fit its GPUs:\n{render(plan)}\n"
                        f"change what 'to fit' names, or set memory_check=false to start anyway")
    log.info("memory plan: fits (%s)", ", ".join(f"{g.role} {g.total_gib:.0f} of {g.capacity_gib:.0f} GiB"
                                                 for g in plan.gpus))
    return plan
