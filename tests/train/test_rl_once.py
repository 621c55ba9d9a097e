"""Exactly once: an RL run killed (SIGKILL, the whole process group, from outside) between a step's metrics and its
checkpoint, then mid-rollout, then between a step's rollouts and its metrics, resumes with `--resume` and ends with
every step in the store once, its rollouts once, the report one row a step, the learning-rate schedule advanced once
a step, and (when tensorboard is installed) each step once in the TensorBoard curves. The process stops in each
window through the test hook of tests/pause_hook.py. Also: `forget_unsaved` on a hand-made store, and
TensorBoard's purge on a resumed writer."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rstar2_agent.store import Store, sample_row
from rstar2_agent.train.config import Stage
from rstar2_agent.train.learner.model import lr_factor
from rstar2_agent.train.recipe import dump
from rstar2_agent.train.rl import forget_unsaved
from rstar2_agent.trajectory import Trajectory

from conftest import run_until_paused, tiny

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def _rl(recipe: Path, resume: bool, pause: str | None, **signal_args) -> subprocess.CompletedProcess | None:
    """`rstar2 train rl --recipe RECIPE [--resume]`; with `pause`, SIGKILL its process group once the test hook says
    it stopped there (None is returned; `signal_args`: see `run_until_paused`), else wait for it to finish."""
    # one torch thread: on a shared 2-core machine two spinning threads make a step about 5x slower
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RSTAR2_TEST_PAUSE_AT", None)
    args = [RSTAR2, "train", "rl", "--recipe", str(recipe), *(["--resume"] if resume else [])]
    if not pause:
        return subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    run_until_paused(args, pause, env, **signal_args)
    return None


def _metric_rows(db: Path) -> list[tuple[int, str, float]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT step, name, value FROM metrics ORDER BY id").fetchall()


def _rollouts(db: Path) -> dict[tuple[str, int], tuple[int, list[int]]]:
    """(problem id, index) -> (attempts, response ids) of every stored rollout; duplicates fail."""
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT s.problem_id, s.sample_index, s.attempts, t.data FROM samples s "
                         "JOIN trajectories t ON t.sample_id = s.id").fetchall()
    out = {(p, i): (a, json.loads(d)["response_ids"]) for p, i, a, d in rows}
    assert len(out) == len(rows)
    return out


@pytest.mark.slow
def test_a_run_killed_in_each_window_of_a_step_and_resumed_records_each_step_once(tmp_path, tiny_smollm2):
    cfg = tiny(tmp_path, model=tiny_smollm2, stages=[Stage(steps=2, max_response_tokens=16, max_turns=1, data_size=8)],
               save_every=1, dtype="fp32", tensorboard=True)
    cfg.optim.warmup_steps = 2  # lr 1/3, 2/3 of the peak at steps 1, 2: a step trained twice would shift it
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(dump(cfg))
    db, out = Path(cfg.db), Path(cfg.out)

    # 1. killed after step 1's metrics and rollouts are in the store, before its checkpoint is saved
    _rl(recipe, resume=False, pause="recorded:1")
    assert {s for s, _, _ in _metric_rows(db)} == {1} and not (out / "checkpoint-1").exists()
    first_attempt = _rollouts(db)
    assert len(first_attempt) == 2 * 4 and {p.split("/")[0] for p, _ in first_attempt} == {"step00000"}

    # 2. resumed (no checkpoint yet: step 1 again), then killed mid-rollout in step 2
    _rl(recipe, resume=True, pause="rollout:2")
    assert (out / "checkpoint-1").exists() and not (out / "checkpoint-2").exists()
    rows = _metric_rows(db)
    assert {s for s, _, _ in rows} == {1} and max(Counter((s, n) for s, n, _ in rows).values()) == 1
    again = _rollouts(db)
    assert set(again) == set(first_attempt)  # replaced, not added: the same prompts, each rollout once
    assert all(a == 1 for a, _ in again.values())
    # a step is a function of (seed, step): trained again from the same weights, it samples the same tokens
    assert {k: ids for k, (_, ids) in again.items()} == {k: ids for k, (_, ids) in first_attempt.items()}

    # 3. resumed from checkpoint-1, then killed in step 2 with its rollouts in the store and its metrics not
    _rl(recipe, resume=True, pause="stored:2")
    assert Counter(p.split("/")[0] for p, _ in _rollouts(db)) == {"step00000": 8, "step00001": 8}
    assert {s for s, _, _ in _metric_rows(db)} == {1} and not (out / "checkpoint-2").exists()

    # 4. resumed from checkpoint-1 again: step 2, to the end
    p = _rl(recipe, resume=True, pause=None)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _metric_rows(db)
    assert max(Counter((s, n) for s, n, _ in rows).values()) == 1  # no (step, metric) twice
    by_step = {s: {n: v for s2, n, v in rows if s2 == s} for s in {s for s, _, _ in rows}}
    assert sorted(by_step) == [1, 2]
    for step, m in by_step.items():  # the schedule advanced exactly once a step
        assert m["lr"] == pytest.approx(cfg.optim.lr * lr_factor(step - 1, 2, cfg.optim))
    final = _rollouts(db)
    assert len(final) == 2 * 2 * 4 and all(a == 1 for a, _ in final.values())
    assert Counter(p.split("/")[0] for p, _ in final) == {"step00000": 8, "step00001": 8}
    import torch

    assert torch.load(out / "checkpoint-2" / "trainer_state.pt", weights_only=False)["step"] == 2

    from click.testing import CliRunner

    from rstar2_agent.cli import main

    report = CliRunner().invoke(main, ["train", "report", out.name, "--db", str(db), "--json"])
    assert report.exit_code == 0, report.output
    steps = json.loads(report.stdout)
    assert [s["step"] for s in steps] == [1, 2] and [s["lr"] for s in steps] == [by_step[1]["lr"], by_step[2]["lr"]]

    if HAS_TENSORBOARD:  # four processes wrote events; the curves show each step once, the last attempt's value
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(out / "tensorboard"))
        events.Reload()
        for name in ("lr", "accuracy", "response_tokens"):
            assert [(e.step, e.value) for e in events.Scalars(name)] == \
                [(s, pytest.approx(by_step[s][name])) for s in (1, 2)]


@pytest.mark.slow
def test_a_run_ended_by_sigterm_in_a_long_update_exits_within_a_micro_batch_and_resumes(tmp_path, tiny_smollm2):
    """SIGTERM (or Ctrl-C) while the update's thread is busy: the command ends at the update's next micro-batch,
    not when the update would have ended. The test hook stands in for a long update (up to 10 minutes, then exit
    status 3): before the update's thread was told to stop, asyncio.run's exit joined it and the command lingered
    as long as the update (3 minutes a step in `make ablation` here)."""
    cfg = tiny(tmp_path, model=tiny_smollm2, stages=[Stage(steps=1, max_response_tokens=16, max_turns=1, data_size=4)],
               save_every=1, dtype="fp32")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(dump(cfg))
    seen: list[str] = []
    _rl(recipe, resume=False, pause="in-update:1", sig=signal.SIGTERM, within=60, seen=seen)
    assert seen[-1] == "exit status 1", "".join(seen)  # click's Abort: not 3, the hook's timeout
    assert "Aborted!" in "".join(seen)
    assert not _metric_rows(Path(cfg.db)) and not (Path(cfg.out) / "checkpoint-1").exists()  # nothing half-recorded
    p = _rl(recipe, resume=True, pause=None)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted({s for s, _, _ in _metric_rows(Path(cfg.db))}) == [1]


def _add_rollout(store: Store, run_id: int, index: int, k: int) -> None:
    traj = Trajectory(prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1], logprobs=[0.0, 0.0],
                      stop_reason="answer")
    store.add_sample(sample_row(run_id, f"step{index:05d}/p{k}", 0, traj, correct=False, answer=None, gold="1",
                                details={"step": index}), traj.to_dict())


def test_forget_unsaved_drops_what_was_recorded_past_the_checkpoint_and_nothing_else(tmp_path):
    """Steps 1-3 recorded, the checkpoint at step 1, step 4's rollouts stored without its metrics (a kill between
    the two); another run and an eval run beside it. Resuming from step 1 keeps step 1 only, for this run only."""
    store = Store(tmp_path / "s.db")
    run = store.open_run("r", "rl", "m", {}, kind="rl")
    other = store.open_run("other", "rl", "m", {}, kind="rl")
    for index in range(4):
        for k in range(2):
            _add_rollout(store, run.id, index, k)
            _add_rollout(store, other.id, index, k)
        if index < 3:
            store.add_metrics(run.id, index + 1, {"loss": float(index)})
            store.add_metrics(other.id, index + 1, {"loss": float(index)})
    store.add_metrics(run.id, 1, {"loss": 7.0})  # a step recorded again replaces its metrics
    forget_unsaved(store, run.id, done=1)
    assert [(s.problem_id, s.details["step"]) for s in store.samples(run.id)] == [("step00000/p0", 0),
                                                                                  ("step00000/p1", 0)]
    assert len(store.trajectories(run.id)) == 2
    assert store.last_step(run.id) == 1
    with sqlite3.connect(tmp_path / "s.db") as c:
        assert c.execute("SELECT step, value FROM metrics WHERE run_id = ?", (run.id,)).fetchall() == [(1, 7.0)]
        assert c.execute("SELECT count(*) FROM trajectories").fetchone() == (2 + 8,)  # no orphan trajectories
    assert len(store.samples(other.id)) == 8 and store.last_step(other.id) == 3
    forget_unsaved(store, run.id, done=0)  # a fresh start under the same name: nothing of the old run is kept
    assert store.samples(run.id) == [] and store.last_step(run.id) is None


def test_tensorboard_curves_of_a_resumed_run_show_each_step_once(tmp_path):
    """The trackers RL and SFT share: a writer resumed at step 2 hides what a killed one wrote from step 2 on."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rstar2_agent.train.trackers import Trackers

    killed = Trackers(tmp_path, "r", {}, tensorboard=True)
    for step in (1, 2, 3):
        killed.log(step, {"loss": float(step)})
    # no close: a killed process does not get to; each step was flushed as it was logged
    resumed = Trackers(tmp_path, "r", {}, tensorboard=True, first_step=2)
    for step in (2, 3, 4):
        resumed.log(step, {"loss": 10.0 + step})
    resumed.close()
    killed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 12.0), (3, 13.0), (4, 14.0)]
