"""The rollout side of RL: the engine (behind the version gate), the sandbox, the chat format and the grader, and
what the step does with them: a stage's problem pool, the prompts of a step, n rollouts per prompt through the
shared agent loop, their rewards, the stage-3 filter, the per-rollout statistics RoC reads, and their storage.

`run_rl` (rl.py), the ablation's held-out probe and the rollout bench all roll out through this object; none of
them needs a learner for it (the hf engine may share a learner's weights, which is the backend's business).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from dataclasses import dataclass

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import (
    ChatFormat,
    answer_blocks,
    answer_scope,
    default_extraction,
    extract_answer,
    well_formed_answer,
)
from rstar2_agent.engines.base import Engine, EngineError, SamplingParams
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.store import Store, sample_row
from rstar2_agent.trajectory import Trajectory

from ..config import RLConfig, Stage
from ..roc import RolloutStats, release_penalty
from .version_gate import VersionGate, Versions

log = logging.getLogger(__name__)
Prompt = tuple[str, str, str]  # (problem id, question, gold answer)
Graded = list[tuple[Trajectory, float]]  # one prompt's rollouts and their rewards


@dataclass
class Batch:
    """One step's rollouts as the learner receives them: per prompt, the (trajectory, reward) group, each
    rollout's policy version (its oldest token's); and the times of its phases."""
    step: int
    prompts: list[Prompt]
    groups: list[Graded]
    versions: list[list[int]]
    times: dict[str, float]


def rollout_stats(traj: Trajectory, reward: float, fmt: ChatFormat) -> RolloutStats:
    """Our counts for the paper's sampler, and the release's penalty on the decoded response for "topk"."""
    return RolloutStats(reward, len(traj.tool_calls), sum(c.failed for c in traj.tool_calls),
                        len(answer_blocks(traj.text)), well_formed_answer(traj.text), max(1, len(traj.turns)),
                        release_penalty(fmt.decode(traj.response_ids)))


def tool_error_ratio(trajs: list[Trajectory]) -> float:
    calls = sum(len(t.tool_calls) for t in trajs)
    return sum(c.failed for t in trajs for c in t.tool_calls) / calls if calls else 0.0


class Rollouts:
    """Rollouts and rewards for the RL recipe `cfg`. `attach` gives it the engine and the sandbox; `close` stops the
    grader, the sandbox and the engine (unless `owns_engine` is False: an engine the caller started and stops)."""

    _generating = 0  # batches generating now
    _idle_since: float | None = None  # when the engine last ran out of rollouts to generate

    def __init__(self, cfg: RLConfig, fmt: ChatFormat | None, *, grader: MathGrader | None = None,
                 pool_ids: list[str] | None = None):
        self.cfg, self.fmt = cfg, fmt
        self.grader = grader or MathGrader(extraction=cfg.answer_extraction or default_extraction(cfg.format))
        self.pool_ids = pool_ids  # the problems a stage keeps after its filter (None: all)
        self.engine: Engine | None = None
        self.sandbox: Sandbox | None = None
        self.gate: VersionGate | None = None  # the engine behind a VersionGate: what the rollouts call
        self.owns_engine = True
        self.times: dict[str, float] = {}

    def attach(self, engine: Engine, sandbox: Sandbox, version: int = 0, owns_engine: bool = True) -> None:
        """The rollout engine (behind its version gate, at `version`) and the sandbox the rollouts use."""
        self.engine, self.sandbox, self.owns_engine = engine, sandbox, owns_engine
        self.gate = VersionGate(engine, partial=self.cfg.partial_rollouts)
        self.gate.version = version

    # ------------------------------------------------------------------ data
    def pool(self, stage: Stage) -> dict[str, tuple[str, str]]:
        """The stage's problems, id -> (question, gold), less those its filter dropped."""
        from rstar2_agent import synthetic

        from ..data import tool_tasks
        from ..data.problems import is_problem_data, sample, stage_problems

        size = 512 if stage.data_size is None else stage.data_size
        if is_problem_data(stage.data):
            curated = sample(stage_problems(stage.data, self.cfg.data_dir, self.cfg.out), stage.data_size,
                             stage.data_seed)
            all_problems = {p.id: (p.problem, p.answer) for p in curated}
        elif stage.data == "synthetic" or stage.data.startswith("synthetic:"):
            families = stage.data.partition(":")[2] or None
            all_problems = {p.id: (p.question, p.answer) for p in synthetic.problems(stage.data_seed, size, families)}
        elif stage.data == "tooltasks":
            all_problems = {p.id: (p.question, p.answer) for p in tool_tasks.problems(stage.data_seed, size)}
        else:
            raise ValueError(f"stage data must be one of synthetic, synthetic:FAMILIES, tooltasks, a problems file "
                             f"(.jsonl) or sources (hub:ID, dapo:PATH, ...), not {stage.data!r}")
        if self.pool_ids is not None:
            return {i: all_problems[i] for i in self.pool_ids if i in all_problems}
        return all_problems

    def prompts(self, pool: dict[str, tuple[str, str]], step: int) -> list[Prompt]:
        """The step's prompts: a function of (seed, step), so a resumed step draws the same ones."""
        ids = sorted(pool)
        chosen = random.Random(self.cfg.seed * 1000003 + step).sample(ids, min(self.cfg.prompts_per_step, len(ids)))
        return [(i, *pool[i]) for i in chosen]

    # ------------------------------------------------------------------ rollouts
    async def groups(self, prompts: list[Prompt], n: int, stage: Stage, step: int, seed: int | None = None
                     ) -> list[Graded]:
        """n rollouts per prompt, then their rewards; `self.times` keeps how long each phase took."""
        batch = await self.batch(prompts, n, stage, step, seed)
        self.times = batch.times
        return batch.groups

    async def batch(self, prompts: list[Prompt], n: int, stage: Stage, step: int, seed: int | None = None) -> Batch:
        """n rollouts per prompt through the version gate, then their rewards, with the versions they came from and
        the phases' times: `rollout_wait_s` is how long the engine had no rollouts to generate before this batch (it
        waited for weights) plus the longest wait of one of them at a push in progress. A rollout's sampling seed is
        a function of (`seed`, default the recipe's; step; prompt; sample index)."""
        seed = self.cfg.seed if seed is None else seed
        t0 = time.perf_counter()
        idle = t0 - self._idle_since if self._generating == 0 and self._idle_since is not None else 0.0
        self._generating += 1

        async def one(question: str, key: str) -> tuple[Trajectory, Versions]:
            async with self.gate.trajectory() as versions:
                traj = await self.rollout(question, stage, key)
            return traj, versions

        try:
            done = await asyncio.gather(*(one(question, f"{seed}:{step}:{pid}:{k}")
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
        """One trajectory through the shared agent loop; its sampling seed is a function of `key` (none without
        `seeded_rollouts`)."""
        cfg = self.cfg
        seed = zlib.crc32(key.encode()) & 0x7FFFFFFF if cfg.seeded_rollouts else None
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=stage.max_response_tokens,
                                  seed=seed)
        acfg = AgentConfig(max_turns=stage.max_turns, max_response_tokens=stage.max_response_tokens, sampling=sampling)
        return await run_agent(question, self.gate, self.sandbox, self.fmt, acfg)

    async def reward(self, traj: Trajectory, gold: str) -> float:
        """1 if the final answer is right and the rollout was not cut off, else 0; no length penalty."""
        if traj.stop_reason in ("max_tokens", "max_turns", "engine_error"):
            return 0.0
        return float((await self.grader.grade_trajectory(traj, gold)).correct)

    async def filter_solved(self, stage: Stage, k: int) -> None:
        """Keep only the problems the current policy does not solve k out of k. A rollout that failed in the engine
        says nothing of the policy: a problem is solved when every rollout that ran is right (and one ran)."""
        pool = self.pool(stage)
        items = [(pid, q, gold) for pid, (q, gold) in sorted(pool.items())]
        groups = without_engine_errors(await self.groups(items, k, stage, step=-1))
        self.pool_ids = [pid for (pid, _, _), g in zip(items, groups, strict=True) if not (g and all(r for _, r in g))]
        log.info("stage filter: %d of %d problems kept (solved %d/%d dropped)", len(self.pool_ids), len(pool), k, k)

    # ------------------------------------------------------------------ statistics and storage
    def stats(self, group: Graded) -> list[RolloutStats]:
        return [rollout_stats(t, r, self.fmt) for t, r in group]

    def metrics(self, batch: Batch, stats: list[list[RolloutStats]], kept: list[Graded]) -> dict[str, float]:
        """The batch's rollout statistics (accuracy, lengths, tools, format) over every rollout, and the tool errors
        among the positives RoC kept."""
        flat = [(t, r) for g in batch.groups for t, r in g]
        ran = [r for t, r in flat if t.stop_reason != "engine_error"]  # an engine failure is no wrong answer
        positives = [t for t, r in flat if r > 0]
        kept_pos = [t for g in kept for t, r in g if r > 0]
        gen_tokens = sum(t.num_generated_tokens for t, _ in flat)
        return {
            "accuracy": sum(ran) / len(ran) if ran else 0.0,
            "response_tokens": gen_tokens / len(flat),
            "turns": sum(len(t.turns) for t, _ in flat) / len(flat),
            "tool_calls": sum(len(t.tool_calls) for t, _ in flat) / len(flat),
            "tool_error_ratio_positive": tool_error_ratio(positives),
            "tool_error_ratio_kept_positive": tool_error_ratio(kept_pos),
            # the share of right answers reached through at least one failing call: what RoC has to filter
            "positive_with_tool_error": (sum(any(c.failed for c in t.tool_calls) for t in positives) / len(positives)
                                         if positives else 0.0),
            "engine_errors": sum(t.stop_reason == "engine_error" for t, _ in flat),
            "format_violations": (sum(not s.well_formed_answer for g in stats for s in g)
                                  / max(1, sum(len(g) for g in stats))),
            **batch.times,
            "rollout_tokens_per_s": gen_tokens / batch.times["time_rollout"],
        }

    def store(self, store: Store, run_id: int, batch: Batch) -> None:
        """Every rollout as a sample of the run (the eval report renders them), stored as eval stores its samples,
        with the policy version it came from (its oldest token's); the row's own `seconds` holds its wall time."""
        for (pid, question, gold), group, versions in zip(batch.prompts, batch.groups, batch.versions, strict=True):
            for k, (traj, reward) in enumerate(group):
                row = sample_row(run_id, f"step{batch.step:05d}/{pid}", k, traj, correct=reward > 0,
                                 answer=extract_answer(answer_scope(traj, self.grader.extraction),
                                                       self.grader.extraction), gold=gold,
                                 details={"question": question, "step": batch.step, "version": versions[k]})
                store.add_sample(row, traj.to_dict())

    async def close(self) -> None:
        """Idempotent: stops the grader, the sandbox and the rollout engine (when this object owns it)."""
        self.grader.close()
        sandbox, engine, self.sandbox, self.engine = self.sandbox, self.engine, None, None
        if sandbox is not None:
            await sandbox.close()
        if engine is not None and self.owns_engine:
            await engine.close()


def without_engine_errors(groups: list[Graded]) -> list[Graded]:
    """Each group without its rollouts that failed in the engine: an infrastructure failure is no negative for
    RoC or the advantages (its reward 0 says nothing of the policy); `engine_errors` in the metrics counts them."""
    return [[(t, r) for t, r in g if t.stop_reason != "engine_error"] for g in groups]
