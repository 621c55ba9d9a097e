"""What a benchmark is: where its rows come from, how a row becomes a problem, how one sample of it is run
and graded. Each benchmark is one small file next to this one; the harness (runner.py) does the rest."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

# the data part lives in the core (training reads the benchmarks too); its names stay importable from here
from rstar2_agent.benchmark_data import DATA_ENV, BenchmarkSource, DataError, data_dirs, read_jsonl  # noqa: F401
from rstar2_agent.problem import Problem  # what eval and RL pose: one record in the core
from rstar2_agent.trajectory import Trajectory


@dataclass(frozen=True)
class RunDefaults:
    """How a benchmark is run when the command line does not say: its authors' settings."""
    n: int  # samples per problem
    temperature: float
    top_p: float
    max_tokens: int  # response budget per sample (generated and tool tokens)
    max_turns: int  # assistant turns


# rStar2-Agent's evaluation (arXiv 2508.20722, section 5.1): math and GPQA-Diamond with the Figure 3 prompt, pass@1
# averaged over 16 samples (avg@16) at temperature 0.6, up to 30 assistant turns. The paper gives no top-p: we
# sample the full distribution (top_p 1, also verl's validation default, which the release's eval script keeps);
# earlier versions of this project credited top_p 0.95 to the paper, wrongly (runs stored with it resume with
# --top-p 0.95). The response budget is the release's: its examples/aime_eval.sh runs
# data.max_response_length=30720 with actor_rollout_ref.rollout.val_kwargs.n=16 (the paper says 30K). Deviation we
# keep: the release's trainer config leaves multi_turn.max_assistant_turns at 5 and that script does not raise it;
# we follow the paper's 30.
PAPER = RunDefaults(n=16, temperature=0.6, top_p=1.0, max_tokens=30720, max_turns=30)
# BFCL v3, IFEval and Arena-Hard (section 5.1: "each benchmark's default prompt template", T 0) in their own prompts,
# without the math-problem instruction (ctx.agent's problem_prefix=False). Their response budget is ours (the paper
# gives none): 16K tokens, room for a reasoning model's thinking before the answer. The leaderboards' 4,096 (BFCL
# caps each generation there; Arena-Hard's baseline answers were generated with it) is --max-tokens 4096.
REASONING_BUDGET = 16384


@dataclass
class Outcome:
    """One graded sample."""
    trajectory: Trajectory
    correct: bool
    predicted: str | None
    gold: str
    reason: str | None = None  # why it is wrong, when known: no_answer, grader_timeout, ...
    details: dict[str, Any] = field(default_factory=dict)  # benchmark-specific (e.g. the option order)


# Runs the agent on a problem text or on messages, with these tools (None: the Python tool; []: none) and this
# sampling seed; max_turns, execute (runs non-Python calls), max_calls (calls answered a turn; None: the
# format's cap) and read_calls (text -> the turn's calls, in place of the format's parser) as a benchmark needs.
# The harness builds it: the core's token-level loop, or the client-side chat-API loop.
AgentFn = Callable[..., Awaitable[Trajectory]]


@dataclass
class Context:
    """What a benchmark gets to run one sample."""
    agent: AgentFn  # await ctx.agent(prompt, tools=None, seed=...)
    math_grader: Any  # rstar2_agent.grading.math.MathGrader
    seed: int  # the run's seed
    use_tools: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # engine, fmt, sandbox, config: for benchmarks that need them


def sample_seed(seed: int, problem_id: str, index: int) -> int:
    """A per-sample seed that does not depend on the order or concurrency samples run in."""
    digest = hashlib.blake2b(f"{seed}:{problem_id}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class Benchmark:
    """Subclasses set the data source and implement `problem` and `grade`."""

    name: str = ""
    source: BenchmarkSource | None = None  # where its rows come from (rstar2_agent.benchmark_data)
    defaults: RunDefaults = PAPER  # n, sampling and budgets unless flags say otherwise; each benchmark sets its own
    # The receipt of a checker compared with its official implementation (`rstar2 bench conformance`): what it is,
    # the official code and versions, the agreement. Stored with the run's settings: a run graded by another
    # checker is another run.
    checker: dict[str, str] | None = None

    def problem(self, row: dict[str, Any], index: int) -> Problem:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """Settings of the benchmark's own that its results depend on (a judge, the checker), stored with the run's."""
        return {"checker": self.checker} if self.checker else {}

    def run_tag(self) -> str:
        """The default run name's tail for settings of the benchmark's own that differ from its default ("": none)."""
        return ""

    async def close(self) -> None:
        """Release what the benchmark opened for a run (a judge's client)."""

    def rows(self, data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
        """The local JSONL mirror when there is one in the data dirs, else the hub dataset through `datasets`."""
        if self.source is None:
            raise DataError(f"{self.name} has no data source; it makes its own problems")
        return self.source.rows(data_dir)

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
        problems = [replace(p, source=p.source or self.name) for p in
                    (self.problem(r, i) for i, r in enumerate(self.rows(data_dir)))]
        ids = [p.id for p in problems]
        if len(set(ids)) != len(ids):
            raise DataError(f"{self.name}: problem ids are not unique in its data")
        return problems[:limit] if limit else problems

    def prompt(self, problem: Problem, sample_index: int, seed: int) -> tuple[str, str]:
        """The text the model sees for this sample and the answer it is graded against."""
        return problem.text, problem.answer

    async def run(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        text, answer = self.prompt(problem, sample_index, ctx.seed)
        traj = await ctx.agent(text, tools=None if ctx.use_tools else [],
                               seed=sample_seed(ctx.seed, problem.id, sample_index))
        outcome = await self.grade(traj, answer, ctx)
        outcome.details.setdefault("question", text)  # what the model saw, for the report (a stored key)
        return outcome

    async def grade(self, traj: Trajectory, answer: str, ctx: Context) -> Outcome:
        raise NotImplementedError


class MathBenchmark(Benchmark):
    """Answers graded by math-verify against the problem's answer."""

    async def grade(self, traj: Trajectory, answer: str, ctx: Context) -> Outcome:
        g = await ctx.math_grader.grade_trajectory(traj, answer)
        reason = {"timeout": "grader_timeout"}.get(g.error or "", g.error)
        if traj.stop_reason == "engine_error":
            reason = "engine_error"
        return Outcome(traj, g.correct, g.predicted, answer, None if g.correct else reason)
