"""`rstar2 bench engines`: engine tokens/s at 1 and 8 concurrent agent loops, and the loop's own overhead.

For each engine, the same prompts run twice side by side: (bare) `engine.generate` on the rendered prompt,
(loop) `run_agent` with one turn and the same sampling and seeds, so both generate the same tokens; the
overhead is the loop's extra wall time (noisy on a shared 2-vCPU machine), and, measured inside the same
runs, the share of the loop's time spent outside `engine.generate` and the sandbox (its own bookkeeping:
prompt rendering, decoding, parsing). Every request generates exactly max_tokens (ignore_eos), so the
figures measure decoding. Hermes format, where SmolLM2 writes no tool call, so no sandbox time enters.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import Engine, SamplingParams
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig

QUESTIONS = [
    "What is the sum of the first 100 positive integers?",
    "How many primes are there below 50?",
    "Solve x^2 - 5x + 6 = 0.",
    "What is 17 * 23?",
    "Find the greatest common divisor of 84 and 120.",
    "How many ways can 5 people sit in a row?",
    "What is the remainder when 2^10 is divided by 7?",
    "Compute the area of a circle of radius 3.",
]


@dataclass
class EngineRow:
    engine: str
    concurrency: int
    requests: int
    tokens: int
    bare_tok_s: float
    loop_tok_s: float
    loop_own: float  # share of the loop's wall time spent outside engine.generate and the sandbox


    @property
    def overhead(self) -> float:
        return self.bare_tok_s / self.loop_tok_s - 1.0


async def _timed(coros) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*coros)
    return time.perf_counter() - t0


async def bench_engine(engine: Engine, name: str, concurrencies=(1, 8), max_tokens: int = 128,
                       rounds: int = 2) -> list[EngineRow]:
    fmt = ChatFormat(engine.tokenizer, "hermes")
    async with LocalSandbox(SandboxConfig(workers=1)) as sandbox:
        return [await _setting(engine, name, fmt, sandbox, conc, max_tokens, rounds) for conc in concurrencies]


async def _setting(engine: Engine, name: str, fmt: ChatFormat, sandbox: LocalSandbox, conc: int, max_tokens: int,
                   rounds: int) -> EngineRow:
    n = max(conc, 4)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    prompts = [fmt.render_prompt(q) for q in questions]
    sampling = [SamplingParams(temperature=0.7, max_tokens=max_tokens, seed=i, ignore_eos=True) for i in range(n)]
    sem = asyncio.Semaphore(conc)
    counted = [0]
    timings: list[dict[str, float]] = []

    async def bare(i: int) -> None:
        async with sem:
            gen = await engine.generate(prompts[i], sampling[i])
        counted[0] += len(gen.token_ids)

    async def loop(i: int) -> None:
        async with sem:
            cfg = AgentConfig(max_turns=1, max_response_tokens=max_tokens, sampling=sampling[i])
            timings.append((await run_agent(questions[i], engine, sandbox, fmt, cfg)).timings)

    await _timed([bare(i) for i in range(n)])  # warm-up: every prompt once, so vLLM's prefix cache is warm for both
    counted[0] = 0
    bare_s = loop_s = 0.0
    for r in range(rounds):  # interleaved, order alternating, so drift and caches favour neither
        if r % 2 == 0:
            bare_s += await _timed([bare(i) for i in range(n)])
            loop_s += await _timed([loop(i) for i in range(n)])
        else:
            loop_s += await _timed([loop(i) for i in range(n)])
            bare_s += await _timed([bare(i) for i in range(n)])
    tokens = counted[0] // rounds
    own = sum(t["total"] - t["generate"] - t["tools"] for t in timings) / sum(t["total"] for t in timings)
    return EngineRow(name, conc, n, tokens, tokens * rounds / bare_s, tokens * rounds / loop_s, own)
