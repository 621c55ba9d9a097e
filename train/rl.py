"""`rstar2 train rl`: multi-stage GRPO-RoC with the Python tool in the rollouts.

Each step: sample prompts, run 2G rollouts per prompt through the shared agent loop (the `hf` engine shares
the learner's weights, so an update is live at once), reward 1/0 by the math grader (truncated rollouts get
0), keep G per prompt with Resample-on-Correct, then one token-level PPO-clip update against the engine's
own logprobs. Stages change the response budget, the turn cap, the data, and may filter out the problems
the current policy already solves k of k and reset the optimizer. Metrics and every rollout go to the
store (and to TensorBoard / Weights & Biases when asked); checkpoints resume exactly (the prompts of a step are a
function of the seed and the step), and each step is recorded exactly once whatever the moment of a kill (see
`run_rl`). With `max_staleness: k` >= 1 the batches of the next k steps generate while the learner updates, behind
a version gate that records each token's policy version (staleness.py), and the loss is decoupled PPO.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat, answer_blocks, default_extraction, well_formed_answer
from rstar2_agent.engines.base import EngineError, SamplingParams
from rstar2_agent.engines.hf import HFEngine
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.models import resolve_model
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig
from rstar2_agent.store import Store, sample_row
from rstar2_agent.trajectory import Trajectory

from .distributed import LearnerGroup, RayConfig, start_rollout
from .learner import OptimConfig, link_last
from .local_learner import LocalLearner
from .loss import grpo_advantages
from .recipe import dump
from .roc import Group, RolloutStats, check_sizes, release_penalty, resample_on_correct
from .sft import checkpoints
from .staleness import VersionGate, Versions, lag_metrics
from .trackers import Trackers
from .update import UpdateItem, check_rollout_correction

log = logging.getLogger(__name__)


@dataclass
class Stage:
    steps: int
    max_response_tokens: int = 8192
    max_turns: int = 10
    # a problem generator: synthetic (rstar2_agent/synthetic.py) or tooltasks (tool_tasks.py); or problems: a file of
    # `rstar2 train problems` (problems:PATH or PATH.jsonl), or sources it curates at the stage start (hub:...,
    # dapo:PATH, ...; a list for several), cached in `out`
    data: str | list[str] = "synthetic"
    data_seed: int = 0  # the generator's problems from this seed; for problems, the seed of the sample
    data_size: int | None = None  # a generator's count (None: 512); for problems, a sample of this many (0/None: all)
    filter_solved: int = 0  # at the stage start, drop the problems the policy solves k of k (0: no filter)
    reset_optimizer: bool = False


@dataclass
class RLConfig:
    model: str = "runs/sft-smollm2-cpu/last"
    stages: list[Stage] = field(default_factory=lambda: [Stage(steps=2)])
    prompts_per_step: int = 4
    group_size: int = 4  # G: 2G rollouts per prompt, G kept
    positive_sampling: str = "paper"  # paper (probability 1/p) or topk (the release's ranking: lowest release p)
    # RoC keeps at least this many positives and negatives of a mixed group (the release: 2 each); group_size must
    # be at least their sum: set both to 1 to keep at least one of each side with G = 2 or 3
    roc_min_positive: int = 2
    roc_min_negative: int = 2
    roc: bool = True  # False: plain GRPO on G rollouts per prompt, all used (the ablation)
    temperature: float = 1.0
    top_p: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    # the PPO ratio is against the learner's own logprobs of the rollouts (update.py); `tis` also weights each token
    # by min(pi_learner / pi_engine, tis_cap) against the rollout engine's policy (verl's token-level rollout
    # correction, rollout_is_threshold 2.0); off as in the release. Logprobs of both are at `temperature`: with
    # top_p < 1 the engine's are renormalized over the nucleus and the learner's are not, so keep top_p 1 here
    # auto: none with max_staleness 0 (the release), tis with max_staleness >= 1 (then the loss is decoupled PPO, as
    # AReaL's: clipped against the learner's proximal logprobs, weighted by the truncated ratio to the behaviour policy)
    rollout_correction: str = "auto"  # auto, none or tis
    tis_cap: float = 2.0
    # bounded staleness: 0, the paper's synchronous step; k >= 1: the rollouts of the next k steps are generated while
    # the learner updates, on weights at most k updates old (train/staleness.py). Needs a rollout engine with its own
    # weights (rollout_engine: vllm, or distributed: ray)
    max_staleness: int = 0
    partial_rollouts: bool = False  # a push interrupts the generations in flight, which go on with the new weights
    micro_batch: int = 8  # trajectories per forward pass
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, warmup_steps=20, schedule="constant"))
    dtype: str = "auto"
    format: str = "hermes"
    answer_extraction: str = ""  # how the reward reads the answer (chat_format.EXTRACTIONS); "": the format's (paper)
    seed: int = 0
    out: str = "runs/rl"
    save_every: int = 0  # steps; stage ends always save
    db: str | None = None
    run: str | None = None
    tensorboard: bool = False  # per-step metrics to out/tensorboard, when tensorboard is installed
    wandb_project: str | None = None  # ... and to this Weights & Biases project, when wandb is installed
    data_dir: str | None = None  # benchmark mirrors that curating a stage's sources decontaminates against
    distributed: str = "none"  # none: one process (rollout_engine below); ray: distributed.py
    # one process: hf shares the learner's weights (no sync); vllm runs vLLM in this process, prefix cache and
    # continuous batching, the new weights pushed after each update. engine_options: VLLMEngine's (kv_cache_gib...)
    rollout_engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    ray: RayConfig = field(default_factory=RayConfig)

    @property
    def rollouts_per_prompt(self) -> int:
        """2G with Resample-on-Correct (G are kept), G without."""
        return 2 * self.group_size if self.roc else self.group_size


@dataclass
class Batch:
    """One step's rollouts as the learner receives them: per prompt, the (trajectory, reward) group, each
    rollout's policy version (its oldest token's); and the times of its phases."""
    step: int
    prompts: list[tuple[str, str, str]]
    groups: list[list[tuple[Trajectory, float]]]
    versions: list[list[int]]
    times: dict[str, float]


def check_staleness(cfg: RLConfig) -> None:
    if not isinstance(cfg.max_staleness, int) or cfg.max_staleness < 0:
        raise ValueError(f"max_staleness must be 0 (synchronous) or a positive number of policy versions, not "
                         f"{cfg.max_staleness!r}")
    if (cfg.max_staleness or cfg.partial_rollouts) and cfg.distributed == "none" and cfg.rollout_engine == "hf":
        raise ValueError("max_staleness >= 1 and partial_rollouts need a rollout engine with its own weights: the hf "
                         "engine in this process shares the learner's model, which the update changes under it. Set "
                         "rollout_engine: vllm (or distributed: ray)")


def stage_of(stages: list[Stage], step: int) -> tuple[int, int]:
    """(stage index, step within it) of a global step."""
    for i, s in enumerate(stages):
        if step < s.steps:
            return i, step
        step -= s.steps
    raise IndexError("past the last stage")


def rollout_stats(traj: Trajectory, reward: float, fmt: ChatFormat) -> RolloutStats:
    """Our counts for the paper's sampler, and the release's penalty on the decoded response for "topk"."""
    return RolloutStats(reward, len(traj.tool_calls), sum(c.failed for c in traj.tool_calls),
                        len(answer_blocks(traj.text)), well_formed_answer(traj.text), max(1, len(traj.turns)),
                        release_penalty(fmt.decode(traj.response_ids)))


class RLRun:
    """One RL run: the learner (in this process, or a Ray learner group), the rollout engine (the hf engine on
    the learner's own weights, or Ray rollout workers behind a replica pool), the sandbox, the grader."""

    given_engine: Any = None  # a rollout engine the caller started (and stops): the tests share one
    _generating = 0  # batches generating now
    _idle_since: float | None = None  # when the engine last ran out of rollouts to generate

    def __init__(self, cfg: RLConfig, resume: bool = False, engine: Any = None):
        if cfg.distributed not in ("none", "ray"):
            raise ValueError(f"distributed must be none or ray, not {cfg.distributed!r}")
        if cfg.rollout_engine not in ("hf", "vllm"):
            raise ValueError(f"rollout_engine must be hf or vllm, not {cfg.rollout_engine!r}")
        if cfg.roc:
            check_sizes(cfg.group_size, cfg.roc_min_positive, cfg.roc_min_negative)
        check_rollout_correction(cfg.rollout_correction, cfg.tis_cap)
        check_staleness(cfg)
        if cfg.rollout_correction == "auto":
            cfg = dataclasses.replace(cfg, rollout_correction="tis" if cfg.max_staleness else "none")
        self.cfg = cfg
        last = checkpoints(cfg.out)[-1] if resume and checkpoints(cfg.out) else None
        self.resolved = resolve_model(str(last) if last else cfg.model)
        total = sum(s.steps for s in cfg.stages)
        self.learner: LocalLearner | LearnerGroup
        if cfg.distributed == "ray":
            self.learner = LearnerGroup(cfg.ray, self.resolved.path, cfg.optim, total, dtype=cfg.dtype)
        else:
            self.learner = LocalLearner(self.resolved.path, cfg.optim, total, dtype=cfg.dtype)
        tokenizer = self.learner.tokenizer
        self.state: dict[str, Any] = self.learner.load_state(last) if last else {}
        self.pool_ids: list[str] | None = self.state.get("pool")
        self.fmt = ChatFormat(tokenizer, cfg.format, self.resolved.spec.chat_template)
        self.context_length = self.resolved.spec.context_length
        self.grader = MathGrader(extraction=cfg.answer_extraction or default_extraction(cfg.format))
        self.engine: Any = None
        self.given_engine = engine
        self.gate: Any = None  # the engine behind a VersionGate: what the rollouts call
        self.sandbox: Any = None

    async def start(self) -> None:
        spec, cfg = self.resolved.spec, self.cfg
        if self.given_engine is not None:
            self.engine, self.sandbox = self.given_engine, LocalSandbox(SandboxConfig(workers=2))
        elif cfg.distributed == "ray":
            self.engine, self.sandbox = await start_rollout(cfg.ray, self.resolved.path, spec.context_length,
                                                            max(s.max_response_tokens for s in cfg.stages))
        elif cfg.rollout_engine == "vllm":
            from rstar2_agent.engines.vllm import VLLMEngine

            options = {"kv_cache_gib": 1.0, "max_num_seqs": 64, "seed": cfg.seed, **cfg.engine_options}
            self.engine = await asyncio.to_thread(VLLMEngine, self.resolved.path, context_length=spec.context_length,
                                                  **options)
            self.sandbox = LocalSandbox(SandboxConfig(workers=2))
        else:
            assert isinstance(self.learner, LocalLearner)  # the hf engine runs on the learner's own model
            self.engine = HFEngine(self.resolved.path, model=self.learner.model, tokenizer=self.learner.tokenizer,
                                   context_length=spec.context_length)
            self.sandbox = LocalSandbox(SandboxConfig(workers=2))
        self.attach(self.engine, self.sandbox, version=self.learner.step)
        await self.sandbox.start()

    def attach(self, engine: Any, sandbox: Any, version: int = 0) -> None:
        """The rollout engine (behind its version gate, at `version`) and the sandbox the rollouts use."""
        self.engine, self.sandbox = engine, sandbox
        self.gate = VersionGate(engine, partial=self.cfg.partial_rollouts)
        self.gate.version = version

    # ------------------------------------------------------------------ data
    def pool(self, stage: Stage) -> dict[str, tuple[str, str]]:
        from rstar2_agent import synthetic, tool_tasks

        from .problems import is_problem_data, sample, stage_problems

        generators = {"synthetic": synthetic.problems, "tooltasks": tool_tasks.problems}
        if is_problem_data(stage.data):
            curated = sample(stage_problems(stage.data, self.cfg.data_dir, self.cfg.out), stage.data_size,
                             stage.data_seed)
            all_problems = {p.id: (p.problem, p.answer) for p in curated}
        elif stage.data in generators:
            problems = generators[stage.data](stage.data_seed, 512 if stage.data_size is None else stage.data_size)
            all_problems = {p.id: (p.question, p.answer) for p in problems}
        else:
            raise ValueError(f"stage data must be one of {', '.join(generators)}, a problems file (.jsonl) or "
                             f"sources (hub:ID, dapo:PATH, ...), not {stage.data!r}")
        if self.pool_ids is not None:
            return {i: all_problems[i] for i in self.pool_ids if i in all_problems}
        return all_problems

    def prompts(self, pool: dict[str, tuple[str, str]], step: int) -> list[tuple[str, str, str]]:
        ids = sorted(pool)
        chosen = random.Random(self.cfg.seed * 1000003 + step).sample(ids, min(self.cfg.prompts_per_step, len(ids)))
        return [(i, *pool[i]) for i in chosen]

    # ------------------------------------------------------------------ rollouts
    async def rollouts(self, prompts: list[tuple[str, str, str]], n: int, stage: Stage, step: int
                       ) -> list[list[tuple[Trajectory, float]]]:
        """n rollouts per prompt, then their rewards; `self.times` keeps how long each phase took."""
        batch = await self.batch(prompts, n, stage, step)
        self.times = batch.times
        return batch.groups

    async def batch(self, prompts: list[tuple[str, str, str]], n: int, stage: Stage, step: int) -> Batch:
        """n rollouts per prompt through the version gate, then their rewards, with the versions they came from and
        the phases' times: `rollout_wait_s` is how long the engine had no rollouts to generate
        before this batch (it waited for weights) plus the longest wait of one of them at a push in progress."""
        t0 = time.perf_counter()
        idle = t0 - self._idle_since if self._generating == 0 and self._idle_since is not None else 0.0
        self._generating += 1

        async def one(question: str, key: str) -> tuple[Trajectory, Versions]:
            async with self.gate.trajectory() as versions:
                traj = await self.rollout(question, stage, key)
            pause_for_test("rollout", step + 1)  # the step's first rollout is done, the others are in flight
            return traj, versions

        try:
            done = await asyncio.gather(*(one(question, f"{self.cfg.seed}:{step}:{pid}:{k}")
                                          for pid, question, _ in prompts for k in range(n)))
        finally:
            self._generating -= 1
            if self._generating == 0:
                self._idle_since = time.perf_counter()
        trajs = [t for t, _ in done]
        t1 = time.perf_counter()
        if trajs and all(t.stop_reason == "engine_error" for t in trajs):  # a dead engine: stop before an update
            raise EngineError(f"all {len(trajs)} rollouts of step {step} failed in the rollout engine "
                              f"({trajs[0].error}); nothing was updated or saved: fix the engine and rerun "
                              "with --resume")
        golds = [gold for _, _, gold in prompts for _ in range(n)]
        rewards = await asyncio.gather(*(self.reward(t, gold) for t, gold in zip(trajs, golds, strict=True)))
        times = {"time_rollout": t1 - t0, "time_grading": time.perf_counter() - t1,
                 "rollout_wait_s": idle + max((v.gate_wait for _, v in done), default=0.0)}
        results = list(zip(trajs, rewards, strict=True))
        return Batch(step, prompts, [results[i * n:(i + 1) * n] for i in range(len(prompts))],
                     [[v.oldest for _, v in done[i * n:(i + 1) * n]] for i in range(len(prompts))], times)

    async def rollout(self, question: str, stage: Stage, key: str) -> Trajectory:
        """One trajectory through the shared agent loop; its sampling seed is a function of `key`."""
        cfg = self.cfg
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=stage.max_response_tokens,
                                  seed=zlib.crc32(key.encode()) & 0x7FFFFFFF)
        acfg = AgentConfig(max_turns=stage.max_turns, max_response_tokens=stage.max_response_tokens, sampling=sampling)
        return await run_agent(question, self.gate, self.sandbox, self.fmt, acfg)

    async def reward(self, traj: Trajectory, gold: str) -> float:
        """1 if the final answer is right and the rollout was not cut off, else 0; no length penalty."""
        if traj.stop_reason in ("max_tokens", "max_turns", "engine_error"):
            return 0.0
        return float((await self.grader.grade(traj.text, gold)).correct)

    async def filter_solved(self, stage: Stage, k: int) -> None:
        """Keep only the problems the current policy does not solve k out of k."""
        pool = self.pool(stage)
        items = [(pid, q, gold) for pid, (q, gold) in sorted(pool.items())]
        groups = await self.rollouts(items, k, stage, step=-1)
        self.pool_ids = [pid for (pid, _, _), g in zip(items, groups, strict=True) if not all(r for _, r in g)]
        log.info("stage filter: %d of %d problems kept (solved %d/%d dropped)", len(self.pool_ids), len(pool), k, k)

    # ------------------------------------------------------------------ update
    def update(self, kept: list[list[tuple[Trajectory, float]]],
               stop: threading.Event | None = None) -> dict[str, float]:
        items = [UpdateItem(t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, adv) for group in kept
                 for (t, _), adv in zip(group, grpo_advantages([r for _, r in group]), strict=True)]
        total = sum(sum(i.response_mask) for i in items)
        pause_for_test("in-update", self.learner.step + 1, stop)
        return self.learner.update(items, self.cfg, total, self.fmt.tokenizer.pad_token_id or 0, stop)

    async def sync_weights(self) -> float:
        """Push the new weights to the rollout engine; seconds taken (~0 with the hf engine: shared weights)."""
        t0 = time.perf_counter()
        await self.learner.push(self.engine)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ one step
    async def step(self, step: int, stage: Stage, pool: dict[str, tuple[str, str]], store: Store | None,
                   run_id: int | None) -> dict[str, float]:
        """One synchronous step: the step's rollouts, then `learn` on them."""
        return await self.learn(await self.batch(self.prompts(pool, step), self.cfg.rollouts_per_prompt, stage, step),
                                store, run_id)

    def launch(self, pending: dict[int, asyncio.Task], first: int, pool: dict[str, tuple[str, str]]) -> None:
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
                stage = self.cfg.stages[index]
                pending[t] = asyncio.ensure_future(self.batch(self.prompts(pool, t), self.cfg.rollouts_per_prompt,
                                                              stage, t))

    async def learn(self, batch: Batch, store: Store | None, run_id: int | None) -> dict[str, float]:
        """RoC on the batch's groups, the update (in a thread: the rollouts of later steps go on meanwhile), the
        push of the new weights through the gate, the step's metrics, and its rollouts to the store. Groups with a
        rollout more than max_staleness versions older than the learner are dropped (the schedule never makes
        one: `stale_groups_dropped` says so)."""
        cfg, step = self.cfg, batch.step
        oldest_allowed = self.learner.step - cfg.max_staleness
        fresh = [i for i, vs in enumerate(batch.versions) if min(vs, default=oldest_allowed) >= oldest_allowed]
        groups = [batch.groups[i] for i in fresh]
        stats = [[rollout_stats(t, r, self.fmt) for t, r in g] for g in groups]
        if cfg.roc:
            kept, roc = resample_on_correct([Group(g, s) for g, s in zip(groups, stats, strict=True)],
                                            cfg.group_size, seed=cfg.seed * 7919 + step,
                                            positive_sampling=cfg.positive_sampling,
                                            min_positive=cfg.roc_min_positive, min_negative=cfg.roc_min_negative)
            roc_metrics = {"roc_dropped_groups": roc.dropped_all_equal, "roc_kept_positive": roc.kept_positive,
                           "roc_kept_negative": roc.kept_negative}
        else:
            kept = [g for g in groups if len({r for _, r in g}) > 1]
            roc_metrics = {"roc_dropped_groups": len(groups) - len(kept)}
        version = self.learner.step
        t1 = time.perf_counter()
        stop = threading.Event()
        try:  # nothing kept: no gradient, the step still advances
            upd = await asyncio.to_thread(self.update, kept, stop)
        except BaseException:  # the command is ending (cancelled, or SIGTERM raised while the thread was being
            stop.set()  # started): the thread stops at its next micro-batch, so asyncio.run's exit, which joins
            raise  # it, waits seconds, not the rest of the update
        pause_for_test("update", step + 1)  # the weights moved in memory; nothing of the step is recorded or saved
        t_update = time.perf_counter() - t1
        t_sync = push_wait = 0.0
        if kept:
            t2 = time.perf_counter()
            push_wait = await self.gate.push(self.sync_weights)
            t_sync = time.perf_counter() - t2 - push_wait
        else:
            self.gate.advance()
        flat = [(t, r) for g in batch.groups for t, r in g]
        positives = [t for t, r in flat if r > 0]
        kept_pos = [t for g in kept for t, r in g if r > 0]
        gen_tokens = sum(t.num_generated_tokens for t, _ in flat)
        metrics = {
            "accuracy": sum(r for _, r in flat) / len(flat),
            "response_tokens": gen_tokens / len(flat),
            "turns": sum(len(t.turns) for t, _ in flat) / len(flat),
            "tool_calls": sum(len(t.tool_calls) for t, _ in flat) / len(flat),
            "tool_error_ratio_positive": _tool_error_ratio(positives),
            "tool_error_ratio_kept_positive": _tool_error_ratio(kept_pos),
            # the share of right answers reached through at least one failing call: what RoC has to filter
            "positive_with_tool_error": (sum(any(c.failed for c in t.tool_calls) for t in positives) / len(positives)
                                         if positives else 0.0),
            "engine_errors": sum(t.stop_reason == "engine_error" for t, _ in flat),
            "format_violations": sum(not s.well_formed_answer for g in stats for s in g) / len(flat),
            **batch.times, "time_update": t_update, "time_weight_sync": t_sync, "push_wait_s": push_wait,
            "rollout_tokens_per_s": gen_tokens / batch.times["time_rollout"],
            **lag_metrics(version, [v for i in fresh for v in batch.versions[i]]),
            "stale_groups_dropped": len(batch.groups) - len(fresh),
            **roc_metrics, **upd,
        }
        if store is not None:
            await asyncio.to_thread(_store_rollouts, store, run_id, batch, self.grader.extraction)
        return metrics

    def save(self, step: int, stage_index: int) -> Path:
        meta = {"format": self.cfg.format, "context_length": self.context_length, "stage": "rl",
                "trained_from": self.cfg.model, "step": step}
        path = self.learner.save(Path(self.cfg.out) / f"checkpoint-{step}",
                                 {"stage": stage_index, "pool": self.pool_ids}, meta)
        link_last(path)
        return path

    async def close(self) -> None:
        """Idempotent: stops the grader, the sandbox, the rollout engine(s) and the learner group."""
        self.grader.close()
        sandbox, engine, self.sandbox, self.engine = self.sandbox, self.engine, None, None
        if sandbox is not None:
            await sandbox.close()
        if engine is not None and engine is not self.given_engine:
            await engine.close()
        if self.learner is not None:  # the ablation's probe rolls out without one
            await asyncio.to_thread(self.learner.close)


TEST_PAUSE_ENV = "RSTAR2_TEST_PAUSE_AT"


def pause_for_test(point: str, step: int, stop: threading.Event | None = None) -> None:
    """A test hook, never set in real runs: with RSTAR2_TEST_PAUSE_AT=POINT:STEP (STEP counted from 1, as the store
    counts) the process logs `test hook: paused at POINT:STEP` and stops there (the whole event loop, for up to 10
    minutes, then exits with status 3), so a test can SIGKILL it in that window. Points: rollout (the step's first
    rollout is done, the rest in flight), in-update (in the update's thread, before its first micro-batch: a long
    update; `stop` ends the pause, as it ends an update), update (after the optimizer step, nothing recorded),
    stored (the rollouts are in the store, the metrics are not), recorded (the metrics are in the store, the
    checkpoint is not saved)."""
    if os.environ.get(TEST_PAUSE_ENV) != f"{point}:{step}":
        return
    import sys

    print(f"test hook: paused at {point}:{step}", file=sys.stderr, flush=True)
    if stop is not None:
        if stop.wait(600):
            return
    else:
        time.sleep(600)
    os._exit(3)


def _tool_error_ratio(trajs: list[Trajectory]) -> float:
    calls = sum(len(t.tool_calls) for t in trajs)
    return sum(c.failed for t in trajs for c in t.tool_calls) / calls if calls else 0.0


def _store_rollouts(store: Store, run_id: int, batch: Batch, extraction: str) -> None:
    """Every rollout as a sample of the run (the eval report renders them), stored as eval stores its samples, with
    the policy version it came from (its oldest token's); the row's own `seconds` holds its wall time."""
    from rstar2_agent.chat_format import extract_answer

    for (pid, question, gold), group, versions in zip(batch.prompts, batch.groups, batch.versions, strict=True):
        for k, (traj, reward) in enumerate(group):
            row = sample_row(run_id, f"step{batch.step:05d}/{pid}", k, traj, correct=reward > 0,
                             answer=extract_answer(traj.text, extraction), gold=gold,
                             details={"question": question, "step": batch.step, "version": versions[k]})
            store.add_sample(row, traj.to_dict())


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
                 on_step: Callable[[int, int, dict[str, float]], None] | None = None, engine: Any = None
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
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "recipe.yaml").write_text(dump(cfg))
    store = Store(cfg.db)
    name = cfg.run or Path(cfg.out).resolve().name
    row = store.open_run(name, "rl", cfg.model, {}, {"recipe": dataclasses.asdict(cfg)}, kind="rl")
    forget_unsaved(store, row.id, run.learner.step)
    total = sum(s.steps for s in cfg.stages)
    history: list[dict[str, float]] = []
    final = Path(cfg.out)
    trackers = Trackers(cfg.out, name, dataclasses.asdict(cfg), tensorboard=cfg.tensorboard,
                        wandb_project=cfg.wandb_project, first_step=run.learner.step + 1)
    try:
        await run.start()
        pending: dict[int, asyncio.Task] = {}  # the batches generating ahead of the learner (max_staleness)
        pool: dict[str, tuple[str, str]] | None = None
        try:
            while run.learner.step < total:
                step = run.learner.step
                index, within = stage_of(cfg.stages, step)
                stage = cfg.stages[index]
                if within == 0:  # a stage starts (nothing of it was generated ahead: `launch` stops at stages)
                    run.pool_ids = None
                    if stage.filter_solved:
                        await run.filter_solved(stage, stage.filter_solved)
                    if stage.reset_optimizer:
                        run.learner.reset_optimizer()
                if within == 0 or pool is None:
                    pool = run.pool(stage)
                t0 = time.perf_counter()
                run.launch(pending, step, pool)
                batch = await pending.pop(step)
                waited = time.perf_counter() - t0
                metrics = await run.learn(batch, store, row.id)
                if within + 1 < stage.steps:
                    run.launch(pending, step + 1, pool)  # at once: the next batches need only this push
                metrics |= {"stage": index, "learner_wait_s": waited, "step_time": time.perf_counter() - t0}
                history.append(metrics)
                pause_for_test("stored", run.learner.step)
                store.add_metrics(row.id, run.learner.step, metrics)
                trackers.log(run.learner.step, metrics)
                if on_step:
                    on_step(run.learner.step, total, metrics)
                pause_for_test("recorded", run.learner.step)
                stage_end = within + 1 == stage.steps
                if stage_end or (cfg.save_every and run.learner.step % cfg.save_every == 0):
                    final = run.save(run.learner.step, index)
        finally:  # batches generated ahead of a stop are not trained on; a resume generates them again
            for task in pending.values():
                task.cancel()
            await asyncio.gather(*pending.values(), return_exceptions=True)
        store.set_status(row.id, "finished")
    except BaseException:
        store.set_status(row.id, "interrupted")
        raise
    finally:
        trackers.close()
        await run.close()
    return final, history
