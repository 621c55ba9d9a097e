"""POST /v1/responses over real HTTP (uvicorn on loopback) with the official `openai` client and the real sandbox.

SmolLM2 does not write tool calls by itself, so most tests drive the server with a scripted engine: it answers each
generation with a fixed text in the format's real call syntax (as SmolLM2's token ids, streamed token by token as
real engines do), and records what it was asked. The last test runs the real SmolLM2 engine through the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import openai
import pytest

from rstar2_agent.engines.base import EngineError, Generation
from rstar2_agent.sandbox.tools import STATELESS_TOOL
from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.responses_state import Containers
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import ScriptedEngine, metrics_once_idle, uvicorn_app

MODEL = "smollm2-135m"
CODE = [{"type": "code_interpreter", "container": {"type": "auto"}}]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def call(code: str, name: str = STATELESS_TOOL) -> str:
    """A Hermes call block, as the hermes and rstar2 profiles write it."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"code": code, "input": ""}})}\n</tool_call>'


class Script(ScriptedEngine):
    """The scripted engine, streaming its tokens and cut off at the request's max_tokens; `sampling`: each request's
    sampling parameters (the prompts: `prompt_text(k)`)."""

    def __init__(self, tokenizer, texts: list[str], delay: float = 0.0):
        super().__init__(tokenizer, texts)
        self.sampling: list = []
        self.delay, self.cancelled = delay, False

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        self.prompts.append(list(prompt_ids))
        self.sampling.append(sampling)
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = "length" if len(ids) > sampling.max_tokens else "stop"
        ids = ids[: sampling.max_tokens]
        try:
            for tok in ids:
                if self.delay:
                    await asyncio.sleep(self.delay)
                if on_tokens is not None:
                    on_tokens([tok], [0.0])
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return Generation(ids, [0.0] * len(ids), finish)


@contextlib.asynccontextmanager
async def serving(engine, sandbox, fmt: str, **cfg):
    """An `rstar2 serve` app in format `fmt` on loopback, and an openai client for it."""
    server = Server(engine, sandbox, ServeConfig(model_name=MODEL, format=fmt, **cfg))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        yield openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0), url


def paper_script() -> list[str]:
    return ["I will compute it.\n" + call("print(2**10)"), "It printed 1024.</reason>\n<answer>\\boxed{1024}</answer>"]


def code_run(response):
    return next(i for i in response.output if i.type == "code_interpreter_call")


def shape(response) -> list[dict]:
    """Output items without their ids (two runs of one script differ only there)."""
    return [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "container_id")}
            for item in response.output]


async def test_scripted_engine_code_interpreter_runs_on_the_real_sandbox(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, paper_script())
    async with serving(engine, sandbox, "rstar2-paper") as (client, _):
        r = await client.responses.create(model=MODEL, input="What is 2**10?", tools=CODE)
    assert r.status == "completed" and not engine.texts
    assert [i.type for i in r.output] == ["reasoning", "code_interpreter_call", "reasoning", "message"]
    think, run, after, answer = r.output
    assert think.content[0].type == "reasoning_text" and think.content[0].text == "I will compute it."
    assert run.code == "print(2**10)" and run.status == "completed" and run.container_id.startswith("cntr")
    assert [(o.type, o.logs) for o in run.outputs] == [("logs", "1024\n")]  # the program's real output
    assert after.content[0].text == "It printed 1024."
    assert answer.role == "assistant" and r.output_text == "<answer>\\boxed{1024}</answer>"
    ext = r.model_extra["rstar2"]
    assert ext["answer"] == "1024" and ext["num_tool_calls"] == 1 and ext["stop_reason"] == "answer"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0 and r.usage.total_tokens == \
        r.usage.input_tokens + r.usage.output_tokens
    assert "1024\n" in engine.prompt_text(1)  # the tool response went back to the model


async def test_scripted_engine_stream_adds_up_to_what_create_returns(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, paper_script() + paper_script())
    async with serving(engine, sandbox, "rstar2-paper") as (client, _):
        whole = await client.responses.create(model=MODEL, input="What is 2**10?", tools=CODE)
        async with client.responses.stream(model=MODEL, input="What is 2**10?", tools=CODE) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.reasoning_text.delta", "response.reasoning_text.done", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.added", "response.content_part.done",
                 "response.code_interpreter_call.in_progress", "response.code_interpreter_call_code.delta",
                 "response.code_interpreter_call_code.done", "response.code_interpreter_call.interpreting",
                 "response.code_interpreter_call.completed"):
        assert kind in kinds, kind
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    assert kinds.index("response.code_interpreter_call.completed") < kinds.index("response.output_text.delta")
    assert shape(final) == shape(whole) and final.status == whole.status == "completed"
    assert final.usage == whole.usage and final.output_text == whole.output_text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text


@pytest.mark.parametrize("fmt, second", [("hermes", "42\n"), ("rstar2-paper", "NameError")])
async def test_scripted_engine_container_state_across_previous_response_id(smol_tokenizer, sandbox, fmt, second):
    """Hermes: the calls of one container share a sandbox session, across requests chained by previous_response_id
    and by naming the container. rstar2-paper: every call is the stateless tool the model was trained with."""
    engine = Script(smol_tokenizer, ["Set it.\n" + call("x = 41"), "Done.", "Add one.\n" + call("print(x + 1)"),
                                     "That is it.", "Again.\n" + call("print(x)"), "Same."])
    sessions = (await sandbox.stats())["sessions"]
    async with serving(engine, sandbox, fmt) as (client, _):
        first = await client.responses.create(model=MODEL, input="Set x to 41.", tools=CODE)
        chained = await client.responses.create(model=MODEL, input="Print x + 1.", tools=CODE,
                                                previous_response_id=first.id)
        box = code_run(first).container_id
        named = await client.responses.create(model=MODEL, input="Print x.", tools=[
            {"type": "code_interpreter", "container": box}])
    assert (await sandbox.stats())["sessions"] == sessions  # the server's shutdown closed its container
    runs = [code_run(r) for r in (first, chained, named)]
    assert runs[0].status == "completed" and runs[0].outputs[0].logs == ""
    assert second in runs[1].outputs[0].logs and runs[1].status == ("completed" if fmt == "hermes" else "failed")
    assert "Set x to 41." in engine.prompt_text(2) and "x = 41" in engine.prompt_text(2)  # the conversation continues
    texts = [p.text for r in (first, chained, named) for i in r.output if i.type != "code_interpreter_call"
             for p in i.content]
    assert texts and not any("<tool_call>" in t for t in texts)  # each call is its code_interpreter_call item
    if fmt == "hermes":
        assert runs[1].container_id == runs[2].container_id == box and runs[2].outputs[0].logs == "41\n"
        assert "persistent Python session" in engine.prompt_text(0)  # the model is told its variables are kept
    else:
        assert "NameError" in runs[2].outputs[0].logs and runs[2].container_id == box  # named, still stateless


async def test_stored_responses_unknown_ids_and_metrics(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, ["Hello.", "Unseen."])
    async with serving(engine, sandbox, "hermes") as (client, url):
        r = await client.responses.create(model=MODEL, input="Hi")
        assert (await client.responses.retrieve(r.id)).output_text == r.output_text == "Hello."
        with pytest.raises(openai.NotFoundError) as e:
            await client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_nope")
        assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
        await client.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(r.id)
        unstored = await client.responses.create(model=MODEL, input="Hi", store=False)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(unstored.id)
        with pytest.raises(openai.NotFoundError) as e:
            await client.responses.create(model=MODEL, input="Hi", tools=[{"type": "code_interpreter",
                                                                           "container": "cntr_gone"}])
        assert e.value.code == "container_not_found" and e.value.param == "tools[0].container"
        async with httpx.AsyncClient() as c:
            metrics = await metrics_once_idle(c, url)
    assert 'rstar2_requests_total{path="/v1/responses",status="200"} 2.0' in metrics
    assert 'path="/v1/responses/{response_id}",status="404"' in metrics and r.id not in metrics
    assert "rstar2_requests_in_flight 0.0" in metrics


async def test_scripted_engine_function_tool_round_trip(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                     "</tool_call>", "It is sunny in Paris."])
    async with serving(engine, sandbox, "hermes") as (client, _):
        async with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                           instructions="Be brief.") as stream:
            kinds = [e.type async for e in stream]
            asked = await stream.get_final_response()
        [fc] = asked.output
        assert fc.type == "function_call" and fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
        told = await client.responses.create(model=MODEL, tools=[WEATHER], previous_response_id=asked.id, input=[
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}])
    assert told.output_text == "It is sunny in Paris." and told.status == "completed"
    history = engine.prompt_text(1)
    assert "Be brief." in engine.prompt_text(0) and "Be brief." not in history  # instructions are not carried over
    assert "Weather in Paris?" in history and '"name": "get_weather"' in history and "sunny, 21 C" in history
    assert not any(i.type == "code_interpreter_call" for i in told.output)


async def test_scripted_engine_gets_instructions_budget_and_sampling(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, ["Bonjour, voici une réponse bien trop longue pour ce budget."])
    async with serving(engine, sandbox, "hermes") as (client, _):
        r = await client.responses.create(model=MODEL, input="Say hello.", instructions="Answer in French.",
                                          max_output_tokens=5, temperature=0.3, top_p=0.9)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.temperature == 0.3 and r.top_p == 0.9
    got = engine.sampling[0]
    assert (got.max_tokens, got.temperature, got.top_p) == (5, 0.3, 0.9)
    prompt = engine.prompt_text(0)
    assert prompt.startswith("<|im_start|>system\nAnswer in French.") and "Say hello." in prompt


async def test_a_request_without_a_temperature_samples_at_the_servers_default(smol_tokenizer, sandbox):
    """`rstar2 serve` sets ServeConfig.temperature to the model's default (0 for the made agent: models.py's
    default_temperature; --temperature overrides). The scripted engine (a fake model: what reaches the engine is the
    point) records each request's sampling: the server's default where a request sets none, on each of the three
    APIs (and the response says it), the request's own where it sets one."""
    engine = Script(smol_tokenizer, ["Hi."] * 4)
    hi = [{"role": "user", "content": "Hi."}]
    async with serving(engine, sandbox, "hermes", temperature=0.0) as (client, _):
        await client.chat.completions.create(model=MODEL, messages=hi, max_tokens=4)
        await client.completions.create(model=MODEL, prompt="Hi.", max_tokens=4)
        r = await client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4)
        await client.chat.completions.create(model=MODEL, messages=hi, max_tokens=4, temperature=0.9)
    assert [s.temperature for s in engine.sampling] == [0.0, 0.0, 0.0, 0.9] and r.temperature == 0.0


@pytest.mark.parametrize("kw, param", [
    ({"tool_choice": "required", "tools": CODE}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "get_weather"}, "tools": [WEATHER]}, "tool_choice"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [*CODE, WEATHER]}, "tools"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"include": ["reasoning.encrypted_content"]}, "include[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
])
async def test_refusals_name_the_param(smol_tokenizer, sandbox, kw, param):
    async with serving(Script(smol_tokenizer, []), sandbox, "hermes") as (client, _):
        with pytest.raises(openai.BadRequestError) as e:
            await client.responses.create(model=MODEL, **{"input": "Hi", **kw})
    assert e.value.param == param and param.split("[")[0].split(".")[0] in e.value.message


class Broken(Script):
    async def generate(self, prompt_ids, sampling, on_tokens=None):
        raise EngineError("the engine fell over")


async def test_an_engine_failure_is_a_500_or_response_failed(smol_tokenizer, sandbox):
    async with serving(Broken(smol_tokenizer, []), sandbox, "hermes") as (client, _):
        with pytest.raises(openai.InternalServerError, match="fell over"):
            await client.responses.create(model=MODEL, input="Hi", tools=CODE)
        stream = await client.responses.create(model=MODEL, input="Hi", tools=CODE, stream=True)
        events = [e async for e in stream]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error" and "fell over" in failed.error.message


async def test_scripted_engine_stream_cancelled_when_the_client_leaves(smol_tokenizer, sandbox):
    engine = Script(smol_tokenizer, ["word " * 400], delay=0.02)
    async with serving(engine, sandbox, "hermes") as (_, url), httpx.AsyncClient(timeout=30) as c:
        body = {"model": MODEL, "input": "Talk.", "stream": True}
        async with c.stream("POST", f"{url}/v1/responses", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("event: response.output_text.delta")
                if seen >= 3:
                    break  # leave mid-stream
        metrics = await metrics_once_idle(c, url)
    assert "rstar2_requests_in_flight 0.0" in metrics and engine.cancelled


async def test_containers_expire_and_are_capped(sandbox):
    before = (await sandbox.stats())["sessions"]
    boxes = Containers(sandbox, cap=1, idle_timeout=0.3)
    first = await boxes.new()
    assert (await boxes.run(first, "x = 1", "", 5)).ok and (await sandbox.stats())["sessions"] == before + 1
    boxes.release(first, reap=False)  # its request ended
    second = await boxes.new()  # the cap: the idle first one is closed
    with pytest.raises(Exception, match="No open container"):
        boxes.find(first.id, "tools[0].container")
    assert (await boxes.run(second, "print('x' in globals())", "", 5)).stdout == "False\n"
    boxes.release(second, reap=False)
    await asyncio.sleep(0.4)
    await boxes.sweep()
    assert boxes.open == {} and (await sandbox.stats())["sessions"] == before


async def test_real_smollm2_engine_through_responses_create(engine, sandbox):
    async with serving(engine, sandbox, "markdown") as (client, _):
        r = await client.responses.create(model=MODEL, input="What is 2**100? Use Python.", tools=CODE,
                                          max_output_tokens=8, temperature=0, extra_body={"max_turns": 1})
    assert r.status in ("completed", "incomplete") and r.output and r.usage.output_tokens > 0
    assert r.model_extra["rstar2"]["turns"]
