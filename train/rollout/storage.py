"""The rollouts' storage: every rollout of a step as a sample of the run, stored as eval stores its samples (the
eval report renders them)."""

from __future__ import annotations

from rstar2_agent.chat_format import answer_scope, extract_answer
from rstar2_agent.store import Store, sample_row

from .rollouts import Batch


def store_batch(store: Store, run_id: int, batch: Batch, extraction: str) -> None:
    """Each rollout under `step{step:05d}/{problem id}` with the answer `extraction` reads from it and the policy
    version it came from (its oldest token's); the row's own `seconds` holds its wall time."""
    for problem, group, versions in zip(batch.problems, batch.groups, batch.versions, strict=True):
        for k, (traj, reward) in enumerate(group):
            row = sample_row(run_id, f"step{batch.step:05d}/{problem.id}", k, traj, correct=reward > 0,
                             answer=extract_answer(answer_scope(traj, extraction), extraction), gold=problem.answer,
                             details={"question": problem.text, "step": batch.step, "version": versions[k]})
            store.add_sample(row, traj.to_dict())
