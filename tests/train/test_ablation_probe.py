"""The ablation's held-out probe: the paired bootstrap on constructed data, the probe's problems held out from
training, and the command end to end at toy size (both arms, the probe's pairing, a kill mid-training and a kill
mid-probe, then resumes that re-use what finished)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_agent.problem import Problem
from rstar2_agent.stats import paired_ratio_bootstrap
from rstar2_agent.train.ablation.experiment import Ablation, power, probe_summary
from rstar2_agent.train.ablation.probe import ProbeError, ProbeSettings, check_disjoint, probe_problems
from rstar2_agent.train.config import RLConfig, Stage
from rstar2_agent.train.data import tool_tasks
from rstar2_agent.train.recipe import load

from conftest import run_until_paused

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


def _arms(effect: float, seeds: int = 3, prompts: int = 48, seed: int = 0):
    """Two arms on the same prompts: per prompt a difficulty shared by both arms (prompt noise much larger than
    the arm effect), arm a's numerator `effect` times arm b's in expectation, binomial noise per arm."""
    rng = random.Random(seed)
    hard = [rng.uniform(0.05, 0.9) for _ in range(prompts)]
    den = [[float(rng.randint(4, 12)) for _ in range(prompts)] for _ in range(seeds)]

    def draw(scale: float) -> list[list[float]]:
        return [[float(sum(rng.random() < min(1.0, h * scale) for _ in range(int(d))))
                 for h, d in zip(hard, row, strict=True)] for row in den]
    return draw(effect), den, draw(1.0), den


def test_identical_arms_give_a_ratio_of_one_with_no_spread_when_pairs_stay_together():
    num, den, _, _ = _arms(1.0)
    ci = paired_ratio_bootstrap(num, den, num, den, reps=300)
    # a prompt's two arms are always drawn together: every replicate's ratio is exactly 1 (an unpaired draw of
    # each arm's prompts would spread it by the prompts' difficulty)
    assert (ci.ratio, ci.lo, ci.hi) == (1.0, 1.0, 1.0)


def test_arms_without_an_effect_give_an_interval_containing_one():
    a_num, a_den, b_num, b_den = _arms(1.0, seed=1)
    ci = paired_ratio_bootstrap(a_num, a_den, b_num, b_den, reps=500)
    assert ci.lo < 1 < ci.hi and ci.lo < ci.ratio < ci.hi


def test_a_known_effect_gives_an_interval_excluding_one_that_holds_it():
    a_num, a_den, b_num, b_den = _arms(0.5, seed=2)
    ci = paired_ratio_bootstrap(a_num, a_den, b_num, b_den, reps=500)
    assert ci.hi < 1 and ci.lo < 0.5 * 1.15 and ci.hi > 0.5 * 0.85  # the effect (0.5, less where capped at 1)


def test_pairing_narrows_the_interval_against_resampling_each_arm_alone():
    a_num, a_den, b_num, b_den = _arms(0.8, seed=3)
    paired = paired_ratio_bootstrap(a_num, a_den, b_num, b_den, reps=400)
    # breaking the pairs: arm b's prompts in another order (the same values, no longer matched to arm a's)
    order = list(range(len(b_num[0])))
    random.Random(0).shuffle(order)
    shuffled = [[row[i] for i in order] for row in b_num], [[row[i] for i in order] for row in b_den]
    unpaired = paired_ratio_bootstrap(a_num, a_den, *shuffled, reps=400)
    assert unpaired.ratio == pytest.approx(paired.ratio)  # the pooled values do not depend on the order
    assert paired.log_sd < unpaired.log_sd


def test_the_seed_and_prompt_parts_of_the_spread():
    a_num, a_den, b_num, b_den = _arms(0.7, seeds=1, seed=4)
    only_seeds = paired_ratio_bootstrap(a_num, a_den, b_num, b_den, resample="seeds", reps=100)
    assert only_seeds.lo == only_seeds.hi == only_seeds.ratio  # one seed: resampling seeds changes nothing
    assert paired_ratio_bootstrap(a_num, a_den, b_num, b_den, resample="prompts", reps=200).log_sd > 0
    with pytest.raises(ValueError, match="shape"):
        paired_ratio_bootstrap(a_num, a_den, b_num[:0], b_den, reps=10)
    with pytest.raises(ValueError, match="resample"):
        paired_ratio_bootstrap(a_num, a_den, b_num, b_den, resample="arms")


def _record(failed: list[float], calls: list[float]) -> dict:
    """A probe record in the stored shape: per prompt one positive rollout with these tool calls and failures."""
    return {"seconds": 2.0 * len(calls), "rollouts": len(calls), "prompts": [
        {"id": f"p{i}", "rollouts": [{"reward": 1.0, "calls": c, "failed": f, "tokens": 100 + 10 * f,
                                      "well_formed": True, "stop": "stop"}]}
        for i, (f, c) in enumerate(zip(failed, calls, strict=True))]}


def _ablation_of(effect: float, seeds: int, prompts: int) -> Ablation:
    a_num, den, b_num, _ = _arms(effect, seeds=seeds, prompts=prompts, seed=5)
    probes = {"start": _record(b_num[0], den[0])}
    for s in range(seeds):
        for k in (1, 2):
            probes[f"roc-seed{s}-step{k}"] = _record(a_num[s], den[s])
            probes[f"grpo-seed{s}-step{k}"] = _record(b_num[s], den[s])
    step = {"time_rollout": 30.0, "time_grading": 1.0, "time_update": 10.0, "time_push": 1.0,
            "response_tokens": 300.0, "update_tokens": 4000.0}
    histories = {arm: {s: [step, step] for s in range(seeds)} for arm in ("roc", "grpo")}
    return Ablation(histories, probes, [Problem(f"p{i}", "", "") for i in range(prompts)], points=(0, 1, 2), steps=2,
                    rollouts_per_step={"roc": 32, "grpo": 16})


def test_the_probe_summary_pairs_the_arms_and_the_power_estimate_asks_for_more_when_the_interval_straddles_one():
    strong = probe_summary(_ablation_of(0.4, seeds=2, prompts=48), [0, 1])
    tool = strong["tool_error_ratio_among_positives"]
    assert tool["ci95"][1] < 1 and tool["ratio"] == pytest.approx(tool["roc"] / tool["grpo"])
    assert tool["moved_from_start"]["roc"]["ci95"][1] < 1  # RoC's checkpoints err less than the start
    assert strong["accuracy"]["ratio"] == 1.0 and strong["accuracy"]["ci95"] == [1.0, 1.0]
    weak = _ablation_of(0.95, seeds=2, prompts=16)  # a small effect, few prompts
    row = probe_summary(weak, [0, 1])["tool_error_ratio_among_positives"]
    assert row["ci95"][0] < 1 < row["ci95"][1]
    need = power(weak, [0, 1], samples=1)
    assert need["needed"]["prompts_at_these_seeds"] is None or need["needed"]["prompts_at_these_seeds"] > 16
    assert need["needed"]["steps_at_these_prompts_and_seeds"] > 2
    assert need["needed"]["scale_prompts_and_seeds_by"] > 1
    bigger = need["options"]["prompts_and_seeds"]
    assert bigger["cpu_hours"] > 0 and bigger["gpu_hours"] < bigger["cpu_hours"]


# ------------------------------------------------------------------ the probe's problems
def test_the_probe_is_held_out_from_the_rl_and_sft_problems(tmp_path):
    cfg = load(RLConfig, "rl-smollm2-tooltasks-cpu")
    problems, _ = probe_problems(cfg, ProbeSettings(prompts=64, data_seed=1009))
    stage = cfg.stages[0]
    training = tool_tasks.problems(stage.data_seed, stage.data_size)
    assert len({p.id for p in problems}) == 64
    assert not {p.text for p in problems} & {p.text for p in training}
    assert not {p.id for p in problems} & {p.id for p in training}
    # the SFT recipe beside the start model: its tool tasks are excluded too
    run = tmp_path / "sft"
    (run / "checkpoint-3").mkdir(parents=True)
    (run / "recipe.yaml").write_text("data:\n- tooltasks:5:1009:0.5\n")
    held, dropped = probe_problems(RLConfig(model=str(run / "checkpoint-3"), stages=cfg.stages),
                                   ProbeSettings(prompts=8, data_seed=1009))
    assert dropped >= 5 and not {f"tool-1009-{i}" for i in range(5)} & {p.id for p in held}
    # an overlap fails loudly
    with pytest.raises(ProbeError, match="held out"):
        check_disjoint(problems[:3] + [Problem("x", training[0].text, training[0].answer)],
                       {"rl": {p.text for p in training}})
    with pytest.raises(ProbeError, match="probe-seed"):  # the training seed itself: nothing is held out
        probe_problems(RLConfig(stages=[Stage(1, data="tooltasks", data_seed=5, data_size=64)]),
                       ProbeSettings(prompts=16, data_seed=5))
    with pytest.raises(ProbeError, match="generator"):
        probe_problems(RLConfig(stages=[Stage(1, data="problems:x.jsonl")]), ProbeSettings())


# ------------------------------------------------------------------ the command end to end
def _ablation(args: list[str], pause: str | None = None) -> str:
    """The command's stdout; with `pause`, SIGKILL its process group once the test hook stops it there."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RSTAR2_TEST_PAUSE_AT", None)
    if pause:
        return run_until_paused(args, pause, env)
    p = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # four CLI runs (two killed), each loading the model and its learner
def test_the_ablation_probes_both_arms_on_the_same_held_out_prompts_and_resumes(tmp_path, tiny_smollm2):
    model = tiny_smollm2
    out = tmp_path / "abl"
    # the ablation's recipe and task family at toy size, on the 2-layer SmolLM2 (the command's machinery): one
    # seed, 2 steps (the probe at 0, 1 and 2), 3 probe prompts x 2 samples; the hf engine, not a vLLM start per
    # process (vLLM rollouts are tested in test_engines)
    args = [RSTAR2, "train", "ablation", "--recipe", "rl-smollm2-tooltasks-cpu", "--seeds", "0", "--steps", "2",
            "--out", str(out), "--final-steps", "1", "--probe-prompts", "3", "--probe-samples", "2",
            "--summary", str(tmp_path / "docs" / "summary.json"), "--png", str(tmp_path / "docs" / "curves.png"),
            f"model={model}", "stages=[{steps: 1, max_response_tokens: 32, max_turns: 2, data: tooltasks, "
            "data_size: 8}]", "prompts_per_step=1", "group_size=2", "roc_min_positive=1", "roc_min_negative=1",
            f"db={tmp_path / 's.db'}", "micro_batch=4", "rollout_engine=hf",
            "start_check.min_answer_share=0"]  # the random model writes no answer the reward reads
    # 1. the SFT start probed first; then killed in RoC's second step (its first is checkpointed)
    first = _ablation(args, pause="recorded:2")
    assert "probe start: ran" in first and "roc seed 0: step 1/2" in first
    assert not (out / "roc-seed0" / "history.json").exists()
    # 2. resumed: RoC trains step 2 only, GRPO both; then killed in the first rollouts of the arms' probes
    second = _ablation(args, pause="rollout:-1")
    assert "roc seed 0: step 1/2" not in second and "roc seed 0: step 2/2" in second
    assert "grpo seed 0: step 1/2" in second and "grpo seed 0: step 2/2" in second
    for arm in ("roc", "grpo"):
        history = json.loads((out / f"{arm}-seed0" / "history.json").read_text())
        assert len(history) == 2  # the resumed run's history holds both steps, from the store
    assert "probe start: re-used" in second
    assert [p.name for p in (out / "probe").glob("*.json")] == ["start.json"]  # a killed probe stores nothing
    # 3. the finished arms and the start probe are re-used; the arms' probes run
    third = _ablation(args)
    assert "step 1/2" not in third and "step 2/2" not in third and "probe start: re-used" in third
    names = {"start", "roc-seed0-step1", "roc-seed0-step2", "grpo-seed0-step1", "grpo-seed0-step2"}
    assert {p.stem for p in (out / "probe").glob("*.json")} == names
    assert all(f"probe {n}: ran" in third for n in names - {"start"})
    records = {n: json.loads((out / "probe" / f"{n}.json").read_text()) for n in names}
    # the pairing: every policy saw the same prompts, in the same order, the same number of times
    ids = [[p["id"] for p in r["prompts"]] for r in records.values()]
    assert all(i == ids[0] for i in ids) and len(ids[0]) == 3
    assert all(len(p["rollouts"]) == 2 for r in records.values() for p in r["prompts"])
    training = {p.id for p in tool_tasks.problems(0, 8)} | {p.text for p in tool_tasks.problems(0, 8)}
    assert not set(ids[0]) & training
    # the midpoint checkpoints are gone once probed; the final ones stay
    assert not (out / "roc-seed0" / "checkpoint-1").exists() and (out / "roc-seed0" / "checkpoint-2").exists()
    # 4. nothing left to do: all re-used, the figures written again
    stamps = {n: (out / "probe" / f"{n}.json").stat().st_mtime_ns for n in names}
    fourth = _ablation(args)
    assert "ran" not in fourth and all(f"probe {n}: re-used" in fourth for n in names)
    assert {n: (out / "probe" / f"{n}.json").stat().st_mtime_ns for n in names} == stamps
    summary = json.loads((tmp_path / "docs" / "summary.json").read_text())
    tool = summary["probe"]["tool_error_ratio_among_positives"]
    assert set(tool) >= {"roc", "grpo", "ratio", "ci95", "start", "midpoint", "moved_from_start"}
    assert summary["probe"]["accuracy"]["start"] is not None and set(summary["probe"]) == {
        "tool_error_ratio_among_positives", "accuracy", "tokens", "format_violations"}
    assert summary["settings"]["finished"]["steps_done"] == {"roc-seed0": 2, "grpo-seed0": 2}
    assert set(summary["training"]) == {"tool_error_ratio_positive", "accuracy", "response_tokens",
                                        "format_violations"}
    assert (tmp_path / "docs" / "curves.png").stat().st_size > 10_000
