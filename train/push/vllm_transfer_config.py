"""vLLM 0.32's own weight transfer for the push from the learner to vLLM rollout workers on GPUs: NCCL to engines on
other GPUs (below), and CUDA IPC to an engine on the learner's own GPU (the colocated placement: `rstar2_ipc`).

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

Only a GPU build runs this (NCCL, CUDA IPC); on CPU the push is chunked (vllm_worker_extension.py), and the IPC transfer
runs on CPU under a named stand-in for CUDA IPC (SUBSTITUTE_ENV) for tests and benchmarks. Registering the backend
imports nothing of NCCL (the factory loads the class when a worker creates its engine). The trainer's side (the
source, the clients, the push) is vllm.py beside this; the trainable engine (train/rollout/trainable.py) puts
`transfer_config` in its engine's arguments.
"""

from __future__ import annotations

import os

BACKEND = "rstar2_nccl"
IPC_BACKEND = "rstar2_ipc"  # vLLM's CUDA IPC engine, checked the same way: the colocated push, on the same GPU
BACKENDS = {BACKEND: "CheckedNCCLEngine", IPC_BACKEND: "CheckedIPCEngine"}


def register() -> None:
    """Make `rstar2_nccl` and `rstar2_ipc` known to vLLM's factory in this process (a vLLM worker imports
    vllm_worker_extension.py, which calls this, before it creates its weight transfer engine)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    for name, cls in BACKENDS.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, "rstar2_agent.train.push.vllm_transfer_backends", cls)


TRANSFERS = ("nccl", "ipc")  # the engine's `weight_transfer`: which of vLLM's transfers its workers hold (or None)
# where the CUDA IPC transfer runs on a CPU: the module of a stand-in for CUDA IPC that every process installs
# (rstar2_agent.bench.cuda_ipc_on_cpu, for tests and `rstar2 bench push`; never set by the product)
SUBSTITUTE_ENV = "RSTAR2_CUDA_IPC_SUBSTITUTE"


def transfer_config(on_gpu: bool, weight_transfer: str | None) -> dict[str, str] | None:
    """The engine's `weight_transfer_config`: vLLM's NCCL transfer (`nccl`: a learner on other GPUs), its CUDA IPC
    transfer (`ipc`: a learner on the same GPU, the colocated placement: NCCL cannot join two ranks on one GPU), or
    none (None: the chunked push of vllm_worker_extension.py). The weight push chooses (push/__init__.py)."""
    if weight_transfer is None:
        return None
    if weight_transfer not in TRANSFERS:
        raise ValueError(f"an engine's weight_transfer is nccl, ipc or None, not {weight_transfer!r}")
    if not on_gpu and not (weight_transfer == "ipc" and os.environ.get(SUBSTITUTE_ENV)):
        raise ValueError(f"vLLM's {weight_transfer} weight transfer needs a GPU: on a CPU the push is chunked "
                         f"(weight_push: chunked, or auto)")
    return {"backend": IPC_BACKEND if weight_transfer == "ipc" else BACKEND}


def install_substitute() -> None:
    """In a process of an engine started with SUBSTITUTE_ENV set: install the named CUDA IPC stand-in."""
    name = os.environ.get(SUBSTITUTE_ENV)
    if name:
        import importlib

        importlib.import_module(name).install()
