"""Bad input at the HTTP edge: `rstar2 serve` (the real hf engine with SmolLM2) and `rstar2 sandbox serve` (a real
LocalSandbox) over real HTTP answer a body of the wrong shape with a 400 that names the field, and never pass it
on to the engine or the sandbox; valid shapes still go through."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from rstar2_agent.sandbox import LocalSandbox, SandboxConfig
from rstar2_agent.sandbox.server import MAX_BATCH, MAX_CODE_CHARS
from rstar2_agent.sandbox.server import create_app as sandbox_app

from conftest import uvicorn_app

slow = pytest.mark.slow  # the tests that start the engine
USER = {"role": "user", "content": "Say hi."}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chat(*messages: dict, **fields) -> dict:
    return {"messages": list(messages) or [USER], **fields}


def with_call(call: dict | None = None, result: dict | None = None) -> list[dict]:
    """A conversation where the assistant called a tool and the tool answered."""
    return [USER, {"role": "assistant", "content": None, "tool_calls": [call or CALL]},
            result or {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


def fn(**function) -> dict:
    return {"type": "function", "function": {"name": "get_weather", **function}}


BAD_CHAT = [
    # strict types: no string for a boolean or a number
    (chat(stream="yes"), "stream"),
    (chat(logprobs="true"), "logprobs"),
    (chat(temperature="0.5"), "temperature"),
    (chat(seed="7"), "seed"),
    (chat(seed=1.5), "seed"),
    (chat(max_turns="3"), "max_turns"),
    (chat(format="xml"), "format"),
    # ranges
    (chat(n=0), "n"),
    (chat(n=17), "n"),
    (chat(top_p=0), "top_p"),
    (chat(presence_penalty=2.5), "presence_penalty"),
    (chat(frequency_penalty=-3), "frequency_penalty"),
    (chat(top_logprobs=21, logprobs=True), "top_logprobs"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=10**6), "max_tokens"),  # more than the context
    (chat(max_completion_tokens=10**6), "max_completion_tokens"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (chat(stop=[1]), "stop"),
    (chat(stop=""), "stop"),
    # what the engines cannot do
    (chat(presence_penalty=0.5), "presence_penalty"),
    (chat(logit_bias={"50256": -100}), "logit_bias"),
    (chat(top_logprobs=3, logprobs=True), "top_logprobs"),
    (chat(logprobs=True, stream=True), "logprobs"),
    (chat(response_format={"type": "json_object"}), "response_format.type"),
    (chat(stream_options={"include_usage": False}), "stream_options"),  # without stream
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    (chat(stream=True, stream_options={"continuous": True}), "stream_options"),
    # messages
    ({"messages": "hi"}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    (chat({"role": "robot", "content": "hi"}), "messages[0].role"),
    (chat({"role": "user", "content": 5}), "messages[0].content"),
    (chat({"role": "user", "content": None}), "messages[0].content"),
    (chat({"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                       {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}),
     "messages[0].content[1].type"),
    (chat({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0]"),
    (chat({"role": "user", "content": "hi", "tool_calls": [CALL]}), "messages[0].tool_calls"),
    (chat(*with_call({**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})),
     "messages[1].tool_calls[0].function.arguments"),
    (chat(*with_call({**CALL, "function": {"name": "get_weather", "arguments": "city=Paris"}})),
     "messages[1].tool_calls[0].function.arguments"),
    (chat(*with_call({"function": {"name": "get_weather", "arguments": "{}"}})), "messages[1].tool_calls[0]"),
    (chat(*with_call(result={"role": "tool", "tool_call_id": "c1"})), "messages[2].content"),
    (chat(*with_call(result={"role": "tool", "content": "sunny"})), "messages[2].tool_call_id"),
    # tools and tool_choice
    (chat(tools=[{"name": "get_weather"}]), "tools[0]"),
    (chat(tools=[fn(name="get weather!")]), "tools[0].function.name"),
    (chat(tools=[fn(description=3)]), "tools[0].function.description"),
    (chat(tools=[fn(parameters="city")]), "tools[0].function.parameters"),
    (chat(tools=[fn(parameters={"type": "object", "required": "city"})]), "tools[0].function.parameters"),
    (chat(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
    (chat(tools=[WEATHER], tool_choice="required"), "tool_choice"),
    (chat(tools=[WEATHER], tool_choice="always"), "tool_choice"),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}), "tool_choice"),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}),
     "tool_choice.function.name"),
    (chat(tool_choice="auto"), "tool_choice"),  # no tools to choose from
    (chat(tools=[fn(parameters={"type": "string"})]), "tools[0].function.parameters"),
    (chat(parallel_tool_calls="no"), "parallel_tool_calls"),
    # fields of OpenAI's or vLLM's API that the engines do not implement, when they ask for something
    (chat(top_k=20), "top_k"),
    (chat(min_p=0.1), "min_p"),
    (chat(repetition_penalty=1.1), "repetition_penalty"),
    (chat(min_tokens=5), "min_tokens"),
    (chat(best_of=2), "best_of"),
    (chat(guided_json={"type": "object"}), "guided_json"),
    (chat(functions=[WEATHER["function"]]), "functions"),
    (chat(function_call="auto"), "function_call"),
]

BAD_COMPLETIONS = [
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": [[1, 2], [3]]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, 10**9]}, "prompt[1]"),  # out of the vocabulary
    ({"prompt": [1, -1]}, "prompt[1]"),
    ({"prompt": "Hi", "stop_token_ids": [10**9]}, "stop_token_ids[0]"),
    ({"prompt": "Hi", "max_tokens": 10**6}, "max_tokens"),
    ({"prompt": "Hi", "logprobs": 5}, "logprobs"),
    ({"prompt": "Hi", "echo": True}, "echo"),
    ({"prompt": "Hi", "stream": "yes"}, "stream"),
    ({"prompt": "Hi", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "Hi", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"prompt": "Hi", "suffix": " end."}, "suffix"),
    ({"prompt": "Hi", "use_beam_search": True}, "use_beam_search"),
]


@pytest.fixture
def url(serve_url):
    return serve_url


async def tokens_counted(c: httpx.AsyncClient, url: str) -> list[str]:
    """The server's token counters: they move only when the engine generates."""
    return [line for line in (await c.get(f"{url}/metrics")).text.splitlines() if line.startswith("rstar2_tokens")]


def assert_names_field(r: httpx.Response, param: str | None, status: int = 400) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert param is None or param.split(".")[0].split("[")[0] in err["message"]
    return err["message"]


@slow
@pytest.mark.parametrize("path, body, param", [("chat/completions", b, p) for b, p in BAD_CHAT]
                         + [("completions", b, p) for b, p in BAD_COMPLETIONS])
async def test_bad_fields_are_400_naming_the_field_and_never_reach_the_engine(url, path, body, param):
    async with httpx.AsyncClient() as c:
        before = await tokens_counted(c, url)
        assert_names_field(await c.post(f"{url}/v1/{path}", json=body), param)
        assert await tokens_counted(c, url) == before


@slow
@pytest.mark.parametrize("path, content, param, fragment", [
    ("chat/completions", b"{not json", None, "not valid JSON"),
    ("chat/completions", json.dumps(chat()).encode() + b"}", None, "not valid JSON"),
    ("chat/completions", b"[1, 2]", None, "must be a JSON object"),
    # a lone surrogate escape decodes to a string the tokenizer cannot encode
    ("chat/completions", b'{"messages": [{"role": "user", "content": "2 + 2 = \\ud800"}]}', "messages[0].content",
     "surrogate"),
    ("completions", b'{"prompt": "\\udfff"}', "prompt", "surrogate"),
])
async def test_bodies_that_cannot_be_read_are_400(url, path, content, param, fragment):
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{url}/v1/{path}", content=content, headers={"content-type": "application/json"})
    assert fragment in assert_names_field(r, param)


@slow
async def test_the_openai_client_reads_the_error(url):
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="smollm2-135m", messages=[USER], tools=[WEATHER],
                                             tool_choice="required")
    assert e.value.param == "tool_choice" and "needs guided decoding" in e.value.message and "vllm" in e.value.message


@slow
@pytest.mark.parametrize("path, body", [
    ("chat/completions", chat({"role": "user", "content": [{"type": "text", "text": "Say "},
                                                           {"type": "text", "text": "hi."}]}, max_turns=1)),
    ("chat/completions", chat(tools=[WEATHER], parallel_tool_calls=False, user="u1", top_k=-1, min_p=0.0,
                              repetition_penalty=1.0, best_of=1, an_unknown_extension=3)),
    ("chat/completions", chat(*with_call(result={"role": "tool", "tool_call_id": "c1",
                                                 "content": [{"type": "text", "text": "sunny"}]}),
                              tools=[WEATHER], tool_choice="auto", stop=["\n\n", "Paris", "x", "y"], seed=3)),
    ("chat/completions", chat(tools=[WEATHER], tool_choice="none", presence_penalty=0, response_format={"type": "text"},
                              stream=True, stream_options={"include_usage": False})),
    ("chat/completions", chat(logprobs=True, top_logprobs=0, n=2, max_turns=1, format="markdown")),
    ("completions", {"prompt": [1, 2, 3], "logprobs": 0, "stop": "\n", "stop_token_ids": [2], "seed": -4}),
])
async def test_valid_shapes_still_pass(url, path, body):
    async with httpx.AsyncClient(timeout=120) as c:
        r = await c.post(f"{url}/v1/{path}", json={"max_tokens": 8, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        assert r.json()["choices"]
    else:
        assert r.text.rstrip().endswith("data: [DONE]")


# ---------------------------------------------------------------------------------------------- sandbox server
@pytest.fixture(scope="module")
async def sandbox_url():
    async with uvicorn_app(sandbox_app(LocalSandbox(SandboxConfig(workers=1)))) as u:
        yield u


async def calls_counted(c: httpx.AsyncClient, url: str) -> list[str]:
    return [line for line in (await c.get(f"{url}/metrics")).text.splitlines()
            if line.startswith("rstar2_sandbox_calls_total")]


@pytest.mark.parametrize("path, body, status, param", [
    ("/run", {"code": 5}, 400, "code"),
    ("/run", {}, 400, "code"),
    ("/run", {"code": "print(1)", "stdin": 3}, 400, "stdin"),
    ("/run", {"code": "print(1)", "timeout": -1}, 400, "timeout"),
    ("/run", {"code": "print(1)", "timeout": 0}, 400, "timeout"),
    ("/run", {"code": "print(1)", "timeout": 1e9}, 400, "timeout"),
    ("/run", {"code": "print(1)", "timeout": "5"}, 400, "timeout"),
    ("/run", {"code": "print(1)", "timout": 5}, 400, "timout"),  # a misspelt field is not ignored
    ("/run", {"code": "#" * (MAX_CODE_CHARS + 1)}, 413, "code"),
    ("/run_batch", {"requests": "print(1)"}, 400, "requests"),
    ("/run_batch", {"requests": [{"code": "print(1)"}, {"code": None}]}, 400, "requests[1].code"),
    ("/run_batch", {"requests": [{"code": "print(1)", "timeout": -5}]}, 400, "requests[0].timeout"),
    ("/run_batch", {"requests": [{"code": "1"}] * (MAX_BATCH + 1)}, 413, "requests"),
    ("/sessions/no-such-session/run", {"code": "print(1)"}, 404, None),
])
async def test_sandbox_bad_requests_are_clear_json_errors(sandbox_url, path, body, status, param):
    async with httpx.AsyncClient(timeout=60) as c:
        before = await calls_counted(c, sandbox_url)
        r = await c.post(f"{sandbox_url}{path}", json=body)
        assert await calls_counted(c, sandbox_url) == before  # nothing ran
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param"} and err["param"] == param and err["message"]
    assert param is None or param.split("[")[0] in err["message"]


async def test_sandbox_valid_requests_and_a_closed_session(sandbox_url):
    async with httpx.AsyncClient(timeout=60) as c:
        oops = await c.post(f"{sandbox_url}/run", content=b"{oops", headers={"content-type": "application/json"})
        assert oops.status_code == 400 and "not valid JSON" in oops.json()["error"]["message"]
        untyped = await c.post(f"{sandbox_url}/run", content=b'{"code": "1"}')  # no content-type
        assert untyped.status_code == 400 and "Content-Type" in untyped.json()["error"]["message"]
        r = await c.post(f"{sandbox_url}/run", json={"code": "print(input())", "stdin": "7", "timeout": 5})
        assert r.status_code == 200 and r.json()["stdout"] == "7\n"
        batch = await c.post(f"{sandbox_url}/run_batch", json={"requests": [{"code": "print(2)", "timeout": 2.5}]})
        assert [x["stdout"] for x in batch.json()["results"]] == ["2\n"]
        sid = (await c.post(f"{sandbox_url}/sessions")).json()["session_id"]
        assert (await c.post(f"{sandbox_url}/sessions/{sid}/run", json={"code": "k = 5"})).status_code == 200
        assert (await c.post(f"{sandbox_url}/sessions/{sid}/run", json={"code": "k + 1"})).json()["stdout"] == "6\n"
        assert (await c.delete(f"{sandbox_url}/sessions/{sid}")).status_code == 200
        gone = await c.post(f"{sandbox_url}/sessions/{sid}/run", json={"code": "k"})
    assert gone.status_code == 404 and "open a new one" in gone.json()["error"]["message"]
