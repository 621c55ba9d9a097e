"""One benchmark run: runs its samples with many in flight, grades them, stores each one as it finishes,
and resumes a run by name. A killed process loses at most the samples in flight.

An engine error (the endpoint failed or timed out) is retried with back-off; a sample that keeps failing is
stored with status `error`, and a later run with the same name retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.store import Store, sample_row
from rstar2_agent.tool_calls import ToolCall

from .benchmarks import Benchmark, Context, Problem, RunDefaults

log = logging.getLogger(__name__)
PER_BENCHMARK = ("n", "temperature", "top_p", "max_tokens", "max_turns")  # None: the benchmark's `defaults`


@dataclass
class EvalConfig:
    """One run's settings. The five per-benchmark ones left None take the benchmark's own defaults (its authors'
    settings, eval/benchmarks/*.py); `resolve` fills them before a benchmark runs."""
    n: int | None = None  # samples per problem
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None  # response budget per sample (generated and tool tokens)
    max_turns: int | None = None
    use_tools: bool = True
    seed: int = 0
    api: str = "completions"  # token level through the core's engines; "chat": client-side over chat completions
    format: str = ""  # "": the model's (registry); set to what was used once the engine is built
    answer_extraction: str = ""  # "": the format's (chat_format.default_extraction); set once the format is known
    limit: int | None = None  # the first K problems
    concurrency: int = 64  # samples in flight
    retries: int = 3  # per sample, on engine errors
    backoff: float = 2.0  # seconds before the first retry; doubles each time
    ignore_eos: bool = False  # benchmarks only: every sample generates max_tokens

    def resolve(self, defaults: RunDefaults) -> EvalConfig:
        """This config for one benchmark: what it leaves None taken from the benchmark's defaults."""
        return dataclasses.replace(self, **{k: getattr(defaults, k) for k in PER_BENCHMARK if getattr(self, k) is None})

    def given(self) -> list[str]:
        """The per-benchmark settings set here (by flags), not left to the benchmark."""
        return [k for k in PER_BENCHMARK if getattr(self, k) is not None]

    def _check_resolved(self) -> None:
        if len(self.given()) < len(PER_BENCHMARK):
            raise ValueError("EvalConfig has settings left to the benchmark; use cfg.resolve(benchmark.defaults)")

    def settings(self) -> dict[str, Any]:
        """What the results depend on: a run resumes only with the same settings (n and limit may grow)."""
        self._check_resolved()
        keep = ("temperature", "top_p", "max_tokens", "max_turns", "use_tools", "seed", "api", "format",
                "answer_extraction")
        return {k: getattr(self, k) for k in keep}

    def describe(self) -> str:
        """The effective per-benchmark settings, for a run's header."""
        return (f"n {self.n}, temperature {self.temperature:g}, top_p {self.top_p:g}, max_tokens {self.max_tokens}, "
                f"max_turns {self.max_turns}" + ("" if self.use_tools else ", no tools"))

    def agent_config(self) -> AgentConfig:
        self._check_resolved()
        return AgentConfig(max_turns=self.max_turns if self.use_tools else 1, max_response_tokens=self.max_tokens,
                           sampling=SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                                   max_tokens=self.max_tokens, ignore_eos=self.ignore_eos))


@dataclass
class Progress:
    """What the progress display shows; the runner updates it as samples finish."""
    total: int = 0
    done: int = 0
    correct: int = 0
    errors: int = 0
    skipped: int = 0  # already in the store


class ReadCalls:
    """`fmt` with a benchmark's own reading of a turn's calls in place of the format's parser (BFCL's multi-turn
    steps are read as its leaderboard's handler reads them): `read(text)` -> the calls to run, none to end."""

    def __init__(self, fmt: Any, read: Callable[[str], list[ToolCall]]):
        self._fmt, self._read = fmt, read

    def parse(self, text: str, max_calls: int, tools: list[dict[str, Any]] | None = None) -> list[ToolCall]:
        return self._read(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fmt, name)


def make_agent(cfg: EvalConfig, engine=None, fmt=None, sandbox=None, chat_agent=None):
    """ctx.agent: the core's token-level loop on `engine`, or the client-side chat-API loop."""
    base = cfg.agent_config()

    async def agent(prompt, tools=None, seed=None, max_turns=None, execute=None, max_calls=None, problem_prefix=True,
                    read_calls=None):
        """`problem_prefix=False`: messages in a benchmark's own prompt, without the rStar2 templates' math-problem
        instruction (over a chat API: asked of the server's template, chat_api.py). `read_calls`: a benchmark's
        reading of the raw text's calls (ReadCalls); over a chat API the server has read them (its tool_calls)."""
        acfg = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=seed))
        if max_turns is not None:
            acfg.max_turns = max_turns
        if max_calls is not None:
            acfg.max_calls_per_turn = max_calls
        if chat_agent is not None:
            return await chat_agent(prompt, acfg, tools=tools, seed=seed, execute=execute,
                                    problem_prefix=problem_prefix)
        ids = None if problem_prefix else fmt.render_prompt(prompt, tools, problem_prefix=False)
        loop_fmt = fmt if read_calls is None else ReadCalls(fmt, read_calls)
        return await run_agent(prompt, engine, sandbox, loop_fmt, acfg, tools=tools, execute=execute, prompt_ids=ids)

    return agent


async def run_benchmark(bench: Benchmark, problems: list[Problem], ctx: Context, cfg: EvalConfig, store: Store,
                        run_id: int, on_progress: Callable[[Progress], None] | None = None) -> Progress:
    """Run every (problem, sample) of the run that is not stored yet; returns the counts."""
    done = await asyncio.to_thread(store.done, run_id)
    todo = [(p, i) for p in problems for i in range(cfg.n) if (p.id, i) not in done]
    prog = Progress(total=len(problems) * cfg.n, skipped=len(problems) * cfg.n - len(todo))
    prog.done = prog.skipped
    notify = on_progress or (lambda p: None)
    notify(prog)
    queue: asyncio.Queue[tuple[Problem, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    # `concurrency` bounds the samples generating at once; grading and storing happen outside that bound, so
    # the engine starts the next sample while the last one is graded.
    slots = asyncio.Semaphore(cfg.concurrency)
    agent = ctx.agent

    async def limited_agent(*args, **kwargs):
        async with slots:
            return await agent(*args, **kwargs)

    ctx = dataclasses.replace(ctx, agent=limited_agent)

    async def one(problem: Problem, index: int) -> None:
        for attempt in range(cfg.retries + 1):
            out = await bench.run(problem, index, ctx)
            if out.trajectory.stop_reason != "engine_error" or attempt == cfg.retries:
                break
            delay = cfg.backoff * 2 ** attempt
            log.warning("%s #%d: %s; retry %d/%d in %.0f s", problem.id, index, out.trajectory.error, attempt + 1,
                        cfg.retries, delay)
            await asyncio.sleep(delay)
        sample = sample_row(run_id, problem.id, index, out.trajectory, correct=out.correct, answer=out.predicted,
                            gold=out.gold, reason=out.reason, details=out.details, attempts=attempt + 1)
        await asyncio.to_thread(store.add_sample, sample, out.trajectory.to_dict())
        prog.done += 1
        prog.correct += sample.correct
        prog.errors += sample.status == "error"
        notify(prog)

    async def worker() -> None:
        while not queue.empty():
            await one(*queue.get_nowait())

    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(2 * cfg.concurrency, len(todo))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*workers, return_exceptions=True)
    return prog


def rich_progress(console, label: str):
    """A rich progress bar (samples done of those to run, running accuracy, errors, ETA; plain lines where the
    console is not a terminal) and its callback."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    from rstar2_agent.progress import PlainProgress

    bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
              TextColumn("acc {task.fields[acc]}"), TextColumn("{task.fields[errors]}"), TimeElapsedColumn(),
              TextColumn("eta"), TimeRemainingColumn(), console=console)
    task = bar.add_task(label, total=None, acc="-", errors="")
    plain = PlainProgress(console, label)  # where the output is not a terminal: a line every 30 s

    def update(p: Progress) -> None:
        new = p.done - p.skipped
        acc, errors = f"{p.correct / new:.3f}" if new else "-", f"{p.errors} errors" if p.errors else ""
        bar.update(task, total=p.total - p.skipped, completed=new, acc=acc, errors=errors,
                   description=label + (f" ({p.skipped} stored)" if p.skipped else ""))
        plain(new, p.total - p.skipped, f"acc {acc}" + (f", {errors}" if errors else ""))

    return bar, update
