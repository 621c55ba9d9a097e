"""Model names: a training run is reachable by its name (`runs/NAME/last` under the working folder), with the
format and context its checkpoint says it was trained with; registry names win over run names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_agent.models import ModelError, resolve_model
from rstar2_agent.train.train_commands import _reach


def test_a_run_name_resolves_to_its_last_checkpoint(tmp_path, monkeypatch):
    last = tmp_path / "runs" / "my-rl" / "checkpoint-4"
    last.mkdir(parents=True)
    (last / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    (last / "rstar2.json").write_text(json.dumps({"format": "hermes", "context_length": 4096}))
    (tmp_path / "runs" / "my-rl" / "last").symlink_to("checkpoint-4")
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model("my-rl")
    assert resolved.path == str(last.resolve())
    assert resolved.spec.format == "hermes" and resolved.spec.context_length == 4096


def test_a_name_that_is_no_run_is_looked_up_on_the_hub_and_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="--model PATH"):
        resolve_model("no-such-run-xyz")


def test_a_registry_name_wins_over_a_run_of_the_same_name(tmp_path, monkeypatch):
    (tmp_path / "runs" / "qwen3-14b-base" / "last").mkdir(parents=True)  # a run named like a registry model
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="Qwen/Qwen3-14B-Base"):  # the registry's hub id is fetched, not the run
        resolve_model("qwen3-14b-base")


def test_a_finished_run_says_how_to_reach_it(tmp_path, monkeypatch):
    """`rstar2 train sft|rl` ends by naming the model: the run's name when --model finds it from here."""
    out = tmp_path / "runs" / "my-rl"
    (out / "step-4").mkdir(parents=True)
    (out / "last").symlink_to("step-4")
    monkeypatch.chdir(tmp_path)
    assert _reach("runs/my-rl", "runs/my-rl/step-4").endswith("rstar2 chat --model my-rl")
    monkeypatch.chdir(tmp_path / "runs")  # from elsewhere the name would not resolve: the path
    assert _reach(str(out), str(out / "step-4")).endswith(f"--model {out / 'step-4'}")


def test_format_reason_says_where_each_model_s_format_comes_from(tmp_path, monkeypatch):
    from rstar2_agent.models import format_reason

    monkeypatch.chdir(tmp_path)
    assert format_reason("rstar2-agent-14b", None, "rstar2-paper").startswith(
        "rstar2-paper: the registry's format for rstar2-agent-14b (the public checkpoint was trained in the paper's")
    given = format_reason("rstar2-agent-14b", "rstar2-release", "rstar2-release")
    assert given == "rstar2-release: given with --format"
    (tmp_path / "runs" / "mine" / "last").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / "last" / "rstar2.json").write_text('{"format": "hermes"}')
    assert "the format the checkpoint was trained in" in format_reason("mine", None, "hermes")
    assert "--format template" in format_reason("org/unknown-model", None, "hermes")


REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "rstar2-release-chat-template.jinja"


@pytest.mark.skipif(not REFERENCE.exists(), reason="../shared/reference is not on this machine")
@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_folder_of_the_public_checkpoint_is_found_by_its_chat_template(tmp_path, where):
    """A local copy of the public checkpoint (no rstar2.json, any folder name) carries the release's chat template:
    it runs in rstar2-paper, and the reason says why; the same folder with Qwen3's own template stays hermes and
    `rstar2 eval paper` refuses it without --format, naming rstar2-paper, before any engine starts."""
    from click.testing import CliRunner

    from rstar2_agent.cli import main
    from rstar2_agent.models import format_reason, recognized

    folder = tmp_path / "downloaded-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                    "max_position_embeddings": 40960}))
    template = REFERENCE.read_text()
    if where == "chat_template.jinja":
        (folder / where).write_text(template)
    else:
        (folder / where).write_text(json.dumps({"chat_template": template}))
    spec = resolve_model(str(folder)).spec
    assert spec.format == "rstar2-paper" and recognized(str(folder))
    assert "release's chat template" in format_reason(str(folder), None, spec.format)

    (folder / where).write_text(json.dumps({"chat_template": "{{ messages }}"}) if where != "chat_template.jinja"
                                else "{{ messages }}")
    assert resolve_model(str(folder)).spec.format == "hermes" and not recognized(str(folder))
    r = CliRunner().invoke(main, ["eval", "paper", "--model", str(folder), "--limit", "1"])
    assert r.exit_code == 1 and "--format rstar2-paper" in r.output, r.output
