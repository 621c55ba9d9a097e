"""`rstar2 bench eval`: what the harness costs on top of the engine (grading's figures: `rstar2 bench grading`).

Harness against the bare engine, side by side in one process: the same prompts, sampling and per-sample
seeds, every sample generating exactly max_tokens (ignore_eos, tools off, so both do the same work): (bare)
`engine.generate` on the rendered prompts with the same concurrency; (harness) `run_benchmark`: the agent loop,
grading (MathGrader), a SQLite write per sample, the progress callback. Rounds alternate the order.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import Engine, SamplingParams
from rstar2_agent.eval.benchmarks import Benchmark, Context, Problem
from rstar2_agent.eval.benchmarks.base import sample_seed
from rstar2_agent.eval.runner import EvalConfig, make_agent, run_benchmark
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.store import Store


@dataclass
class HarnessRow:
    samples: int
    tokens: int
    bare_s: float
    harness_s: float

    @property
    def ratio(self) -> float:
        return self.harness_s / self.bare_s


async def bench_harness(engine: Engine, fmt: ChatFormat, bench: Benchmark, problems: list[Problem], n: int,
                        max_tokens: int, concurrency: int, rounds: int = 2) -> HarnessRow:
    cfg = EvalConfig(n=n, temperature=0.6, top_p=1.0, max_tokens=max_tokens, max_turns=1, use_tools=False,
                     concurrency=concurrency, ignore_eos=True)  # top_p as the bare calls' SamplingParams
    items = [(p, i) for p in problems for i in range(n)]
    prompts = {p.id: fmt.render_prompt(bench.prompt(p, 0, cfg.seed)[0], []) for p in problems}
    sem = asyncio.Semaphore(concurrency)
    tokens = [0]

    async def bare_one(p: Problem, i: int) -> None:
        async with sem:
            gen = await engine.generate(prompts[p.id], SamplingParams(
                temperature=cfg.temperature, max_tokens=max_tokens, seed=sample_seed(cfg.seed, p.id, i),
                ignore_eos=True))
        tokens[0] += len(gen.token_ids)

    async def bare() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(bare_one(p, i) for p, i in items))
        return time.perf_counter() - t0

    grader = MathGrader()
    ctx = Context(agent=make_agent(cfg, engine, fmt, sandbox=None), math_grader=grader, seed=cfg.seed,
                  use_tools=False)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")

        async def harness(r: int) -> float:
            run = store.open_run(f"bench-{r}", bench.name, "bench", cfg.settings())
            t0 = time.perf_counter()
            await run_benchmark(bench, problems, ctx, cfg, store, run.id, on_progress=lambda p: None)
            return time.perf_counter() - t0

        try:
            await bare()  # warm-up (and the grader's processes start)
            await grader.grade("\\boxed{1}", "1")
            tokens[0] = 0
            bare_s = harness_s = 0.0
            for r in range(rounds):
                if r % 2 == 0:
                    bare_s += await bare()
                    harness_s += await harness(r)
                else:
                    harness_s += await harness(r)
                    bare_s += await bare()
        finally:
            grader.close()
            store.close()
    return HarnessRow(len(items), tokens[0] // rounds, bare_s / rounds, harness_s / rounds)
