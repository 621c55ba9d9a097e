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
    FIXTURE_ROWS,
    RL_RECIPE,
    SFT_RECIPE,
    HandOffError,
    Rehearsal,
    check_chain,
    check_eval_reads_the_checkpoint,
    check_rl_start,
    check_rl_updates,
    check_sft_shapes,
    fixture_rows,
    overlay_text,
)

FIXTURES = Path(__file__).resolve().parents[1] / "data"
# what the overlay may change: the model and where things are read and written, counts, budgets, ranks and actors,
# the CPU's engine (rollout_engine hf, its options, sandbox workers) and dtype; SFT's learning rate (a few-step SFT
# of a small model learns nothing at the 14B's 5e-6) and seeded rollouts (reproducible; the recipe leaves them off
# for vLLM's batched sampler's speed); never the algorithm, the format or the data's shape
SCALE = {"model", "hub_dir", "batch_examples", "epochs", "dtype", "out", "db", "prompts_per_step", "group_size",
         "micro_batch_tokens", "logprob_chunk_tokens", "gpu_memory_gib", "data_dir",
         "optim.lr", "seeded_rollouts", "rollout_engine", "sandbox_workers", "engine_options.gpu_memory_utilization",
         "engine_options.max_num_seqs"}


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
    # the paper's mix, and the RL fixture problems as rows: the one data departure, named in the printed diff
    assert sft_plain.data == ["mix:paper"] and sft.data == ["mix:paper", str(tmp_path / FIXTURE_ROWS)]
    assert sft.format == rl.format == "rstar2-paper" and sft.target_shape == "format"
    assert rl.start_check == rl_plain.start_check and rl.start_check.min_answer_share > 0  # a threshold to pass
    assert rl.ppo_mini_batches == rl_plain.ppo_mini_batches
    assert rl.gradient_checkpointing and rl.micro_batch_tokens and rl.logprob_chunk_tokens
    assert "# + the RL fixture problems as SFT rows" in overlay_text(sft_plain, sft, rl_plain, rl)
    check_chain(sft_plain, rl_plain)  # the recipes as written hand RL the SFT checkpoint
    check_chain(sft, rl)
    with pytest.raises(HandOffError, match="out/last"):
        check_chain(sft_plain, dataclasses.replace(rl_plain, model="qwen3-14b-base"))
    with pytest.raises(HandOffError, match="same format"):
        check_chain(sft_plain, dataclasses.replace(rl_plain, format="hermes"))


def test_the_fixture_rows_answer_rls_prompts_in_the_format_s_shape(tmp_path):
    """Each row's prompt is the one RL's rollouts render for that problem, and its target is in the rstar2-paper
    shape with the problem's answer boxed: the SFT'd policy learns to answer RL's own prompts."""
    from transformers import AutoTokenizer

    from rstar2_agent.chat_format import ChatFormat
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.data.chat_data import load_examples, read_jsonl
    from rstar2_agent.train.data.pool import stage_pool

    (_, _), (_, rl) = Rehearsal(tmp_path, FIXTURES, model="smollm2-135m").configs()
    assert fixture_rows(rl, tmp_path / FIXTURE_ROWS) == 4
    problems = sorted(stage_pool(rl.stages[0], rl).values(), key=lambda p: p.id)
    records = list(read_jsonl(tmp_path / FIXTURE_ROWS))
    fmt = ChatFormat(AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path), "rstar2-paper")
    examples = load_examples(fmt, records, 8192, shape="as_written")  # as written: no conversion needed
    assert len(examples) == len(problems) == 4 and all(e.shaped_as_written for e in examples)
    for p, e in zip(problems, examples, strict=True):
        prompt = fmt.render_prompt(p.text)
        assert e.ids[:len(prompt)] == prompt and not any(e.mask[:len(prompt)]) and e.mask[len(prompt)] == 1
        assert f"\\boxed{{{p.answer}}}" in fmt.tokenizer.decode(e.ids[len(prompt):])


def _stage_step(stage: int, kept: int) -> dict[str, float]:
    pushed = {"push_probe_max_abs_diff": 0.0, "push_probe_move_decided": 1.0, "push_probe_move_share": 1.0}
    return {"stage": stage, "update_tokens": 100 * kept, "roc_kept_positive": kept, "roc_kept_negative": kept,
            "grad_norm": 0.5 if kept else 0.0, **(pushed if kept else {})}


def test_a_stage_that_took_no_update_stops_the_rehearsal_naming_it():
    history = [_stage_step(0, 2) | {"push_probe_bound": 1e-3}, _stage_step(1, 2), _stage_step(2, 1)]
    stages = check_rl_updates(history, 3)
    assert [s["updates"] for s in stages] == [1, 1, 1] and [s["kept_rollouts"] for s in stages] == [4, 4, 2]
    assert stages[0]["grad_norm"] == 0.5 and stages[2]["push_probe_bound"] == 1e-3
    history[1] = _stage_step(1, 0)  # stage 2: every group all right or all wrong, nothing kept
    with pytest.raises(HandOffError, match="RL stage 2 took no update"):
        check_rl_updates(history, 3)
    history[1] = {k: v for k, v in _stage_step(1, 2).items() if not k.startswith("push_probe")}
    with pytest.raises(HandOffError, match="RL stage 2 updated without a checked weight push"):
        check_rl_updates(history, 3)


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
    fixture and the RL fixture rows, the three RL stages on Ray each taking an update and a checked push, the paper
    table; each hand-off's figures in its JSON."""
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
    assert len(sources) == 7 and all(s["in_shape"] == 1.0 and s["examples"] > 0 for s in sources)
    assert sources[-1]["source"].endswith(FIXTURE_ROWS) and sources[-1]["in_shape_as_written"] == 1.0
    assert any(s["in_shape_as_written"] < 1.0 for s in sources)  # the conversion did the work, and was needed
    assert figures["sft"]["steps"] > 0 and figures["rl"]["steps"] == 3  # one step in each of the three stages
    # the SFT'd policy passes the recipe's start check (0.02), and every stage trained, pushed and checked the push
    assert figures["rl"]["start_answer_share"] >= 0.02 and 0.0 <= figures["rl"]["start_signal_share"] <= 1.0
    stages = figures["rl"]["stages"]
    assert [s["stage"] for s in stages] == [1, 2, 3] and all(s["updates"] >= 1 for s in stages), stages
    assert all(s["grad_norm"] > 0 and s["push_probe_max_abs_diff"] <= s["push_probe_bound"] for s in stages), stages
    assert all(f"RL stage {i}: " in out for i in (1, 2, 3)) and "push checked: probe gap" in out
    assert {"aime24", "math500"} <= set(figures["eval"]["checked"]) and figures["eval"]["runs"] >= 6
    assert "rStar2-Agent paper vs" in out  # the paper's table, printed by eval


def test_the_rehearsal_refuses_missing_fixtures_before_anything_runs(tmp_path):
    with pytest.raises(HandOffError, match="fixtures are missing"):
        Rehearsal(tmp_path / "r", tmp_path / "nothing").run()
    assert not (tmp_path / "r").exists()
