"""The worker extension `WeightSync`, which a rollout engine mixes into vLLM's workers (`worker_extension_cls`, set by
the trainable engine: train/rollout/trainable.py) so the trainer can push weights where the engine has no weight
transfer of its own (vLLM's CPU build): collective_rpc arguments go through msgpack, where nested tensors arrive as
lists, so each message is one safetensors blob of whole layers (weight_chunks.py). vLLM imports this module in every
worker: it imports nothing of the wing beyond vllm_transfer_config.py (the package's __init__ only its config types).

A push is one layerwise-reload session, the lifecycle of vLLM's own weight transfer engines (its NCCL engine's
start_weight_update, update_weights, finish_weight_update): `begin_weight_push`, then `load_weight_chunk` per
message, then `end_weight_push`, which processes what is left and puts the old values back for any module that
received nothing. Each chunk returns the names vLLM's `load_weights` reports loaded, which the push checks.

On a GPU the engine has vLLM's own weight transfer instead (vllm_transfer_config.py): importing this module (which vLLM
does in each worker before it creates its transfer engine) registers that backend.
"""

from __future__ import annotations

from .vllm_transfer_config import install_substitute, register

register()
install_substitute()  # tests and benchmarks only: a CPU stand-in for CUDA IPC, when the engine's environment names one


class WeightSync:
    def _reload_model(self):  # type: ignore[no-untyped-def]
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def begin_weight_push(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self._reload_model())

    def load_weight_chunk(self, blob: bytes) -> list[str]:
        """Load one message (Hugging Face names, any dtype); the names vLLM loaded, in its own naming."""
        import torch
        from safetensors.torch import load
        from vllm.config import set_current_vllm_config

        weights = load(bytes(blob))
        with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
            loaded = self._reload_model().load_weights(list(weights.items()))
        return sorted(loaded or ())

    def end_weight_push(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(self._reload_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        # what vLLM's own reload_weights drops after new weights (state derived from the old ones)
        runner.reset_lora_state()
        runner.reset_encoder_cache()
        runner.reset_mm_cache()

    def abort_weight_transfer(self) -> dict[str, int | bool]:
        """End a push through vLLM's weight transfer that failed at any phase (a trainer that raised before sending,
        a receive that failed half way): the layerwise reload is finalized (every module holds weights again: the
        new ones where they arrived whole, the old ones elsewhere) and the worker takes the next
        `start_weight_update`. Returns whether a push was open and how many names it had loaded (0: the engine
        serves the previous weights exactly)."""
        engine = self.weight_transfer_engine  # type: ignore[attr-defined]
        open_ = bool(getattr(engine, "reloading", False))
        loaded = len(getattr(engine, "loaded", ()))
        if open_:
            from vllm.config import set_current_vllm_config

            try:
                with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                    engine.finish_weight_update()
            finally:
                engine.reloading = False
                engine.reset_weight_update_target()
            self.model_runner.reset_lora_state()  # type: ignore[attr-defined]
        self._weight_update_active = False  # type: ignore[attr-defined]  # the next start_weight_update is taken
        return {"open": open_, "loaded": loaded if open_ else 0}

    def transferred_weight_names(self) -> list[str]:
        """The names loaded by the latest push through vLLM's weight transfer (the rstar2_nccl backend)."""
        return sorted(getattr(self.weight_transfer_engine, "loaded", ()))  # type: ignore[attr-defined]
