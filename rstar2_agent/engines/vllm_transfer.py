"""vLLM 0.32's own weight transfer for the push from the learner to vLLM rollout workers on GPUs: NCCL to engines on
other GPUs (below), and CUDA IPC to an engine on the learner's own GPU (the colocated placement: `rstar2_ipc`,
`push_in_place` in one process, `LoopClient`; from FSDP ranks, ray_group.join_vllm_ipc).

vLLM's workers hold a weight transfer engine when started with `weight_transfer_config` (its NCCL backend: a
watchdog-free PyNccl communicator of the trainer's rank 0 and every rollout worker, apart from torch.distributed).
The learner's rank 0 drives it with vLLM's `NCCLTrainerWeightTransferEngine`: `init_weight_transfer_engine` once
per group, then per push `start_weight_update` (a layerwise-reload session), `update_weights` (the workers receive
packed buckets straight onto their GPU and load each before the next, concurrently with the trainer's broadcast),
`finish_weight_update`. Every learner rank iterates the source in lockstep (an FSDP parameter's `full_tensor()` is
a collective); only rank 0 sends.

What this module adds to vLLM's: the backend `rstar2_nccl`, vLLM's NCCL engine that also keeps the names its
model's `load_weights` reports loaded (vLLM drops them), so the push checks them as the fallback does
(weight_chunks.not_loaded); a source that sends in the engine's dtype (bf16, half the learner's fp32) and keeps
a CPU copy for a replacement worker; and a client over several independent rollout engines, each given its own
rank offset in the one group (vLLM's trainer engine gives every engine offset 1, for one engine).

Only a GPU build runs this (NCCL); on CPU the push falls back to weight_sync.py and the chunked messages of
vllm_worker.py. Registering the backend imports nothing of NCCL (the factory loads the class when a worker
creates its engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

BACKEND = "rstar2_nccl"
IPC_BACKEND = "rstar2_ipc"  # vLLM's CUDA IPC engine, checked the same way: the colocated push, on the same GPU
BACKENDS = {BACKEND: "CheckedNCCLEngine", IPC_BACKEND: "CheckedIPCEngine"}


def register() -> None:
    """Make `rstar2_nccl` and `rstar2_ipc` known to vLLM's factory in this process (a vLLM worker imports
    vllm_worker.py, which calls this, before it creates its weight transfer engine)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    for name, cls in BACKENDS.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, "rstar2_agent.engines.vllm_transfer_nccl", cls)


def transfer_config(on_gpu: bool, weight_transfer: str) -> dict[str, str] | None:
    """The engine's `weight_transfer_config`: on a GPU vLLM's NCCL transfer (`auto`, `vllm`: a learner on other
    GPUs) or its CUDA IPC transfer (`ipc`: a learner on the same GPU, the colocated placement: NCCL cannot join two
    ranks on one GPU); none on CPU (`ipc` there: the CPU push, as `auto`) or with `fallback` (the chunked push of
    vllm_worker.py)."""
    if weight_transfer not in ("auto", "vllm", "ipc", "fallback"):
        raise ValueError(f"weight_transfer is auto, vllm, ipc or fallback, not {weight_transfer!r}")
    if weight_transfer == "vllm" and not on_gpu:
        raise ValueError("weight_transfer=vllm needs a GPU (vLLM's weight transfer runs over NCCL): use auto or "
                         "fallback on CPU")
    if not on_gpu or weight_transfer == "fallback":
        return None
    return {"backend": IPC_BACKEND if weight_transfer == "ipc" else BACKEND}


def source(model: torch.nn.Module, dtype: torch.dtype | None, keep: dict[str, torch.Tensor] | None = None) -> Any:
    """A vLLM `WeightSource` over `model`'s parameters (tied ones once, as vLLM ties them itself), floating point
    cast to `dtype`; `keep`, when given, receives a CPU copy of each tensor sent (rank 0: what a replacement
    rollout worker loads)."""
    from vllm.distributed.weight_transfer.base import ModuleSource, ParamMeta, materialize_full_tensor

    def cast(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    class Source(ModuleSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, cast(p), tuple(p.shape)) for n, p in model.named_parameters()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for n, p in model.named_parameters():
                t = materialize_full_tensor(p.detach()).to(cast(p))
                if keep is not None:
                    keep[n] = t.to("cpu", copy=True)
                yield n, t

    return Source(model)


class RolloutClient:
    """vLLM's `VLLMWeightSyncClient` over the rollout workers' Ray actors (EngineActor), each call to all of them
    at once: engine i joins the group at rank offset 1 + the tensor-parallel sizes of engines 0..i-1 (NCCL; CUDA IPC
    has no group: `ipc`, each engine maps the handles of its own GPU)."""

    def __init__(self, actors: list[Any], tensor_parallel: list[int], timeout_s: float, ipc: bool = False):
        self.actors, self.tensor_parallel, self.timeout_s, self.ipc = actors, tensor_parallel, timeout_s, ipc

    def offsets(self) -> list[int]:
        return [1 + sum(self.tensor_parallel[:i]) for i in range(len(self.actors))]

    def init_payloads(self, init_info: dict[str, Any]) -> list[dict[str, Any]]:
        """vLLM's worker init info (rank offset 1, for one engine) for each engine, at its own offset."""
        if self.ipc:
            return [dict(init_info) for _ in self.actors]
        return [{**init_info, "rank_offset": o} for o in self.offsets()]

    def _all(self, method: str, *per_actor: list[Any]) -> list[Any]:
        import ray

        calls = [getattr(a, method).remote(*(args[i] for args in per_actor)) for i, a in enumerate(self.actors)]
        return ray.get(calls, timeout=self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all("init_weight_transfer", self.init_payloads(init_info))

    def start_weight_update(self) -> None:
        self._all("start_weight_transfer")

    def update_weights(self, update_info: Any) -> None:
        self._all("receive_weight_transfer", [update_info] * len(self.actors))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_transfer")

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer")


class LoopClient:
    """vLLM's `VLLMWeightSyncClient` over a vLLM engine in this process, for a trainer engine driven from a thread:
    each call runs the engine's coroutine on the event loop the engine lives on and waits for it."""

    def __init__(self, engine: Any, loop: Any, timeout_s: float):
        self.engine, self.loop, self.timeout_s = engine, loop, timeout_s

    def _run(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._run(self.engine.init_weight_transfer(init_info))

    def start_weight_update(self) -> None:
        self._run(self.engine.start_weight_transfer())

    def update_weights(self, update_info: Any) -> None:
        self._run(self.engine.receive_weight_transfer(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run(self.engine.finish_weight_transfer())

    def shutdown_weight_transfer_engine(self) -> None:
        self._run(self.engine.shutdown_weight_transfer())


async def push_in_place(model: torch.nn.Module, engine: Any, timeout_s: float = 600.0) -> None:
    """The colocated push in one process (a learner and an in-process vLLM engine on one GPU): vLLM's trainer-side
    CUDA IPC engine exports a handle of each of the learner's tensors (cast to the engine's dtype on the GPU: no host
    copy) and the engine's workers map and load them (`rstar2_ipc`, names checked). The trainer engine is sync and
    calls the engine's async methods: it runs in a thread, the client hands each call to this event loop."""
    import asyncio

    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    client = LoopClient(engine, asyncio.get_running_loop(), timeout_s)

    def send() -> None:
        trainer = IPCTrainerWeightTransferEngine.trainer_init(IPCTrainerInitInfo(rank=0), client=client,
                                                              source=source(model, engine.weights_dtype))
        trainer.send_weights()

    await asyncio.to_thread(send)
