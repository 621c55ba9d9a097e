"""The rstar2-paper profile (what the public checkpoint saw: the paper's prompt and trace figures) and the template
profile (any tool-calling model in its own chat template, as vLLM renders it), through the real agent loop and
sandbox on scripted model turns; the release's template is the oracle for the parts the paper shares with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.models import REGISTRY
from rstar2_agent.paper_format import PAPER_SCHEMA, PAPER_SYSTEM, PAPER_TOOL, PaperFormat
from rstar2_agent.release_format import PROBLEM_PREFIX, ReleaseFormat
from rstar2_agent.sandbox.release_tool import RELEASE_SCHEMA, RELEASE_TOOL
from rstar2_agent.sandbox.tools import STATELESS_SCHEMA

from conftest import ScriptedEngine, chat_prompt_ids

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
TEMPLATE = REFERENCE / "rstar2-release-chat-template.jinja"
needs_reference = pytest.mark.skipif(not TEMPLATE.exists(), reason="../shared/reference is not on this machine")

# A tool-aware ChatML template in the Hermes style (as Qwen2.5's renders tools, calls and tool messages), written for
# these tests: the template profile must follow whatever the model's own template does with `tools=`.
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nYou are a test model.\\n<tools>' }}{% for t in tools %}"
    "{{ '\\n' + (t | tojson) }}{% endfor %}{{ '\\n</tools><|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{% for c in m.tool_calls or [] %}{{ '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif m.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def call(name: str, code: str, stdin: str = "") -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"code": code, "input": stdin}})}\n</tool_call>'


# ------------------------------------------------------------------ rstar2-paper
def test_the_public_checkpoint_is_registered_in_the_paper_s_format():
    spec = REGISTRY["rstar2-agent-14b"]
    assert spec.hub_id == "rstar2-reproduce/rStar2-Agent-14B" and spec.format == "rstar2-paper"


def test_the_paper_s_tool_is_the_release_s_schema_under_its_name_with_a_return_entry():
    fn, release = PAPER_SCHEMA["function"], RELEASE_SCHEMA["function"]
    assert fn["name"] == "execute_python_code_with_standard_io"
    assert fn["parameters"] == release["parameters"] and fn["description"] == release["description"]
    assert fn["parameters"]["required"] == ["code", "input"]
    assert fn["return"]["type"] == "string" and fn["return"]["description"].startswith("str: The output produced")


@needs_reference
def test_the_first_prompt_is_figure_3_rendered_by_the_release_template_with_the_paper_s_tool(smol_tokenizer):
    """Figure 3's system prompt, tools block, "This is the problem:" prefix and the <reason> generation prompt: the
    release's template fixes the same parts, so given Figure 3's system prompt and the paper's tool it must give the
    same ids. The system prompt is Figure 3's, not the release's (they differ in four places)."""
    fmt = ChatFormat(smol_tokenizer, "rstar2-paper")
    q = "Find the number of colorings."
    expected = smol_tokenizer.apply_chat_template([{"role": "system", "content": PAPER_SYSTEM},
                                                   {"role": "user", "content": q}], tools=[PAPER_SCHEMA],
                                                  chat_template=TEMPLATE.read_text(), add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    assert fmt.render_prompt(q) == list(expected)
    text = fmt.decode(fmt.render_prompt(q))
    assert text.startswith("<|im_start|>system\nA conversation between User and Assistant. The user asks a question")
    assert "provides the user with the answer. The reasoning process and answer are enclosed within" in text
    assert "</reason><answer> answer here </answer>." in text and "The User asks" not in text
    release_fmt = ChatFormat(smol_tokenizer, "rstar2-release")
    release = release_fmt.decode(release_fmt.render_prompt(q))
    assert "The User asks a question" in release and "</reason> <answer> answer here" in release
    assert '"return": {"type": "string"' in text
    assert text.endswith(PROBLEM_PREFIX + q + "<|im_end|>\n<|im_start|>assistant\n<reason>")


async def test_tool_responses_are_bare_output_or_tool_call_failed_with_the_traceback(smol_tokenizer, sandbox):
    """The trace figures: a success is the program's bare output, a failure `tool call failed` / `reason: error
    message: Traceback ...`; each in a user turn, the next assistant turn opening <reason>."""
    count = "print('Total valid colorings:', 24)"
    engine = ScriptedEngine(smol_tokenizer, ["Let me count.\n" + call(PAPER_TOOL, count),
                                             "Check.\n" + call(PAPER_TOOL, "x = [1]\nx[3]"),
                                             "Echo.\n" + call(PAPER_TOOL, "2 ** 10 == 1024"),
                                             "So 24.</reason>\n<answer>\\boxed{24}</answer>"])
    fmt = ChatFormat(smol_tokenizer, "rstar2-paper")
    traj = await run_agent("How many colorings?", engine, sandbox, fmt, AgentConfig(max_turns=5))
    assert traj.stop_reason == "answer" and not engine.texts
    ok, failed, echoed = (t.tool_calls[0] for t in traj.turns[:3])
    assert ok.response == "Total valid colorings: 24\n"
    assert failed.response.startswith("tool call failed\nreason: error message: Traceback (most recent call last):")
    assert failed.response.rstrip().endswith("IndexError: list index out of range")
    assert echoed.response == "True\n"
    inserted = fmt.decode(fmt.tool_response_ids([ok.response], turn_ended_with_eos=True))
    assert inserted == ("\n<|im_start|>user\n<tool_response>\nTotal valid colorings: 24\n\n</tool_response><|im_end|>"
                        "\n<|im_start|>assistant\n<reason>")
    assert inserted in fmt.decode(traj.response_ids)


async def test_at_the_turn_cap_the_last_turns_calls_are_recorded_not_run(smol_tokenizer, sandbox):
    """The release's loop stops before the calls of the turn that reaches the cap: they are recorded (BFCL's
    single-turn check reads them) but not run, nothing is inserted after them, and they are not tool errors."""
    engine = ScriptedEngine(smol_tokenizer, ["One.\n" + call(PAPER_TOOL, "print(6 * 7)"),
                                             "Two.\n" + call(PAPER_TOOL, "open('/tmp/ran-at-the-cap', 'w')")])
    fmt = ChatFormat(smol_tokenizer, "rstar2-paper")
    traj = await run_agent("What is 6 * 7?", engine, sandbox, fmt, AgentConfig(max_turns=2))
    assert traj.stop_reason == "max_turns" and not engine.texts and len(traj.turns) == 2
    ran, capped = traj.turns[0].tool_calls[0], traj.turns[1].tool_calls[0]
    assert ran.status == "ok" and ran.response == "42\n"
    assert capped.status == "not_run" and capped.response == "" and not capped.failed and capped.name == PAPER_TOOL
    assert traj.turns[1].inserted_tokens == 0 and fmt.decode(traj.response_ids).count("<tool_response>") == 1


def test_a_call_that_does_not_decode_is_answered_with_its_error_message():
    (bad,) = PaperFormat().parse('<tool_call>{"name": "execute_python_code_with_standard_io", "arguments": }'
                                   "</tool_call>", [PAPER_SCHEMA], 1)
    assert bad.error.startswith("tool call failed\nreason: error message: Failed to decode tool call: ")
    assert PaperFormat.result_text(bad, None, 2048) == bad.error


def test_each_profile_answers_the_other_s_name_for_the_python_tool():
    """The public checkpoint learned the paper's name; served in the release's profile its calls still run (and a
    release-trained model's calls run in the paper's profile)."""
    (c,) = ReleaseFormat().parse(call(PAPER_TOOL, "print(1)"), [RELEASE_SCHEMA], 1)
    assert (c.name, c.error, c.arguments) == (RELEASE_TOOL, None, {"code": "print(1)", "input": ""})
    (c,) = PaperFormat().parse(call(RELEASE_TOOL, "print(1)"), [PAPER_SCHEMA], 1)
    assert (c.name, c.error) == (PAPER_TOOL, None)
    (c,) = PaperFormat().parse(call("search", "x"), [PAPER_SCHEMA], 1)
    assert c.error.startswith("tool call failed\nreason: error message: Error when executing tool: ")


def test_history_renders_assistant_turns_as_written_so_sft_can_teach_the_profile(smol_tokenizer):
    from rstar2_agent.train.data.chat_data import render

    fmt = ChatFormat(smol_tokenizer, "rstar2-paper")
    record = {"messages": [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": "<reason>Compute.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": PAPER_TOOL,
                                                          "arguments": json.dumps({"code": "6*7", "input": ""})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42\n"},
        {"role": "assistant", "content": "<reason>It is 42.</reason>\n<answer>\\boxed{42}</answer>"}]}
    ex = render(fmt, record)
    text = smol_tokenizer.decode(ex.ids)
    assert "<|im_start|>assistant\n<reason>It is 42.</reason>" in text  # no problem prefix on the answer turn
    target = smol_tokenizer.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if m])
    assert "\\boxed{42}</answer><|im_end|>" in target and "This is the problem" not in target
    assert "<tool_response>" not in target


# ------------------------------------------------------------------ template
def test_the_template_profile_prompt_is_the_tokenizer_s_own_apply_chat_template(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer, "template", chat_template=TOOL_TEMPLATE)
    messages = [{"role": "user", "content": "What is 2**10?"}]
    expected = smol_tokenizer.apply_chat_template(messages, tools=[STATELESS_SCHEMA], chat_template=TOOL_TEMPLATE,
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert fmt.render_prompt("What is 2**10?") == list(expected)
    assert fmt.render_prompt(messages) == list(expected)
    assert '"name": "execute_python_code_with_standard_io"' in fmt.decode(list(expected))


async def test_a_template_trajectory_is_the_template_s_rendering_of_the_whole_conversation(smol_tokenizer, sandbox):
    """Token-in/token-out against the oracle: prompt + generated turns + inserted tool messages equal the template's
    rendering of the same conversation (calls as the model wrote them, results as `tool` messages)."""
    turn = "I will compute.\n" + call("execute_python_code_with_standard_io", "print(6*7)")
    engine = ScriptedEngine(smol_tokenizer, [turn, "It is 42."])
    fmt = ChatFormat(smol_tokenizer, "template", chat_template=TOOL_TEMPLATE)
    traj = await run_agent("What is 6*7?", engine, sandbox, fmt, AgentConfig(max_turns=3))
    assert traj.stop_reason == "no_tool_call"
    (rec,) = traj.turns[0].tool_calls
    assert json.loads(rec.response)["stdout"] == "42\n"
    conversation = [{"role": "user", "content": "What is 6*7?"},
                    {"role": "assistant", "content": "I will compute.", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": rec.name, "arguments": rec.arguments}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": rec.response},
                    {"role": "assistant", "content": "It is 42."}]
    expected = smol_tokenizer.apply_chat_template(conversation, tools=[STATELESS_SCHEMA], chat_template=TOOL_TEMPLATE,
                                                  tokenize=False)
    assert fmt.decode(traj.prompt_ids + traj.response_ids) == expected.rstrip("\n")


@pytest.mark.slow
def test_rstar2_chat_template_format_sends_the_user_text_alone_plus_the_tool(tiny_smollm2, smol_tokenizer):
    q = "What is 2**10?"
    expected = smol_tokenizer.apply_chat_template([{"role": "user", "content": q}], tools=[STATELESS_SCHEMA],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat_prompt_ids(q, "template", tiny_smollm2) == list(expected)


def test_one_record_set_teaches_each_profile_its_own_turns(smol_tokenizer):
    """Generated SFT records keep the problem and the raw tool result: the paper's profile writes the problem after
    its prefix and the result as bare output; hermes keeps its own wrapping and JSON result."""
    from rstar2_agent.synthetic import conversations
    from rstar2_agent.train.data.chat_data import render

    record = conversations(0, 1)[0]
    problem = next(m["problem"] for m in record["messages"] if m["role"] == "user")
    stdout = next(m["result"]["stdout"] for m in record["messages"] if m["role"] == "tool")
    paper = smol_tokenizer.decode(render(ChatFormat(smol_tokenizer, "rstar2-paper"), record).ids)
    assert PROBLEM_PREFIX + problem + "<|im_end|>" in paper and "Please reason step by step" not in paper
    assert f"<tool_response>\n{stdout}\n</tool_response>" in paper and '"status"' not in paper
    assert paper.startswith("<|im_start|>system\nA conversation between User and Assistant.")
    hermes = smol_tokenizer.decode(render(ChatFormat(smol_tokenizer, "hermes"), record).ids)
    assert "Please reason step by step" in hermes and '"status": "success"' in hermes


async def test_every_generation_of_a_trajectory_has_its_own_seed(smol_tokenizer, sandbox):
    """A seeded trajectory's first call keeps its seed and each later turn gets another (one seed reused at every
    turn would restart the engine's sampling noise there), derived so that neighbouring trajectories' seeds do not
    replay each other's turns."""
    async def trajectory_seeds(seed: int) -> list[int | None]:
        engine = ScriptedEngine(smol_tokenizer, ["Count.\n" + call(PAPER_TOOL, "print(2)"),
                                                 "Again.\n" + call(PAPER_TOOL, "print(3)"),
                                                 "So 3.</reason>\n<answer>\\boxed{3}</answer>"])
        sampling = SamplingParams(seed=seed)
        traj = await run_agent("How many?", engine, sandbox, ChatFormat(smol_tokenizer, "rstar2-paper"),
                               AgentConfig(max_turns=5, sampling=sampling))
        assert traj.stop_reason == "answer"
        return engine.seeds

    first, second = await trajectory_seeds(7), await trajectory_seeds(8)
    assert first[0] == 7 and second[0] == 8 and len(first) == 3
    assert len(set(first + second)) == 6
    assert await trajectory_seeds(7) == first  # derived, not drawn: a resumed run repeats them
