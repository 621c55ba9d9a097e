"""The colocated placement's memory plan (`placement: colocated`, learner/colocated.py), which planner.py's `plan_rl`
calls: each GPU holds one learner rank and one engine shard (`ray.rollout_workers` x tensor_parallel_size =
`ray.learners`; one GPU without Ray), in two phases planned apart, and the GPU must fit the larger
(`colocated_phases`). Rollout: vLLM awake (its `gpu_memory_utilization` share: weights, forward, KV cache) beside
what the learner keeps between updates (`resident_parts`: its fp32 master weights and AdamW's moments). Update: the
learner's peak beside the sleeping engine and the in-place push (the engine's weights woken to receive it and the
push's transient, `push_transient`). Planned apart because the phases never overlap: the learner returns its
allocator's cache before the engine's KV cache wakes, and the engine sleeps through the update.

The host memory (`Host`): the sleeping engines' weights at sleep level 1 (pinned copies), nothing at level 2,
checked against the node's memory when the plan runs on it (`node_host_memory`). What makes each phase fit
(`colocated_advice`): vLLM's share in the rollout phase, the learner's settings in the update phase, sleep level 2
for the host. The formulas and what they leave out: docs/memory.md, "Colocated".
"""

from __future__ import annotations

from typing import Any

from ..model_shape import Shape
from .formulas import (
    DEFAULT_UTILIZATION,
    FRAGMENTATION,
    GIB,
    VLLM_ASLEEP_GIB,
    LearnerSpec,
    PlanError,
    engine_parts,
    host_memory_here,
    learner_advice,
)
from .records import GPU, Host, Plan


# ------------------------------------------------------------------------------------------------ the two phases
def is_colocated(cfg: Any) -> bool:
    """A colocated placement the plan models: vLLM engines (the hf engine's own weights are not planned)."""
    return getattr(cfg, "placement", "separate") == "colocated" and cfg.rollout_engine == "vllm"


def colocated_phases(cfg: Any, s: Shape, learner: dict[str, float], capacity: float, receive: str, context: int,
                     host_memory_gib: float | None = None) -> tuple[list[GPU], int, str, Host]:
    """Each GPU of a colocated placement holds one learner rank and one engine shard (`ray.rollout_workers` x
    tensor_parallel_size = `ray.learners`; one GPU without Ray), in two phases planned apart; the GPU must fit the
    larger. Rollout: vLLM awake (its `gpu_memory_utilization` share: weights, forward, KV cache) beside what the
    learner keeps between updates (`resident_parts`). Update: the learner's peak (`learner_parts`, as the separate
    plan) beside the sleeping engine (`VLLM_ASLEEP_GIB`) and the in-place push: the engine's weights woken to receive
    it and the push's transient (`receive`: a bucket, the whole bf16 model, or nothing through the host). Both are
    counted beside the peak: PyTorch's caching allocator keeps the update's blocks reserved until the learner empties
    it, and vLLM's weights are allocated outside that cache. The host holds the weights at sleep level 1, checked
    against `host_memory_gib` when given."""
    ray = cfg.distributed == "ray"
    options = {"gpu_memory_utilization": DEFAULT_UTILIZATION, **cfg.engine_options}
    tp = int(options.get("tensor_parallel_size", 1))
    gpus = cfg.ray.learners if ray else 1
    engines = cfg.ray.rollout_workers if ray else 1
    if engines * tp != gpus:
        where = "ray.rollout_workers x engine_options.tensor_parallel_size" if ray else \
            "engine_options.tensor_parallel_size"
        raise PlanError(f"placement: colocated puts one engine shard beside each learner rank, one GPU each: "
                        f"{engines} engine(s) x tensor parallel {tp} on {gpus} GPU(s); set {where} to "
                        f"{'ray.learners' if ray else '1'} ({gpus})")
    vllm, notes, ok = engine_parts(s, options, capacity, "host", 0, context)
    rollout = GPU("rollout phase", gpus, capacity, {**resident_parts(learner), **vllm}, notes, ok)
    weights = 2 * s.params() / tp / GIB
    update = dict(learner)
    update["vllm_asleep"] = VLLM_ASLEEP_GIB
    if cfg.sleep_level == 1:
        update["(vllm: weights in host memory)"] = weights
    update["vllm_weights_woken_for_push"] = weights
    # the IPC push is packed (push/vllm.py): one reusable buffer of ray.weight_bucket_mb, at least the largest tensor
    update["push_transient"] = push_transient(s, receive, cfg.ray.weight_bucket_mb, weights)
    kept = "weights to host memory" if cfg.sleep_level == 1 else "weights dropped (the push brings them)"
    upd_notes = [f"sleep level {cfg.sleep_level}: KV cache dropped, {kept}; the push wakes the weights first "
                 f"(counted beside the learner's peak)"]
    gpus_list = [rollout, GPU("update phase", gpus, capacity, update, upd_notes)]
    host = Host(gpus * weights if cfg.sleep_level == 1 else 0.0, host_memory_gib)
    engine = "a vLLM engine" if tp == 1 else f"a shard of a vLLM engine (tensor parallel {tp})"
    where = "one GPU holds the learner (one process)" if gpus == 1 else f"{gpus} GPUs, each a learner rank (FSDP2)"
    placement = (f"colocated: {where} and {engine}, which sleeps (level {cfg.sleep_level}) through the update; "
                 f"{'the' if gpus == 1 else 'each'} GPU must fit the larger of two phases")
    needed = int(gpus * max(cfg.ray.gpus_per_learner, 1.0)) if ray else 1
    return gpus_list, needed, placement, host


def resident_parts(learner: dict[str, float]) -> dict[str, float]:
    """What a colocated learner keeps on its GPU between updates (GiB): its fp32 master weights and AdamW's moments
    (no optimizer offload), the allocator's slack on them and its runtime. Gradients are freed by each optimizer
    step (zero_grad(set_to_none=True)), the activations and compute copies by the update's end, and the learner
    returns its allocator's cache (torch.cuda.empty_cache) before the engine's KV cache wakes."""
    parts = {k: learner[k] for k in ("weights_fp32_shard", "optimizer_adamw")}
    parts["fragmentation"] = FRAGMENTATION * sum(parts.values())
    parts["runtime"] = learner["runtime"]
    return parts


def push_transient(s: Shape, receive: str, bucket_mb: float, weights_gib: float) -> float:
    """GiB the in-place push holds beside the engine's woken weights: one bucket (whole layers: at least the bf16
    embedding), the whole bf16 model, or nothing (through host memory)."""
    if receive == "model":
        return weights_gib
    if receive == "bucket":
        return max(bucket_mb * 2**20, 2 * s.vocab * s.hidden) / GIB
    return 0.0


# ------------------------------------------------------------------------------------------------ advice
def colocated_advice(plan: Plan, s: Shape, spec: LearnerSpec, cfg: Any, capacity: float) -> list[str]:
    """What makes each phase of a colocated plan fit: vLLM's share in the rollout phase, the learner's settings in
    the update phase (in what the sleeping engine and the push leave it), sleep level 2 for the host."""
    rollout, update = plan.gpus
    out: list[str] = []
    if not rollout.fits or not rollout.ok:
        out += _colocated_util_advice(rollout, capacity, cfg, spec.world)
    if not update.fits:
        beside = sum(v for k, v in update.parts.items() if k.startswith(("vllm", "push")))
        out += learner_advice(s, spec, cfg, capacity - beside, "rl", colocated=True)
    if plan.host is not None and not plan.host.fits:
        out.append(f"set sleep_level: 2 (the sleeping engines' weights, {plan.host.offload_gib:.0f} GiB, are then not "
                   f"kept in host memory, which has {plan.host.capacity_gib:.0f} GiB; the push brings new ones)")
    return out


def _colocated_util_advice(g: GPU, capacity: float, cfg: Any, world: int) -> list[str]:
    """The gpu_memory_utilization that fits beside the learner's resident state and still holds one sequence's KV
    cache; or, when none does, what shrinks the resident state."""
    share = g.parts["vllm_gpu_memory_utilization"]
    resident = g.total_gib - share
    fixed = g.parts["(vllm: weights)"] + g.parts["(vllm: forward and graphs)"]
    need = fixed + g.parts["(vllm: kv for one sequence)"]
    best = int((capacity - resident) / capacity * 100) / 100
    least = -int(-need / capacity * 100) / 100
    where = "engine_options"
    if best >= least:
        now = share / capacity
        return [f"set {where}.gpu_memory_utilization: {best:.2f} (now {now:.2f}; {least:.2f} to {best:.2f} fit): "
                f"vLLM's share must fit beside the learner's {resident:.1f} GiB resident (fp32 weights and AdamW "
                f"moments) and hold one sequence's KV cache ({need:.1f} GiB with vLLM's weights and forward)"]
    more = "more learner ranks (ray.learners, with as many engines: ray.rollout_workers) to shard it" if \
        cfg.distributed == "ray" else "distributed: ray with several learner ranks to shard it"
    return [f"the learner's {resident:.1f} GiB resident between updates (fp32 weights and AdamW moments over "
            f"{world} rank(s)) leaves vLLM {capacity - resident:.1f} GiB, less than its weights, forward and one "
            f"sequence's KV cache ({need:.1f} GiB): {more}, a bigger GPU, or placement: separate"]


# ------------------------------------------------------------------------------------------------ before a run
def node_host_memory(cfg: Any) -> float | None:
    """This machine's memory when a colocated run's engines sleep on it (one process, or a Ray cluster started
    here), against which the plan checks their weights at sleep level 1; None otherwise (another node's)."""
    if not is_colocated(cfg) or (cfg.distributed == "ray" and cfg.ray.address is not None):
        return None
    return host_memory_here()
