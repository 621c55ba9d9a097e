"""The shapes of POST /v1/responses (OpenAI's Responses API): the request and its checks, the input items as the
chat messages the formats render, and the output items with the stream events that build them.

What the server cannot do is refused by name (400, `param` naming the field, as chat completions does); fields
that change nothing here are accepted, or ignored with a log line when they ask for something that is only a hint
(`reasoning.effort`, `text.verbosity`).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .guard import printable
from .protocol import MAX_TOOLS, InvalidField, check_tool, field_path, first_unencodable, names, new_id

log = logging.getLogger("rstar2.serve")

CODE_TOOL = "code_interpreter"
_TEXT_PARTS = ("input_text", "output_text")
_ASSISTANT_ITEMS = ("reasoning", "function_call", "code_interpreter_call")
_FUNCTION = '{"type": "function", "name": "...", "description": "...", "parameters": {<JSON Schema>}}'
_CODE = '{"type": "code_interpreter", "container": {"type": "auto"}}'
_MESSAGE = '{"role": "user", "content": "..."}'
# Fields of the API this server does not implement: the values that ask for nothing, and why any other is refused.
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((None, False), "responses run while the request is open; there are no background responses"),
    "truncation": ((None, "disabled"), "the input is never cut to fit: a prompt past the context is refused"),
    "conversation": ((None,), "there is no Conversations API here: chain responses with previous_response_id"),
    "prompt": ((None,), "there are no stored prompt templates: send the text as instructions and input"),
    "max_tool_calls": ((None,), "the loop's budget is in turns: send extra_body max_turns"),
    "top_logprobs": ((None, 0), "logprobs are not returned by /v1/responses"),
}
# Accepted as bookkeeping (nothing a model generates depends on them).
IGNORED = {"metadata", "user", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "stream_options"}
INCLUDABLE = ("code_interpreter_call.outputs",)  # always included; any other `include` value is refused
MAX_METADATA = (16, 64, 512)  # pairs, key length, value length (OpenAI's)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    # extensions (extra_body), as on chat completions
    max_turns: int | None = Field(default=None, ge=1, le=100)
    tool_timeout: float | None = Field(default=None, gt=0, le=600)
    format: Literal["hermes", "markdown", "rstar2-release", "rstar2-paper", "template"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _body(cls, body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        loc = first_unencodable(body)
        if loc is not None:
            at = field_path(loc)
            raise InvalidField(at, f"{at} holds a lone surrogate (an escape in \\ud800-\\udfff), which is not "
                                   "text; send valid UTF-8")
        for name, (neutral, why) in REFUSED.items():
            if name in body and body[name] not in neutral:
                raise InvalidField(name, f"{name}={body[name]!r} is not supported: {why}; leave it out")
        unknown = sorted(set(body) - set(cls.model_fields) - IGNORED - set(REFUSED))
        if unknown:
            log.warning("ignored /v1/responses fields this server does not know: %s", names(unknown))
        return body

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, items: Any) -> Any:
        if not isinstance(items, str) and not (isinstance(items, list) and items):
            raise InvalidField("input", f"input must be a string or a non-empty list of items such as {_MESSAGE}")
        for i, item in enumerate(items if isinstance(items, list) else []):
            check_item(item, f"input[{i}]")
        return items

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        seen: set[str] = set()
        for i, tool in enumerate(tools or []):
            name = check_response_tool(tool, f"tools[{i}]")
            if name in seen:
                what = "two code_interpreter tools" if name == CODE_TOOL else f"two tools named {name!r}"
                raise InvalidField(f"tools[{i}]", f"tools[{i}]: {what}; each may appear once")
            seen.add(name)
        if CODE_TOOL in seen and len(seen) > 1:
            raise InvalidField("tools", "code_interpreter together with function tools is not supported: the server "
                                        "runs its code loop only for requests without client functions; send one or "
                                        "the other")
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, choice: Any) -> Any:
        if choice == "required" or isinstance(choice, dict):
            what = '"required"' if choice == "required" else f"naming a tool ({json.dumps(choice)[:80]})"
            raise InvalidField("tool_choice", f"tool_choice {what} is not supported on /v1/responses: use \"auto\" "
                                              "and ask for the call in the input, or /v1/chat/completions, which "
                                              "forces calls on the vllm engine")
        if choice not in (None, "none", "auto"):
            raise InvalidField("tool_choice", f'tool_choice must be "none" or "auto"; got {choice!r}')
        return choice

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        """OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512 (it is stored with the response)."""
        if metadata and len(metadata) > MAX_METADATA[0]:
            raise InvalidField("metadata", f"metadata has {len(metadata)} pairs; at most {MAX_METADATA[0]} are allowed")
        for key, value in (metadata or {}).items():
            if len(key) > MAX_METADATA[1]:
                raise InvalidField("metadata", f"metadata key {printable(key)} is {len(key)} characters long; at "
                                               f"most {MAX_METADATA[1]} are allowed")
            if len(value) > MAX_METADATA[2]:
                raise InvalidField(f"metadata.{key}", f"metadata.{key} is {len(value)} characters long; at most "
                                                      f"{MAX_METADATA[2]} are allowed")
        return metadata

    @field_validator("text")
    @classmethod
    def _text(cls, text: dict[str, Any] | None) -> dict[str, Any] | None:
        fmt = (text or {}).get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
            kind = fmt.get("type") if isinstance(fmt, dict) else fmt
            raise InvalidField("text.format", f"text.format {kind!r} is not supported (no JSON modes here): "
                                              'send {"type": "text"} and ask for JSON in the input')
        if (text or {}).get("verbosity") not in (None, "medium"):
            log.info("text.verbosity %s ignored: the model has one verbosity", printable(text["verbosity"]))
        return text

    @field_validator("reasoning")
    @classmethod
    def _reasoning(cls, reasoning: dict[str, Any] | None) -> dict[str, Any] | None:
        if (reasoning or {}).get("effort") not in (None, "none"):
            log.info("reasoning.effort %s ignored: the model reasons as it was trained to",
                     printable(reasoning["effort"]))
        return reasoning

    @field_validator("include")
    @classmethod
    def _include(cls, include: list[str] | None) -> list[str] | None:
        for i, value in enumerate(include or []):
            if value not in INCLUDABLE:
                raise InvalidField(f"include[{i}]", f"include {value!r} is not supported: this server returns "
                                                    f"{', '.join(INCLUDABLE)} (always) and nothing else to include")
        return include

    def function_tools(self) -> list[dict[str, Any]]:
        """The client's functions in the chat shape the formats render."""
        return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
                for t in self.tools or [] if t["type"] == "function"]

    def code_tool(self) -> dict[str, Any] | None:
        return next((t for t in self.tools or [] if t["type"] == CODE_TOOL), None)


# ---------------------------------------------------------------------------------------------- checks
def check_item(item: Any, at: str) -> None:
    """One input item: a message, a function call or its output, or an output item of an earlier response."""
    if not isinstance(item, dict):
        raise InvalidField(at, f"{at} must be an object such as {_MESSAGE}")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidField(f"{at}.role", f"{at}.role must be user, system, developer or assistant; got {role!r}")
        check_content(item.get("content"), f"{at}.content")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise InvalidField(f"{at}.{key}", f"{at} is a function_call: {key} must be a string")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise InvalidField(f"{at}.call_id", f"{at} is a function_call_output: give the call_id it answers")
        if not isinstance(item.get("output"), str):
            check_content(item.get("output"), f"{at}.output")
    elif kind == "code_interpreter_call":
        for key in ("code", "id"):
            if not isinstance(item.get(key), str | None):
                raise InvalidField(f"{at}.{key}", f"{at}.{key} must be a string")
        outputs = item.get("outputs")
        if outputs is not None and not (isinstance(outputs, list) and all(
                isinstance(o, dict) and isinstance(o.get("logs", ""), str) for o in outputs)):
            raise InvalidField(f"{at}.outputs", f'{at}.outputs must be a list of {{"type": "logs", "logs": "..."}}')
    elif kind == "reasoning":
        for key in ("content", "summary"):
            parts = item.get(key)
            if parts is not None and not (isinstance(parts, list) and all(
                    isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in parts)):
                raise InvalidField(f"{at}.{key}", f'{at}.{key} must be a list of parts {{"type": "...", "text": '
                                                  '"..."}')
    elif kind == "item_reference":
        raise InvalidField(f"{at}.type", f"{at} is an item_reference, which this server does not resolve: send "
                                         "previous_response_id, or the items themselves")
    else:
        raise InvalidField(f"{at}.type", f"{at} is a {kind!r} item, which this server does not take: send messages, "
                                         "function_call and function_call_output items (or earlier output items)")


def check_content(content: Any, at: str) -> None:
    """A string, or a list of text parts (input_text, or output_text from an earlier response)."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidField(at, f'{at} must be a string or a list of text parts {{"type": "input_text", "text": "..."}}')
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise InvalidField(f"{at}[{j}].type", f"{at}[{j}] is a {kind!r} part, but this model reads text only: "
                                                  'send {"type": "input_text", "text": "..."} parts')
        if not isinstance(part.get("text"), str):
            raise InvalidField(f"{at}[{j}].text", f"{at}[{j}].text must be a string")


def check_response_tool(tool: Any, at: str) -> str:
    """A code_interpreter or function tool; its name (code_interpreter for the former)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == CODE_TOOL:
        check_container(tool.get("container"), f"{at}.container")
        return CODE_TOOL
    if kind != "function":
        raise InvalidField(f"{at}.type", f"{at} is a {kind!r} tool, which this server does not have: it runs "
                                         f"{_CODE} in its own sandbox and takes client functions {_FUNCTION}")
    try:
        return check_tool({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}, at)
    except InvalidField as e:  # the chat check names the chat shape's fields
        raise InvalidField(e.param.replace(".function", ""), str(e).replace(".function", "")) from None


def check_container(container: Any, at: str) -> None:
    if isinstance(container, str) and container:
        return
    if not isinstance(container, dict) or container.get("type") != "auto":
        raise InvalidField(at, f'{at} must be {{"type": "auto"}} or the id of a container an earlier response used')
    if container.get("file_ids"):
        raise InvalidField(f"{at}.file_ids", f"{at}.file_ids is not supported: there is no file store; write the "
                                             "data into the input")
    if container.get("memory_limit") is not None:
        raise InvalidField(f"{at}.memory_limit", f"{at}.memory_limit is not supported: the sandbox's limits are the "
                                                 "server's; leave it out")
    policy = container.get("network_policy")
    if policy is not None and (not isinstance(policy, dict) or policy.get("type") != "disabled"):
        raise InvalidField(f"{at}.network_policy", f"{at}.network_policy: the sandbox has no network; leave it out")


# ---------------------------------------------------------------------------------------------- input -> messages
def input_messages(items: str | list[dict[str, Any]], python_tool: str) -> list[dict[str, Any]]:
    """Input items as the chat messages the formats render: output items of an earlier response (reasoning,
    message, function_call, code_interpreter_call) join one assistant message until a tool result or a user turn;
    a code_interpreter_call becomes a call of the format's Python tool (`python_tool`) answered by its logs."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item["role"] != "assistant":
            out.append({"role": "system" if item["role"] == "developer" else item["role"],
                        "content": text_of(item["content"])})
        elif kind == "function_call_output":
            output = item["output"]
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else text_of(output)})
        else:  # a part of an assistant turn
            turn = _open_turn(out)
            if kind == "message":
                turn["content"] = _join(turn["content"], text_of(item["content"]))
            elif kind == "reasoning":
                parts = item.get("content") or item.get("summary") or []
                turn["content"] = _join(turn["content"], "\n\n".join(p.get("text", "") for p in parts))
            elif kind == "function_call":
                turn["tool_calls"].append(chat_call(item["call_id"], item["name"], item["arguments"]))
            else:  # code_interpreter_call: the call and, right after it, its result
                call_id = item.get("id") or new_id("ci")
                turn["tool_calls"].append(chat_call(call_id, python_tool, json.dumps({"code": item.get("code") or "",
                                                                                  "input": ""})))
                logs = "".join(o.get("logs", "") for o in item.get("outputs") or [] if isinstance(o, dict))
                out.append({"role": "tool", "tool_call_id": call_id, "content": logs})
    return out


def with_instructions(instructions: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instructions as the system message, joined with the system messages that open the conversation (one
    system turn: the formats write the tools block into each)."""
    head = [instructions] if instructions else []
    k = 0
    while k < len(messages) and messages[k]["role"] == "system":
        head.append(messages[k]["content"])
        k += 1
    return ([{"role": "system", "content": "\n\n".join(head)}] if head else []) + messages[k:]


def text_of(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _open_turn(out: list[dict[str, Any]]) -> dict[str, Any]:
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": "", "tool_calls": []})
    return out[-1]


def _join(a: str, b: str) -> str:
    return f"{a}\n\n{b}" if a and b else a or b


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A call as a chat message's tool_calls entry."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------------------------------------- output items
class Output:
    """The output items of one response as they form, and the stream events that say so. A response returned whole
    and a stream are built by the same calls (the events of a request without `stream` are dropped), so what a
    client assembles from the events is what `create` returns."""

    def __init__(self, emit: Any = None):
        self.items: list[dict[str, Any]] = []
        self.emit = emit or (lambda event: None)
        self.seq = 0
        self.text_item: dict[str, Any] | None = None  # the open reasoning or message item
        self.calls: dict[int, dict[str, Any]] = {}  # open function_call items, by the reply's call index
        self.code: dict[str, dict[str, Any]] = {}  # running code_interpreter_call items, by the loop's call id

    def event(self, kind: str, **fields: Any) -> None:
        self.emit({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1

    def _add(self, item: dict[str, Any], **shown: Any) -> int:
        """A new item (announced as `shown` overrides it: the empty start of what streams into it)."""
        self.items.append(item)
        self.event("response.output_item.added", output_index=len(self.items) - 1, item={**item, **shown})
        return len(self.items) - 1

    def _done(self, item: dict[str, Any]) -> None:
        self.event("response.output_item.done", output_index=self.items.index(item), item=item)

    # -- reasoning and message text
    def text(self, kind: str, delta: str) -> None:
        """`kind` "reasoning" or "content" (a reply parser's delta): appended to the open item of that kind, else
        to a new one."""
        item = self.text_item
        reasoning = kind == "reasoning"
        if item is None or (item["type"] == "reasoning") != reasoning:
            delta = delta.lstrip()  # a part's paragraph break where a new item starts
            if not delta:
                return
            self.close()
            item = self.text_item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "completed",
                                     "content": [{"type": "reasoning_text", "text": ""}]} if reasoning else \
                {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
            at = self._add(item, content=[], status="in_progress")
            self.event("response.content_part.added", item_id=item["id"], output_index=at, content_index=0,
                       part=dict(item["content"][0]))
        part = item["content"][0]
        part["text"] += delta
        self.event("response.reasoning_text.delta" if reasoning else "response.output_text.delta",
                   item_id=item["id"], output_index=self.items.index(item), content_index=0, delta=delta,
                   **({} if reasoning else {"logprobs": []}))

    def close(self, status: str = "completed") -> None:
        """End the open text item and the open function calls."""
        item, self.text_item = self.text_item, None
        if item is not None:
            at, part = self.items.index(item), item["content"][0]
            item["status"] = status
            if item["type"] == "reasoning":
                self.event("response.reasoning_text.done", item_id=item["id"], output_index=at, content_index=0,
                           text=part["text"])
            else:
                self.event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                           text=part["text"], logprobs=[])
            self.event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0, part=part)
            self._done(item)
        for call in self.calls.values():
            call["status"] = status
            self.event("response.function_call_arguments.done", item_id=call["id"], arguments=call["arguments"],
                       output_index=self.items.index(call), name=call["name"])
            self._done(call)
        self.calls.clear()

    # -- client function calls
    def function_call(self, index: int, call_id: str, name: str) -> None:
        self.close()
        item = {"id": new_id("fc"), "type": "function_call", "call_id": call_id, "name": name, "arguments": "",
                "status": "completed"}
        self._add(item, status="in_progress")
        self.calls[index] = item

    def arguments(self, index: int, delta: str) -> None:
        item = self.calls[index]
        item["arguments"] += delta
        self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=self.items.index(item),
                   delta=delta)

    # -- code run by the server
    def code_call(self, call_id: str, code: str, container_id: str) -> None:
        self.close()
        item = {"id": new_id("ci"), "type": "code_interpreter_call", "status": "in_progress", "code": code,
                "container_id": container_id, "outputs": None}
        at = self._add(item, code="")
        self.code[call_id] = item
        self.event("response.code_interpreter_call.in_progress", item_id=item["id"], output_index=at)
        self.event("response.code_interpreter_call_code.delta", item_id=item["id"], output_index=at, delta=code)
        self.event("response.code_interpreter_call_code.done", item_id=item["id"], output_index=at, code=code)
        self.event("response.code_interpreter_call.interpreting", item_id=item["id"], output_index=at)

    def code_result(self, call_id: str, logs: str, ok: bool) -> None:
        item = self.code.pop(call_id)
        item["status"], item["outputs"] = "completed" if ok else "failed", [{"type": "logs", "logs": logs}]
        self.event("response.code_interpreter_call.completed", item_id=item["id"],
                   output_index=self.items.index(item))
        self._done(item)

    def finish(self, complete: bool) -> None:
        """Close what is open: "incomplete" when the response is (cut off, cancelled or failed)."""
        self.close("completed" if complete else "incomplete")
        for item in self.code.values():  # calls whose result never came
            item["status"] = "incomplete"
            self._done(item)
        self.code.clear()
