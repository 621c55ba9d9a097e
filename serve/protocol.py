"""OpenAI request and response shapes for `rstar2 serve`, the checks a request passes before it reaches the
engine, and the error format.

Where each check lives: field types and ranges are pydantic's (strict: "stream": "yes" is not true); the shape
of nested fields (messages, tools, tool_choice, stop, prompt) is a field validator; what this server does
not do and what depends on two fields is the model validator. A failed check raises `InvalidField`, which
names the field as OpenAI does ("messages[1].content"); `validation_error` turns pydantic's first error into
the 400 answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .guard import printable
from .tool_constraints import named_function

MAX_N = 16
MAX_STOP = 4
MAX_TOOLS = 128
ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TEXT_PART = '{"type": "text", "text": "..."}'
_CALL = '{"id": "...", "type": "function", "function": {"name": "...", "arguments": "<a JSON object, as a string>"}}'
_TOOL = '{"type": "function", "function": {"name": "...", "description": "...", "parameters": {<JSON Schema>}}}'


class OpenAIError(Exception):
    """Answered as {"error": {...}} with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class InvalidField(ValueError):
    """A request field that fails a check; `param` is its path, e.g. "tools[0].function.name"."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def field_path(loc: Sequence[str | int]) -> str:
    """("messages", 1, "content") -> "messages[1].content"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def validation_error(errors: Sequence[Any]) -> OpenAIError:
    """The 400 answer for the first of FastAPI's validation errors of a request body."""
    first = errors[0] if errors else {}
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidField):
        return OpenAIError(400, str(cause), cause.param)
    if first.get("type") == "json_invalid":
        return OpenAIError(400, "The request body is not valid JSON.")
    param = field_path(first.get("loc", ())[1:])  # the first element is "body"
    if not param:
        return OpenAIError(400, "The request body must be a JSON object (sent with Content-Type: application/json).")
    return OpenAIError(400, f"{param}: {first.get('msg', 'invalid value')}", param)


# ---------------------------------------------------------------------------------------------- nested shapes
def first_unencodable(value: Any, loc: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where the first string that is not Unicode text is (a lone surrogate, from a "\\ud800" escape); the
    tokenizer cannot encode one."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return loc
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = first_unencodable(key, loc) or first_unencodable(item, (*loc, key))
        if found is not None:
            return found
    return None


def check_message(m: dict[str, Any], at: str) -> None:
    role = m.get("role")
    if role not in ROLES:
        raise InvalidField(f"{at}.role", f"{at}.role must be one of {', '.join(ROLES)}; got {role!r}")
    if not isinstance(m.get("name", ""), str):
        raise InvalidField(f"{at}.name", f"{at}.name must be a string")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InvalidField(f"{at}.tool_calls", f"{at} is a {role} message; only assistant messages have tool_calls")
        check_tool_calls(calls, f"{at}.tool_calls")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise InvalidField(f"{at}.tool_call_id", f"{at} is a tool result: give the id of the call it answers as "
                                                 "tool_call_id (a string)")
    if not (role == "assistant" and calls and m.get("content") is None):  # a call alone needs no text
        check_content(m.get("content"), f"{at}.content")


def check_content(content: Any, at: str) -> None:
    """A string, or a list of text parts."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        got = "missing" if content is None else f"a {type(content).__name__}"
        raise InvalidField(at, f"{at} must be a string or a list of text parts {_TEXT_PART}; it is {got}")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise InvalidField(f"{at}[{j}].type", f"{at}[{j}] is a {kind!r} part, but this model reads text only; "
                                                  f"send text parts {_TEXT_PART}")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidField(f"{at}[{j}]", f"{at}[{j}] must be a text part {_TEXT_PART}")


def check_tool_calls(calls: Any, at: str) -> None:
    if not isinstance(calls, list):
        raise InvalidField(at, f"{at} must be a list of calls {_CALL}")
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        shaped = isinstance(fn, dict) and call.get("type", "function") == "function"
        if not shaped or not isinstance(call.get("id"), str):
            raise InvalidField(f"{at}[{k}]", f"{at}[{k}] must be {_CALL}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidField(f"{at}[{k}].function.name", f"{at}[{k}].function.name must be a non-empty string")
        if not _is_json_object(fn.get("arguments")):
            raise InvalidField(f"{at}[{k}].function.arguments", f"{at}[{k}].function.arguments must be a JSON "
                                                                "object encoded as a string, e.g. json.dumps(args)")


def _is_json_object(text: Any) -> bool:
    try:
        return isinstance(text, str) and isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_tool(tool: Any, at: str) -> str:
    """The tool's name, once its entry has the OpenAI shape."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or tool.get("type") != "function":
        raise InvalidField(at, f"{at} must be {_TOOL}")
    name = fn.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise InvalidField(f"{at}.function.name", f"{at}.function.name must be 1 to 64 letters, digits, _ or -; "
                                                  f"got {name!r}")
    if not isinstance(fn.get("description", ""), str | None):
        raise InvalidField(f"{at}.function.description", f"{at}.function.description must be a string")
    if not _is_object_schema(fn.get("parameters")):
        raise InvalidField(f"{at}.function.parameters", f"{at}.function.parameters must be a JSON Schema object: "
                                                        '{"type": "object", "properties": {"<arg>": {...}}, '
                                                        '"required": ["<arg>"]}')
    return name


def _is_object_schema(schema: Any) -> bool:
    """What the call checker reads of a tool's JSON Schema: type object, properties that are objects, required
    names."""
    if schema is None:
        return True
    if not isinstance(schema, dict):
        return False
    props, required = schema.get("properties") or {}, schema.get("required") or []
    return (schema.get("type", "object") == "object" and isinstance(props, dict)
            and all(isinstance(p, dict) for p in props.values()) and isinstance(required, list)
            and all(isinstance(r, str) for r in required))


# ---------------------------------------------------------------------------------------------- requests
# Fields of OpenAI's or vLLM's API that these engines do not implement: the values that ask for nothing, and why
# any other is refused (by name, instead of being served as if the field were not there).
_SAMPLING = "the engines sample with temperature and top_p only"
_GUIDED = "guided decoding serves only a forced tool_choice here; ask for the shape in the prompt"
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "top_k": ((None, -1, 0), _SAMPLING), "min_p": ((None, 0), _SAMPLING),
    "repetition_penalty": ((None, 1), _SAMPLING), "length_penalty": ((None, 1), _SAMPLING),
    "min_tokens": ((None, 0), "generation stops at the end-of-turn token or max_tokens"),
    "best_of": ((None, 1), "each choice is one sample (no best-of, no beam search); use n"),
    "use_beam_search": ((None, False), "each choice is one sample (no best-of, no beam search); use n"),
    "suffix": ((None, ""), "there is no insertion (fill-in-the-middle)"),
    "prompt_logprobs": ((None, 0), "the prompt's logprobs are not returned"),
    "guided_json": ((None,), _GUIDED), "guided_regex": ((None,), _GUIDED), "guided_choice": ((None,), _GUIDED),
    "guided_grammar": ((None,), _GUIDED), "structured_outputs": ((None,), _GUIDED),
    "functions": ((None,), f"functions and function_call are the deprecated form of tools and tool_choice: send "
                           f"tools=[{_TOOL}]"),
    "function_call": ((None,), "functions and function_call are the deprecated form of tools and tool_choice: "
                               'send tools with tool_choice ("auto", "none", "required" or a named function)'),
}
# OpenAI fields that change nothing a model generates here (bookkeeping), accepted without a warning.
IGNORED = {"user", "metadata", "store", "service_tier", "request_id", "priority"}
log = logging.getLogger("rstar2.serve")


def _asks_for_nothing(value: Any, neutral: tuple[Any, ...]) -> bool:
    return any(value is n or (type(value) in (int, float) and type(n) is int and value == n) for n in neutral)


def check_unsupported(body: dict[str, Any], known: set[str]) -> None:
    """Refuse a field of the API that this server does not implement when it asks for something; log the fields
    it does not know at all (ignored, as vLLM ignores them)."""
    for name, (neutral, why) in NEUTRAL.items():
        if name in body and not _asks_for_nothing(body[name], neutral):
            raise InvalidField(name, f"{name} is not supported: {why}; leave it out")
    unknown = sorted(set(body) - known - IGNORED - set(NEUTRAL))
    if unknown:
        log.warning("ignored request fields this server does not know: %s", names(unknown))


def names(unknown: list[str], most: int = 10) -> str:
    """Client-provided field names for a log line: each escaped and cut (no newline or control character of a
    client's reaches the log), at most `most` of them."""
    shown = ", ".join(printable(n, 40) for n in unknown[:most])
    return shown + (f" and {len(unknown) - most} more" if len(unknown) > most else "")


class _Request(BaseModel):
    # unknown fields are logged and ignored, as vLLM does; fields of the API that these engines do not implement
    # are refused by name (NEUTRAL); strict: no "1.0" for a number, no "yes" for true
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # None: the server's default (--temperature)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1 - MAX_N)  # seed + choice index: an int64
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _text(cls, body: Any) -> Any:
        loc = first_unencodable(body) if isinstance(body, dict) else None
        if loc is not None:
            at = field_path(loc)
            raise InvalidField(at, f"{at} holds a lone surrogate (an escape in \\ud800-\\udfff), which is not "
                                   "text; send valid UTF-8")
        if isinstance(body, dict):
            check_unsupported(body, set(cls.model_fields))
        return body

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, stop: Any) -> Any:
        stops = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stops, list) and len(stops) <= MAX_STOP
                                     and all(isinstance(s, str) and s for s in stops)):
            raise InvalidField("stop", f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
        return stop

    @model_validator(mode="after")
    def _supported(self) -> _Request:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise InvalidField(name, f"{name} is not supported: the engines sample with temperature and top_p "
                                         "only; leave it at 0")
        if self.logit_bias:
            raise InvalidField("logit_bias", "logit_bias is not supported: the engines cannot bias tokens; leave "
                                             "it out")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise InvalidField("response_format.type", f"response_format {self.response_format.get('type')!r} is "
                               'not supported (no JSON modes here): send {"type": "text"} and ask for '
                               "JSON in the prompt")
        if self.stream_options is not None:
            if not self.stream:
                raise InvalidField("stream_options", "stream_options is only allowed with stream=true")
            if set(self.stream_options) - {"include_usage", "continuous_usage_stats"}:
                raise InvalidField("stream_options", "stream_options takes only include_usage and "
                                                     "continuous_usage_stats")
        return self

    def usage_in_stream(self) -> tuple[bool, bool]:
        """(the stream ends in a usage chunk, every chunk carries the usage so far), as vLLM reads stream_options:
        continuous_usage_stats counts only with include_usage."""
        usage = bool((self.stream_options or {}).get("include_usage"))
        return usage, usage and bool((self.stream_options or {}).get("continuous_usage_stats"))

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True  # false: only the first call of a response is returned
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # extensions (extra_body)
    max_turns: int | None = Field(default=None, ge=1, le=100)
    tool_timeout: float | None = Field(default=None, gt=0, le=600)
    format: Literal["hermes", "markdown", "rstar2-release", "rstar2-paper", "template"] | None = None
    separate_reasoning: bool | None = None  # SGLang's field: false keeps the raw text as content; None: the server's
    # vLLM's field: keyword arguments of the chat template; the rStar2 formats take `problem_prefix` (false: user
    # turns as written, without the math-problem instruction, as IFEval and Arena-Hard are run)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (kwargs or {}).items():
            if key != "problem_prefix":
                raise InvalidField(f"chat_template_kwargs.{key}", "chat_template_kwargs takes only problem_prefix")
            if not isinstance(value, bool):
                raise InvalidField("chat_template_kwargs.problem_prefix", "problem_prefix is true or false")
        return kwargs

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            check_message(m, f"messages[{i}]")
        return messages

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        seen: set[str] = set()
        for i, tool in enumerate(tools or []):
            name = check_tool(tool, f"tools[{i}]")
            if name in seen:
                raise InvalidField(f"tools[{i}].function.name", f"two tools are named {name!r}; names must be unique")
            seen.add(name)
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, choice: Any) -> Any:
        if named_function(choice) is None and choice not in (None, "none", "auto", "required"):
            raise InvalidField("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                               f'{{"type": "function", "function": {{"name": "..."}}}}; got {choice!r}')
        return choice

    @model_validator(mode="after")
    def _fits_together(self) -> ChatRequest:
        names = [t["function"]["name"] for t in self.tools or []]
        if self.tool_choice not in (None, "none") and not names:
            raise InvalidField("tool_choice", "tool_choice needs tools: send the functions it chooses from in tools")
        named = named_function(self.tool_choice)
        if named is not None and named not in names:
            raise InvalidField("tool_choice.function.name", f"tool_choice names {named!r}, which is not in tools "
                               f"({', '.join(names)}): name one of them")
        if self.top_logprobs:
            raise InvalidField("top_logprobs", "top_logprobs is not supported: only the sampled token's logprob "
                                               "is returned; leave it at 0")
        if self.logprobs and (self.stream or self.tools):
            raise InvalidField("logprobs", "logprobs are returned only for a request without stream and without "
                                           "tools; drop one or the other")
        return self

    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def forces_call(self) -> bool:
        """tool_choice "required" or naming a function: the call must come (guided decoding enforces it)."""
        return self.tool_choice == "required" or named_function(self.tool_choice) is not None

    def budget_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


class CompletionRequest(_Request):
    prompt: str | list[int]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    # vLLM-compatible extensions
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            raise InvalidField("prompt", "a batch of prompts (a list of strings or of token-id lists) is not "
                                         "supported; send one prompt per request")
        if not prompt or not (isinstance(prompt, str) or isinstance(prompt, list)
                              and all(type(t) is int for t in prompt)):
            raise InvalidField("prompt", "prompt must be a non-empty string or a non-empty list of token ids")
        return prompt

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if self.logprobs:
            raise InvalidField("logprobs", "logprobs above 0 is not supported: only the sampled token's logprob "
                                           "is returned; send logprobs=0")
        if self.echo:
            raise InvalidField("echo", "echo is not supported: the prompt is not returned with the completion; "
                                       "prepend it yourself")
        return self


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
