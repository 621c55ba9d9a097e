"""Streamed chat completions with client tools, through the real server and the official `openai` client: the
chunks reassemble to the non-streamed response for every format, token by token as a model writes them, and a
call's first argument fragment reaches the client while the model is still writing it. The engine is scripted
(real SmolLM2 tokenizer ids, streamed one token at a time): SmolLM2 does not write these calls itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest

from rstar2_agent.paper_format import PAPER_SCHEMA
from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import StreamingScriptedEngine, uvicorn_app

REPLIES = json.loads((Path(__file__).parents[1] / "data" / "replies.json").read_text())
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}},
           {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
TOOLS = {"weather": WEATHER, "python": [PAPER_SCHEMA]}
CASES = [c for c in REPLIES if c["tools"] in TOOLS and len(c["turns"]) == 1]


async def reassemble(stream) -> tuple[dict, str, list[tuple[float, dict]]]:
    """What a client builds from the chunks: content, reasoning and calls by index; the finish reason; the time each
    tool-call delta arrived; and the order of what the chunks carried."""
    content, reasoning, calls, finish, seen = "", "", {}, None, []
    order: list[str] = []  # what each chunk carried, in order: content, reasoning, the server loop's tool_call
    async for chunk in stream:
        choice = chunk.choices[0]
        delta = choice.delta
        extra = delta.model_extra or {}
        order += [(k, v) for k, v in (("content", delta.content), ("reasoning", extra.get("reasoning_content")),
                                      ("tool_call", (extra.get("rstar2") or {}).get("tool_call"))) if v]
        content += delta.content or ""
        reasoning += extra.get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            seen.append((time.monotonic(), tc.model_dump()))
            if tc.id is not None:  # a new call: announced once, with its name
                assert tc.index not in calls and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments
        finish = choice.finish_reason or finish
    return {"content": content or None, "reasoning": reasoning or None,
            "calls": [calls[k] for k in sorted(calls)]}, finish, seen, order


def non_streamed(msg) -> dict:
    return {"content": msg.content or None, "reasoning": (msg.model_extra or {}).get("reasoning_content"),
            "calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                      for c in msg.tool_calls or []]}


def without_ids(reply: dict) -> dict:
    return {**reply, "calls": [(c["name"], c["arguments"]) for c in reply["calls"]]}


async def test_streamed_tool_calls_reassemble_to_the_response_for_every_profile_with_a_scripted_engine(
        smol_tokenizer, sandbox):
    """Each recorded reply of a profile with client tools, non-streamed and streamed token by token."""
    texts = [t for c in CASES for t in (c["turns"][0], c["turns"][0])]
    engine = StreamingScriptedEngine(smol_tokenizer, texts)
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for case in CASES:
            kw = dict(model="m", messages=[{"role": "user", "content": "Go."}], tools=TOOLS[case["tools"]],
                      parallel_tool_calls=case.get("parallel", True), extra_body={"format": case["profile"]})
            r = await client.chat.completions.create(**kw)
            whole, whole_finish = non_streamed(r.choices[0].message), r.choices[0].finish_reason
            streamed, finish, _, order = await reassemble(await client.chat.completions.create(**kw, stream=True))
            assert without_ids(streamed) == without_ids(whole), case["name"]
            assert finish == whole_finish == ("tool_calls" if whole["calls"] else "stop"), case["name"]
            expect = case["expect"]
            assert [(c["name"], c["arguments"]) for c in whole["calls"]] == [tuple(c) for c in expect["calls"]]
            if case["profile"] != "template":  # template: the case's reasoning relies on a prompt that opened <think>
                assert (whole["content"], whole["reasoning"]) == (expect["content"], expect["reasoning"]), case["name"]
        await client.close()


async def test_the_first_argument_fragment_arrives_while_the_model_writes_the_call_with_a_scripted_engine(
        smol_tokenizer, sandbox):
    code = "\\n".join(f"print({i} ** 2)" for i in range(20))
    text = ("Let me compute.</reason>\n<tool_call>\n{\"name\": \"execute_python_code_with_standard_io\", "
            f"\"arguments\": {{\"code\": \"{code}\", \"input\": \"\"}}}}\n</tool_call>")
    engine = StreamingScriptedEngine(smol_tokenizer, [text], delay=0.01)
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="rstar2-paper"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Go."}],
                                                      tools=[PAPER_SCHEMA], stream=True)
        reply, finish, seen, _ = await reassemble(stream)
        await client.close()
    fragments = [(t, d) for t, d in seen if d["id"] is None]
    assert finish == "tool_calls" and len(fragments) > 5  # the arguments came in pieces, as written
    assert fragments[0][0] < engine.last_token_at - 0.1  # the first came long before the model's last token
    assert json.loads(reply["calls"][0]["arguments"])["code"] == code.replace("\\n", "\n")
    assert reply["reasoning"] == "Let me compute." and reply["content"] is None


@pytest.mark.parametrize("separate", [True, False])
async def test_the_server_loop_splits_reasoning_or_keeps_the_raw_text_with_a_scripted_engine(
        smol_tokenizer, sandbox, separate):
    """The server runs the call; content is the answer block, reasoning_content the rest, streamed or not; with
    separate_reasoning false, the raw text as before."""
    turns = ["Compute.</reason>\n<tool_call>\n{\"name\": \"execute_python_code_with_standard_io\", \"arguments\": "
             "{\"code\": \"print(6 * 7)\", \"input\": \"\"}}\n</tool_call> then <a",  # "<a": held (<answer>?)
             "It printed 42.</reason>\n<answer>\\boxed{42}</answer>"]
    engine = StreamingScriptedEngine(smol_tokenizer, turns * 2)
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="rstar2-paper"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "6 * 7?"}],
                  extra_body={"separate_reasoning": separate})
        msg = (await client.chat.completions.create(**kw)).choices[0].message
        streamed, finish, _, order = await reassemble(await client.chat.completions.create(**kw, stream=True))
        await client.close()
    assert msg.model_extra["rstar2"]["turns"][0]["tool_calls"][0]["stdout"] == "42\n"
    if separate:
        assert msg.content == "<answer>\\boxed{42}</answer>" == streamed["content"]
        assert msg.model_extra["reasoning_content"] == streamed["reasoning"]
        assert streamed["reasoning"].startswith("Compute.\n\n<tool_call>") and "It printed 42." in streamed["reasoning"]
        assert "</tool_call> then <a\n\nIt printed 42." in streamed["reasoning"]
        # a turn's text streams before its calls run, even what the parser held back to its end ("<a")
        kinds = [k for k, _ in order]
        held = next(i for i, (k, v) in enumerate(order) if k == "reasoning" and "<a" in v)
        assert held < kinds.index("tool_call")
    else:
        assert "reasoning_content" not in msg.model_extra
        assert msg.content.endswith("</reason>\n<answer>\\boxed{42}</answer>")
        assert streamed["reasoning"] is None and streamed["content"].startswith("Compute.</reason>")
    assert finish == "stop"


@pytest.mark.slow
async def test_tool_choice_forces_the_call_on_the_in_process_vllm_engine(vllm_engine, sandbox):
    """tool_choice naming a function, and "required" without parallel calls, through the official client: vLLM's
    structured outputs make SmolLM2 write the call (with "auto" it writes none); streamed, the same greedy call."""
    server = Server(vllm_engine, sandbox, ServeConfig(model_name="m", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=WEATHER,
                  temperature=0.0, max_tokens=48)
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = await client.chat.completions.create(**kw, tool_choice=named)
        [call] = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)
        streamed, finish, _, order = await reassemble(await client.chat.completions.create(**kw, tool_choice=named,
                                                                                    stream=True))
        assert finish == "tool_calls" and without_ids(streamed) == without_ids(non_streamed(r.choices[0].message))
        required = await client.chat.completions.create(**kw, tool_choice="required", parallel_tool_calls=False)
        assert [c.function.name in ("get_weather", "add") for c in required.choices[0].message.tool_calls] == [True]
        auto = await client.chat.completions.create(**kw, tool_choice="auto")
        assert auto.choices[0].message.tool_calls is None  # the control: unforced, SmolLM2 writes no call
        await client.close()
