"""The `rstar2_nccl` and `rstar2_ipc` weight transfer backends (see vllm_transfer_config.py): vLLM's NCCL and CUDA IPC
engines, which load what they receive with the model's `load_weights` and drop what that returns, here keeping the
names loaded during a push for the push's check. Imported in a vLLM worker by vLLM's factory when the worker
creates its engine (GPU only)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine


class CountsLoaded:
    """Keeps the names the model's load_weights reports loaded during a push (`loaded`)."""

    loaded: set[str]
    reloading = False  # a layerwise reload is open (started, not finished): an abort finalizes it

    def start_weight_update(self) -> None:
        self.loaded = set()
        super().start_weight_update()  # type: ignore[misc]
        self.reloading = True

    def finish_weight_update(self) -> None:
        super().finish_weight_update()  # type: ignore[misc]
        self.reloading = False

    def receive_weights(self, update_info: Any) -> None:
        model = self.model
        load = model.load_weights

        def counted(weights: Any) -> Any:
            got = load(weights)
            self.loaded |= set(got or ())
            return got

        model.load_weights = counted  # the engines call self.model.load_weights for what they receive
        try:
            super().receive_weights(update_info)  # type: ignore[misc]
        finally:
            del model.load_weights  # the class's method again


class CheckedNCCLEngine(CountsLoaded, NCCLWeightTransferEngine):
    pass


class CheckedIPCEngine(CountsLoaded, IPCWeightTransferEngine):
    """CUDA IPC handles hold a tensor class, a `torch.Size`, a storage class and a `torch.dtype`, which vLLM's
    msgpack wire refuses; the trainer sends them pickled in `ipc_handles_pickled` (as vLLM's own HTTP client does),
    and this engine unpickles that one field. vLLM's own unpickling of it needs VLLM_ALLOW_INSECURE_SERIALIZATION,
    which cannot be scoped to it: the engine core caches its environment at start (vllm.envs.enable_envs_cache), and
    set there the switch also makes the engine core send pickled utility results, which the front end (the
    learner's process) then refuses unless it is set there too (msgspec.ValidationError, seen on vLLM 0.32's CPU
    build). So the trust this takes is exactly the handle field of an update, from the engine's own trainer, in an
    engine started with this backend (only a training run starts one: `rstar2 serve` never does)."""

    def parse_update_info(self, update_dict: dict[str, Any]) -> Any:
        blob = update_dict.get("ipc_handles_pickled")
        if blob is not None:
            import pickle

            import pybase64

            update_dict = {k: v for k, v in update_dict.items() if k != "ipc_handles_pickled"}
            update_dict["ipc_handles"] = pickle.loads(pybase64.b64decode(blob))
        return super().parse_update_info(update_dict)
