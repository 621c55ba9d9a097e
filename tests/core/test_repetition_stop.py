"""The repetition stop (rstar2_agent/repetition.py): the detector on token sequences (a loop is caught, text with
legitimate repetition is not), and the agent loop and the server ending a looping generation early with the stop
reason `repetition` (a scripted engine that streams an endless run of code fences, as the issue's SmolLM2 did)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import Generation, SamplingParams
from rstar2_agent.repetition import RepetitionDetector, RepetitionStop
from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import uvicorn_app


def caught(ids: list[int], stop: RepetitionStop | None = None) -> bool:
    return RepetitionDetector(stop or RepetitionStop()).feed(ids)


def tokens(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_a_loop_is_caught_at_any_pattern_size_up_to_the_limit():
    assert caught([7] * 256)  # one token over and over
    assert caught([1, 2] * 128)
    assert caught(list(range(100)) * 4)  # a 100-token paragraph, four times
    assert not caught([1, 2] * 127)  # under min_tokens
    assert not caught(list(range(100)) * 3)  # under min_count
    assert not caught(list(range(200)) * 4)  # longer than max_pattern_size
    assert caught(list(range(200)) * 4, RepetitionStop(max_pattern_size=256))
    d = RepetitionDetector(RepetitionStop())
    assert not any(d.feed([5, 6, 7]) for _ in range(80)) and d.feed([5, 6, 7] * 6) and d.pattern_size == 3


def test_text_with_legitimate_repetition_is_not_caught(smol_tokenizer):
    tok = smol_tokenizer
    table = "| n | n**2 | n**3 |\n|---|---|---|\n" + "".join(f"| {n} | {n * n} | {n ** 3} |\n" for n in range(1, 60))
    numbers = ", ".join(str(n) for n in range(1, 400))
    zeros = "[" + ", ".join("[" + ", ".join(["0"] * 6) + "]" for _ in range(6)) + "]"  # a 10x10 one is caught
    code = "```python\n" + "".join(f"x{i} = compute({i})\nprint(x{i})\n" for i in range(40)) + "```\n"
    for text in (table, numbers, zeros, code, "-" * 400, "\n" * 40 + "done"):
        assert not caught(tokens(tok, text)), text[:60]
    assert caught(tokens(tok, "The answer is:\n" + "```\n" * 200))  # the endless code fences
    assert caught(tokens(tok, "I think so. " * 80))


def test_the_option_parses_on_off_and_overrides():
    assert RepetitionStop.parse("on") == RepetitionStop() and RepetitionStop.parse("off") is None
    assert RepetitionStop.parse("min_tokens=512,min-count=3") == RepetitionStop(min_count=3, min_tokens=512)
    with pytest.raises(ValueError, match="min_tokens"):
        RepetitionStop.parse("tokens=5")


class LoopingEngine:
    """Streams `text` once and then `loop` forever (until cancelled), one token at a time, as a model stuck in a
    loop; `cancelled` says whether its request was ended from outside."""

    name = model_path = "looping"
    context_length = 8192

    def __init__(self, tokenizer, text: str, loop: str):
        self.tokenizer, self.head, self.loop = tokenizer, tokens(tokenizer, text), tokens(tokenizer, loop)
        self.produced, self.cancelled = 0, False

    async def probe(self) -> None:
        pass

    async def generate(self, prompt_ids, sampling: SamplingParams, on_tokens=None):
        ids: list[int] = []
        try:
            while len(ids) < sampling.max_tokens:
                new = (self.head + self.loop)[len(ids)] if len(ids) < len(self.head) else \
                    self.loop[(len(ids) - len(self.head)) % len(self.loop)]
                ids.append(new)
                self.produced += 1
                if on_tokens is not None:
                    on_tokens([new], [0.0])
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return Generation(ids, [0.0] * len(ids), "length")


async def test_the_agent_loop_stops_a_looping_turn_with_the_repetition_stop_reason(smol_tokenizer):
    engine = LoopingEngine(smol_tokenizer, "Let me write it out.\n", "```\n")
    fmt = ChatFormat(smol_tokenizer, "hermes")
    cfg = AgentConfig(max_turns=3, max_response_tokens=20000, repetition=RepetitionStop(),
                      sampling=SamplingParams(max_tokens=20000))
    events: list[str] = []
    traj = await run_agent("What is 2**100?", engine, None, fmt, cfg, on_event=lambda kind, _: events.append(kind))
    assert traj.stop_reason == "repetition" and engine.cancelled
    assert 256 <= traj.num_generated_tokens < 400 and engine.produced < 400
    assert traj.turns[-1].finish_reason == "repetition" and "```\n```\n```" in traj.text
    assert events.count("tokens") == traj.num_generated_tokens  # the chat's progress line counts these
    # off (eval and RL): the same model runs to its budget
    engine = LoopingEngine(smol_tokenizer, "Let me write it out.\n", "```\n")
    cfg.repetition, cfg.sampling.max_tokens = None, 1000
    traj = await run_agent("What is 2**100?", engine, None, fmt, cfg)
    assert traj.stop_reason == "max_tokens" and traj.num_generated_tokens == 1000


async def test_serve_finishes_a_looping_choice_as_length_with_the_stop_reason_in_rstar2(smol_tokenizer, sandbox):
    engine = LoopingEngine(smol_tokenizer, "Thinking.\n", "I think so. ")
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="hermes", max_tokens=5000))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "Why?"}])
        choice = (await client.chat.completions.create(**kw)).choices[0]
        finish, extension = None, None
        async for chunk in await client.chat.completions.create(**kw, stream=True):
            c = chunk.choices[0] if chunk.choices else None
            finish = (c and c.finish_reason) or finish
            extension = ((c and c.delta.model_extra) or {}).get("rstar2") or extension
        await client.close()
    assert choice.finish_reason == "length" and finish == "length"
    assert choice.message.model_extra["rstar2"]["stop_reason"] == "repetition"
    assert (extension or {}).get("stop_reason") == "repetition"
    assert engine.produced < 2 * 400  # two requests, each stopped soon after its 256th looping token
