"""The rStar2 format and THE tool-call parser: rendering, parsing, round trips, fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_agent.chat_format import (
    ChatFormat,
    HermesFormat,
    MarkdownFormat,
    ToolCall,
    extract_answer,
    last_boxed,
)
from rstar2_agent.sandbox.tools import STATELESS_SCHEMA, STATELESS_TOOL

TOOLS = [STATELESS_SCHEMA]


@pytest.fixture(scope="module")
def fmt(smol_tokenizer):
    return ChatFormat(smol_tokenizer, "hermes")


# ------------------------------------------------------------------ parser
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('<>/{}":,[] \n`abc') + ["<tool_call>", "</tool_call>", "```python\n", "```\n",
                                                          "```output", '"name"', '"arguments"', STATELESS_TOOL]),
                max_size=60).map("".join))
def test_parsers_never_raise_and_flag_every_bad_call(text):
    for proto in (HermesFormat(), MarkdownFormat()):
        calls = proto.parse(text, TOOLS, max_calls=2)
        assert all(isinstance(c, ToolCall) for c in calls)
        for c in calls:
            assert c.error is not None or (c.name == STATELESS_TOOL and isinstance(c.arguments.get("code"), str))


@settings(max_examples=100, deadline=None)
@given(code=st.text(max_size=200), stdin=st.text(max_size=20))
def test_hermes_round_trip(code, stdin):
    proto = HermesFormat()
    text = "Let me compute.\n" + proto.render_call(STATELESS_TOOL, {"code": code, "input": stdin})
    calls = proto.parse(text, TOOLS, max_calls=4)
    if "</tool_call>" in code or "</tool_call>" in stdin:
        # as the release's parser (verl's Hermes regex), a call ends at its first </tool_call>, even inside a JSON
        # string: the model is told the call did not decode
        assert calls and "not valid JSON" in calls[0].error
        return
    [call] = calls
    assert call.error is None and call.arguments == {"code": code, "input": stdin}


def test_a_hermes_call_ends_at_its_first_closing_tag_as_the_releases_does():
    proto = HermesFormat()
    [call] = proto.parse(proto.render_call(STATELESS_TOOL, {"code": "", "input": "</tool_call>"}), TOOLS, max_calls=4)
    assert call.error.startswith("the tool call is not valid JSON")


@settings(max_examples=100, deadline=None)
@given(code=st.text(alphabet=st.characters(blacklist_characters="`"), max_size=200))
def test_markdown_round_trip(code):
    proto = MarkdownFormat()
    [call] = proto.parse("I will run it.\n" + proto.render_call(STATELESS_TOOL, {"code": code}), TOOLS, 4)
    assert call.error is None and call.arguments["code"].rstrip("\n") == code.rstrip("\n")


@pytest.mark.parametrize("body, fragment", [
    ('{"name": "execute_python_code_with_standard_io", "arguments": {"code": 1}}', "must be string"),
    ('{"name": "execute_python_code_with_standard_io", "arguments": {}}', "missing required argument"),
    ('{"name": "execute_python_code_with_standard_io", "arguments": {"code": "1", "x": 2}}', "unexpected argument"),
    ('{"name": "rm_rf", "arguments": {}}', "unknown tool 'rm_rf'"),
    ('{"name": "execute_python_code_with_standard_io", "arguments": {"code": "1"', "not valid JSON"),
    ('["execute_python_code_with_standard_io"]', 'a "name" string'),
    ('{"name": "execute_python_code_with_standard_io", "arguments": "{bad"}', "must be a JSON object"),
    ('{"name": "execute_python_code_with_standard_io", "arguments": {"code": "1"}, "id": 3}', "unexpected field"),
])
def test_hermes_malformed_calls_become_errors(body, fragment):
    [call] = HermesFormat().parse(f"<tool_call>\n{body}\n</tool_call>", TOOLS, 4)
    assert call.error is not None and fragment in call.error


def test_hermes_arguments_as_a_json_string_are_accepted():
    body = json.dumps({"name": STATELESS_TOOL, "arguments": json.dumps({"code": "print(1)"})})
    [call] = HermesFormat().parse(f"<tool_call>{body}</tool_call>", TOOLS, 4)
    assert call.error is None and call.arguments == {"code": "print(1)"}


def test_unclosed_call_and_the_per_turn_cap():
    ok = HermesFormat().render_call(STATELESS_TOOL, {"code": "1"})
    calls = HermesFormat().parse(ok * 3 + "<tool_call>\n{", TOOLS, max_calls=2)
    assert [c.error is None for c in calls] == [True, True, False, False]
    assert "too many tool calls" in calls[2].error and "not closed" in calls[3].error


def test_markdown_runs_only_a_closed_python_block_at_the_end():
    proto = MarkdownFormat()
    assert proto.parse("```text\nhello\n```\n", TOOLS, 4) == []
    assert proto.parse("```python\nprint(1)\n```\nand then", TOOLS, 4) == []
    [c] = proto.parse("Try:\n```python\nx = 2\nprint(x)\n```\n", TOOLS, 4)
    assert c.arguments["code"] == "x = 2\nprint(x)\n"
    [c] = proto.parse("```python\nprint(3)\n```\n```output", TOOLS, 4)
    assert c.arguments["code"] == "print(3)\n"
    [c] = proto.parse("no code here\n```output", TOOLS, 4)
    assert c.error is not None


# ------------------------------------------------------------------ rendering
def test_prompt_has_system_tools_and_user_wrapper(fmt):
    text = fmt.decode(fmt.render_prompt("What is 1+1?"))
    assert text.startswith("<|im_start|>system\n") and "<tools>\n{" in text and "</tools>" in text
    assert "<tool_call>" in text and "<answer>" in text
    assert "What is 1+1?\n\nPlease reason step by step" in text and "\\boxed{}" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "SmolLM" not in text  # our system prompt replaces the template's default


def test_inserted_tool_response_equals_what_the_template_renders(fmt):
    """Token-in/token-out and the template agree: prompt + generated turn + inserted ids decode to exactly
    the chat-template rendering of the same conversation."""
    turn = 'Let me check.\n<tool_call>\n{"name": "execute_python_code_with_standard_io", "arguments": ' \
           '{"code": "print(2**10)"}}\n</tool_call>'
    turn_ids = fmt.encode(turn) + [fmt.eos_id]
    results = ['{"status": "success", "stdout": "1024\\n"}', '{"status": "success", "stdout": ""}']
    inserted = fmt.tool_response_ids(results, turn_ended_with_eos=True)
    got = fmt.decode(fmt.render_prompt("q") + turn_ids + inserted)
    messages = fmt.messages_for("q") + [{"role": "assistant", "content": turn},
                                        {"role": "user", "content": fmt.rules.results_text(results)}]
    expected = fmt.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 chat_template=fmt.template)
    assert got == expected
    assert fmt.decode(inserted).count("<tool_response>") == 2  # consecutive results merged into one turn


def test_openai_messages_with_tool_calls_and_tool_results(fmt):
    messages = [
        {"role": "user", "content": "2**10?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": STATELESS_TOOL, "arguments": json.dumps({"code": "print(2**10)"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1024"},
        {"role": "tool", "tool_call_id": "c2", "content": "x"},
    ]
    rendered = fmt.messages_for(messages)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in rendered[2]["content"] and "print(2**10)" in rendered[2]["content"]
    assert rendered[3]["content"].count("<tool_response>") == 2


# ------------------------------------------------------------------ answers
@pytest.mark.parametrize("text, block, release", [
    ("so <answer>The answer is \\boxed{\\frac{1}{2}}.</answer>", "\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\boxed{1} then <answer>\\boxed{2}</answer> and \\boxed{3}", "2", "3"),
    ("no answer block, but \\boxed{x^{2}+1} and \\boxed{7}", None, "7"),
    ("<answer>42</answer>", None, None),
    ("<answer>\\boxed{5}</answer> then <answer>no box</answer>", None, "5"),
    ("\\boxed{unclosed", None, None),
])
def test_extract_answer_as_the_paper_and_as_the_release(text, block, release):
    """The paper and the release: the last box wherever it stands (the paper's within the final answer's turns,
    answer_scope); answer_block: the boxed answer inside the (last) answer block only."""
    assert extract_answer(text) == extract_answer(text, "paper") == extract_answer(text, "release") == release
    assert extract_answer(text, "answer_block") == block


def test_each_format_s_default_extraction_and_a_bad_mode():
    from rstar2_agent.chat_format import default_extraction

    assert [default_extraction(f) for f in ("rstar2-paper", "rstar2-release", "hermes", "template")] == [
        "paper", "paper", "paper", "release"]
    with pytest.raises(ValueError, match="choose one of paper, answer_block, release"):
        extract_answer("x", "prime")


def test_last_boxed_handles_nesting():
    assert last_boxed("\\boxed{\\sqrt{\\frac{a}{b}}}") == "\\sqrt{\\frac{a}{b}}"


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=80))
def test_streamed_text_deltas_add_up_to_the_decoded_turn(fmt, text):
    from rstar2_agent.agent import StreamDecoder

    ids = fmt.encode(text)
    deltas: list[str] = []
    decoder = StreamDecoder(fmt, lambda kind, delta: deltas.append(delta))
    for i in ids:
        decoder.feed([i])
    decoder.flush()
    assert "".join(deltas) == fmt.decode(ids)


async def test_a_boxed_answer_outside_the_block_is_right_for_the_paper_and_wrong_for_answer_block():
    """The same response graded both ways by the real grader: the paper's extraction reads the box after the last
    tool response (1), answer_block finds no <answer> block (0); a box written before the tool call is not the
    final answer for the paper."""
    from rstar2_agent.grading.math import MathGrader
    from rstar2_agent.trajectory import ToolCallRecord, Trajectory, Turn

    call = ToolCallRecord(turn=0, id="c1", name="python", arguments={"code": "print(6*7)"}, raw="", stdout="42")
    traj = Trajectory(prompt_ids=[], turns=[Turn("Maybe \\boxed{41}? Let me check.", 9, "stop", [call]),
                                            Turn("The program printed 42, so the answer is \\boxed{42}.", 12, "stop")])
    graded = {}
    for mode in ("paper", "answer_block", "release"):
        grader = MathGrader(workers=1, extraction=mode)
        try:
            graded[mode] = (await grader.grade_trajectory(traj, "42")).correct
        finally:
            grader.close()
    assert graded == {"paper": True, "answer_block": False, "release": True}
    early = Trajectory(prompt_ids=[], turns=[Turn("Surely \\boxed{42}.", 4, "stop", [call]),
                                             Turn("The program agrees.", 4, "stop")])
    assert extract_answer(early.final_text) is None and extract_answer(early.text, "release") == "42"
