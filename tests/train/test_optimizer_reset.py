"""RL's stage 3 resets the optimizer (the paper: its state), and the learning-rate schedule goes on: the 20-step
warm-up is not run again unless the stage asks for it by name (restart_schedule)."""

from __future__ import annotations

import torch

from rstar2_agent.train.config import OptimConfig
from rstar2_agent.train.learner.model import TorchLearner


def steps(learner: TorchLearner, n: int) -> list[float]:
    ids = torch.arange(1, 17).unsqueeze(0)
    lrs = []
    for _ in range(n):
        learner.sft_loss({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}, 16).backward()
        lrs.append(learner.optimizer_step()["lr"])
    return lrs


def test_a_reset_drops_the_optimizer_state_and_keeps_the_schedule_unless_told_to_restart_it(tiny_smollm2):
    learner = TorchLearner(tiny_smollm2, OptimConfig(lr=1e-3, warmup_steps=4, schedule="constant"), 20, dtype="fp32")
    before = steps(learner, 6)
    assert before[0] < before[3] < before[4] == before[5] == 1e-3  # warmed up
    learner.reset_optimizer()
    assert not learner.optimizer.state  # Adam's moments and step counts dropped
    assert steps(learner, 1) == [1e-3]  # the schedule goes on
    assert all(int(s["step"]) == 1 for s in learner.optimizer.state.values())
    learner.reset_optimizer(restart_schedule=True)
    assert steps(learner, 2) == before[:2]  # the named option: the warm-up again


def test_restart_schedule_without_a_reset_is_refused():
    import pytest

    from rstar2_agent.train.config import Stage

    with pytest.raises(ValueError, match="reset_optimizer: true"):
        Stage(steps=1, restart_schedule=True)
    assert Stage(steps=1, reset_optimizer=True, restart_schedule=True).restart_schedule
