"""The default agent is made once per machine from the embedded base by the project's own SFT recipe
(train/made_models.py), under a key of recipe, data and base: made whole or not at all (a stopped build is never used),
found again without training, remade when its recipe changes, and named by the command that makes it when it is
missing. Run here on a scaled-down recipe (2 conversations, 1 step) in a fresh RSTAR2_HOME that shares only the
converted base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_agent.models import DEFAULT_AGENT, ModelError, made_pointer, resolve_model
from rstar2_agent.train.learner.checkpoint import SHARDS, STATE_FILE
from rstar2_agent.train.made_models import RECIPES, make_model

SMALL = {"data": ["synthetic:2:0"], "epochs": 1, "seq_len": 1024}  # one step


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("sft-checkpoint")  # an SFT of SmolLM2: never beside the shared one (memory)
def test_the_agent_is_made_once_whole_and_a_changed_recipe_starts_a_new_one(tmp_path, monkeypatch, smol):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m").symlink_to(smol.path)  # the converted base, shared
    monkeypatch.setenv("RSTAR2_HOME", str(tmp_path))
    monkeypatch.setattr("rstar2_agent.models.MAKERS", {})  # an in-process `rstar2` run may have registered one
    with pytest.raises(ModelError, match=f"rstar2 models make {DEFAULT_AGENT}"):
        resolve_model(DEFAULT_AGENT)

    steps: list[int] = []
    folder = make_model(changes=SMALL, on_step=lambda done, total, m: steps.append(done), echo=lambda _: None)
    card = json.loads(made_pointer(DEFAULT_AGENT).read_text())
    assert steps == [1] and card["path"] == str(folder) and card["recipe"] == RECIPES[DEFAULT_AGENT]
    meta = json.loads((folder / "rstar2.json").read_text())
    assert meta["format"] == "hermes" and (folder / "config.json").exists()
    assert (folder / "model.safetensors").is_file()  # the weights alone: no AdamW shards, no trainer state
    assert not (folder / SHARDS).exists() and not (folder / STATE_FILE).exists()
    assert resolve_model(DEFAULT_AGENT).path == str(folder)  # found by its pointer, nothing trained
    assert make_model(changes=SMALL, on_step=lambda *a: steps.append(-1), echo=lambda _: None) == folder
    assert steps == [1]

    def stop(text: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C as the build starts, its folder made

    with pytest.raises(KeyboardInterrupt):  # another recipe: another key, so a new build starts (and is stopped)
        make_model(changes={**SMALL, "seed": 1}, echo=stop)
    assert not list((tmp_path / "models").glob(".smollm2-agent-building-*"))  # nothing partial left
    assert resolve_model(DEFAULT_AGENT).path == str(folder)  # the whole one is still the one used

    from click.testing import CliRunner

    from rstar2_agent.cli import main
    from rstar2_agent.train.learner.model import learner_precision

    assert card["precision"] == learner_precision("auto")  # bf16 on a CPU with AMX, fp32 without: said, not hidden
    listing = CliRunner().invoke(main, ["models"])
    assert listing.exit_code == 0 and f"made here in {card['precision']}: {folder}" in listing.output


def test_the_key_follows_the_generators_code_and_a_file_sources_data(smol, monkeypatch, tmp_path):
    """A generator whose code changed makes other data from the same recipe: another model (the key hashes the
    generators' files, so a start of chat does not generate the data again); a file source's key follows its rows."""
    from rstar2_agent.train import made_models, recipe
    from rstar2_agent.train.config import SFTConfig
    from rstar2_agent.train.data import asks
    from rstar2_agent.train.made_models import model_key

    cfg = recipe.load(SFTConfig, RECIPES[DEFAULT_AGENT], changes={"out": "OUT", "db": "DB", "data": ["asks:4:0"]})
    key = model_key(cfg)
    assert model_key(cfg) == key
    assert Path(asks.__file__).resolve() in [p.resolve() for p in made_models.GENERATORS["asks"]]
    copy = tmp_path / "asks.py"
    copy.write_bytes(Path(asks.__file__).read_bytes())
    monkeypatch.setitem(made_models.GENERATORS, "asks", [copy])
    same = model_key(cfg)
    copy.write_text(copy.read_text().replace('" Use Python."', '" Answer with Python."', 1))
    assert model_key(cfg) != same
    rows = tmp_path / "rows.jsonl"
    record = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    rows.write_text(json.dumps(record) + "\n")
    on_file = recipe.load(SFTConfig, RECIPES[DEFAULT_AGENT], changes={"out": "OUT", "db": "DB",
                                                                      "data": [str(rows)]})
    file_key = model_key(on_file)
    record["messages"][1]["content"] = "5"
    rows.write_text(json.dumps(record) + "\n")
    assert model_key(on_file) != file_key


def test_the_key_follows_the_precision_auto_trains_in(smol, monkeypatch):
    """`dtype: auto` trains in bf16 on a CPU with AMX and in fp32 on one without: two models from one recipe, so two
    keys; an fp32 build keeps the key it had before precision counted (models made on such machines stay valid)."""
    import hashlib

    from rstar2_agent.train import recipe
    from rstar2_agent.train.config import SFTConfig
    from rstar2_agent.train.learner import model as learner_model
    from rstar2_agent.train.made_models import data_digest, model_key

    cfg = recipe.load(SFTConfig, RECIPES[DEFAULT_AGENT], changes={"out": "OUT", "db": "DB", "data": ["asks:4:0"]})
    assert cfg.dtype == "auto"
    keys = {}
    for amx in (False, True):
        monkeypatch.setattr(learner_model, "bf16_supported", lambda device, amx=amx: amx)
        keys[amx] = model_key(cfg)
    assert keys[False] != keys[True]
    base = Path(resolve_model(cfg.model).path)
    files = sorted((p.name, p.stat().st_size) for p in base.iterdir() if p.is_file())
    before = json.dumps([recipe.dump(cfg), data_digest(cfg), files])  # the key as it was made before precision counted
    assert keys[False] == hashlib.sha256(before.encode()).hexdigest()[:12]
