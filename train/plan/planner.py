"""The memory plan of a recipe (`rstar2 train plan`): what each GPU of its placement holds at its peak, and whether it
fits, before a GPU is rented. `plan_rl` plans an RL recipe on its placement (the separate one of `distributed: ray`,
one process, or the colocated one, colocated_phases.py), `plan_sft` an SFT recipe under torchrun; each with the
advice that makes it fit. `check_before_run` refuses a GPU run whose plan does not fit. The parts each GPU holds are
formulas.py's, the records they make records.py's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..model_shape import Shape, ShapeError, model_shape
from .colocated_phases import colocated_advice, colocated_phases, is_colocated, node_host_memory
from .formulas import (
    DEFAULT_UTILIZATION,
    GIB,
    PROMPT_TOKENS,
    RECEIVE,
    LearnerSpec,
    PlanError,
    activations,
    engine_parts,
    host_memory_here,
    learner_advice,
    learner_parts,
)
from .records import GPU, Plan, render

log = logging.getLogger(__name__)


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
    if is_colocated(cfg) and on_gpu:
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
    options = dict(cfg.engine_options)
    tp = int(options.get("tensor_parallel_size", 1))
    gpus_list = [GPU("learner", world, capacity, learner)]
    needed = int(world * cfg.ray.gpus_per_learner)
    if cfg.rollout_engine == "vllm" and cfg.ray.gpus_per_rollout_worker > 0:
        parts, notes, ok = engine_parts(s, options, capacity, receive, cfg.ray.weight_bucket_mb, context)
        gpus_list.append(GPU("rollout", cfg.ray.rollout_workers * tp, capacity, parts, notes, ok))
        needed += int(cfg.ray.rollout_workers * cfg.ray.gpus_per_rollout_worker)
    placement = (f"ray: {world} learner ranks (FSDP2) and {cfg.ray.rollout_workers} {cfg.rollout_engine} "
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
    return host_memory_here()


def _context(model: str, s: Shape) -> int:
    from rstar2_agent.models import REGISTRY

    spec = REGISTRY.get(model.lower())
    return spec.context_length if spec else s.context_length


def _settings(spec: LearnerSpec, cfg: Any, receive: str | None) -> dict[str, Any]:
    out = {"learner_ranks": spec.world, "precision": spec.precision, "micro_batch_tokens": spec.tokens,
           "sequence_tokens": spec.seq, "attention_mask_4d": spec.masked, "gradient_checkpointing": spec.checkpointing,
           "logits": f"chunks of {spec.logits_chunk} tokens" if spec.logits_chunk else "full fp32 [tokens x vocab]"
           + (" (the cross-entropy's)" if spec.kind == "sft" else "")}
    if receive is not None and is_colocated(cfg):
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


# ------------------------------------------------------------------------------------------------ advice
def _advice(plan: Plan, s: Shape, spec: LearnerSpec, cfg: Any, capacity: float, kind: str) -> list[str]:
    """What to change so that the plan fits, each checked against the plan itself."""
    out: list[str] = []
    if plan.gpus_given is not None and plan.gpus_given < plan.gpus_needed:
        out.append(f"the placement needs {plan.gpus_needed} GPUs and {plan.gpus_given} are given: lower "
                   f"ray.learners or ray.rollout_workers, or add GPUs")
    if plan.host is not None:  # colocated: two phases of one GPU
        return out + colocated_advice(plan, s, spec, cfg, capacity)
    for g in plan.gpus:
        if g.fits:
            continue
        engine = _engine_advice(g, capacity, cfg) if g.role in ("rollout", "learner+rollout") else []
        if g.role in ("learner", "cpu") or (g.role == "learner+rollout" and not _util_is_enough(g, capacity)):
            share = capacity - sum(v for k, v in g.parts.items() if k not in learner_parts(s, spec)[0]
                                   and not k.startswith("("))
            out += learner_advice(s, spec, cfg, share, kind)
        out += engine
    return out


def _util_is_enough(g: GPU, capacity: float) -> bool:
    """A lower gpu_memory_utilization fits the GPU and still leaves vLLM a KV cache for one sequence."""
    others = g.total_gib - g.parts.get("vllm_gpu_memory_utilization", 0.0)
    fixed = g.parts.get("(vllm: weights)", 0.0) + g.parts.get("(vllm: forward and graphs)", 0.0)
    return capacity - others - fixed >= g.parts.get("(vllm: kv for one sequence)", 0.0) > 0


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
    where = "engine_options"
    return [f"set {where}.gpu_memory_utilization: {int(room * 100) / 100:.2f} (now {util:.2f}): vLLM's share and "
            f"the {others:.1f} GiB beside it must fit the GPU"]


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
        plan = plan_rl(cfg, recipe=recipe, gpu_memory_gib=memory, host_memory_gib=node_host_memory(cfg)) \
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
