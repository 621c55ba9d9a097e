"""A decoder's shape (hidden size, layers, heads, KV heads, head size, MLP width, vocabulary) for the memory plan
(plan/), from the model's config.json when it is on disk, else from a small table of the models the recipes
name, so that `rstar2 train plan` needs no network and no weights. Only Qwen3/Qwen2/Llama-style decoders."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rstar2_agent.models import REGISTRY

from .recipe import RECIPES

ARCHITECTURES = ("qwen3", "qwen2", "llama")


class ShapeError(ValueError):
    """A model whose shape the plan cannot find; the message says what to give instead."""


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False  # the output projection is the embedding (no separate lm_head)
    qk_norm: bool = True  # Qwen3's RMSNorm on each head's query and key
    attention_bias: bool = False  # biases on q, k, v (Qwen2)
    context_length: int = 32768  # max_position_embeddings: the engine's max_model_len
    name: str = field(default="", compare=False)

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        d = self.hidden
        attn = d * self.q + 2 * d * self.kv + self.q * d + (self.q + 2 * self.kv if self.attention_bias else 0)
        norms = 2 * d + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * d * self.intermediate + norms

    def root_params(self) -> int:
        """What FSDP's root unit holds: the embedding, the final norm and an untied lm_head."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """The engine's KV cache per token: a key and a value per KV head in every layer."""
        return 2 * self.layers * self.kv * dtype_bytes

    def as_json(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "intermediate": self.intermediate, "vocab": self.vocab, "tied": self.tied,
                "params": self.params()}


def from_config(config: dict[str, Any], name: str = "") -> Shape:
    kind = str(config.get("model_type", ""))
    if kind not in ARCHITECTURES:
        raise ShapeError(f"{name or 'the model'} is a {kind or 'model of unknown type'}: the memory plan knows "
                         f"{', '.join(ARCHITECTURES)} decoders only (run with memory_check=false to skip it)")
    heads = int(config["num_attention_heads"])
    return Shape(hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]), heads=heads,
                 kv_heads=int(config.get("num_key_value_heads") or heads),
                 head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
                 intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                 tied=bool(config.get("tie_word_embeddings", False)), qk_norm=kind == "qwen3",
                 attention_bias=bool(config.get("attention_bias", kind == "qwen2")),
                 context_length=int(config.get("max_position_embeddings") or 32768), name=name)


_QWEN3_14B = Shape(5120, 40, 40, 8, 128, 17408, 151936, context_length=32768, name="Qwen3-14B")
# the config.json of each (hub id, lowercased); Qwen3-8B/1.7B-Base share their instruct models' shapes
KNOWN: dict[str, Shape] = {
    "qwen/qwen3-14b": _QWEN3_14B, "qwen/qwen3-14b-base": _QWEN3_14B,
    "rstar2-reproduce/rstar2-agent-14b": _QWEN3_14B,  # a Qwen3-14B-Base fine-tune
    "qwen/qwen3-8b": Shape(4096, 36, 32, 8, 128, 12288, 151936, context_length=32768, name="Qwen3-8B"),
    "qwen/qwen3-1.7b": Shape(2048, 28, 16, 8, 128, 6144, 151936, tied=True, context_length=32768,
                             name="Qwen3-1.7B"),
    "huggingfacetb/smollm2-135m-instruct": Shape(576, 30, 9, 3, 64, 1536, 49152, tied=True, qk_norm=False,
                                                 context_length=8192, name="SmolLM2-135M"),
}
KNOWN["qwen/qwen3-8b-base"] = KNOWN["qwen/qwen3-8b"]
KNOWN["qwen/qwen3-1.7b-base"] = KNOWN["qwen/qwen3-1.7b"]
KNOWN["huggingfacetb/smollm2-135m"] = KNOWN["huggingfacetb/smollm2-135m-instruct"]


def model_shape(model: str) -> Shape:
    """The shape of `model` as a recipe names it: a local folder (its config.json), a registry name or hub id in
    `KNOWN` or in the local hub cache, or a checkpoint not written yet (`runs/NAME/last`) of a run whose recipe
    (its saved recipe.yaml, or a recipe in train/recipes/ with that `out`) starts from a model we can size:
    training does not change the shape."""
    return _shape(model, set())


def _shape(model: str, seen: set[str]) -> Shape:
    if model in seen:
        raise ShapeError(f"the recipes' models refer to each other in a loop at {model!r}")
    seen.add(model)
    folder = Path(model).expanduser()
    for candidate in (folder, Path("runs") / model / "last"):
        if (candidate / "config.json").is_file():
            return from_config(json.loads((candidate / "config.json").read_text()), model)
    spec = REGISTRY.get(model.lower())
    hub_id = (spec.hub_id if spec else model) or model
    if hub_id.lower() in KNOWN:
        return KNOWN[hub_id.lower()]
    cached = _hub_cache_config(hub_id)
    if cached is not None:
        return from_config(cached, hub_id)
    parent = _run_folder(folder)
    if parent is not None:
        base = _recipe_model(parent)
        if base is not None:
            return _shape(base, seen)
    raise ShapeError(f"cannot size the model {model!r}: it is not a local folder with a config.json, not one of "
                     f"the known shapes ({', '.join(sorted(KNOWN))}) nor in the hub cache, and no recipe starts the "
                     f"run that writes it; give a folder (or --shape NAME_OR_FOLDER to `rstar2 train plan`)")


def _hub_cache_config(hub_id: str) -> dict[str, Any] | None:
    if hub_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(hub_id, "config.json")
    except Exception:  # noqa: BLE001 - no hub library, a bad id: not cached
        return None
    return json.loads(Path(path).read_text()) if isinstance(path, str) else None


def _run_folder(path: Path) -> Path | None:
    """The run folder of a checkpoint path (`out/last`, `out/checkpoint-N`), else None."""
    if path.name == "last" or path.name.startswith("checkpoint-"):
        return path.parent
    return None


def _recipe_model(out: Path) -> str | None:
    """The model the run writing to `out` starts from: its saved recipe.yaml, else a recipe with that `out`."""
    saved = out / "recipe.yaml"
    files = [saved] if saved.is_file() else []
    files += sorted(RECIPES.glob("*.yaml"))
    for f in files:
        try:
            raw = yaml.safe_load(f.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(raw, dict) and raw.get("model") and (f == saved or Path(str(raw.get("out", ""))) == out):
            return str(raw["model"])
    return None
