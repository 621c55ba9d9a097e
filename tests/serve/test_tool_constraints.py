"""tool_choice "required" and a named function as vLLM structured outputs (tool_constraints.py): the structural tag
checked string by string with xgrammar (what it accepts and refuses, in milliseconds), then on the in-process vLLM
engine with SmolLM2-135M, which never calls a tool on its own: the constraint is what makes the call, and the same
prompt and seeds without it (the control) make none. The hf and openai engines refuse a constraint by name."""

from __future__ import annotations

import asyncio
import json

import pytest

from rstar2_agent.chat_format import ChatFormat, HermesFormat
from rstar2_agent.engines.base import EngineError, SamplingParams
from rstar2_agent.serve.tool_constraints import tool_call_constraint
from rstar2_agent.tool_calls import validate_arguments

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two small numbers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"]}}},
]
NAMED = {"type": "function", "function": {"name": "add"}}
QUESTION = "Hi! How are you today? Tell me about your favourite book."  # asks for no tool: the model writes prose
SEEDS = (0, 1, 2)
TEXT_TOKENS = 12  # free text allowed before the first call in (a)
CALL = HermesFormat().render_call


# ------------------------------------------------------------------ the structural tag, checked with xgrammar
@pytest.fixture(scope="module")
def accepts(smol_tokenizer):
    """accepts(constraint, text): xgrammar's matcher takes `text` and then the end of turn (as vLLM builds it: the
    tokenizer's info, the request's stop ids as the matcher's stop tokens)."""
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo.from_huggingface(smol_tokenizer, vocab_size=len(smol_tokenizer))
    compiler = xgr.GrammarCompiler(info)
    eos = smol_tokenizer.eos_token_id

    def run(constraint: dict, text: str) -> bool:
        tag = json.dumps(constraint["structural_tag"])
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(tag), override_stop_tokens=[eos])
        return matcher.accept_string(text) and matcher.accept_token(eos)

    return run


def test_required_without_parallel_calls_is_one_call_of_any_tool_with_fitting_arguments(accepts):
    one = tool_call_constraint(TOOLS, "required", parallel=False)
    weather, add = CALL("get_weather", {"city": "Rome"}), CALL("add", {"a": 2, "b": 40})
    assert accepts(one, weather) and accepts(one, add)
    assert not accepts(one, "")  # the turn cannot end without a call
    assert not accepts(one, "Let me see. " + weather)  # text_tokens=0: the call comes first
    assert not accepts(one, weather + "\n" + add)  # one call only
    assert not accepts(one, weather + " Done.")  # nothing after the call
    assert not accepts(one, CALL("get_weather", {"city": "Oslo"}))  # not in the enum
    assert not accepts(one, CALL("add", {"a": 2}))  # a required argument missing
    assert not accepts(one, CALL("add", {"a": 2, "b": 40, "c": 1}))  # an undeclared argument
    assert not accepts(one, CALL("search", {"q": "x"}))  # not a tool


def test_free_text_before_the_first_call_and_parallel_calls(accepts):
    """With a text budget the model may reason first; with parallel calls it may make several, newline-separated;
    never text after (or between) the calls. xgrammar's own `triggered_tags` with `at_least_one` (its builtin form
    for "required") allows no text before the first call: the measured limitation the module's form works around."""
    many = tool_call_constraint(TOOLS, "required", parallel=True, text_tokens=TEXT_TOKENS)
    weather, add = CALL("get_weather", {"city": "Rome"}), CALL("add", {"a": 2, "b": 40})
    assert accepts(many, "<reason>Rome, I think.</reason>\n" + weather)
    assert accepts(many, weather + "\n" + add + "\n" + weather)
    assert not accepts(many, weather + " then " + add) and not accepts(many, weather + "\nDone.")
    two = tool_call_constraint(TOOLS, "required", parallel=True, max_calls=2)
    assert accepts(two, weather + "\n" + add) and not accepts(two, weather + "\n" + add + "\n" + weather)
    triggered = {"structural_tag": {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": '<tool_call>\n{"name": "get_weather", "arguments": ',
                  "content": {"type": "json_schema", "json_schema": TOOLS[0]["function"]["parameters"]},
                  "end": "}\n</tool_call>"}]}}}
    assert accepts(triggered, weather) and not accepts(triggered, "Rome, I think.\n" + weather)


def test_a_named_function_is_exactly_one_call_of_it(accepts):
    named = tool_call_constraint(TOOLS, NAMED, parallel=True)
    assert accepts(named, CALL("add", {"a": 1, "b": 2}))
    assert not accepts(named, CALL("get_weather", {"city": "Rome"}))
    assert not accepts(named, CALL("add", {"a": 1, "b": 2}) + "\n" + CALL("add", {"a": 3, "b": 4}))


def test_choices_that_need_no_constraint_or_name_no_tool_are_refused_with_what_to_send():
    with pytest.raises(ValueError, match='"auto" and "none" need none'):
        tool_call_constraint(TOOLS, "auto", parallel=True)
    with pytest.raises(ValueError, match="'mul', which is not in tools"):
        tool_call_constraint(TOOLS, {"type": "function", "function": {"name": "mul"}}, parallel=True)
    with pytest.raises(ValueError, match="needs tools"):
        tool_call_constraint([], "required", parallel=True)
    pytest.importorskip("xgrammar")  # a schema xgrammar cannot compile is named before it reaches vLLM
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"$ref": "#/nope"}}}}}]
    with pytest.raises(ValueError, match=r"parameters of 'f' cannot constrain decoding \(Cannot find field nope"):
        tool_call_constraint(bad, "required", parallel=True)


def test_the_vllm_engine_maps_a_constraint_onto_structured_outputs():
    from rstar2_agent.engines.vllm import structured_outputs

    constraint = tool_call_constraint(TOOLS, NAMED, parallel=False)
    params = structured_outputs(constraint)
    assert json.loads(params.structural_tag) == constraint["structural_tag"] and params.json is None
    assert structured_outputs(None) is None and structured_outputs({"regex": "a+"}).regex == "a+"
    with pytest.raises(EngineError, match="one of structural_tag, grammar, json, regex, choice"):
        structured_outputs({"structural_tag": {}, "regex": "a"})


# ------------------------------------------------------------------ on the engines
def _prompt(tokenizer) -> list[int]:
    return ChatFormat(tokenizer, "hermes", tools=TOOLS).render_prompt(QUESTION)


async def _generate(engine, constraint: dict | None, max_tokens: int = 96) -> list[tuple[list[int], str, str]]:
    """(ids, text without the end of turn, finish reason) of one generation per seed, at temperature 1.0."""
    ids = _prompt(engine.tokenizer)
    gens = await asyncio.gather(*(engine.generate(ids, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s,
                                                                      constraint=constraint)) for s in SEEDS))
    eos = engine.tokenizer.eos_token_id
    return [(g.token_ids, engine.tokenizer.decode([t for t in g.token_ids if t != eos]), g.finish_reason)
            for g in gens]


def _calls(text: str) -> list:
    """The Hermes calls in `text`, as the server's parser reads them (errors set on the malformed)."""
    return HermesFormat().parse(text, TOOLS, max_calls=8)


@pytest.mark.slow
async def test_vllm_required_forces_exactly_one_well_formed_call_where_the_model_makes_none(vllm_engine):
    """(a) "required", two tools, no parallel calls, up to TEXT_TOKENS of free text first: at temperature 1.0 over
    three seeds, each response is text, then exactly one call whose JSON names a tool and whose arguments fit its
    schema, then the end of turn (nothing after the call). (c) The same prompt and seeds without the constraint:
    no well-formed call (the control: the test can fail)."""
    constraint = tool_call_constraint(TOOLS, "required", parallel=False, text_tokens=TEXT_TOKENS)
    eos = vllm_engine.tokenizer.eos_token_id
    forced, free = await asyncio.gather(_generate(vllm_engine, constraint), _generate(vllm_engine, None))
    texts = []
    for ids, text, finish in forced:
        assert finish == "stop" and ids[-1] == eos and text.count("<tool_call>") == 1, text
        before, call = text.split("<tool_call>")
        texts.append(before)
        assert len(vllm_engine.tokenizer.encode(before, add_special_tokens=False)) <= TEXT_TOKENS + 1, text
        assert call.endswith("</tool_call>"), text
        body = json.loads(call.removesuffix("</tool_call>"))
        assert body["name"] in ("get_weather", "add") and set(body) == {"name", "arguments"}
        assert validate_arguments(body["name"], body["arguments"], TOOLS) is None, text
    assert any(t.strip() for t in texts)  # the model wrote before its call (what the text budget is for)
    for _, text, _ in free:
        assert not [c for c in _calls(text) if c.error is None], text


@pytest.mark.slow
async def test_vllm_a_named_function_yields_a_call_of_that_function(vllm_engine):
    """(b) A named function, the call first (text_tokens 0): each seed's response is that one call and the end."""
    constraint = tool_call_constraint(TOOLS, NAMED, parallel=True)
    for _, text, finish in await _generate(vllm_engine, constraint):
        assert finish == "stop" and text.startswith("<tool_call>\n") and text.endswith("</tool_call>"), text
        (call,) = _calls(text)
        assert call.name == "add" and call.error is None and validate_arguments("add", call.arguments, TOOLS) is None


async def test_engines_that_cannot_constrain_refuse_a_constraint_by_name(engine, smol_tokenizer):
    """(d) The hf engine and a remote openai server cannot constrain decoding: a constraint is refused before any
    token (or request), naming the field and what to use instead."""
    from rstar2_agent.engines.openai import OpenAIEngine

    constraint = tool_call_constraint(TOOLS, "required", parallel=False)
    sampling = SamplingParams(max_tokens=8, constraint=constraint)
    assert not engine.constrains
    with pytest.raises(EngineError, match=r"hf engine cannot constrain decoding \(SamplingParams.constraint.*vllm"):
        await engine.generate(_prompt(engine.tokenizer), sampling)
    remote = OpenAIEngine("http://127.0.0.1:9", tokenizer=smol_tokenizer, context_length=2048)
    try:
        with pytest.raises(EngineError, match=r"openai engine .* cannot constrain decoding.*--engine vllm"):
            await remote.generate([1, 2, 3], sampling)
    finally:
        await remote.close()
