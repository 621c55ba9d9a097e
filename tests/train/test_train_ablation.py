"""`rstar2 train ablation`: its statistics over seeds against known values."""

from __future__ import annotations

import pytest

from rstar2_agent.stats import student_t_cdf
from rstar2_agent.train.ablation.experiment import arms, paired_t, sign_flip_p, table
from rstar2_agent.train.config import RLConfig


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

# the command end to end (both arms, the probe, resume): tests/train/test_ablation_probe.py
