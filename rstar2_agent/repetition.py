"""The repetition stop: a generation that has degenerated into a loop (the same run of tokens over and over, such
as an endless run of code fences) ends early with the stop reason `repetition` instead of spending its budget.

The detector reads the generated token ids as they stream. The tail is a loop when it is one pattern of at most
`max_pattern_size` tokens repeated exactly, back to back, at least `min_count` times and over at least
`min_tokens` tokens. It keeps, for each pattern size p, how many of the last tokens equal the token p before them
(a run counter), so each new token costs O(max_pattern_size) and no window is rescanned. Samplers only discourage
repeats (HF's `no_repeat_ngram_size` bans an n-gram's second occurrence, llama.cpp's repeat penalty and DRY lower
the logits of a repeat); vLLM's `repetition_detection` sampling parameter (max_pattern_size, min_pattern_size,
min_count; off by default) is the same kind of stop inside its scheduler, with the finish reason "repetition".
This one lives in the agent loop (agent.py), so it works on every engine; chat and serve turn it on by default,
eval and RL leave it off (they measure the model as it is).

The defaults let legitimate repetition through: a table's rows and a list of numbers differ from one another, and a
short exact repeat (a separator, a few identical lines) stays under 256 tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, fields

from .engines.base import Engine, Generation, OnTokens, SamplingParams


@dataclass(frozen=True)
class RepetitionStop:
    max_pattern_size: int = 128  # the longest repeating pattern looked for, in tokens
    min_count: int = 4  # the pattern occurs at least this many times in a row
    min_tokens: int = 256  # and the repeats cover at least this many tokens

    def __post_init__(self) -> None:
        if self.max_pattern_size < 1 or self.min_count < 2 or self.min_tokens < 1:
            raise ValueError("the repetition stop needs max_pattern_size >= 1, min_count >= 2 and min_tokens >= 1")

    @classmethod
    def parse(cls, text: str) -> RepetitionStop | None:
        """`on` (the defaults), `off` (None), or `KEY=VALUE,...` over the defaults (e.g. `min_tokens=512`)."""
        text = text.strip().lower()
        if text in ("off", "none", "0", "false", "no"):
            return None
        if text in ("on", "", "default", "true", "yes"):
            return cls()
        names = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in names or not value.strip().isdigit():
                raise ValueError(f"{item!r}: say on, off, or KEY=VALUE pairs with KEY one of {', '.join(sorted(names))}"
                                 " (e.g. min_tokens=512,min_count=4)")
            values[key] = int(value)
        return cls(**values)

    def describe(self) -> str:
        return (f"a pattern of at most {self.max_pattern_size} tokens repeated at least {self.min_count} times over "
                f"at least {self.min_tokens} tokens")


class RepetitionDetector:
    """Fed token ids in order; `feed` says whether the tail has become a loop (RepetitionStop)."""

    def __init__(self, stop: RepetitionStop):
        self.stop = stop
        self.tail: deque[int] = deque(maxlen=stop.max_pattern_size + 1)
        self.runs = [0] * (stop.max_pattern_size + 1)  # runs[p]: how many of the last tokens equal the one p before
        self.pattern_size: int | None = None  # the loop's pattern size, once found

    def feed(self, ids: list[int]) -> bool:
        if self.pattern_size is not None:
            return True
        stop, runs, tail = self.stop, self.runs, self.tail
        for tok in ids:
            tail.append(tok)
            n = len(tail)
            for p in range(1, n):  # tail[-1 - p] is the token p before the new one
                if tail[n - 1 - p] == tok:
                    runs[p] += 1
                    # a run of r matches at period p means the last r + p tokens repeat a p-token pattern
                    span = runs[p] + p
                    if span >= stop.min_tokens and span >= stop.min_count * p:
                        self.pattern_size = p
                        return True
                else:
                    runs[p] = 0
        return False


async def generate_watched(engine: Engine, prompt_ids: list[int], sampling: SamplingParams,
                           on_tokens: OnTokens | None, stop: RepetitionStop | None,
                           before: list[int] = ()) -> Generation:
    """`engine.generate`, ended early (the engine's request cancelled, so it aborts) once the streamed tokens loop;
    such a generation has the finish reason "repetition" and holds the tokens up to the loop's detection. `before`:
    what the same turn generated before this call (a turn resumed after a stop string), so that a loop of short
    generations is caught too. Without a `stop`, or with `ignore_eos` (a benchmark asking for max_tokens whatever the
    model says), it is `engine.generate` itself."""
    if stop is None or sampling.ignore_eos:
        return await engine.generate(prompt_ids, sampling, on_tokens)
    detector = RepetitionDetector(stop)
    detector.feed(list(before[-(stop.min_tokens + stop.max_pattern_size):]))
    ids: list[int] = []
    logprobs: list[float] = []
    looped = asyncio.Event()

    def watch(new: list[int], new_logprobs: list[float] | None = None) -> None:
        if looped.is_set():
            return
        ids.extend(new)
        logprobs.extend(new_logprobs if new_logprobs is not None else [0.0] * len(new))
        if on_tokens is not None:
            on_tokens(new, new_logprobs)
        if detector.feed(new):
            looped.set()

    task = asyncio.ensure_future(engine.generate(prompt_ids, sampling, watch))
    waiter = asyncio.ensure_future(looped.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if looped.is_set():
        return Generation(ids, logprobs, "repetition")
    gen = task.result()
    if len(ids) < len(gen.token_ids) and detector.feed(gen.token_ids[len(ids):]):  # an engine that did not stream
        return Generation(gen.token_ids, gen.logprobs, "repetition")
    return gen
