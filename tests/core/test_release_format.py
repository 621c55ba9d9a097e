"""The rstar2-release profile against the release's own chat template and tool config (../shared/reference):
the same text and the same token ids for the first prompt, for every inserted tool response and for OpenAI
messages with tool calls; and the release's tool behaviour in the real sandbox."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat, format_result
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.release_format import ReleaseFormat, render, truncate
from rstar2_agent.sandbox.release_tool import RELEASE_SCHEMA, RELEASE_TOOL, program, response
from rstar2_agent.sandbox.types import ExecResult, Status
from rstar2_agent.tool_calls import ToolCall

from conftest import ScriptedEngine, chat_prompt_ids

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
TEMPLATE = REFERENCE / "rstar2-release-chat-template.jinja"
TOOL_CONFIG = REFERENCE / "rstar2-release-python-tool.yaml"
needs_reference = pytest.mark.skipif(not TEMPLATE.exists(), reason="../shared/reference is not on this machine")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def release_tools() -> list[dict]:
    return [t["tool_schema"] for t in yaml.safe_load(TOOL_CONFIG.read_text())["tools"]]


def oracle(tok, messages, tools, add_generation_prompt: bool, tokenize: bool = False):
    """The release's template rendered as transformers renders chat templates (its jinja environment and
    `tojson`), with tool-call arguments as objects, as vLLM hands them to templates."""
    kw = {"return_dict": False} if tokenize else {}
    return tok.apply_chat_template(messages, tools=tools, chat_template=TEMPLATE.read_text(), tokenize=tokenize,
                                   add_generation_prompt=add_generation_prompt, **kw)


def openai_form(messages: list[dict]) -> list[dict]:
    """The same conversation as an OpenAI client sends it: arguments as JSON strings, call ids."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function",
                                "function": {"name": c["function"]["name"],
                                             "arguments": json.dumps(c["function"]["arguments"])}}
                               for j, c in enumerate(m["tool_calls"])]
        out.append(m)
    return out


# Text the model and the tools write: unicode, newlines, quotes, braces, backslashes; never a special token.
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60).filter(
    lambda s: "<|" not in s)
results = st.builds(
    ExecResult, status=st.sampled_from(list(Status)), stdout=texts | st.just("") | st.just("x" * 900),
    stderr=texts | st.just(""), duration=st.floats(0, 30, allow_nan=False))


@st.composite
def conversations(draw) -> list[dict]:
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    messages.append({"role": "user", "content": draw(texts)})
    for _ in range(draw(st.integers(0, 3))):
        calls = draw(st.lists(st.fixed_dictionaries({"code": texts, "input": texts}), min_size=1, max_size=3))
        messages.append({"role": "assistant", "content": draw(texts),
                         "tool_calls": [{"function": {"name": RELEASE_TOOL, "arguments": a}} for a in calls]})
        for _ in calls:
            messages.append({"role": "tool", "content": truncate(response(draw(results)), 256)})
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": draw(texts)})
    return messages


@needs_reference
def test_the_tool_schema_is_the_release_config_s():
    assert json.dumps([RELEASE_SCHEMA]) == json.dumps(release_tools())


@needs_reference
@SETTINGS
@given(messages=conversations(), add_generation_prompt=st.booleans(), with_tools=st.booleans())
def test_rendering_is_the_release_template_byte_for_byte(smol_tokenizer, messages, add_generation_prompt,
                                                         with_tools):
    tools = release_tools() if with_tools else None
    assert render(messages, tools, add_generation_prompt) == oracle(smol_tokenizer, messages, tools,
                                                                    add_generation_prompt)


@needs_reference
@SETTINGS
@given(messages=conversations())
def test_openai_messages_render_to_the_template_s_ids(smol_tokenizer, messages):
    """What `rstar2 serve` does with a chat request: OpenAI messages (arguments as JSON strings) to prompt ids."""
    fmt = ChatFormat(smol_tokenizer, "rstar2-release")
    expected = oracle(smol_tokenizer, messages, release_tools(), True, tokenize=True)
    assert fmt.render_prompt(openai_form(messages)) == list(expected)


@needs_reference
@SETTINGS
@given(problem=texts)
def test_the_first_prompt_is_the_template_s(smol_tokenizer, problem):
    fmt = ChatFormat(smol_tokenizer, "rstar2-release")
    expected = oracle(smol_tokenizer, [{"role": "user", "content": problem}], release_tools(), True)
    assert fmt.render_prompt(problem) == oracle(smol_tokenizer, [{"role": "user", "content": problem}],
                                                release_tools(), True, tokenize=True)
    assert expected.endswith("This is the problem:\n" + problem + "<|im_end|>\n<|im_start|>assistant\n<reason>")


@needs_reference
@SETTINGS
@given(tool_results=st.lists(results, min_size=1, max_size=4))
def test_inserted_tool_responses_are_the_release_loop_s_ids(smol_tokenizer, tool_results):
    """The release's loop renders the tool messages with the generation prompt and cuts off the ids of the
    template's empty-conversation system turn."""
    fmt = ChatFormat(smol_tokenizer, "rstar2-release")
    texts_ = [truncate(response(r), 256) for r in tool_results]
    system = oracle(smol_tokenizer, [{}], None, False, tokenize=True)
    full = oracle(smol_tokenizer, [{"role": "tool", "content": t} for t in texts_], None, True, tokenize=True)
    assert fmt.tool_response_ids(texts_, turn_ended_with_eos=True) == list(full)[len(system):]


# ------------------------------------------------------------------ the release's parser and tool
def parse(text: str) -> list[ToolCall]:
    return ReleaseFormat().parse(text, [RELEASE_SCHEMA], ReleaseFormat.max_calls_per_turn)


def test_a_call_whose_json_does_not_parse_is_answered_as_the_release_answers_it():
    calls = parse("<tool_call>\n{not json}\n</tool_call>")
    assert calls[0].error == "Failed to decode tool call: Expecting property name enclosed in double quotes: " \
                             "line 2 column 2 (char 2)"  # the body is parsed unstripped, as the release does
    assert format_result(calls[0], None, 256, "rstar2-release") == calls[0].error
    assert parse('<tool_call>{"name": "x"}</tool_call>')[0].error == "Failed to decode tool call: 'arguments'"


def test_unknown_tools_and_bad_arguments_get_the_release_s_execution_errors():
    assert parse('<tool_call>{"name": "bash", "arguments": {}}</tool_call>')[0].error == \
        "Error when executing tool: 'bash'"
    assert parse(f'<tool_call>{{"name": "{RELEASE_TOOL}", "arguments": [1]}}</tool_call>')[0].error == \
        "Error when executing tool: 'list' object has no attribute 'get'"
    call = parse(f'<tool_call>{{"name": "{RELEASE_TOOL}", "arguments": {{"code": "1"}}}}</tool_call>')[0]
    assert call.error is None and call.arguments == {"code": "1", "input": ""}  # input defaults as the release's


def test_other_tools_keep_their_arguments_and_every_call_a_caller_asks_for():
    """A client's functions (rstar2 serve) and BFCL's go through the release's parser too: their arguments are
    the model's, not the Python tool's, and a caller that wants every call of a turn gets them."""
    area = {"type": "function", "function": {"name": "calc_area", "parameters": {
        "type": "object", "properties": {"base": {"type": "integer"}}}}}
    text = "".join(f'<tool_call>\n{{"name": "calc_area", "arguments": {{"base": {b}}}}}\n</tool_call>'
                   for b in (10, 20))
    calls = ReleaseFormat().parse(text, [area, RELEASE_SCHEMA], 64)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("calc_area", {"base": 10}, None),
                                                                ("calc_area", {"base": 20}, None)]
    bad = ReleaseFormat().parse('<tool_call>{"name": "calc_area", "arguments": [10]}</tool_call>', [area], 1)
    assert bad[0].error == "Error when executing tool: the arguments of calc_area must be a JSON object, not list"


def test_only_the_first_call_of_a_turn_is_answered_and_the_rest_dropped():
    one = f'<tool_call>{{"name": "{RELEASE_TOOL}", "arguments": {{"code": "1", "input": ""}}}}</tool_call>'
    assert len(parse(one + one + one)) == 1
    assert parse(one.replace("</tool_call>", "")) == []  # no closing tag: no call at all


def test_long_responses_keep_both_ends():
    text = "a" * 300 + "b" * 300
    assert truncate(text, 256) == "a" * 128 + "...(truncated)..." + "b" * 128
    assert truncate("short", 256) == "short"


async def run_release(sandbox, code: str, stdin: str = "") -> str:
    return response(await sandbox.run(program(code), stdin=stdin))


async def test_errors_name_their_line_and_drop_unflushed_stdout(sandbox):
    out = await run_release(sandbox, "x = 2\nprint(x)\ny = 1/0\nprint(3)")
    assert out.startswith("Tool call failure\nreason: \nstderr: ZeroDivisionError at line 3: division by zero\n"
                          "  y = 1/0\n\nexecution time: ")
    assert "stdout" not in out  # os._exit(1) drops a block-buffered stdout's unflushed rest


async def test_explicit_flushes_and_normal_exits_write_stdout_as_the_release_s_process(sandbox):
    """Only os._exit(1) on an error drops unflushed stdout; a flush and a normal exit write it, and the program
    sees a real stdout's attributes."""
    assert "stdout: a\n\nstderr: ZeroDivisionError at line 1" in await run_release(
        sandbox, "print('a', flush=True); 1/0")
    for code in ("print('hi'); import sys; sys.exit(0)", "print('hi'); exit()"):
        assert (await run_release(sandbox, code)).startswith("Tool call success\nstdout: hi\n\n"), code
    out = await run_release(sandbox, "import sys\nprint('x')\nsys.exit(3)")
    assert out.startswith("Tool call failure\nreason: \nstdout: x\n\nexecution time: ")
    out = await run_release(sandbox, "import sys\nprint(sys.stdout.encoding)\nsys.stdout.buffer.write(b'raw\\n')")
    assert out.startswith("Tool call success\nstdout: utf-8\nraw\n4\n\n")  # write()'s 4, echoed last


async def test_the_last_expression_is_echoed_and_stdin_is_read(sandbox):
    assert (await run_release(sandbox, "import numpy as np\nnp.arange(3)")).startswith(
        "Tool call success\nstdout: array([0, 1, 2])\n\nexecution time: ")
    assert "stdout: 5\n" in await run_release(sandbox, "print(int(input()) + int(input()))", "2\n3\n")
    assert re.fullmatch(r"Tool call success\nexecution time: \d+\.\d\ds", await run_release(sandbox, "None"))


async def test_syntax_errors_and_timeouts_read_as_the_release_s(sandbox):
    assert "stderr: IndentationError at line 2: unexpected indent" in await run_release(sandbox, "print(1)\n  bad")
    result = await sandbox.run(program("while True: pass"), timeout=1)
    assert response(result).startswith("Tool call failure\nreason: worker_timeout\n")


@pytest.mark.slow
async def test_the_agent_loop_runs_the_release_tool_with_release_prompts(engine, sandbox):
    fmt = ChatFormat(engine.tokenizer, "rstar2-release")
    traj = await run_agent("What is 6*7?", engine, sandbox, fmt,
                           AgentConfig(max_turns=1, sampling=SamplingParams(temperature=0, max_tokens=16)))
    assert traj.prompt_ids == fmt.render_prompt("What is 6*7?")
    assert fmt.decode(traj.prompt_ids).endswith("<|im_start|>assistant\n<reason>")


@needs_reference
async def test_a_loop_trajectory_has_the_template_s_ids_at_every_turn(smol_tokenizer, sandbox):
    """The real agent loop and sandbox in the release's format, on scripted model turns (two with calls, one
    parallel, one failing; then the answer): the first prompt and every inserted tool response are the ids the
    release's template and loop give, and each response is the release tool's text for what the sandbox ran."""
    def turn(*calls: tuple[str, str]) -> str:
        return "Let me compute." + "".join(
            f'\n<tool_call>\n{json.dumps({"name": RELEASE_TOOL, "arguments": {"code": c, "input": i}})}\n'
            "</tool_call>" for c, i in calls)

    engine = ScriptedEngine(smol_tokenizer, [turn(("print(6*7)", "")),
                                             turn(("print(int(input())+1)", "41"), ("1/0", "")),
                                             "So it is 42.</reason>\n<answer>\\boxed{42}</answer>"])
    fmt = ChatFormat(smol_tokenizer, "rstar2-release")
    # two calls a turn (the release answers one, verl's max_parallel_calls; raised here to merge two responses)
    traj = await run_agent("What is 6*7?", engine, sandbox, fmt, AgentConfig(max_turns=4, max_calls_per_turn=2))
    assert traj.stop_reason == "answer" and not engine.texts
    assert traj.prompt_ids == list(oracle(smol_tokenizer, [{"role": "user", "content": "What is 6*7?"}],
                                          release_tools(), True, tokenize=True))
    system = oracle(smol_tokenizer, [{}], None, False, tokenize=True)
    at = 0
    for t in traj.turns:
        at += t.num_tokens
        if not t.tool_calls:
            continue
        responses = [c.response for c in t.tool_calls]
        full = oracle(smol_tokenizer, [{"role": "tool", "content": r} for r in responses], None, True, tokenize=True)
        assert traj.response_ids[at:at + t.inserted_tokens] == list(full)[len(system):]
        at += t.inserted_tokens
    assert at == len(traj.response_ids)
    first, (second, failing) = traj.turns[0].tool_calls[0].response, traj.turns[1].tool_calls
    assert first.startswith("Tool call success\nstdout: 42\n\nexecution time: ")
    assert second.response.startswith("Tool call success\nstdout: 42\n")
    assert failing.response.startswith("Tool call failure\nreason: \nstderr: ZeroDivisionError at line 1: "
                                       "division by zero\n  1/0\n")


@needs_reference
@pytest.mark.slow
def test_rstar2_chat_prints_the_template_s_prompt_ids(tiny_smollm2, smol_tokenizer):
    q = "What is 2**10?"
    expected = oracle(smol_tokenizer, [{"role": "user", "content": q}], release_tools(), True, tokenize=True)
    assert chat_prompt_ids(q, "rstar2-release", tiny_smollm2) == list(expected)


@needs_reference
@pytest.mark.slow
async def test_rstar2_serve_renders_openai_tool_messages_as_the_template(serve_url, smol_tokenizer):
    """A chat request in the release's format with an earlier call and its result, through the official client:
    the server's prompt is the template's (its prompt token count; the ids are checked above)."""
    import openai

    messages = [{"role": "user", "content": "What is 2**100?"},
                {"role": "assistant", "content": "<reason>Let me compute.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": RELEASE_TOOL, "arguments": json.dumps({"code": "2**100", "input": ""})}}]},
                {"role": "tool", "tool_call_id": "call_1",
                 "content": "Tool call success\nstdout: 1267650600228229401496703205376\n\nexecution time: 0.01s"}]
    client = openai.AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0)
    try:
        resp = await client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=4,
                                                    temperature=0, extra_body={"format": "rstar2-release",
                                                                               "max_turns": 1})
    finally:
        await client.close()
    parsed = [{**m, "tool_calls": [{"function": {"name": RELEASE_TOOL, "arguments": {"code": "2**100", "input": ""}}}]}
              if m.get("tool_calls") else m for m in messages]
    expected = oracle(smol_tokenizer, parsed, release_tools(), True, tokenize=True)
    assert resp.usage.prompt_tokens == len(expected)
