"""The rollout side of RL: the engine (behind the version gate), the sandbox, the chat format and the grader, and
what the step does with them: n rollouts per problem through the shared agent loop, their rewards, and the
per-rollout statistics RoC reads. The problems come from the data side (data/pool.py: a stage's pool, a step's
draw); the stage filter (../stage_filter.py) and the rollouts' storage (storage.py) use this object.

`run_rl` (rl.py), the ablation's held-out probe and the rollout bench all roll out through this object; none of
them needs a learner for it (the hf engine may share a learner's weights, which is the backend's business).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat, answer_blocks, default_extraction, well_formed_answer
from rstar2_agent.engines.base import Engine, EngineError, SamplingParams
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.problem import Problem
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.trajectory import Trajectory

from ..config import RLConfig, Stage
from ..roc import RolloutStats, release_penalty
from .version_gate import VersionGate, Versions

Graded = list[tuple[Trajectory, float]]  # one problem's rollouts and their rewards


@dataclass
class Batch:
    """One step's rollouts as the learner receives them: per problem, the (trajectory, reward) group, each
    rollout's policy version (its oldest token's); and the times of its phases."""
    step: int
    problems: list[Problem]
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

    def __init__(self, cfg: RLConfig, fmt: ChatFormat | None, *, grader: MathGrader | None = None):
        self.cfg, self.fmt = cfg, fmt
        self.grader = grader or MathGrader(extraction=cfg.answer_extraction or default_extraction(cfg.format))
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

    # ------------------------------------------------------------------ rollouts
    async def groups(self, problems: list[Problem], n: int, stage: Stage, step: int, seed: int | None = None
                     ) -> list[Graded]:
        """n rollouts per problem, then their rewards; `self.times` keeps how long each phase took."""
        batch = await self.batch(problems, n, stage, step, seed)
        self.times = batch.times
        return batch.groups

    async def batch(self, problems: list[Problem], n: int, stage: Stage, step: int, seed: int | None = None
                    ) -> Batch:
        """n rollouts per problem through the version gate, then their rewards, with the versions they came from and
        the phases' times: `rollout_wait_s` is how long the engine had no rollouts to generate before this batch (it
        waited for weights) plus the longest wait of one of them at a push in progress. A rollout's sampling seed is
        a function of (`seed`, default the recipe's; step; problem id; sample index)."""
        seed = self.cfg.seed if seed is None else seed
        t0 = time.perf_counter()
        idle = t0 - self._idle_since if self._generating == 0 and self._idle_since is not None else 0.0
        self._generating += 1

        async def one(text: str, key: str) -> tuple[Trajectory, Versions]:
            async with self.gate.trajectory() as versions:
                traj = await self.rollout(text, stage, key)
            return traj, versions

        try:
            done = await asyncio.gather(*(one(p.text, f"{seed}:{step}:{p.id}:{k}") for p in problems for k in range(n)))
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
        answers = [p.answer for p in problems for _ in range(n)]
        rewards = await asyncio.gather(*(self.reward(t, a) for t, a in zip(trajs, answers, strict=True)))
        times = {"time_rollout": t1 - t0, "time_grading": time.perf_counter() - t1,
                 "rollout_wait_s": idle + max((v.gate_wait for _, v in done), default=0.0)}
        results = list(zip(trajs, rewards, strict=True))
        return Batch(step, problems, [results[i * n:(i + 1) * n] for i in range(len(problems))],
                     [[v.oldest for _, v in done[i * n:(i + 1) * n]] for i in range(len(problems))], times)

    async def rollout(self, text: str, stage: Stage, key: str) -> Trajectory:
        """One trajectory through the shared agent loop; its sampling seed is a function of `key` (none without
        `seeded_rollouts`)."""
        cfg = self.cfg
        seed = zlib.crc32(key.encode()) & 0x7FFFFFFF if cfg.seeded_rollouts else None
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=stage.max_response_tokens,
                                  seed=seed)
        acfg = AgentConfig(max_turns=stage.max_turns, max_response_tokens=stage.max_response_tokens, sampling=sampling)
        return await run_agent(text, self.gate, self.sandbox, self.fmt, acfg)

    async def reward(self, traj: Trajectory, answer: str) -> float:
        """1 if the final answer is the problem's and the rollout was not cut off, else 0; no length penalty."""
        if traj.stop_reason in ("max_tokens", "max_turns", "engine_error"):
            return 0.0
        return float((await self.grader.grade_trajectory(traj, answer)).correct)

    # ------------------------------------------------------------------ statistics
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
