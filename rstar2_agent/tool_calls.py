"""A parsed tool call, the check of its arguments against the tools' JSON schemas, and the per-turn cap.

Every format's parser (chat_format.py, release_format.py) produces these."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """A call's id, as OpenAI's look (call_ and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the text the model wrote for this call
    error: str | None = None  # set when the call cannot run; the loop answers with this message
    id: str = field(default_factory=new_call_id)


def _schema(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for t in tools:
        fn = t.get("function", t)
        out[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


def validate_arguments(name: str, args: Any, tools: list[dict[str, Any]]) -> str | None:
    """None when `args` fit the tool's JSON schema (required, extra and basic types), else the problem."""
    schemas = _schema(tools)
    if name not in schemas:
        return f"unknown tool {name!r}; the available tools are: {', '.join(sorted(schemas)) or 'none'}"
    if not isinstance(args, dict):
        return f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}"
    params = schemas[name]
    props: dict[str, Any] = params.get("properties") or {}
    missing = [p for p in params.get("required", []) if p not in args]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))} for {name!r}"
    extra = [a for a in args if props and a not in props and not params.get("additionalProperties", False)]
    if extra:
        return f"unexpected argument(s) {', '.join(map(repr, extra))} for {name!r}; it takes {', '.join(props)}"
    for key, value in args.items():
        expected = (props.get(key) or {}).get("type")
        kinds = [expected] if isinstance(expected, str) else (expected or [])
        if kinds and not any(isinstance(value, _JSON_TYPES.get(k, (object,))) and not (
                k in ("integer", "number") and isinstance(value, bool)) for k in kinds):
            return f"argument {key!r} of {name!r} must be {' or '.join(kinds)}, got {type(value).__name__}"
    return None


def cap_calls(calls: list[ToolCall], max_calls: int) -> list[ToolCall]:
    for c in calls[max_calls:]:
        if c.error is None:
            c.error = f"too many tool calls in one turn (at most {max_calls}); this call was not run"
    return calls
