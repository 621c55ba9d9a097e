"""Mixed into vLLM's workers (AsyncEngineArgs(worker_extension_cls=...)) so the trainer can push weights:
collective_rpc arguments go through msgpack, where nested tensors arrive as lists, so they travel as one
safetensors blob."""

from __future__ import annotations


class WeightSync:
    def load_safetensors_bytes(self, blob: bytes) -> int:
        from safetensors.torch import load

        weights = load(bytes(blob))  # Hugging Face parameter names, any dtype
        self.reload_weights(weights_iterator=list(weights.items()))  # type: ignore[attr-defined]
        return len(weights)
