"""The paper's pipeline rehearsed (train/rehearsal.py): the 14B recipes chained under the CPU overlay, end to end on
Ray's CPU actors and `rstar2 eval paper`, every hand-off checked on what the stages wrote; and each check failing on
what a broken chain would hand on."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_agent.store import Store
from rstar2_agent.train import recipe as recipes
from rstar2_agent.train.rehearsal import (
    RL_RECIPE,
    SFT_RECIPE,
    HandOffError,
    Rehearsal,
    check_chain,
    check_eval_reads_the_checkpoint,
    check_rl_start,
    check_sft_shapes,
)

FIXTURES = Path(__file__).resolve().parent / "data"
# what the overlay may change: the model and where things are read and written, counts, budgets, ranks and actors,
# the CPU's dtype and the start check's threshold; never the algorithm, the format or the data's shape
SCALE = {"model", "hub_dir", "batch_examples", "epochs", "dtype", "out", "db", "prompts_per_step", "group_size",
         "micro_batch_tokens", "logprob_chunk_tokens", "gpu_memory_gib", "start_check.min_answer_share", "data_dir"}


def test_the_overlay_changes_only_scale_and_the_recipes_chain(tmp_path):
    rehearsal = Rehearsal(tmp_path, FIXTURES, model="smollm2-135m")
    (sft_plain, sft), (rl_plain, rl) = rehearsal.configs()
    for before, after in ((sft_plain, sft), (rl_plain, rl)):
        keys = {k for k, _, _ in recipes.diff(before, after)}
        algorithm = {k for k in keys if k not in SCALE and not k.startswith("ray.")
                     and k.split(".")[-1] not in ("steps", "max_response_tokens", "data")}
        assert not algorithm, algorithm
    assert [s.filter_solved for s in rl.stages] == [s.filter_solved for s in rl_plain.stages] == [0, 0, 8]
    assert [s.reset_optimizer for s in rl.stages] == [False, False, True] and rl.roc and rl.distributed == "ray"
    assert sft.data == ["mix:paper"] and sft.format == rl.format == "rstar2-paper" and sft.target_shape == "format"
    check_chain(sft_plain, rl_plain)  # the recipes as written hand RL the SFT checkpoint
    check_chain(sft, rl)
    with pytest.raises(HandOffError, match="out/last"):
        check_chain(sft_plain, dataclasses.replace(rl_plain, model="qwen3-14b-base"))
    with pytest.raises(HandOffError, match="same format"):
        check_chain(sft_plain, dataclasses.replace(rl_plain, format="hermes"))


def _store_with(tmp_path, kind: str, name: str, benchmark: str, config: dict, info: dict) -> Store:
    store = Store(str(tmp_path / "s.db"))
    store.open_run(name, benchmark, "m", config, info, kind=kind)
    return store


def test_each_check_stops_a_broken_hand_off(tmp_path):
    sources = [{"source": "hub:a", "examples": 3, "in_shape_as_written": 0.0, "in_shape": 1.0},
               {"source": "hub:b", "examples": 2, "in_shape_as_written": 0.5, "in_shape": 0.5}]
    store = _store_with(tmp_path, "sft", "sft", "sft", {}, {"sources": sources})
    with pytest.raises(HandOffError, match="hub:b 0.5"):
        check_sft_shapes(store, "sft")
    with pytest.raises(HandOffError, match="no preflight"):
        check_rl_start([{"accuracy": 0.0}])
    meta = {"format": "rstar2-paper", "answer_extraction": "paper"}
    store = _store_with(tmp_path / "e", "eval", "rehearsal", "aime24",
                        {"format": "rstar2-paper", "answer_extraction": "release", "use_tools": True}, {})
    with pytest.raises(HandOffError, match="aime24: rstar2-paper/release"):
        check_eval_reads_the_checkpoint(store, meta)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(900)  # SFT, RL on a local Ray cluster of CPU actors, then `rstar2 eval paper`, on 2 shared cores
def test_the_rehearsal_chains_the_14b_recipes_end_to_end(tmp_path):
    """`rstar2 train rehearse` as a user runs it: the overlay printed as a diff, SFT on every paper-mix source's
    fixture, the three RL stages on Ray, the paper table; each hand-off's figures in its JSON."""
    import json

    rstar2 = [sys.executable, "-m", "rstar2_agent.cli"]
    p = subprocess.run([*rstar2, "train", "rehearse", "--fixtures", str(FIXTURES), "--out", str(tmp_path / "r"),
                        "--json"], capture_output=True, text=True, timeout=880)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert f"--- {SFT_RECIPE}" in out and f"--- {RL_RECIPE}" in out
    assert "  stages[0].steps: 300 -> 1" in out and "  ray.learners: 16 -> 2" in out
    assert "  model: qwen3-14b-base ->" in out
    assert "rehearsal passed" in out
    figures = json.loads(out.strip().splitlines()[-1])
    sources = figures["sft"]["sources"]
    assert len(sources) == 6 and all(s["in_shape"] == 1.0 and s["examples"] > 0 for s in sources)
    assert any(s["in_shape_as_written"] < 1.0 for s in sources)  # the conversion did the work, and was needed
    assert figures["sft"]["steps"] > 0 and figures["rl"]["steps"] == 3  # one step in each of the three stages
    assert 0.0 <= figures["rl"]["start_answer_share"] <= 1.0 and 0.0 <= figures["rl"]["start_signal_share"] <= 1.0
    assert {"aime24", "math500"} <= set(figures["eval"]["checked"]) and figures["eval"]["runs"] >= 6
    assert "rStar2-Agent paper vs" in out  # the paper's table, printed by eval


def test_the_rehearsal_refuses_missing_fixtures_before_anything_runs(tmp_path):
    with pytest.raises(HandOffError, match="fixtures are missing"):
        Rehearsal(tmp_path / "r", tmp_path / "nothing").run()
    assert not (tmp_path / "r").exists()
