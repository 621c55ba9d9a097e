"""The SFT -> RL hand-off check (train/rollout/start_check.py): on step 0's own rollouts, the share whose answer the
reward can read and the share of groups with signal; a policy below the thresholds stops the run before its first
update, with what to fix. Figures on hand-made batches; then a real run of the 2-layer random SmolLM2 (which writes no
answer) stopped by the default check, with nothing saved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rstar2_agent.problem import Problem
from rstar2_agent.train.config import StartCheck
from rstar2_agent.train.rl import run_rl
from rstar2_agent.train.rollout.rollouts import Batch
from rstar2_agent.train.rollout.start_check import BlindStart, check_start, start_figures
from rstar2_agent.trajectory import Trajectory, Turn

from conftest import tiny

ANSWER = "<reason>7 * 6 = 42</reason><answer>\\boxed{42}</answer>"


def rollout(text: str, stop: str = "answer") -> Trajectory:
    return Trajectory(prompt_ids=[1], turns=[Turn(text, 5, "stop")], stop_reason=stop)


def batch(groups) -> Batch:
    return Batch(0, [Problem("p", "q", "42")] * len(groups), groups, [[0] * len(g) for g in groups], {})


def test_figures_count_readable_answers_and_mixed_groups_leaving_out_engine_failures():
    groups = [
        [(rollout(ANSWER), 1.0), (rollout("<answer>\\boxed{41}</answer>"), 0.0)],  # mixed: signal
        [(rollout("no answer at all"), 0.0), (rollout(ANSWER, stop="max_tokens"), 0.0)],  # cut off: unreadable
        [(rollout("", stop="engine_error"), 0.0), (rollout("<answer>\\boxed{1}</answer>"), 0.0)],
    ]
    f = start_figures(batch(groups), "paper")
    assert f["start_rollouts"] == 5 and f["start_groups"] == 3  # the engine failure is not a rollout of the policy
    assert f["start_answer_share"] == pytest.approx(3 / 5) and f["start_signal_share"] == pytest.approx(1 / 3)
    # the release's extraction reads more than a \boxed{} (math-verify over the whole text): a reward counts
    release = start_figures(batch([[(rollout("so it is 42"), 1.0), (rollout("hmm"), 0.0)]]), "release")
    assert release["start_answer_share"] == 0.5


def test_a_blind_start_names_the_threshold_the_format_and_the_fix():
    blind = start_figures(batch([[(rollout("Leaves fall softly down."), 0.0)] * 4] * 2), "paper")
    with pytest.raises(BlindStart) as e:
        check_start(StartCheck(), blind, "runs/sft/last", "rstar2-paper", "paper")
    msg = str(e.value)
    assert "0.0% of its 8 rollouts" in msg and "format 'rstar2-paper'" in msg and "min_answer_share is 0.02" in msg
    assert "SFT checkpoint" in msg and "Nothing was updated or saved" in msg and "thresholds to 0" in msg
    check_start(StartCheck(min_answer_share=0.0), blind, "m", "hermes", "paper")  # off: no error
    flat = start_figures(batch([[(rollout(ANSWER), 1.0)] * 2] * 3), "paper")  # all solved: no group has signal
    check_start(StartCheck(), flat, "m", "hermes", "paper")
    with pytest.raises(BlindStart, match=r"0.0% of its 3 groups have both a right and a wrong rollout"):
        check_start(StartCheck(min_signal_share=0.1), flat, "m", "hermes", "paper")
    with pytest.raises(ValueError, match="start_check.min_answer_share is a share between 0 and 1"):
        StartCheck(min_answer_share=2)


@pytest.mark.slow
def test_a_run_from_a_policy_that_writes_no_answer_stops_before_its_first_update(tmp_path, tiny_smollm2):
    cfg = tiny(tmp_path, model=tiny_smollm2, dtype="fp32", start_check=StartCheck())  # the default thresholds
    # 2 prompts x 2 rollouts, oversampled twice for RoC: the check reads all 8 the first step generated
    with pytest.raises(BlindStart, match=r"the starting policy .* would start RL blind: 0.0% of its 8 rollouts"):
        asyncio.run(run_rl(cfg))
    assert not list(Path(cfg.out).glob("checkpoint-*"))
    from rstar2_agent.store import Store

    (run,) = Store(cfg.db).runs("rl")
    assert Store(cfg.db).last_step(run.id) is None and run.status != "finished"  # no step recorded
