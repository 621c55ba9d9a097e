"""`rstar2 serve` over real HTTP (uvicorn on loopback), the real hf engine with SmolLM2, the real sandbox,
driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.engines.openai import OpenAIEngine
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig
from rstar2_agent.sandbox.remote import RemoteSandbox
from rstar2_agent.sandbox.server import create_app as sandbox_app
from rstar2_agent.serve.server import reply_message

from conftest import metrics_once_idle, serving, uvicorn_app

pytestmark = pytest.mark.slow
QUESTION = "What is 2**100? Use Python."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture
def url(serve_url):
    return serve_url


@pytest.fixture
def client(url):
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_chat_runs_the_tool_loop_server_side(client):
    r = await client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": QUESTION}],
                                             temperature=0, max_tokens=120, extra_body={"max_turns": 2})
    msg = r.choices[0].message
    assert isinstance(msg.content, str) and r.choices[0].finish_reason in ("stop", "length")
    ext = msg.model_extra["rstar2"]
    call = ext["turns"][0]["tool_calls"][0]  # greedy SmolLM2 writes a python block first
    assert call["name"] == "execute_python_code_with_standard_io" and call["status"] == "ok"
    assert ext["num_tool_calls"] >= 1 and ext["stop_reason"]
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


async def test_streaming_sends_text_and_tool_activity(client):
    stream = await client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=120,
        stream=True, extra_body={"max_turns": 2})
    text, events, finish, summary = "", [], None, {}
    async for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        ext = (delta.model_extra or {}).get("rstar2") or {}
        events += [k for k in ext if k in ("tool_call", "tool_result")]
        if chunk.choices[0].finish_reason:
            finish, summary = chunk.choices[0].finish_reason, ext
    assert "```python" in text and finish in ("stop", "length")
    n = summary["num_tool_calls"]  # the last chunk carries the summary
    assert n >= 1 and events.count("tool_call") == events.count("tool_result") == n
    assert events[:2] == ["tool_call", "tool_result"]


async def test_client_side_tools_round_trip(client):
    r = await client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason in ("tool_calls", "stop", "length")
    follow = await client.chat.completions.create(model="smollm2-135m", tools=[WEATHER], temperature=0,
                                                  max_tokens=30, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}])
    assert isinstance(follow.choices[0].message.content, str)


def test_client_tools_map_parsed_calls_to_openai_tool_calls():
    """The mapping from the reply parser to `tool_calls` (SmolLM2 rarely writes Hermes calls itself)."""
    from rstar2_agent.serve.reply_stream import ReplyParser, parse_reply

    def message(text, fmt="hermes", tools=(WEATHER,), parallel=True, split=True):
        return reply_message(parse_reply([text], ReplyParser(fmt, tools=list(tools), parallel=parallel,
                                                             split=split)), split)

    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
           '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    msg = message(text)
    assert msg["content"] == 'Checking.\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    [call] = msg["tool_calls"]  # the second names no tool of the client's: it stays text
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and call["type"] == "function"
    assert message(text, tools=())["content"] == text and "tool_calls" not in message(text, tools=())  # "none"
    two = text.replace('"get_time", "arguments": {}', '"get_weather", "arguments": {"city": "Rome"}')
    assert len(message(two)["tool_calls"]) == 2 and message(two)["content"] == "Checking."
    [first] = message(two, parallel=False)["tool_calls"]
    assert json.loads(first["function"]["arguments"]) == {"city": "Paris"}
    calls = message("ok</reason>\n" + two, fmt="rstar2-release")  # the client's arguments, the reasoning apart
    args = [json.loads(c["function"]["arguments"]) for c in calls["tool_calls"]]
    assert args == [{"city": "Paris"}, {"city": "Rome"}]
    assert calls["reasoning_content"] == "ok\nChecking." and calls["content"] is None
    assert "reasoning_content" not in message(two, split=False)


async def test_completions_with_token_ids_drive_the_openai_engine(url, engine):
    remote = OpenAIEngine(url, tokenizer=engine.tokenizer)
    try:
        ids = engine.tokenizer.encode("The capital of France is")
        gen = await remote.generate(ids, SamplingParams(temperature=0, max_tokens=8))
        local = await engine.generate(ids, SamplingParams(temperature=0, max_tokens=8))
        assert gen.token_ids == local.token_ids and len(gen.logprobs) == 8
        assert gen.logprobs == pytest.approx(local.logprobs, abs=1e-4)
        streamed: list[int] = []
        again = await remote.generate(ids, SamplingParams(temperature=0, max_tokens=8),
                                      lambda new, lps: streamed.extend(new))
        assert streamed == again.token_ids == gen.token_ids
        assert remote.context_length == engine.context_length
    finally:
        await remote.close()


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "max_tokens"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"content": "no role"}]}, 400, "role"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "context"),
])
async def test_bad_requests_get_openai_errors(url, body, status, fragment):
    async with httpx.AsyncClient() as c:
        kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        r = await c.post(f"{url}/v1/chat/completions", **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert fragment in err["message"] or fragment == err.get("param") or fragment in str(err.get("param"))


async def test_api_key_is_enforced(engine, sandbox):
    async with serving(engine, sandbox, api_key="sekret") as u:
        bad = openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        good = openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="sekret", max_retries=0)
        assert [m.id for m in (await good.models.list()).data] == ["smollm2-135m"]


async def test_client_disconnect_cancels_generation(url):
    async with httpx.AsyncClient(timeout=60) as c:
        body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 4000,
                "temperature": 1.0, "stream": True, "extra_body": None}
        async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data:")
                if seen >= 4:
                    break  # leave mid-stream
        metrics = await metrics_once_idle(c, url)  # 4,000 tokens would take minutes
        assert "rstar2_requests_in_flight 0.0" in metrics


async def test_a_sandbox_that_goes_down_still_gives_an_answer(engine):
    async with uvicorn_app(sandbox_app(LocalSandbox(SandboxConfig(workers=1)))) as sandbox_url:
        remote = RemoteSandbox([sandbox_url])
        await remote.start()
    try:  # the sandbox server is gone now
        async with serving(engine, remote) as u:
            c = openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="x", max_retries=0)
            r = await c.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=120,
                                                messages=[{"role": "user", "content": QUESTION}],
                                                extra_body={"max_turns": 2})
            call = r.choices[0].message.model_extra["rstar2"]["turns"][0]["tool_calls"][0]
            assert call["status"] == "internal_error" and "unavailable" in call["stderr"]
    finally:
        await remote.close()


@pytest.fixture
async def tiny_url(tiny_engine, sandbox):
    async with serving(tiny_engine, sandbox, model_name="tiny") as url:
        yield url


async def test_load_64_concurrent_requests(tiny_url):
    """64 concurrent requests, half of them streamed, on the tiny SmolLM2 (the server's machinery under load, whatever
    the model writes): each answered, none a 5xx, nothing left in flight."""
    url, client = tiny_url, openai.AsyncOpenAI(base_url=f"{tiny_url}/v1", api_key="unused", max_retries=0)

    async def plain(i: int) -> str:
        r = await client.chat.completions.create(model="tiny", max_tokens=12, temperature=0.7, seed=i,
                                                 messages=[{"role": "user", "content": f"Say {i}."}],
                                                 extra_body={"max_turns": 1})
        assert r.choices[0].finish_reason in ("stop", "length")
        return r.choices[0].message.content

    async def streamed(i: int) -> str:
        stream = await client.chat.completions.create(model="tiny", max_tokens=12, temperature=0.7,
                                                      seed=i, stream=True, extra_body={"max_turns": 1},
                                                      messages=[{"role": "user", "content": f"Say {i}."}])
        finish, text = None, ""
        async for chunk in stream:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish in ("stop", "length")
        return text

    results = await asyncio.gather(*(plain(i) if i % 2 else streamed(i) for i in range(64)))
    assert len(results) == 64 and all(isinstance(t, str) for t in results)
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{url}/health")).json()["status"] == "ok"
        metrics = (await c.get(f"{url}/metrics")).text
    assert 'status="5' not in metrics and "rstar2_requests_in_flight 0.0" in metrics
    assert 'rstar2_tokens_total{kind="completion"}' in metrics


async def test_serve_cli_spreads_conversations_over_replicas(tiny_smollm2, tmp_path):
    """`rstar2 serve --replicas 2` (the real CLI in a subprocess, on the tiny SmolLM2: the machinery): concurrent
    conversations land on both hf replicas, each multi-turn conversation on one of them, and /health shows every
    replica's load; its start-up line says the temperature a request that sets none gets (--temperature's)."""
    import sys
    from pathlib import Path

    from rstar2_agent.bench.serve import running

    from conftest import free_port

    port = free_port()
    argv = [str(Path(sys.executable).with_name("rstar2")), "serve", "--model", tiny_smollm2, "--served-model-name",
            "smollm2-135m", "--port", str(port), "--replicas", "2", "--replica-policy", "least_outstanding",
            "--sandbox-workers", "1", "--format", "markdown", "--temperature", "0"]
    log = tmp_path / "serve.log"
    with running(argv, port, timeout=240, log=log) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        replies = await asyncio.gather(*(client.chat.completions.create(
            model="smollm2-135m", max_tokens=48, temperature=0.0, extra_body={"max_turns": 2},
            messages=[{"role": "user", "content": f"{QUESTION} ({i})"}]) for i in range(6)))
        assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
        async with httpx.AsyncClient() as c:
            health = (await c.get(f"{url}/health")).json()
    engine = health["engine"]
    assert "a request that sets no temperature samples at 0)" in log.read_text()  # --temperature, not the 0.6
    assert engine["policy"] == "least_outstanding" and len(engine["replicas"]) == 2
    placed = [r["placed"] for r in engine["replicas"]]
    assert sum(placed) == 6 and min(placed) > 0  # one placement per conversation, on both replicas
    assert all(r["trajectories"] == 0 and r["in_flight"] == 0 for r in engine["replicas"])  # all released
