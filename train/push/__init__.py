"""The weight push: the learner's new weights into the rollout engines after every update, one interface, one backend
per transport, chosen once from the recipe and the placement by one knob, `weight_push` (RLConfig).

| weight_push  | where                                   | how                                                        |
| ------------ | --------------------------------------- | ---------------------------------------------------------- |
| shared       | one process, hf engine on the learner's model | nothing: an update is live at once                   |
| chunked      | one process, vLLM (the CPU build)       | safetensors messages of whole layers (engines/vllm.py)     |
| ipc          | learner and vLLM on the same GPU        | vLLM's CUDA IPC transfer, packed, bounded (vllm.py here)   |
| nccl         | Ray, vLLM rollout workers on other GPUs | vLLM's NCCL transfer from rank 0 (vllm.py here)            |
| collective   | Ray, any rollout workers                | a torch.distributed group, flat buckets (collective.py)    |
| object_store | Ray, any rollout workers                | the state dict put once in Ray's object store              |

`auto` (the default) picks by the placement: one process: `shared` for the hf engine, `ipc` for vLLM colocated on a
GPU, else `chunked`; Ray: vLLM on GPUs `ipc` colocated, `nccl` otherwise; else `collective`. What a backend needs
of the engine (vLLM's `weight_transfer` in its workers) comes from the same choice (`engine_transfer`).

Failure, one rule for every backend: a push that fails at any phase (before the send, mid-send, a receiver's load
error, at finish, a dead engine) aborts the transfer on every engine (each ends its open reload and resumes
generation), releases every learner rank (the ranks go on through their collectives in lockstep and agree on the
failure after the send, so none waits on a rank that left), and raises one `PushError` naming the backend, the
phase, the rank and the parameter. The engines then serve the previous weights, or (a push that failed half way)
a mix that `PushError.mixed` says, which the next push replaces whole; the run's retry or `--resume` goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import RLConfig
from .error import PushError

BACKENDS = ("auto", "shared", "chunked", "ipc", "nccl", "collective", "object_store")
LOCAL = ("shared", "chunked", "ipc")
RAY = ("ipc", "nccl", "collective", "object_store")
# the knobs this one replaced, refused by name with the new spelling
OLD_KNOBS = {
    "ray.weight_push": "weight_push: collective or object_store (top level of the recipe)",
    "ray.vllm_weight_transfer": "weight_push: nccl (true) or collective (false)",
    "engine_options.weight_transfer": "weight_push: ipc, nccl or chunked (the engine's transfer follows it)",
    "ray.engine_options.weight_transfer": "weight_push: ipc, nccl or chunked (the engine's transfer follows it)",
}


@dataclass(frozen=True)
class Choice:
    backend: str  # one of BACKENDS but auto
    engine_transfer: str | None  # what a vLLM engine's workers must hold: "nccl", "ipc" or None


def choose(cfg: RLConfig, on_gpu: bool | None = None) -> Choice:
    """The backend for this recipe and placement (the one place that reads `weight_push`)."""
    from rstar2_agent import devices

    ray = cfg.distributed == "ray"
    vllm = cfg.rollout_engine == "vllm"
    colocated = cfg.placement == "colocated"
    gpu = (cfg.ray.gpus_per_learner > 0 if ray else devices.on_gpu()) if on_gpu is None else on_gpu
    want = cfg.weight_push
    if want not in BACKENDS:
        raise ValueError(f"weight_push is one of {', '.join(BACKENDS)}, not {want!r}")
    if want == "auto":
        if ray:
            want = ("ipc" if colocated else "nccl") if vllm and gpu else "collective"
        else:
            want = "shared" if not vllm and not colocated else "ipc" if vllm and colocated and gpu else "chunked"
    allowed = RAY if ray else LOCAL
    if want not in allowed:
        raise ValueError(f"weight_push: {want} is not a {'Ray' if ray else 'one-process'} push; with distributed: "
                         f"{cfg.distributed} it is one of {', '.join(allowed)} (or auto)")
    if want in ("ipc", "nccl") and not vllm:
        raise ValueError(f"weight_push: {want} is vLLM's own transfer: it needs rollout_engine: vllm")
    if want == "shared" and (vllm or colocated):
        raise ValueError("weight_push: shared is the hf engine on the learner's own model (rollout_engine: hf, not "
                         "colocated): use auto")
    if ray and colocated and gpu and want in ("nccl", "collective"):
        raise ValueError("placement: colocated on GPUs pushes through vLLM's CUDA IPC transfer (NCCL cannot join two "
                         "ranks on one GPU): weight_push: ipc (rollout_engine: vllm) or object_store")
    return Choice(want, want if want in ("ipc", "nccl") else None)


def refuse_old_knobs(raw: dict[str, Any]) -> None:
    """A recipe (as read) that still spells a replaced knob: ValueError with the new spelling."""
    ray = raw.get("ray") or {}
    found = [k for k, present in (
        ("ray.weight_push", "weight_push" in ray),
        ("ray.vllm_weight_transfer", "vllm_weight_transfer" in ray),
        ("engine_options.weight_transfer", "weight_transfer" in (raw.get("engine_options") or {})),
        ("ray.engine_options.weight_transfer", "weight_transfer" in (ray.get("engine_options") or {})),
    ) if present]
    if found:
        raise ValueError("; ".join(f"{k} is gone: use {OLD_KNOBS[k]}" for k in found))


class WeightPush:
    """One transport of the learner's weights into the rollout engine (the backend `choose` picked)."""

    name = "push"

    async def push(self, learner: Any, engine: Any) -> None:
        raise NotImplementedError


class Shared(WeightPush):
    """The hf engine on the learner's own model: nothing to push."""

    name = "shared"

    async def push(self, learner: Any, engine: Any) -> None:
        if getattr(engine, "model", None) is not learner.model:
            raise PushError(self.name, "check", 0, None, "weight_push: shared needs the hf engine built on the "
                            "learner's own model, and this engine holds weights of its own: use auto")


class Chunked(WeightPush):
    """The full state dict into the engine (vLLM: safetensors messages of whole layers in one layerwise reload,
    which the engine ends and resumes after a failure; hf: a load_state_dict)."""

    name = "chunked"

    async def push(self, learner: Any, engine: Any) -> None:
        state = learner.full_state_dict()
        try:
            await engine.load_weights(state)
        except Exception as e:  # noqa: BLE001 - vLLM's collective_rpc raises a bare Exception for a worker's error
            raise PushError(self.name, "load", 0, None, e) from e


class InPlace(WeightPush):
    """vLLM's CUDA IPC transfer to the engine in this process (the colocated placement), packed (push/vllm.py)."""

    name = "ipc"

    def __init__(self, buffer_mb: float = 1024.0, timeout_s: float = 600.0):
        self.buffer_mb, self.timeout_s = buffer_mb, timeout_s

    async def push(self, learner: Any, engine: Any) -> None:
        from .vllm import push_in_place

        await push_in_place(learner.model, engine, buffer_mb=self.buffer_mb, timeout_s=self.timeout_s)


class ThroughGroup(WeightPush):
    """The Ray backends: the learner group's ranks send (train/learner/ray_group.py), by `name`."""

    def __init__(self, name: str):
        self.name = name

    async def push(self, learner: Any, engine: Any) -> None:
        await learner.push(engine, self.name)


def make_push(choice: Choice, distributed: str, bucket_mb: float = 256.0) -> WeightPush:
    """The chosen backend; `bucket_mb` (the recipe's `ray.weight_bucket_mb`) is the packed IPC push's buffer here as
    on Ray, so the memory plan's push transient is one figure for both."""
    if distributed == "ray":
        return ThroughGroup(choice.backend)
    if choice.backend == "ipc":
        return InPlace(buffer_mb=bucket_mb)
    return {"shared": Shared, "chunked": Chunked}[choice.backend]()
