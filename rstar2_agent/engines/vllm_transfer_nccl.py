"""The `rstar2_nccl` weight transfer backend (see vllm_transfer.py): vLLM's NCCL engine, which loads each received
bucket with its model's `load_weights` and drops what that returns, here keeping the names loaded during a push
for the push's check. Imported in a vLLM worker by vLLM's factory when the worker creates its engine (GPU only)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine


class CheckedNCCLEngine(NCCLWeightTransferEngine):
    loaded: set[str]

    def start_weight_update(self) -> None:
        self.loaded = set()
        super().start_weight_update()

    def receive_weights(self, update_info: Any) -> None:
        model = self.model
        load = model.load_weights

        def counted(weights: Any) -> Any:
            got = load(weights)
            self.loaded |= set(got or ())
            return got

        model.load_weights = counted  # the NCCL engine calls self.model.load_weights for each unpacked bucket
        try:
            super().receive_weights(update_info)
        finally:
            del model.load_weights  # the class's method again
