"""The `rstar2_nccl` and `rstar2_ipc` weight transfer backends (see vllm_transfer.py): vLLM's NCCL and CUDA IPC
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
    pass
