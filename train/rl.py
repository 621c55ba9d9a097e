"""`rstar2 train rl`: multi-stage GRPO-RoC with the Python tool in the rollouts.

Each step: sample prompts, run 2G rollouts per prompt through the shared agent loop (the `hf` engine shares
the learner's weights, so an update is live at once), reward 1/0 by the math grader (truncated rollouts get
0), keep G per prompt with Resample-on-Correct, then one token-level PPO-clip update whose ratio is taken
against the learner's own recomputed logprobs (the old-logprob pass; the engine's feed the mismatch metrics and
the rollout correction, `rollout_correction`). Stages change the response budget, the turn cap, the data, and
may filter out the problems the current policy already solves k of k and reset the optimizer. The rollout side is
`Rollouts` (rollout/rollouts.py), the learner any implementation of the `Learner` protocol (placement.py picks
where the two run from the recipe; config.py holds the recipe's types and their checks).

Metrics and every rollout go to the store (and to TensorBoard / Weights & Biases when asked); checkpoints resume
exactly (the prompts of a step are a function of the seed and the step), and each step is recorded exactly once
whatever the moment of a kill (see `run_rl`). With `max_staleness: k` >= 1 the batches of the next k steps
generate while the learner updates, behind a version gate that records each token's policy version
(rollout/version_gate.py), and the loss is decoupled PPO.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import Engine, TrainableEngine, trainable
from rstar2_agent.models import resolve_model
from rstar2_agent.problem import Problem
from rstar2_agent.store import Store

from .config import (
    RLConfig,
    Stage,
    check_distributed,
    check_micro_batch_tokens,
    check_placement,
    check_rollout_correction,
    check_staleness,
)
from .data.pool import draw, stage_pool
from .learner.colocated import Colocation
from .learner.interface import Learner
from .learner.update import UpdateConfig, UpdateItem
from .loss import grpo_advantages
from .placement import choose_placement
from .push import Choice, choose, make_push
from .push_check import PushChecker
from .roc import Group, check_sizes, resample_on_correct
from .rollout.rollouts import Batch, Graded, Rollouts, without_engine_errors
from .rollout.start_check import check_start, start_figures
from .rollout.storage import store_batch
from .rollout.version_gate import lag_metrics
from .rollout.workers import local_sandbox
from .run_frame import RunFrame, resume_from, save_checkpoint
from .stage_filter import filter_solved

log = logging.getLogger(__name__)


def stage_of(stages: list[Stage], step: int) -> tuple[int, int]:
    """(stage index, step within it) of a global step."""
    for i, s in enumerate(stages):
        if step < s.steps:
            return i, step
        step -= s.steps
    raise IndexError("past the last stage")


def update_config(cfg: RLConfig, pad_id: int) -> UpdateConfig:
    """What the policy update reads of the recipe (its `auto` rollout correction resolved), sent to the ranks."""
    correction = cfg.rollout_correction
    if correction == "auto":
        correction = "tis" if cfg.max_staleness else "none"
    return UpdateConfig(micro_batch=cfg.micro_batch, temperature=cfg.temperature, eps_low=cfg.eps_low,
                        eps_high=cfg.eps_high, rollout_correction=correction, tis_cap=cfg.tis_cap, pad_id=pad_id,
                        micro_batch_tokens=cfg.micro_batch_tokens, logprob_chunk_tokens=cfg.logprob_chunk_tokens,
                        ppo_mini_batches=cfg.ppo_mini_batches)


def check_recipe(cfg: RLConfig) -> Choice:
    """Every check of the recipe, before anything loads: its fields (config.py), RoC's sizes, the placement's weight
    push (refused here by name when it cannot run: colocated on GPUs pushes through CUDA IPC), the update's fields.
    Returns the weight push, chosen once (train/push): its backend and what the engine must hold."""
    check_distributed(cfg)
    if cfg.roc:
        check_sizes(cfg.group_size, cfg.roc_min_positive, cfg.roc_min_negative, cfg.roc_sizes)
    check_rollout_correction(cfg.rollout_correction, cfg.tis_cap)
    check_staleness(cfg)
    check_placement(cfg)
    check_stage_data(cfg)
    choice = choose(cfg)
    update_config(cfg, 0)
    check_micro_batch_tokens(cfg)
    return choice


def check_stage_data(cfg: RLConfig) -> None:
    """A stage's local problems file that is not there stops the run before anything starts (the 14B recipe reads
    the paper's 42K, which `rstar2 train problems-paper` builds), saying how to build it and the named alternative."""
    from .data.paper_problems import missing_problems_error
    from .data.pool import missing_local_data

    for i, stage in enumerate(cfg.stages, 1):
        missing = missing_local_data(stage.data)
        if missing:
            raise DataError(missing_problems_error(i, missing))


class RLRun:
    """One RL run: the learner (where it runs: `choose_placement`) and the rollouts (engine, sandbox, format,
    grader), and the step that joins them (`learn`). `engine`: a rollout engine the caller started and stops (the
    tests share one), used instead of the placement's: one training can drive (hf, vllm: `trainable`), else refused
    here, before anything loads."""

    def __init__(self, cfg: RLConfig, resume: bool = False, engine: Engine | None = None):
        given = trainable(engine) if engine is not None else None
        self.choice = check_recipe(cfg)
        where = choose_placement(cfg)
        if cfg.rollout_correction == "auto":
            cfg = dataclasses.replace(cfg, rollout_correction="tis" if cfg.max_staleness else "none")
        self.push = make_push(self.choice, cfg.distributed, cfg.ray.weight_bucket_mb)
        self.cfg, self.placement, self.given_engine = cfg, where, given
        self.colocation: Colocation | None = None
        self.engine: TrainableEngine | None = None  # the rollout engine, from `start`
        last = resume_from(cfg.out, resume)
        self.resolved = resolve_model(str(last) if last else cfg.model)
        self.learner: Learner = where.learner(self.resolved.path, sum(s.steps for s in cfg.stages))
        self.state: dict[str, Any] = self.learner.load_state(last) if last else {}
        self.fmt = ChatFormat(self.learner.tokenizer, cfg.format, self.resolved.spec.chat_template)
        self.update_cfg = update_config(cfg, self.fmt.tokenizer.pad_token_id or 0)
        self.rollouts = Rollouts(cfg, self.fmt)
        self.kept: list[str] | None = self.state.get("pool")  # the problems the stage filter kept (None: all)
        self.checker = PushChecker(cfg.push_check, self.fmt)
        self.calibration: dict[str, float] = {}  # the push check's, for this process's first step's metrics

    async def start(self) -> None:
        """The rollout engine and the sandbox, the engine's version gate at the learner's step."""
        if self.given_engine is not None:
            engine, sandbox = self.given_engine, local_sandbox(self.cfg)
        else:
            engine, sandbox = await self.placement.rollout(self.resolved, self.learner, self.choice.engine_transfer)
        self.engine = engine
        self.rollouts.attach(engine, sandbox, version=self.learner.step, owns_engine=self.given_engine is None)
        # colocated: the engine sleeps through each update (learner/colocated.py)
        self.colocation = Colocation(engine, self.cfg.sleep_level, release=self.learner.release_memory) \
            if self.cfg.placement == "colocated" else None
        await sandbox.start()
        # before any update the engine and the learner hold the same weights: the push check's bound (push_check.py)
        self.calibration = await self.checker.calibrate(engine, self.learner)

    # ------------------------------------------------------------------ update
    def update(self, kept: list[Graded], stop: threading.Event | None = None) -> dict[str, float]:
        """One policy update on the kept groups, each rollout weighted by its group's GRPO advantage."""
        items = [UpdateItem(t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, adv) for group in kept
                 for (t, _), adv in zip(group, grpo_advantages([r for _, r in group]), strict=True)]
        total = sum(sum(i.response_mask) for i in items)
        return self.learner.update(items, self.update_cfg, total, stop)

    async def sync_weights(self) -> float:
        """Push the new weights to the rollout engine (the recipe's `weight_push`, chosen once: train/push); seconds
        taken (~0 with the hf engine: shared weights)."""
        t0 = time.perf_counter()
        push = functools.partial(self.push.push, self.learner, self.engine)
        if self.colocation is not None:  # its weights woken first
            await self.colocation.push(push)
        else:
            await push()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ one step
    def batch(self, pool: dict[str, Problem], stage: Stage, step: int) -> asyncio.Future[Batch]:
        """The step's rollouts (its problems drawn from the pool, 2G rollouts each with RoC), generating."""
        problems = draw(pool, self.cfg.prompts_per_step, self.cfg.seed, step)
        return asyncio.ensure_future(self.rollouts.batch(problems, self.cfg.rollouts_per_prompt, stage, step))

    async def step(self, step: int, stage: Stage, pool: dict[str, Problem], store: Store | None,
                   run_id: int | None) -> dict[str, float]:
        """One synchronous step: the step's rollouts, then `learn` on them."""
        return await self.learn(await self.batch(pool, stage, step), store, run_id)

    def launch(self, pending: dict[int, asyncio.Future], first: int, pool: dict[str, Problem]) -> None:
        """Start generating the batches of steps first .. first + max_staleness that are not started yet, within
        first's stage (a stage's start waits for the previous updates: its filter and data need the current
        policy). Called when the learner's version is `first` (it has made `first` updates): so no batch is
        generated on weights more than max_staleness updates older than the update that trains on it."""
        total = sum(s.steps for s in self.cfg.stages)
        index = stage_of(self.cfg.stages, first)[0] if first < total else -1
        for t in range(first, min(total, first + self.cfg.max_staleness + 1)):
            if stage_of(self.cfg.stages, t)[0] != index:
                break
            if t not in pending:
                pending[t] = self.batch(pool, self.cfg.stages[index], t)

    def down_sample(self, batch: Batch, groups: list[Graded], step: int) -> tuple[list[Graded], dict[str, float],
                                                                                   list[list[Any]]]:
        """RoC (or plain GRPO's all-equal drop) on the groups: the kept ones, RoC's counts, each rollout's stats.
        A rollout that failed in the engine is left out of its group (an infrastructure failure is no negative:
        its reward 0 says nothing of the policy), counted in `engine_errors` (metrics)."""
        cfg, rollouts = self.cfg, self.rollouts
        groups = without_engine_errors(groups)
        stats = [rollouts.stats(g) for g in groups]
        if cfg.roc:
            kept, roc = resample_on_correct([Group(g, s) for g, s in zip(groups, stats, strict=True)],
                                            cfg.group_size, seed=cfg.seed * 7919 + step,
                                            positive_sampling=cfg.positive_sampling,
                                            min_positive=cfg.roc_min_positive, min_negative=cfg.roc_min_negative,
                                            sizes=cfg.roc_sizes)
            return kept, {"roc_dropped_groups": roc.dropped_all_equal, "roc_kept_positive": roc.kept_positive,
                          "roc_kept_negative": roc.kept_negative}, stats
        kept = [g for g in groups if len({r for _, r in g}) > 1]
        return kept, {"roc_dropped_groups": len(groups) - len(kept)}, stats

    def check_start(self, batch: Batch) -> dict[str, float]:
        """The hand-off check on the first step's rollouts (rollout/start_check.py); its figures, for the step's
        metrics."""
        extraction = self.rollouts.grader.extraction
        figures = start_figures(batch, extraction)
        log.info("start check: %.1f%% of %d rollouts with a readable answer, %.1f%% of %d groups with signal",
                 100 * figures["start_answer_share"], figures["start_rollouts"], 100 * figures["start_signal_share"],
                 figures["start_groups"])
        check_start(self.cfg.start_check, figures, self.cfg.model, self.cfg.format, extraction)
        return figures

    async def learn(self, batch: Batch, store: Store | None, run_id: int | None) -> dict[str, float]:
        """RoC on the batch's groups, the update (in a thread: the rollouts of later steps go on meanwhile), the
        push of the new weights through the gate, the step's metrics, and its rollouts to the store. Groups with a
        rollout more than max_staleness versions older than the learner are dropped (the schedule never makes
        one: `stale_groups_dropped` says so)."""
        oldest_allowed = self.learner.step - self.cfg.max_staleness
        fresh = [i for i, vs in enumerate(batch.versions) if min(vs, default=oldest_allowed) >= oldest_allowed]
        kept, roc_metrics, stats = self.down_sample(batch, [batch.groups[i] for i in fresh], batch.step)
        version = self.learner.step
        if self.colocation is not None and kept:  # the rollouts are done (synchronous): the GPU to the learner; a
            await self.colocation.sleep()  # step that keeps nothing updates and pushes nothing, so the engine stays up
        t1 = time.perf_counter()
        stop = threading.Event()
        try:  # nothing kept: no gradient, the step still advances
            upd = await asyncio.to_thread(self.update, kept, stop)
        except BaseException:  # the command is ending (cancelled, or SIGTERM raised while the thread was being
            stop.set()  # started): the thread stops at its next micro-batch, so asyncio.run's exit, which joins
            raise  # it, waits seconds, not the rest of the update
        t_update = time.perf_counter() - t1
        gate = self.rollouts.gate
        t_sync = push_wait = 0.0
        if kept:
            t2 = time.perf_counter()
            push_wait = await gate.push(self.sync_weights)
            t_sync = time.perf_counter() - t2 - push_wait
        else:
            gate.advance()
        if self.colocation is not None:
            await self.colocation.wake()
        # the push checked, the engine awake: the probe's figures (push_check.py)
        probe = await self.checker.check(self.engine, self.learner, self.learner.step) if kept else {}
        metrics = {
            **self.rollouts.metrics(batch, stats, kept),
            "time_update": t_update, "time_push": t_sync, "push_wait_s": push_wait,
            **lag_metrics(version, [v for i in fresh for v in batch.versions[i]]),
            "stale_groups_dropped": len(batch.groups) - len(fresh),
            **roc_metrics, **upd, **probe,
        }
        if store is not None:
            await asyncio.to_thread(store_batch, store, run_id, batch, self.rollouts.grader.extraction)
        return metrics

    def save(self, step: int, stage_index: int) -> Path:
        return save_checkpoint(self.learner, self.cfg, "rl", step, self.resolved.spec.context_length,
                               {"stage": stage_index, "pool": self.kept},
                               answer_extraction=self.rollouts.grader.extraction)

    async def close(self) -> None:
        """Idempotent: stops the rollouts (grader, sandbox, the engine unless the caller's) and the learner. A
        caller's engine left asleep by a step that failed is woken first (it outlives the run)."""
        if self.colocation is not None and self.colocation.asleep and self.given_engine is not None:
            with contextlib.suppress(Exception):
                await self.colocation.wake()
        await self.rollouts.close()
        await asyncio.to_thread(self.learner.close)


def forget_unsaved(store: Store, run_id: int, done: int) -> None:
    """Delete what the store holds for the steps after `done` (the checkpoint this run starts from): the metrics
    of steps done+1.. and their rollouts (stored under `step{index:05d}/` with the 0-based index, so step N's are
    under index N-1). A step's rollouts are stored before its metrics, and the next step starts only after them:
    rollouts exist at most up to the index of the highest recorded step, which bounds the range."""
    last = store.last_step(run_id) or 0
    if last > done:
        log.info("the store has steps %d-%d past the checkpoint (step %d): forgetting them, they are trained again",
                 done + 1, last, done)
    store.forget_steps(run_id, done + 1, [f"step{i:05d}/" for i in range(done, max(done, last) + 1)])


async def run_rl(cfg: RLConfig, resume: bool = False,
                 on_step: Callable[[int, int, dict[str, float]], None] | None = None, engine: Engine | None = None
                 ) -> tuple[Path, list[dict[str, float]]]:
    """Train every stage; returns the final checkpoint folder and each step's metrics. `engine`: a rollout engine
    already running to use (and leave running) instead of starting the configured one.

    Exactly once, whatever the moment of a kill: the checkpoint is the only thing a resume trusts, and the store
    follows it. A step's rollouts and then its metrics are written as soon as the step ends (so `rstar2 train
    report` and the live curves show it at once, even when the checkpoint comes every `save_every` steps or takes
    minutes to write, as at 14B); the checkpoint is saved after, by an atomic rename. A resume first deletes from
    the store what the killed attempt recorded past the checkpoint it starts from (`forget_unsaved`), then trains
    those steps again and records them afresh; a step's metrics are also written in one transaction that replaces
    any earlier ones of that step. So the store never holds a step twice, nor a step the saved weights have not
    seen, whether the kill came mid-rollout, mid-update, between the rollouts and the metrics, or between the
    metrics and the checkpoint. Writing a step's records in the checkpoint's own commit instead would hide every
    step until its checkpoint is on disk, and a checkpoint is not a database transaction.
    """
    run = RLRun(cfg, resume, engine)
    total = sum(s.steps for s in cfg.stages)
    history: list[dict[str, float]] = []
    final = Path(cfg.out)
    try:
        with RunFrame(cfg, "rl", run.learner.step, forget=forget_unsaved) as frame:
            await run.start()
            pending: dict[int, asyncio.Future] = {}  # the batches generating ahead of the learner (max_staleness)
            pool: dict[str, Problem] | None = None
            try:
                while run.learner.step < total:
                    step = run.learner.step
                    index, within = stage_of(cfg.stages, step)
                    stage = cfg.stages[index]
                    if within == 0:  # a stage starts (nothing of it was generated ahead: `launch` stops at stages)
                        run.kept = None
                        if stage.filter_solved:
                            run.kept = await filter_solved(run.rollouts, stage_pool(stage, cfg), stage,
                                                           stage.filter_solved)
                        if stage.reset_optimizer:
                            run.learner.reset_optimizer(stage.restart_schedule)
                    if within == 0 or pool is None:
                        pool = stage_pool(stage, cfg, run.kept)
                    t0 = time.perf_counter()
                    run.launch(pending, step, pool)
                    batch = await pending.pop(step)
                    waited = time.perf_counter() - t0
                    start = run.check_start(batch) if step == 0 else {}
                    metrics = await run.learn(batch, frame.store, frame.run_id) | start | run.calibration
                    run.calibration = {}
                    if within + 1 < stage.steps:
                        run.launch(pending, step + 1, pool)  # at once: the next batches need only this push
                    metrics |= {"stage": index, "learner_wait_s": waited, "step_time": time.perf_counter() - t0}
                    history.append(metrics)
                    frame.record(run.learner.step, metrics)
                    if on_step:
                        on_step(run.learner.step, total, metrics)
                    if within + 1 == stage.steps or frame.periodic_save(run.learner.step):
                        final = run.save(run.learner.step, index)
            finally:  # batches generated ahead of a stop are not trained on; a resume generates them again
                for task in pending.values():
                    task.cancel()
                await asyncio.gather(*pending.values(), return_exceptions=True)
    finally:
        await run.close()
    return final, history
