"""The `rstar2-release` format: the prompt, tool calls and tool responses the released checkpoint saw.

Reproduced from the release (microsoft/rStar: the trainer config's `custom_chat_template`, the tool config, the
`rstar2_agent_hermes` tool parser and the agent loop), not included from it; tests render the release's own
template and compare text and token ids.

- `render(messages, tools, add_generation_prompt)`: the release's chat template. A system turn (the given system
  message, else the release's default prompt) with the Hermes tools block; every user turn, and every assistant
  turn without tool calls, prefixed with PROBLEM_PREFIX; calls written back as `<tool_call>` JSON; consecutive
  `tool` messages merged into one user turn of `<tool_response>` blocks; the generation prompt opens `<reason>`.
- `tool_response_text(results)`: what the release's loop inserts after a turn with calls: the template's
  rendering of the tool messages with the generation prompt, less its system turn (the release renders
  `[tool messages]` and cuts off the ids of the template's empty-conversation system turn). It starts at
  `<|im_start|>user`, right after the model's `<|im_end|>`, with no newline between them.
- `ReleaseFormat.parse`: the release's parser: nothing unless both `<tool_call>` and `</tool_call>` occur; each
  `<tool_call>...</tool_call>` body is JSON with "name" and "arguments", else it is answered
  `Failed to decode tool call: <error>`; only the first `max_calls` calls are answered (the release's
  `max_parallel_calls`, verl's default 1), the rest are dropped without an answer, as the release drops them.
  The release knew one tool; other tools (a client's on `rstar2 serve`, BFCL's functions) keep their arguments as
  written, and a caller that wants every call (BFCL, client tools) passes a larger `max_calls`.
- `result_text(call, result, max_chars)`: "Tool call success/failure" (sandbox/release_tool.py), cut to
  `max_chars` characters keeping both ends around `...(truncated)...` (verl's `max_tool_response_length`,
  default 256, `tool_response_truncate_side: middle`, which the release's config does not change).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .sandbox.release_tool import RELEASE_SCHEMA, RELEASE_TOOL, response
from .sandbox.tools import STATELESS_TOOL as PAPER_TOOL
from .sandbox.types import ExecResult
from .tool_calls import ToolCall

DEFAULT_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The "
    "Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>."
)
TOOLS_OPEN = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_CLOSE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
PROBLEM_PREFIX = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your "
    "final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n"
)
GENERATION_PROMPT = "<|im_start|>assistant\n<reason>"
MAX_CALLS_PER_TURN = 1  # verl's max_parallel_calls default; the release's config keeps it
MAX_RESPONSE_CHARS = 256  # verl's max_tool_response_length default; the release's config keeps it


def _json(value: Any) -> str:
    """transformers' `tojson` filter for chat templates."""
    return json.dumps(value, ensure_ascii=False)


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool, prefix_assistant: bool = True, default_system: str = DEFAULT_SYSTEM,
           problem_prefix: bool = True) -> str:
    """The release's template. `prefix_assistant=False` (the rstar2-paper format) leaves assistant turns without
    tool calls as written: the release template's prefix on them is a quirk of its code, not in the paper.
    `default_system`: the system prompt when the messages bring none (the paper's format: its Figure 3's).
    `problem_prefix=False`: user turns as written, without the math-problem instruction (the paper's non-math
    benchmarks, in their own prompts)."""
    prefix = PROBLEM_PREFIX if problem_prefix else ""
    first = messages[0] if messages else {}
    system = first.get("content") if first.get("role") == "system" else None
    system = default_system if system is None else system
    if tools:
        out = ["<|im_start|>system\n", system, TOOLS_OPEN, *("\n" + _json(t) for t in tools), TOOLS_CLOSE]
    else:
        out = ["<|im_start|>system\n", system, "<|im_end|>\n"]
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        plain_assistant = role == "assistant" and not m.get("tool_calls")
        if plain_assistant and not prefix_assistant:
            out.append(f"<|im_start|>assistant\n{content}<|im_end|>\n")
        elif role == "user" or (role == "system" and i > 0) or plain_assistant:
            out.append(f"<|im_start|>{role}\n{prefix}{content}<|im_end|>\n")
        elif role == "assistant":
            out.append("<|im_start|>assistant" + (f"\n{content}" if content else ""))
            for call in m["tool_calls"]:
                fn = call.get("function", call)
                out.append(f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {_json(fn["arguments"])}}}'
                           "\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1].get("role") != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1].get("role") != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append(GENERATION_PROMPT)
    return "".join(out)


def tool_response_text(results: list[str]) -> str:
    """The same for the release and the paper's format (tool turns and the generation prompt only)."""
    return render([{"role": "tool", "content": r} for r in results], None, True)[len(render([], None, False)):]


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return text[:keep] + "...(truncated)..." + text[len(text) - keep:]


class ReleaseFormat:
    name = "rstar2-release"
    system = DEFAULT_SYSTEM  # the system prompt when a conversation brings none
    stop: list[str] = []  # a turn ends at <|im_end|>
    soft_stop: list[str] = []
    user_turn_results = True
    max_calls_per_turn = MAX_CALLS_PER_TURN
    max_tool_output_chars = MAX_RESPONSE_CHARS
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str, tools: list[dict[str, Any]], max_calls: int) -> list[ToolCall]:
        if "<tool_call>" not in text or "</tool_call>" not in text:
            return []
        calls = []
        for m in self._CALL.finditer(text):
            try:
                obj = json.loads(m.group(1))
                name, args = obj["name"], obj["arguments"]
            except Exception as e:  # noqa: BLE001 - the release answers any failure with its message
                calls.append(ToolCall("", {}, m.group(0), self.failure(f"Failed to decode tool call: {e}")))
                continue
            calls.append(self._call(name, args, m.group(0), tools))
        return calls[:max_calls]

    python_tool = RELEASE_TOOL  # the format's own Python tool; the other format's name for it is answered too
    alias = PAPER_TOOL

    @staticmethod
    def failure(message: str) -> str:
        """How the format words a call it could not run (the release's loop: the message as it is)."""
        return message

    def _call(self, name: Any, args: Any, raw: str, tools: list[dict[str, Any]]) -> ToolCall:
        """A decoded call, or the error the release's tool runner answers it with."""
        known = {t.get("function", t).get("name") for t in tools}
        arguments = args if isinstance(args, dict) else {}
        if name == self.alias and self.alias not in known and self.python_tool in known:
            name = self.python_tool  # the release and the paper name the same tool differently: answer both
        try:
            if name not in known:
                raise KeyError(name)
            if name != self.python_tool:  # a client's or a benchmark's function: its arguments as written
                if not isinstance(args, dict):
                    raise TypeError(f"the arguments of {name} must be a JSON object, not {type(args).__name__}")
                return ToolCall(name, args, raw)
            code, stdin = args.get("code", ""), args.get("input", "")
            if not isinstance(code, str):
                code.encode()
        except Exception as e:  # noqa: BLE001 - as the release's loop words it
            return ToolCall(str(name), arguments, raw, self.failure(f"Error when executing tool: {e}"))
        if stdin is not None and not isinstance(stdin, str):
            return ToolCall(str(name), arguments, raw, self.invalid_input())
        return ToolCall(name, {"code": code, "input": stdin or ""}, raw)

    @staticmethod
    def invalid_input() -> str:
        return "Tool call failure\nreason: invalid_input\nexecution time: 0.00s"

    @staticmethod
    def result_text(call: ToolCall, result: ExecResult | None, max_chars: int) -> str:
        if call.error is not None:  # not cut: the release answers these before its truncation
            return call.error
        assert result is not None
        return truncate(response(result), max_chars)

    @staticmethod
    def tools_prompt(tools: list[dict[str, Any]]) -> str:
        return TOOLS_OPEN + "".join("\n" + _json(t) for t in tools) + TOOLS_CLOSE


def default_tools() -> list[dict[str, Any]]:
    return [RELEASE_SCHEMA]


__all__ = ["RELEASE_TOOL", "ReleaseFormat", "default_tools", "render", "tool_response_text"]
