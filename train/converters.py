"""Converters from the public SFT sets the paper mixed to our OpenAI-style chat records
({"messages": [...], "tools": [...]}), by hub id, plus the `load_records` entry point for recipe sources:

- `path.jsonl`: OpenAI chat records already;
- `FORMAT:path.jsonl`: a local file in one of the formats below;
- `hub:ORG/NAME[:split]`: a hub dataset through `datasets`, converted by its id;
- `synthetic:N[:SEED]`: N generated tool-use conversations (rstar2_agent/synthetic.py);
- `tooltasks:N[:SEED[:ERROR_SHARE]]`: N conversations on tool tasks whose data the program reads from stdin
  (rstar2_agent/tool_tasks.py), ERROR_SHARE of them (default 0.5) a buggy call, its real error, then the fix.

Formats: `sharegpt` (from human/gpt/function_call/observation, with a `tools` JSON string: APIGen-MT,
LLaMA-Factory's glaive_toolcall_en), `glaive_v2` (glaive-function-calling-v2's raw `system` and `chat`
strings), `toolace` (Team-ACE/ToolACE: tools listed in the system prompt, calls as `[f(a=1)]`), `openai`
(Tulu 3 and anything with `messages`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .chat_data import DataError, DataStats, read_jsonl

Record = dict[str, Any]


def _tool(fn: dict[str, Any]) -> dict[str, Any]:
    return fn if fn.get("type") == "function" else {"type": "function", "function": fn}


def _call(i: int, name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _with_results(messages: list[dict[str, Any]], result: str) -> None:
    """A tool result answers the last call that has none yet."""
    answered = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
    pending = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []
               if c["id"] not in answered]
    messages.append({"role": "tool", "tool_call_id": pending[0] if pending else "call_0", "content": result})


def sharegpt(row: Record) -> Record:
    tools = row.get("tools") or "[]"
    tools = json.loads(tools) if isinstance(tools, str) else tools
    messages: list[dict[str, Any]] = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    for i, turn in enumerate(row["conversations"]):
        kind, value = turn["from"], turn["value"]
        if kind in ("human", "user"):
            messages.append({"role": "user", "content": value})
        elif kind in ("gpt", "assistant"):
            messages.append({"role": "assistant", "content": value})
        elif kind == "function_call":
            call = json.loads(value)
            calls = call if isinstance(call, list) else [call]
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [_call(i * 10 + k, c["name"], c.get("arguments", {}))
                                            for k, c in enumerate(calls)]})
        elif kind in ("observation", "tool"):
            _with_results(messages, value)
        else:
            raise DataError(f"unknown sharegpt turn kind {kind!r}")
    return {"messages": messages, "tools": [_tool(t) for t in tools]}


_GLAIVE_TURN = re.compile(r"(USER|ASSISTANT|FUNCTION RESPONSE):\s*")


def glaive_v2(row: Record) -> Record:
    system = row.get("system", "").removeprefix("SYSTEM:").strip()
    tools, prose = [], system
    if "-" in system and "{" in system:
        prose, _, listing = system.partition(" -")
        decoder, at = json.JSONDecoder(), listing.find("{")
        while at >= 0:
            obj, end = decoder.raw_decode(listing, at)
            tools.append(_tool(obj))
            at = listing.find("{", end)
    messages: list[dict[str, Any]] = [{"role": "system", "content": prose.strip()}] if prose.strip() else []
    parts = _GLAIVE_TURN.split(row["chat"])
    for i in range(1, len(parts) - 1, 2):
        kind, text = parts[i], parts[i + 1].replace("<|endoftext|>", "").strip()
        if kind == "USER":
            messages.append({"role": "user", "content": text})
        elif kind == "FUNCTION RESPONSE":
            _with_results(messages, text)
        elif text.startswith("<functioncall>"):
            body = text.removeprefix("<functioncall>").strip()
            body = re.sub(r"'(\{.*\})'", lambda m: json.dumps(m.group(1)), body, flags=re.DOTALL)  # quoted args
            call = json.loads(body)
            args = call.get("arguments", {})
            args = json.loads(args) if isinstance(args, str) else args
            messages.append({"role": "assistant", "content": None, "tool_calls": [_call(i, call["name"], args)]})
        else:
            messages.append({"role": "assistant", "content": text})
    return {"messages": messages, "tools": tools}


def _python_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """'[f(a=1, b="x"), g()]' -> [("f", {"a": 1, "b": "x"}), ("g", {})]; None when it is not such a list."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
        return None
    try:
        return [(ast.unparse(e.func), {k.arg: ast.literal_eval(k.value) for k in e.keywords}) for e in tree.elts]
    except ValueError:
        return None


def toolace(row: Record) -> Record:
    system = row.get("system", "")
    tools = []
    start = system.find("[{")
    if start >= 0:
        tools = [_tool(t) for t in json.JSONDecoder().raw_decode(system, start)[0]]
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(row["conversations"]):
        kind, value = turn["from"], turn["value"]
        if kind == "user":
            messages.append({"role": "user", "content": value})
        elif kind == "tool":
            _with_results(messages, value if isinstance(value, str) else json.dumps(value))
        else:
            calls = _python_calls(value) if value.strip().startswith("[") else None
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                _call(i * 10 + k, n, a) for k, (n, a) in enumerate(calls)]} if calls else
                {"role": "assistant", "content": value})
    return {"messages": messages, "tools": tools}


def openai(row: Record) -> Record:
    return {"messages": row["messages"], "tools": row.get("tools") or []}


FORMATS: dict[str, Callable[[Record], Record]] = {
    "sharegpt": sharegpt, "glaive_v2": glaive_v2, "toolace": toolace, "openai": openai}
HUB: dict[str, str] = {
    "Team-ACE/ToolACE": "toolace",
    "Salesforce/APIGen-MT-5k": "sharegpt",
    "glaiveai/glaive-function-calling-v2": "glaive_v2",
    "llamafactory/glaive_toolcall_en": "sharegpt",
    "allenai/tulu-3-sft-mixture": "openai",
}


def _convert(rows: list[Record], fmt: str, where: str, stats: DataStats, on_bad_line: str) -> list[Record]:
    out = []
    for i, row in enumerate(rows, 1):
        try:
            out.append(FORMATS[fmt](row))
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            if on_bad_line == "fail":
                raise DataError(f"{where}: row {i} is not {fmt} data ({type(e).__name__}: {e})") from e
            stats.bad_lines.append(i)
    return out


def load_records(source: str, on_bad_line: str = "skip", stats: DataStats | None = None) -> list[Record]:
    stats = stats or DataStats()
    if source.startswith("synthetic:"):
        from rstar2_agent.synthetic import conversations

        _, n, *seed = source.split(":")
        return conversations(int(seed[0]) if seed else 0, int(n))
    if source.startswith("tooltasks:"):
        from rstar2_agent import tool_tasks

        _, n, *rest = source.split(":")
        seed = int(rest[0]) if rest else 0
        share = float(rest[1]) if len(rest) > 1 else tool_tasks.DEFAULT_ERROR_SHARE
        return tool_tasks.conversations(seed, int(n), share)
    if source.startswith("hub:"):
        hub_id, _, split = source[4:].partition(":")
        if hub_id not in HUB:
            raise DataError(f"no converter for {hub_id}; known: {', '.join(HUB)} (or convert it to chat JSONL)")
        import datasets

        rows = [dict(r) for r in datasets.load_dataset(hub_id, split=split or "train")]
        return _convert(rows, HUB[hub_id], source, stats, on_bad_line)
    fmt, _, path = source.rpartition(":") if source.split(":", 1)[0] in FORMATS else ("", "", source)
    if not Path(path).is_file():
        raise DataError(f"no data file {path}")
    if not fmt or fmt == "openai":
        return list(read_jsonl(path, on_bad_line, stats))
    return _convert(list(read_jsonl(path, on_bad_line, stats, chat=False)), fmt, path, stats, on_bad_line)
