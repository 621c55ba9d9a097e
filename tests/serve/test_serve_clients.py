"""The clients users reach for first, each driving the real server over HTTP as a user runs it: the `openai` client
(stream usage, Responses streaming), LangChain's ChatOpenAI, LiteLLM's `openai/` route and pydantic-ai. Each test
asserts what the user reads: the call's name and arguments as the client parsed them, the final text, the usage.

SmolLM2 does not write tool calls by itself, so the tool round trips run on the scripted engine (real SmolLM2 token
ids, streamed token by token; its exact token counts make the usage checkable); the usage and Responses tests run the
real SmolLM2 engine. docs/serve.md's "Clients tried" table lists what each test shows."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import operator
import os
import re
import sys
from pathlib import Path

import openai
import pytest

from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import StreamingScriptedEngine, uvicorn_app

slow = pytest.mark.slow
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads its packaged price list, offline

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
THOUGHT = "The user wants the weather."
CALL = f'<think>{THOUGHT}</think>\n<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n' \
    "</tool_call>"
ANSWER = "It is sunny and 21 C in Paris."
ASK = "What is the weather in Paris?"
RESULT = "sunny, 21 C in Paris"


class Engine(StreamingScriptedEngine):
    """The streaming scripted engine, recording each generation's sampling (its forced-call constraint); `constrains`
    says it honours one (it writes its script either way: the test reads what the server asked of it)."""

    constrains = True

    def __init__(self, tokenizer, texts):
        super().__init__(tokenizer, texts)
        self.sampling: list = []

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        self.sampling.append(sampling)
        return await super().generate(prompt_ids, sampling, on_tokens)

    def generated(self, text: str) -> int:
        """How many tokens the script `text` is (with the end-of-turn token)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False)) + 1


@contextlib.asynccontextmanager
async def scripted(tokenizer, sandbox, replies: list[str]):
    """The server (hermes format, client tools) over a scripted engine, on loopback: (engine, base URL of /v1)."""
    engine = Engine(tokenizer, replies)
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        yield engine, f"{url}/v1"


# ---------------------------------------------------------------------------------------------- openai: usage
@slow  # the real SmolLM2 engine
async def test_openai_stream_usage_chunk_counts_what_the_response_counts(serve_url):
    """stream_options.include_usage: a last chunk with no choices and the request's usage, the numbers the
    non-streamed response gives; continuous_usage_stats: every chunk carries the usage so far (as vLLM)."""
    async with openai.AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0) as client:
        kw = dict(model="smollm2-135m", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6,
                  temperature=0, extra_body={"max_turns": 1})
        whole = await client.chat.completions.create(**kw)
        stream = await client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        *chunks, last = [c async for c in stream]
        assert last.choices == [] and last.usage == whole.usage and whole.usage.completion_tokens > 0
        assert all(c.usage is None for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content

        stream = await client.chat.completions.create(
            **kw, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        *chunks, last = [c async for c in stream]
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == whole.usage.completion_tokens
        assert {c.usage.prompt_tokens for c in chunks} == {whole.usage.prompt_tokens} and last.usage == whole.usage

        kw = dict(model="smollm2-135m", prompt="1, 2, 3,", max_tokens=4, temperature=0)
        whole = await client.completions.create(**kw)
        stream = await client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        *chunks, last = [c async for c in stream]
        assert last.choices == [] and last.usage == whole.usage and whole.usage.completion_tokens == 4
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


async def test_openai_stream_usage_with_client_tools_and_two_choices(smol_tokenizer, sandbox):
    """With tools and n=2, the usage chunk adds both choices' tokens, as the response's usage does."""
    async with scripted(smol_tokenizer, sandbox, [CALL, ANSWER, CALL, ANSWER]) as (engine, url):
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            kw = dict(model="m", messages=[{"role": "user", "content": ASK}], tools=[WEATHER], n=2)
            whole = await client.chat.completions.create(**kw)
            stream = await client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
            last = [c async for c in stream][-1]
    expected = engine.generated(CALL) + engine.generated(ANSWER)
    assert whole.usage.completion_tokens == last.usage.completion_tokens == expected
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens == len(engine.prompts[0])


# ---------------------------------------------------------------------------------------------- openai: Responses
@slow  # the real SmolLM2 engine
async def test_openai_responses_stream_reads_the_events_to_the_final_response(serve_url):
    """`responses.stream` as the client reads it, on a reply cut at max_output_tokens: typed events in order, text
    deltas that add up to the response's text, and the usage of the non-streamed response. As on OpenAI's server,
    the last event is response.incomplete, which `get_final_response()` refuses (it wants response.completed): the
    client reads the response from that event (a reply that ends by itself: tests/serve/test_serve_responses.py)."""
    async with openai.AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0) as client:
        kw = dict(model="smollm2-135m", input="Name a colour.", max_output_tokens=6, temperature=0)
        whole = await client.responses.create(**kw)
        async with client.responses.stream(**kw) as stream:
            events = [e async for e in stream]
            with pytest.raises(RuntimeError, match="response.completed"):
                await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    final = events[-1].response
    assert final.status == whole.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == whole.output_text and text
    assert final.usage == whole.usage and final.usage.output_tokens == 6
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


# ---------------------------------------------------------------------------------------------- LangChain
async def test_langchain_chat_openai_bind_tools_streams_a_call_and_takes_its_result(smol_tokenizer, sandbox):
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai comes with `make install`")
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny, 21 C in {city}"

    async with scripted(smol_tokenizer, sandbox, [CALL, ANSWER, CALL]) as (engine, url):
        llm = lc.ChatOpenAI(model="m", base_url=url, api_key="unused", max_retries=0, stream_usage=True)
        bound = llm.bind_tools([get_weather])
        chunks = [c async for c in bound.astream([HumanMessage(ASK)])]
        asked = functools.reduce(operator.add, chunks)  # what LangChain builds from the chunks
        told = await bound.ainvoke([HumanMessage(ASK), asked, await get_weather.ainvoke(asked.tool_calls[0])])
        forced = await llm.bind_tools([get_weather], tool_choice="any").ainvoke([HumanMessage(ASK)])
    [call] = asked.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"} and call["id"]
    fragments = [c.tool_call_chunks[0] for c in chunks if c.tool_call_chunks]
    assert len(fragments) > 2 and fragments[0]["id"] and all(f["id"] is None for f in fragments[1:])
    assert asked.usage_metadata["input_tokens"] == len(engine.prompts[0])
    assert asked.usage_metadata["output_tokens"] == engine.generated(CALL)
    assert told.content == ANSWER and RESULT in engine.prompt_text(1)
    assert forced.tool_calls[0]["args"] == {"city": "Paris"} and engine.sampling[2].constraint is not None


# ---------------------------------------------------------------------------------------------- LiteLLM
async def test_litellm_openai_route_completion_and_stream_with_tools(smol_tokenizer, sandbox):
    litellm = pytest.importorskip("litellm", reason="litellm comes with `make install`")
    messages = [{"role": "user", "content": ASK}]
    async with scripted(smol_tokenizer, sandbox, [CALL, CALL, ANSWER]) as (engine, url):
        kw = dict(model="openai/m", api_base=url, api_key="unused", tools=[WEATHER], num_retries=0)
        whole = await litellm.acompletion(messages=messages, **kw)
        stream = await litellm.acompletion(messages=messages, stream=True, stream_options={"include_usage": True},
                                           **kw)
        built = litellm.stream_chunk_builder([c async for c in stream], messages=messages)
        msg = whole.choices[0].message
        told = await litellm.acompletion(messages=[*messages, msg.model_dump(exclude_none=True), {
            "role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": RESULT}], **kw)
    for r in (whole, built):
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.usage.completion_tokens == engine.generated(CALL)
        assert r.usage.prompt_tokens == len(engine.prompts[0])
    assert msg.reasoning_content == THOUGHT
    assert told.choices[0].message.content == ANSWER and RESULT in engine.prompt_text(2)


# ---------------------------------------------------------------------------------------------- pydantic-ai
async def test_pydantic_ai_streamed_agent_run_with_a_tool(smol_tokenizer, sandbox):
    pytest.importorskip("pydantic_ai", reason="pydantic-ai comes with `make install`")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ThinkingPart, ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    asked: list[str] = []
    async with scripted(smol_tokenizer, sandbox, [CALL, ANSWER]) as (engine, url):
        model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=url, api_key="unused"))
        agent = Agent(model, instructions="Answer with the tool.")

        @agent.tool_plain
        def get_weather(city: str) -> str:
            """The weather in a city."""
            asked.append(city)
            return f"sunny, 21 C in {city}"

        async with agent.run_stream(ASK) as run:  # asks for stream_options.include_usage
            texts = [t async for t in run.stream_text(debounce_by=None)]
            output = await run.get_output()
        usage = run.usage
    assert asked == ["Paris"] and output == texts[-1] == ANSWER and RESULT in engine.prompt_text(1)
    parts = [p for m in run.all_messages() for p in m.parts]
    call = next(p for p in parts if isinstance(p, ToolCallPart))
    assert call.tool_name == "get_weather" and call.args_as_dict() == {"city": "Paris"}
    assert any(isinstance(p, ThinkingPart) and p.content == THOUGHT for p in parts)
    assert usage.requests == 2 and usage.output_tokens == engine.generated(CALL) + engine.generated(ANSWER)
    assert usage.input_tokens == len(engine.prompts[0]) + len(engine.prompts[1])


# ---------------------------------------------------------------------------------------------- docs/serve.md
DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
PY_CALL = '<tool_call>\n{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(2**100)"}}\n' \
    "</tool_call>"
TWO_100 = str(2 ** 100)


def doc_examples() -> list[str]:
    """The python blocks of docs/serve.md's "Each client, as a user writes it"."""
    section = DOCS.read_text().split("#### Each client, as a user writes it", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_docs_show_one_example_per_client():
    assert [b.splitlines()[0] for b in doc_examples()] == [
        "# openai: a streamed answer", "# LangChain", "# LiteLLM: the openai/ route", "# pydantic-ai"]


@pytest.mark.parametrize("index", range(4))
async def test_each_docs_example_runs_as_written(index, smol_tokenizer, sandbox, tmp_path):
    """The block as written, in a fresh interpreter, against the real server on a free port (the one change): the
    server runs the model's Python call in the sandbox and the client prints the answer that uses its output. The
    engine is scripted (a call of print(2**100), then the boxed answer) so the printed number is the tool's."""
    code = doc_examples()[index]
    answer = f"<answer>2**100 is \\boxed{{{TWO_100}}}.</answer>"
    engine = Engine(smol_tokenizer, [PY_CALL, answer])
    server = Server(engine, sandbox, ServeConfig(model_name="smollm2-agent", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        script = tmp_path / "example.py"
        script.write_text(code.replace("http://127.0.0.1:8000", url))
        proc = await asyncio.create_subprocess_exec(sys.executable, str(script), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, cwd=tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert TWO_100 in out.decode()
    assert TWO_100 in engine.prompt_text(1)  # the sandbox's output, shown to the model before its answer
