"""Models the project makes from the embedded base with its own recipes, once per machine: today the default agent
of `rstar2 chat` and `rstar2 serve` (`smollm2-agent`), the embedded SmolLM2-135M-Instruct after the SFT recipe
`sft-smollm2-agent` (444 everyday "compute this" asks, train/data/asks.py: one Hermes call to the Python tool and a
boxed answer each).

A made model lives in `$RSTAR2_HOME/models/NAME-KEY`, KEY a hash of the recipe as resolved, the data as loaded and
the base model's files, so a changed recipe or base makes a new one and an unchanged one is made once. It is built
in a hidden folder beside it and renamed into place when whole; `NAME.json` then points at it (the core's
`models.made_folder` reads the pointer): a build stopped by Ctrl-C, SIGTERM or a crash leaves no pointer to a
partial model, and the next build starts clean. Training is deterministic (the recipe's seed; synthesized data)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2_agent.models import DEFAULT_AGENT, file_lock, made_pointer, resolve_model, rstar2_home

from . import recipe as recipes
from .config import SFTConfig

RECIPES = {DEFAULT_AGENT: "sft-smollm2-agent"}


# The code each generated source comes from (converters.py reads the `asks:N[:SEED]` spelling): a changed generator
# makes other data from the same recipe, so another model. Hashing the code, not the data it makes, keeps every
# start of chat and serve from generating the data again (the asks run each program to take its output).
_DATA = Path(__file__).with_name("data")
_CORE = Path(__file__).resolve().parents[1] / "rstar2_agent"
GENERATORS = {"asks": [_DATA / "asks.py", _DATA / "tool_tasks.py", _DATA / "converters.py", _CORE / "synthetic.py"],
              "synthetic": [_DATA / "converters.py", _CORE / "synthetic.py"]}


def data_digest(cfg: SFTConfig) -> str:
    """What the recipe's data is made from: for generated sources (asks:, synthetic:) the sources and their
    generators' code; for any other (a file, a hub set) the data as loaded."""
    from .data.sft_mix import load_mix

    digest = hashlib.sha256(json.dumps(cfg.data).encode())
    kinds = {source.split(":", 1)[0] for source in cfg.data}
    if kinds <= GENERATORS.keys():
        for path in sorted({p for kind in kinds for p in GENERATORS[kind]}):
            digest.update(path.read_bytes())
        return digest.hexdigest()
    for part in load_mix(cfg.data, cfg.seed, cfg.on_bad_line, cfg.hub_dir):
        digest.update(json.dumps(part.records, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def model_key(cfg: SFTConfig) -> str:
    """A hash of what the model is made from: the resolved recipe (`cfg` loaded with placeholders for where it is
    written, so the key does not depend on them), its data (data_digest) and the base model's files (their names and
    sizes), and the precision it trains in where that is bf16 (`dtype: auto` is bf16 on a CPU with AMX and on most
    GPUs: another model from the same recipe; fp32 builds keep the key they had before precision counted)."""
    from .learner.model import learner_precision

    base = Path(resolve_model(cfg.model).path)
    files = sorted((p.name, p.stat().st_size) for p in base.iterdir() if p.is_file())
    parts = [recipes.dump(cfg), data_digest(cfg), files]
    if (precision := learner_precision(cfg.dtype)) != "fp32":
        parts.append(precision)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def make_model(name: str = DEFAULT_AGENT, changes: dict[str, Any] | None = None,
               on_step: Callable[[int, int, dict[str, float]], None] | None = None,
               echo: Callable[[str], None] = print) -> Path:
    """The folder of the made model `name`, made now if this machine has none of the current recipe; `changes`:
    recipe overrides (tests make a small one)."""
    from .learner.checkpoint import SHARDS, STATE_FILE
    from .learner.model import learner_precision
    from .sft import run_sft

    if name not in RECIPES:
        raise ValueError(f"no made model {name!r}; the project makes {', '.join(RECIPES)}")
    home = rstar2_home() / "models"
    home.mkdir(parents=True, exist_ok=True)
    cfg = recipes.load(SFTConfig, RECIPES[name], changes={"out": "OUT", "db": "DB", **(changes or {})})
    key = model_key(cfg)
    target = home / f"{name}-{key}"
    with file_lock(home / f".{name}.lock"):
        pointer = made_pointer(name)
        if target.is_dir() and pointer.exists() and json.loads(pointer.read_text()).get("key") == key:
            return target
        for stale in home.glob(f".{name}-building-*"):  # a build a kill stopped: never used, removed
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}-building-", dir=home))
        try:
            echo(f"making {name} once: SFT of {cfg.model} on the recipe {RECIPES[name]} ({', '.join(cfg.data)}), "
                 f"into {target}")
            started = time.monotonic()
            cfg = recipes.load(SFTConfig, RECIPES[name], changes={**(changes or {}), "out": str(work / "sft"),
                                                                   "db": str(work / "store.db")})
            final, history = run_sft(cfg, on_step=on_step)
            final = final.resolve()
            shutil.rmtree(final / SHARDS)  # the optimizer state a resume would need: 3x the model, never read here
            (final / STATE_FILE).unlink()
            os.replace(final, work / "model")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work / "model", target)  # whole, or not there
            card = {"name": name, "key": key, "path": str(target), "recipe": RECIPES[name], "base": cfg.model,
                    "precision": learner_precision(cfg.dtype),
                    "steps": len(history), "loss": [history[0]["loss"], history[-1]["loss"]] if history else [],
                    "seconds": round(time.monotonic() - started, 1)}
            tmp = pointer.with_suffix(".tmp")
            tmp.write_text(json.dumps(card, indent=1))
            os.replace(tmp, pointer)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    echo(f"{name}: made in {card['seconds']:.0f} s ({card['steps']} steps in {card['precision']}, loss "
         f"{card['loss'][0]:.2f} -> {card['loss'][1]:.2f})")
    return target
