"""`rstar2 bench tool-stream`: what streaming a reply's reasoning and tool calls costs, and what it gains.

- Parser cost: a long reply in the rStar2 shape (reasoning, a call with many lines of code, the answer), fed token by
  token as a server streams it, through the incremental decoder alone (the baseline: what the server did for
  streamed text before it parsed calls) and through the decoder and the reply parser (serve/reply_stream.py),
  side by side in alternating rounds; the time per token and the ratio, median over rounds.
- First argument latency: a real engine writing a forced call (`tool_choice` naming the function, enforced by
  vLLM's structured outputs) through `rstar2 serve` over HTTP, greedy with a fixed seed, so both forms generate the
  same tokens: the time to the first argument fragment of the stream against the time to the whole non-streamed
  response, alternating the two forms.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rstar2_agent.agent import StreamDecoder
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.paper_format import PAPER_SCHEMA, PAPER_TOOL
from rstar2_agent.serve.reply_stream import ReplyParser


def long_reply(code_lines: int = 60, reasoning_sentences: int = 60) -> str:
    """A reply as an rStar2 model writes one: reasoning, `</reason>`, a call whose code has many lines."""
    reasoning = " ".join(f"Step {i}: the sum of the first {i} squares is {i * (i + 1) * (2 * i + 1) // 6}."
                         for i in range(1, reasoning_sentences + 1))
    code = "\n".join(f"print(sum(k * k for k in range({i})))  # {i}" for i in range(code_lines))
    call = json.dumps({"name": PAPER_TOOL, "arguments": {"code": code, "input": ""}})
    return f"{reasoning}\n</reason><tool_call>\n{call}\n</tool_call>"


@dataclass
class ParserCost:
    tokens: int
    baseline_us_per_token: float
    parsed_us_per_token: float
    ratios: list[float]


def _stream(fmt: ChatFormat, ids: list[int], parse: bool) -> float:
    parser = ReplyParser(fmt.rules.name, True, tools=[PAPER_SCHEMA])
    sink: list[Any] = []
    on_text = (lambda kind, text: sink.extend(parser.feed(text))) if parse else (lambda kind, text: sink.append(text))
    decoder = StreamDecoder(fmt, on_text)
    t0 = time.perf_counter()
    for i in ids:
        decoder.feed([i])
    decoder.flush()
    if parse:
        sink.extend(parser.finish())
    return time.perf_counter() - t0


def parser_cost(tokenizer: Any, rounds: int = 5) -> ParserCost:
    fmt = ChatFormat(tokenizer, "rstar2-paper")
    ids = fmt.encode(long_reply())
    base, parsed = [], []
    for r in range(rounds):  # alternating, so that a drift of the machine falls on both
        for parse in ((False, True) if r % 2 == 0 else (True, False)):
            (parsed if parse else base).append(_stream(fmt, ids, parse))
    ratios = [p / b for p, b in zip(parsed, base, strict=True)]
    return ParserCost(len(ids), statistics.median(base) / len(ids) * 1e6,
                      statistics.median(parsed) / len(ids) * 1e6, ratios)


@dataclass
class ArgumentLatency:
    tokens: int
    streamed_first_argument_s: list[float]
    streamed_total_s: list[float]
    non_streamed_s: list[float]


async def first_argument_latency(url: str, model: str, tools: list[dict[str, Any]], rounds: int = 3,
                                 max_tokens: int = 96) -> ArgumentLatency:
    """Against a running `rstar2 serve` whose engine constrains decoding (vllm)."""
    import logging

    import openai

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    name = tools[0]["function"]["name"]
    kw = dict(model=model, messages=[{"role": "user", "content": "Look up the weather in Paris."}], tools=tools,
              tool_choice={"type": "function", "function": {"name": name}}, temperature=0.0, seed=0,
              max_tokens=max_tokens)
    out = ArgumentLatency(0, [], [], [])
    try:
        for r in range(rounds):
            for streamed in ((True, False) if r % 2 == 0 else (False, True)):
                t0 = time.monotonic()
                if not streamed:
                    resp = await client.chat.completions.create(**kw)
                    out.non_streamed_s.append(time.monotonic() - t0)
                    out.tokens = resp.usage.completion_tokens
                    continue
                first = None
                async for chunk in await client.chat.completions.create(**kw, stream=True):
                    calls = chunk.choices[0].delta.tool_calls if chunk.choices else None
                    if first is None and any(c.function and c.function.arguments for c in calls or []):
                        first = time.monotonic() - t0
                out.streamed_total_s.append(time.monotonic() - t0)
                out.streamed_first_argument_s.append(first if first is not None else float("nan"))
    finally:
        await client.close()
    return out


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}]


def run(model_path: str, rounds: int = 3, max_tokens: int = 96) -> tuple[ParserCost, ArgumentLatency]:
    """The parser's cost in this process; then `rstar2 serve --engine vllm` started as a user starts it, and the
    first argument latency against it."""
    import asyncio
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    from .serve import _port, running

    cost = parser_cost(AutoTokenizer.from_pretrained(model_path), rounds=max(rounds, 5))
    port = _port()
    argv = [str(Path(sys.executable).with_name("rstar2")), "serve", "--engine", "vllm", "--model", model_path,
            "--served-model-name", "m", "--port", str(port), "--format", "hermes"]
    with running(argv, port) as url:
        latency = asyncio.run(first_argument_latency(url, "m", WEATHER, rounds, max_tokens))
    return cost, latency
