"""The rStar2 chat format: prompt rendering, the tool schema, THE tool-call parser, tool-response rendering.

Everything the model sees goes through here, as token ids, for serve, eval and train alike.

The formats share one interface:
- `hermes` (rStar2-Agent): calls are `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` in the
  assistant turn; results come back as a `user` turn of `<tool_response>` blocks.
- `markdown` (Qwen2.5-Math tool-integrated reasoning): a fenced ```python block followed by ```output runs;
  generation stops at ```output and the program's output is inserted in the same assistant turn, closed
  by ```. Small models that never learned Hermes still write fenced Python.

The parser never raises: malformed JSON, an unknown tool, missing, extra or mistyped arguments and calls
past the per-turn cap all become calls with `error` set, which the loop answers with a tool response
that says what was wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import paper_format, release_format
from .paper_format import PaperFormat
from .release_format import ReleaseFormat
from .sandbox.tools import STATELESS_SCHEMA, STATELESS_TOOL
from .tool_calls import ToolCall, cap_calls, validate_arguments

SYSTEM_PROMPT = (
    "You are a helpful assistant. Solve the user's problem by reasoning step by step. When you are done, "
    "give the final answer inside <answer> and </answer>, with the final value in \\boxed{}, for example: "
    "<answer>The answer is \\boxed{42}.</answer>"
)
HERMES_TOOLS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
MARKDOWN_TOOLS = (
    "\n\nYou can run Python: write a program in a ```python block, then write ```output on the next line. "
    "The program's output will appear in the output block, and you continue from there."
)
USER_TEMPLATE = (
    "{problem}\n\nPlease reason step by step. Put your final answer inside <answer></answer> tags, "
    "with the final value in \\boxed{{}}."
)
# Used when a tokenizer has no chat template (base models).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_MARK_B, _MARK_C = "\x00rstar2-assistant\x00", "\x00rstar2-tool\x00"


def default_tools() -> list[dict[str, Any]]:
    return [STATELESS_SCHEMA]



# ---------------------------------------------------------------------------------------------- formats
class HermesFormat:
    name = "hermes"
    max_calls_per_turn = 8  # calls past it are answered with an error
    max_tool_output_chars = 2048  # per stream, per call
    stop: list[str] = []  # the turn ends at the end-of-turn token; calls are parsed from the whole turn
    soft_stop: list[str] = []
    user_turn_results = True
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def tools_prompt(self, tools: list[dict[str, Any]]) -> str:
        return HERMES_TOOLS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))

    def parse(self, text: str, tools: list[dict[str, Any]], max_calls: int) -> list[ToolCall]:
        calls = [self._one(m.group(1), m.group(0), tools) for m in self._CALL.finditer(text)]
        end = text.rfind("</tool_call>")
        tail = text[end + len("</tool_call>"):] if end >= 0 else text
        if "<tool_call>" in tail:
            raw = tail[tail.index("<tool_call>"):]
            calls.append(ToolCall("", {}, raw, "the tool call was not closed: end it with </tool_call>"))
        return cap_calls(calls, max_calls)

    def _one(self, body: str, raw: str, tools: list[dict[str, Any]]) -> ToolCall:
        try:
            obj = json.loads(body.strip())
        except ValueError as e:
            return ToolCall("", {}, raw, f"the tool call is not valid JSON ({e}); write "
                            '{"name": "<tool name>", "arguments": {...}} inside <tool_call></tool_call>')
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCall("", {}, raw, 'the tool call must be a JSON object with a "name" string and an '
                            '"arguments" object')
        name, args = obj["name"], obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return ToolCall(name, {}, raw, f'the "arguments" of {name!r} must be a JSON object')
        extra_keys = set(obj) - {"name", "arguments"}
        if extra_keys:
            return ToolCall(name, args if isinstance(args, dict) else {}, raw,
                            f"unexpected field(s) {', '.join(sorted(extra_keys))} in the tool call; use only "
                            '"name" and "arguments"')
        return ToolCall(name, args if isinstance(args, dict) else {}, raw, validate_arguments(name, args, tools))

    def results_text(self, results: list[str], turn_text: str = "") -> str:
        return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + \
            "\n</tool_call>"


class MarkdownFormat:
    """A closed ```python block at the end of the generated text runs: either followed by ```output (the
    Qwen2.5-Math TIR form) or just closed by ``` (what small models write). Generation stops at both; a stop
    at any other fence is not a call, and the loop lets the model go on."""

    name = "markdown"
    max_calls_per_turn = 1
    max_tool_output_chars = 2048
    stop = ["```output", "```\n"]
    soft_stop = ["```\n"]  # also ends other fences: the loop resumes the turn then
    user_turn_results = False
    _OPEN = "```python"

    def tools_prompt(self, tools: list[dict[str, Any]]) -> str:
        return MARKDOWN_TOOLS

    def parse(self, text: str, tools: list[dict[str, Any]], max_calls: int) -> list[ToolCall]:
        wants_output = text.endswith("```output")
        body = text[: -len("```output")].rstrip() if wants_output else text
        if not (body.endswith("```") if wants_output else body.endswith("```\n")):
            return [self._no_block()] if wants_output else []
        start = body.rfind(self._OPEN)
        inner = body[start + len(self._OPEN):].rstrip()[:-3] if start >= 0 else ""
        if start < 0 or "```" in inner or not inner.startswith(("\n", " ", "\t")):
            return [self._no_block()] if wants_output else []  # the fence closed some other block
        code = inner.split("\n", 1)[1] if "\n" in inner else ""
        return [ToolCall(STATELESS_TOOL, {"code": code, "input": ""}, body[start:])]

    @staticmethod
    def _no_block() -> ToolCall:
        return ToolCall(STATELESS_TOOL, {}, "```output", "an ```output block must follow a ```python block")

    def results_text(self, results: list[str], turn_text: str = "") -> str:
        opener = "" if turn_text.endswith("```output") else "```output"
        return opener + "\n" + "\n".join(results) + "\n```\n"

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"```python\n{arguments.get('code', '')}\n```\n```output"


class TemplateFormat(HermesFormat):
    """Any tool-calling model in its own format: the model's chat template renders the conversation with the tools
    passed as `tools=` and the results as `tool` messages (as vLLM and SGLang render it); Hermes calls are parsed."""

    name = "template"


FORMAT_RULES = {"hermes": HermesFormat, "markdown": MarkdownFormat, "rstar2-release": ReleaseFormat,
             "rstar2-paper": PaperFormat, "template": TemplateFormat}
FORMATS = tuple(FORMAT_RULES)  # the formats: `--format` on chat, serve, eval, train
FIXED_TEMPLATE = (ReleaseFormat.name, PaperFormat.name)  # rendered by release_format, not the model's template


# ---------------------------------------------------------------------------------------------- results
def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = text[: limit // 2]
    tail = text[len(text) - limit // 2:]
    return f"{head}\n...[{len(text) - len(head) - len(tail)} characters cut]...\n{tail}"


def format_result(call: ToolCall, result: Any | None, max_chars: int, format_name: str) -> str:
    """The text the model reads for one call: an error, or status, stdout, stderr and time, each cut."""
    if format_name in FIXED_TEMPLATE:
        return FORMAT_RULES[format_name].result_text(call, result, max_chars)
    if call.error is not None:
        body = {"name": call.name or None, "status": "failure", "error": call.error}
        return f"Error: {call.error}" if format_name == "markdown" else json.dumps(body, ensure_ascii=False)
    assert result is not None
    stdout, stderr = truncate(result.stdout, max_chars), truncate(result.stderr, max_chars)
    if format_name == "markdown":
        text = stdout + (("\n" if stdout and not stdout.endswith("\n") else "") + stderr if stderr else "")
        if str(result.status) not in ("ok", "error"):
            text += f"\n[{result.status}]"
        return text.strip("\n")
    body = {"name": call.name, "status": "success" if result.ok else f"failure: {result.status}",
            "stdout": stdout, "stderr": stderr, "execution_time": f"{result.duration:.3f}s"}
    return json.dumps(body, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- records
# SFT records (OpenAI-style messages) may carry what a turn was made of, so one record set teaches any format:
# a user turn's `problem` (each format wraps it its own way) and a tool turn's `result` (an ExecResult as a dict:
# each format writes its own tool response text). `for_format` writes those turns as the format does.
def problem_message(problem: str) -> dict[str, Any]:
    return {"role": "user", "content": USER_TEMPLATE.format(problem=problem), "problem": problem}


def tool_message(call_id: str, name: str, result: Any) -> dict[str, Any]:
    """A tool turn for a call that ran (result: an ExecResult), written as hermes writes it, with the raw result."""
    text = format_result(ToolCall(name, {}, id=call_id), result, HermesFormat.max_tool_output_chars, "hermes")
    shown = {k: v for k, v in result.to_dict().items() if k in ("status", "stdout", "stderr", "exit_code", "duration")}
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text, "result": shown}


def for_format(fmt: ChatFormat, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from .sandbox.types import ExecResult

    out = []
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("problem"), str):
            m = {**m, "content": fmt.user_content(m["problem"])}
        elif m.get("role") == "tool" and isinstance(m.get("result"), dict):
            name = fmt.tools[0].get("function", fmt.tools[0])["name"] if fmt.tools else m.get("name", "")
            call = ToolCall(name, {}, id=m.get("tool_call_id", ""))
            m = {**m, "content": format_result(call, ExecResult.from_dict(m["result"]),
                                               fmt.rules.max_tool_output_chars, fmt.rules.name)}
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------------- answers
def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end(): i - 1].strip()
    return best


def answer_blocks(text: str) -> list[str]:
    return re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)


def well_formed_answer(text: str) -> bool:
    """The response ends its answer as the format asks: its last <answer> block holds a \\boxed{} (GRPO-RoC's
    format penalty and eval's format share both use this)."""
    blocks = answer_blocks(text)
    return bool(blocks) and last_boxed(blocks[-1]) is not None


def format_check(traj: Any) -> dict[str, bool]:
    """What the SFT stage teaches: the first turn makes well-formed tool calls; the answer is in
    <answer>\\boxed{}</answer>."""
    first = traj.turns[0].tool_calls if traj.turns else []
    return {"first_turn_call": bool(first) and all(c.error is None for c in first),
            "answer_block": well_formed_answer(traj.text)}


# How the final answer is read from a response (what `answer_scope` hands over: the model's text, tool responses left
# out). `paper` (the default): the last \\boxed{} after the last tool response, wherever it stands: the paper's prompt
# says the answer "will be extracted automatically by the \\boxed{} tag", and RoC's p_format has a case for correct
# answers without an <answer> tag, so a missing or malformed block is what p_format measures, not a zero reward.
# `answer_block`: the last \\boxed{} of the last <answer> block, nothing without one (stricter than the paper: a
# format reward). `release`: the release's reward over the whole response: the last \\boxed{} anywhere (verl's
# prime_math), and where there is none math-verify's own extraction over the whole text (grading/math.py).
EXTRACTIONS = ("paper", "answer_block", "release")


def default_extraction(format_name: str) -> str:
    """The extraction a format's prompt asks for: every format of ours asks for <answer>\\boxed{}</answer>;
    the template format sends the user's text alone, so nothing asks for an answer block there."""
    return "release" if format_name == TemplateFormat.name else "paper"


def extract_answer(text: str, mode: str = "paper") -> str | None:
    """The answer a response gives, read as `mode` says (EXTRACTIONS); `text` as `answer_scope` gives it."""
    if mode not in EXTRACTIONS:
        raise ValueError(f"unknown answer extraction {mode!r}; choose one of {', '.join(EXTRACTIONS)}")
    if mode != "answer_block":
        return last_boxed(text)
    blocks = answer_blocks(text)
    return last_boxed(blocks[-1]) if blocks else None


def answer_scope(traj: Any, mode: str = "paper") -> str:
    """The text an extraction reads of a trajectory: `paper`, the model's turns after its last tool response (the
    final answer; a \\boxed{} written before a tool call is not one); the others, all the model's turns."""
    return traj.final_text if mode == "paper" else traj.text


# ---------------------------------------------------------------------------------------------- rendering
class ChatFormat:
    """Renders conversations to token ids with the model's chat template and parses what it writes."""

    def __init__(self, tokenizer: Any, format_name: str = "hermes", chat_template: str | None = None,
                 tools: list[dict[str, Any]] | None = None):
        if format_name not in FORMAT_RULES:
            raise ValueError(f"unknown format {format_name!r}; choose one of {', '.join(FORMAT_RULES)}")
        self.tokenizer = tokenizer
        self.rules = FORMAT_RULES[format_name]()
        self.release = format_name == ReleaseFormat.name
        self.fixed = format_name in FIXED_TEMPLATE  # the release's template (or the paper's variant), not the model's
        self.own_template = format_name == TemplateFormat.name  # the model's template with tools=, as vLLM renders
        self.template = chat_template or getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
        if tools is None:
            tools = {ReleaseFormat.name: release_format.default_tools, PaperFormat.name: paper_format.default_tools
                     }.get(format_name, default_tools)()
        self.tools = tools
        self.eos_text: str = tokenizer.eos_token
        self.eos_id: int = tokenizer.eos_token_id
        self.stop_token_ids: list[int] = []  # ids that end a turn besides the engine's end of sequence
        if self.fixed:  # the template ends every turn with <|im_end|>, whatever the tokenizer's eos is
            end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(end, int) and end != tokenizer.unk_token_id:
                self.eos_text, self.eos_id, self.stop_token_ids = "<|im_end|>", end, [end]
        self._after_assistant = "" if self.fixed or self.own_template else self._probe_turn_suffix()

    def _apply(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None, problem_prefix: bool = True) -> str:
        tools = self.tools if tools is None else tools
        if self.fixed:
            return release_format.render(messages, tools, add_generation_prompt, prefix_assistant=self.release,
                                         default_system=self.rules.system, problem_prefix=problem_prefix)
        extra = {"tools": tools or None} if self.own_template else {}
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **extra)

    def _probe_turn_suffix(self) -> str:
        """What the template puts between an assistant's content and the next user turn's content, and after
        it up to the next assistant header, with the tool marker where the content goes."""
        probe = self._apply([{"role": "system", "content": "S"}, {"role": "user", "content": "A"},
                             {"role": "assistant", "content": _MARK_B}, {"role": "user", "content": _MARK_C}],
                            add_generation_prompt=True)
        return probe[probe.index(_MARK_B) + len(_MARK_B):]

    # -- prompts
    def system_prompt(self, tools: list[dict[str, Any]] | None = None, base: str = SYSTEM_PROMPT) -> str:
        tools = self.tools if tools is None else tools
        return base + (self.rules.tools_prompt(tools) if tools else "")

    def user_content(self, problem: str) -> str:
        """A user turn for a problem: wrapped as rStar2 asks (the release's template wraps it itself)."""
        return problem if self.fixed or self.own_template else USER_TEMPLATE.format(problem=problem)

    def messages_for(self, prompt: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
                     ) -> list[dict[str, str]]:
        """A problem (wrapped as rStar2 asks) or OpenAI-style messages -> plain role/content messages (for the
        release's template and the model's own: messages with their tool calls, arguments as objects, as vLLM gives
        templates; a problem is the user's text alone)."""
        if self.fixed or self.own_template:
            return _structured_messages(prompt)
        if isinstance(prompt, str):
            return [{"role": "system", "content": self.system_prompt(tools)},
                    {"role": "user", "content": self.user_content(prompt)}]
        out: list[dict[str, str]] = []
        pending_results: list[str] = []
        for m in prompt:
            role, content = m.get("role"), _text(m.get("content"))
            if role == "tool":
                pending_results.append(content)
                continue
            if pending_results:  # consecutive tool results become one user turn
                out.append({"role": "user", "content": self.rules.results_text(pending_results)})
                pending_results = []
            if role == "system":
                out.append({"role": "system", "content": self.system_prompt(tools, base=content)})
            elif role == "assistant":
                calls = [self.rules.render_call(c["function"]["name"], _args(c["function"].get("arguments")))
                         for c in m.get("tool_calls") or []]
                out.append({"role": "assistant", "content": "\n".join([content, *calls]).strip("\n")})
            else:
                out.append({"role": str(role), "content": content})
        if pending_results:
            out.append({"role": "user", "content": self.rules.results_text(pending_results)})
        if not out or out[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": self.system_prompt(tools)})
        return out

    def render_prompt(self, prompt: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                      problem_prefix: bool = True) -> list[int]:
        """The prompt's ids, up to and including the generation prompt. `problem_prefix=False`, for messages that
        are not a math problem (IFEval, Arena-Hard, BFCL in their own prompts): the rStar2 formats' templates leave
        out the math-problem instruction they put before every user turn (the other formats never add it to
        messages)."""
        return self.encode(self._apply(self.messages_for(prompt, tools), True, tools, problem_prefix))

    # -- tool responses
    def tool_response_ids(self, results: list[str], turn_ended_with_eos: bool, turn_text: str = "") -> list[int]:
        """The exact ids inserted after an assistant turn: for hermes the end of that turn, a user turn of
        <tool_response> blocks and the next assistant header; for markdown the output block."""
        if self.release:  # the release's loop: right after the model's <|im_end|>, no newline
            return self.encode(release_format.tool_response_text(results))
        if self.fixed:  # the paper's format: as its template renders the whole conversation (SFT renders that too)
            end = "\n" if turn_ended_with_eos else self.eos_text + "\n"
            return self.encode(end + release_format.tool_response_text(results))
        if self.own_template:
            return self.encode(self._template_results(results, turn_ended_with_eos))
        if not self.rules.user_turn_results:
            return self.encode(self.rules.results_text(results, turn_text))
        text = self._after_assistant.replace(_MARK_C, self.rules.results_text(results))
        if turn_ended_with_eos and text.startswith(self.eos_text):
            text = text[len(self.eos_text):]
        return self.encode(text)

    def user_turn_ids(self, text: str, turn_ended_with_eos: bool) -> list[int]:
        """The ids that continue a conversation after the assistant's last turn with the question `text` (a
        multi-turn chat): the end of that turn (left out where the model ended it with the end-of-turn token), the
        user turn as the template renders one after an assistant turn, and the generation prompt. Worked out on a
        probe conversation rendered with and without the new user turn; only the new part is encoded, so the
        conversation before it is never re-tokenized. ValueError where the template cannot be continued so."""
        before = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _MARK_B}]
        closed = self._apply(self.messages_for(before), False)
        opened = self._apply(self.messages_for([*before, {"role": "user", "content": self.user_content(text)}]), True)
        turn_end, new = (t[t.index(_MARK_B) + len(_MARK_B):] for t in (closed, opened))
        if not new.startswith(turn_end):
            raise ValueError(f"the {self.rules.name} template ends an assistant turn differently when a user turn "
                             "follows")
        if turn_ended_with_eos:
            if not new.startswith(self.eos_text):
                raise ValueError(f"the {self.rules.name} template does not end an assistant turn with "
                                 f"{self.eos_text!r}, the token the model ended its answer with")
            new = new[len(self.eos_text):]
        return self.encode(new)

    def _template_results(self, results: list[str], turn_ended_with_eos: bool) -> str:
        """The model's template rendering `tool` messages after an assistant turn with calls, from the end of that
        turn to the next assistant header (the ids vLLM's chat endpoint would put there on the next request)."""
        name = (self.tools[0].get("function", self.tools[0])["name"]) if self.tools else "tool"
        ids = [f"call_{i}" for i in range(len(results))]
        probe = [{"role": "user", "content": "A"},
                 {"role": "assistant", "content": _MARK_B, "tool_calls": [
                     {"id": i, "type": "function", "function": {"name": name, "arguments": {}}} for i in ids]},
                 *({"role": "tool", "tool_call_id": i, "content": r} for i, r in zip(ids, results, strict=True))]
        text = self._apply(probe, add_generation_prompt=True)
        end = text.find(self.eos_text, text.index(_MARK_B) + len(_MARK_B))
        if end < 0:
            raise ValueError(f"the chat template does not end an assistant turn with {self.eos_text!r}; the template "
                             "format cannot insert tool results token-exactly: use --format hermes")
        text = text[end:]
        return text[len(self.eos_text):] if turn_ended_with_eos else text

    def parse(self, text: str, max_calls: int, tools: list[dict[str, Any]] | None = None) -> list[ToolCall]:
        try:
            return self.rules.parse(text, self.tools if tools is None else tools, max_calls)
        except Exception as e:  # noqa: BLE001 - the parser must never raise into the loop
            return [ToolCall("", {}, text[-200:], f"the tool call could not be read ({type(e).__name__})")]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts ({"type": "text", "text": ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _structured_messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    out = []
    for m in prompt:
        msg = {"role": m.get("role"), "content": _text(m.get("content"))}
        if m.get("tool_calls"):
            msg["tool_calls"] = [{"id": c.get("id", f"call_{j}"), "type": "function",
                                  "function": {"name": c["function"]["name"],
                                               "arguments": _args(c["function"].get("arguments"))}}
                                 for j, c in enumerate(m["tool_calls"])]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _args(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
