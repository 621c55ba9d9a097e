"""`rstar2 train ablation`: its statistics against known values, and the command end to end at toy size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_agent.stats import student_t_cdf
from rstar2_agent.train.ablation import arms, paired_t, sign_flip_p, table
from rstar2_agent.train.rl import RLConfig

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


@pytest.mark.parametrize(("t", "df", "p"), [(12.706, 1, 0.05), (4.303, 2, 0.05), (2.776, 4, 0.05), (1.0, 3, 0.391)])
def test_the_t_distribution_gives_the_table_s_two_sided_p(t, df, p):
    assert 2 * (1 - student_t_cdf(t, df)) == pytest.approx(p, abs=2e-3)


def test_the_paired_tests_on_known_differences():
    t, p = paired_t([1.0, 2.0, 3.0])  # mean 2, sd 1: t = 2 / (1 / sqrt 3)
    assert t == pytest.approx(3.4641, abs=1e-3) and p == pytest.approx(0.0742, abs=2e-3)
    assert sign_flip_p([1.0, 2.0, 3.0]) == 2 / 8  # only all-plus and all-minus reach |6|
    assert sign_flip_p([1.0, -1.0]) == 1.0


def test_arms_share_the_recipe_and_differ_in_sampling_only():
    a = arms(RLConfig(group_size=4, prompts_per_step=3), with_2g=True)
    assert (a["roc"].rollouts_per_prompt, a["grpo"].rollouts_per_prompt, a["grpo-2g"].rollouts_per_prompt) == (8, 4, 8)
    assert {c.prompts_per_step for c in a.values()} == {3}


def test_the_table_pairs_runs_by_seed():
    def run(err: float, acc: float) -> list[dict[str, float]]:
        return [{"tool_error_ratio_positive": 0.5, "accuracy": 0.5, "response_tokens": 100, "format_violations": 0},
                {"tool_error_ratio_positive": err, "accuracy": acc, "response_tokens": 90, "format_violations": 0}]

    histories = {"roc": {0: run(0.1, 0.6), 1: run(0.2, 0.7)}, "grpo": {0: run(0.3, 0.6), 1: run(0.4, 0.5)}}
    rows = {r.metric: r for r in table(histories, last=1)}
    assert rows["tool_error_ratio_positive"].ratio == pytest.approx(0.15 / 0.35)
    assert rows["tool_error_ratio_positive"].diff == pytest.approx(-0.2)
    assert rows["accuracy"].diff == pytest.approx(0.1)


@pytest.mark.slow
def test_the_ablation_command_runs_both_arms_over_seeds_and_resumes(tmp_path, sft_checkpoint):
    model, _ = sft_checkpoint
    # The ablation's own recipe and task family (tool tasks), at toy size; four runs: the hf engine, not a vLLM
    # start each (the in-process vLLM rollouts are tested in test_engines).
    args = [RSTAR2, "train", "ablation", "--recipe", "rl-smollm2-tooltasks-cpu", "--seeds", "0,1", "--out",
            str(tmp_path / "abl"), "--final-steps", "1", f"model={model}", "stages=[{steps: 1, max_response_tokens: "
            "32, max_turns: 2, data: tooltasks, data_size: 8}]", "prompts_per_step=1", "group_size=2",
            "roc_min_positive=1", "roc_min_negative=1", f"db={tmp_path / 's.db'}", "micro_batch=4",
            "rollout_engine=hf"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for arm, seed in [("roc", 0), ("roc", 1), ("grpo", 0), ("grpo", 1)]:
        assert len(json.loads((tmp_path / "abl" / f"{arm}-seed{seed}" / "history.json").read_text())) == 1
    summary = json.loads((tmp_path / "abl" / "summary.json").read_text())
    assert set(summary) == {"tool_error_ratio_positive", "accuracy", "response_tokens", "format_violations"}
    assert (tmp_path / "abl" / "curves.png").stat().st_size > 10_000
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)  # every run finished: read back
    assert again.returncode == 0 and "step 1/1" not in again.stdout
