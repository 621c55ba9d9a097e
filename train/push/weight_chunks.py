"""How a weight push is cut into messages, and how a push checks what the engine loaded.

A message to vLLM's workers goes through its msgpack encoder, which cannot encode a bytes object over 2**32 - 1
bytes (Qwen3-14B in bf16 is 29.5 GB), so a push travels as several messages under a cap. The unit of a message
is a whole layer: every name under `model.layers.N.` together (keyed, as vLLM's own `layerwise_groups` does, on
the outermost integer segment of the name), and each other module (embeddings, final norm, lm_head) as a unit of
its own. vLLM's layerwise reload materializes a module once it has received all its weights, and one that has
received only part of them when the reload ends is materialized with the rest uninitialized, silently: whole
layers per message keep every module's weights together.

vLLM's `load_weights` returns the names it loaded, in its own naming: the stacked projections (q/k/v into
qkv_proj, gate/up into gate_up_proj) and no lm_head when it is tied to the embeddings. A name it skips (an
unexpected `.bias`, a module the engine's model does not have) is only a log line there, so the push compares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rstar2_agent.engines.base import EngineError

MESSAGE_LIMIT = 2**32 - 1  # msgspec's limit on one bytes object, which vLLM's collective_rpc arguments go through
HEADER_BYTES = 1024  # the safetensors header's fixed part, budgeted in every message
ENTRY_BYTES = 160  # the header's share per tensor (its name, dtype, shape and offsets as JSON), beyond the name
STACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
           "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def unit_of(name: str) -> str:
    """The unit a weight travels in: its decoder layer (the name up to its outermost integer segment), else its
    module (the name less its last segment)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or name


def units(names: Iterable[str]) -> dict[str, list[str]]:
    """{unit: its names}, units in the order of their first name, names in their order."""
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(unit_of(name), []).append(name)
    return out


def message_bytes(sizes: dict[str, int]) -> int:
    """What a safetensors blob of tensors of these byte sizes takes, at most (the header budgeted)."""
    return HEADER_BYTES + sum(n + len(k) + ENTRY_BYTES for k, n in sizes.items())


def chunks(sizes: dict[str, int], max_bytes: int, param: str = "max_message_mb") -> list[list[str]]:
    """The names of {name: tensor bytes}, cut into chunks of whole units, each a message of at most `max_bytes`
    (`message_bytes`); a unit that alone passes it is refused, naming the unit and `param`, the setting that
    raises the cap. Nothing is cut before everything is planned, so a refused push sends nothing."""
    out: list[list[str]] = []
    current: list[str] = []
    used = HEADER_BYTES
    for unit, names in units(sizes).items():
        need = message_bytes({k: sizes[k] for k in names}) - HEADER_BYTES
        if HEADER_BYTES + need > max_bytes:
            raise EngineError(
                f"the weights of {unit} ({need / 2**20:.1f} MiB) do not fit one message of {param}="
                f"{max_bytes / 2**20:.1f} MiB, and a layer is never split across messages (vLLM would rebuild it "
                f"half loaded): raise {param} to at least {math.ceil((HEADER_BYTES + need) / 2**20)} (at most "
                f"{MESSAGE_LIMIT // 2**20}, vLLM's message limit)")
        if current and used + need > max_bytes:
            out.append(current)
            current, used = [], HEADER_BYTES
        current += names
        used += need
    if current:
        out.append(current)
    return out


def not_loaded(sent: Iterable[str], loaded: set[str], tied_embeddings: bool = False) -> list[str]:
    """The sent names that vLLM did not report loaded, allowing its stacked projections and a tied lm_head."""
    missing = []
    for name in sent:
        stacked = ".".join(STACKED.get(p, p) for p in name.split("."))
        if name in loaded or stacked in loaded or (tied_embeddings and unit_of(name) == "lm_head"):
            continue
        missing.append(name)
    return missing


def not_loaded_error(missing: list[str], sent: int, engine: str) -> EngineError:
    return EngineError(
        f"{engine} did not load {len(missing)} of the {sent} weights pushed ({', '.join(missing[:5])}"
        f"{', ...' if len(missing) > 5 else ''}): the engine's model has no such parameter (a learner of another "
        f"architecture or with renamed modules, or a weight vLLM ignores, such as an unexpected .bias), so the "
        f"engine does not hold what the learner holds; push the state dict of the model the engine serves")
