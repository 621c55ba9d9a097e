"""What a benchmark is: where its rows come from, how a row becomes a problem, how one sample of it is run
and graded. Each benchmark is one small file next to this one; the harness (runner.py) does the rest."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_agent.trajectory import Trajectory

DATA_ENV = "RSTAR2_DATA_DIR"


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


class DataError(RuntimeError):
    """A benchmark whose data cannot be found or read; the message says where it looked and what to do."""


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    gold: str
    meta: dict[str, Any] = field(default_factory=dict)


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
# sampling seed; max_turns, execute (runs non-Python calls) and max_calls (calls answered a turn; None: the
# format's cap) as a benchmark needs. The harness builds it: the core's token-level loop, or the client-side
# chat-API loop.
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


def data_dirs(data_dir: str | os.PathLike | None) -> list[Path]:
    dirs = [data_dir] if data_dir else []
    if os.environ.get(DATA_ENV):
        dirs.append(os.environ[DATA_ENV])
    return [Path(d) for d in dirs]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or replace the file") from e
    return rows


class Benchmark:
    """Subclasses set the data source and implement `problem` and `grade`."""

    name: str = ""
    hub_id: str = ""  # the Hugging Face dataset
    hub_config: str | None = None
    split: str = "test"
    file: str = ""  # the local JSONL mirror (same columns as the hub dataset), looked up in the data dirs
    columns: tuple[str, ...] = ()  # the columns it reads, for error messages
    defaults: RunDefaults = PAPER  # n, sampling and budgets unless flags say otherwise; each benchmark sets its own

    def problem(self, row: dict[str, Any], index: int) -> Problem:
        raise NotImplementedError

    def rows(self, data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
        """The local JSONL mirror when there is one in the data dirs, else the hub dataset through `datasets`."""
        dirs = data_dirs(data_dir)
        for d in dirs:
            if (d / self.file).is_file():
                return read_jsonl(d / self.file)
        try:
            if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
                raise ConnectionError("HF_HUB_OFFLINE is set")  # datasets reads it only when first imported
            import datasets

            ds = datasets.load_dataset(self.hub_id, self.hub_config, split=self.split)
            return [dict(r) for r in ds]
        except Exception as e:  # noqa: BLE001 - offline, gated, missing: all end in the same advice
            looked = ", ".join(str(d) for d in dirs) or f"nowhere (neither --data-dir nor ${DATA_ENV} is set)"
            raise DataError(
                f"no data for {self.name}: no {self.file} in {looked}, and the hub dataset {self.hub_id}"
                f"{'/' + self.hub_config if self.hub_config else ''} (split {self.split}) could not be loaded "
                f"({type(e).__name__}: {str(e)[:200]}). Put a JSONL file named {self.file} with the hub's columns "
                f"({', '.join(self.columns)}) in a folder and pass --data-dir FOLDER or set ${DATA_ENV}, or give "
                f"this machine access to the Hugging Face Hub.") from e

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
        problems = [self.problem(r, i) for i, r in enumerate(self.rows(data_dir))]
        ids = [p.id for p in problems]
        if len(set(ids)) != len(ids):
            raise DataError(f"{self.name}: problem ids are not unique in its data")
        return problems[:limit] if limit else problems

    def prompt(self, problem: Problem, sample_index: int, seed: int) -> tuple[str, str]:
        """The question the model sees for this sample and the gold answer it is graded against."""
        return problem.question, problem.gold

    async def run(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        question, gold = self.prompt(problem, sample_index, ctx.seed)
        traj = await ctx.agent(question, tools=None if ctx.use_tools else [],
                               seed=sample_seed(ctx.seed, problem.id, sample_index))
        outcome = await self.grade(traj, gold, ctx)
        outcome.details.setdefault("question", question)  # what the model saw, for the report
        return outcome

    async def grade(self, traj: Trajectory, gold: str, ctx: Context) -> Outcome:
        raise NotImplementedError


class MathBenchmark(Benchmark):
    """Answers graded by math-verify against the gold answer."""

    async def grade(self, traj: Trajectory, gold: str, ctx: Context) -> Outcome:
        g = await ctx.math_grader.grade(traj.text, gold)
        reason = {"timeout": "grader_timeout"}.get(g.error or "", g.error)
        if traj.stop_reason == "engine_error":
            reason = "engine_error"
        return Outcome(traj, g.correct, g.predicted, gold, None if g.correct else reason)
