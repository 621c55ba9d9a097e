"""Converters from the public SFT sets the paper mixed to our OpenAI-style chat records
({"messages": [...], "tools": [...]}), by hub id, plus the `load_records` entry point for recipe sources:

- `path.jsonl`: OpenAI chat records already;
- `FORMAT:path`: a local file (JSONL, JSON or Parquet) or folder of them, in one of the formats below;
- `hub:ORG/NAME[:split]`: a hub dataset through `datasets`, converted by its id; with `hub_dir`, read from the
  local copy `hub_dir/ORG/NAME` (the hub repository's files, e.g. from `huggingface-cli download`) instead;
- `synthetic:N[:SEED[:FAMILIES]]`: N generated tool-use conversations (rstar2_agent/synthetic.py), from the
  problem families joined with + (default: all);
- `asks:N[:SEED[:ERROR_SHARE]]`: N everyday "compute this" asks in many phrasings, each answered with the direct
  program (train/data/asks.py; the default agent's data), ERROR_SHARE of those importing math (default 0) first
  calling it without the import, reading the error, then the fix;
- `tooltasks:N[:SEED[:ERROR_SHARE]]`: N conversations on tool tasks whose data the program reads from stdin
  (train/data/tool_tasks.py), ERROR_SHARE of them (default 0.5) a buggy call, its real error, then the fix.

Formats: `sharegpt` (from human/gpt/function_call/observation, with a `tools` JSON string: APIGen-MT,
LLaMA-Factory's glaive_toolcall_en), `glaive_v2` (glaive-function-calling-v2's raw `system` and `chat`
strings), `toolace` (Team-ACE/ToolACE: tools listed in the system prompt, calls as `[f(a=1)]`), `magicoder`
(Magicoder's instruction/response or problem/solution: the Python blocks of the answer become a call of
the Python tool), `nemotron` (Llama-Nemotron-Post-Training-Dataset: input messages, output, reasoning on/off;
the reasoning rows are left out), `openai` (Tulu 3 and anything with `messages`).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import DataError

from .chat_data import PYTHON_TOOL, DataStats, read_jsonl

log = logging.getLogger(__name__)
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


_PYTHON_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def magicoder(row: Record) -> Record | None:
    """The answer's text up to its first Python block, then a call of the Python tool (the format's own, see
    chat_data.PYTHON_TOOL) that runs the answer's Python blocks as one program (each call of the tool is a fresh
    program); the answer's other text is dropped, as it was written without the program's output. None for a row
    of another language or with no Python block."""
    if row.get("lang", "python") != "python":
        return None
    prompt, answer = (row["instruction"], row["response"]) if "instruction" in row else \
        (row["problem"], row["solution"])
    blocks = list(_PYTHON_BLOCK.finditer(answer))
    code = "\n\n".join(b.group(1).strip("\n") for b in blocks if b.group(1).strip())
    if not code:
        return None
    call = _call(0, PYTHON_TOOL, {"code": code, "input": ""})
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": answer[:blocks[0].start()].strip(), "tool_calls": [call]}]}


_LLAMA3_TURN = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?=<\|eot_id\|>|$)", re.DOTALL)
_THINKING = ("detailed thinking on", "detailed thinking off")  # Nemotron's reasoning switch, not a system prompt


def nemotron(row: Record) -> Record | None:
    """A non-reasoning row (reasoning "off"): its input turns (a message list, or v1's Llama 3 template text) and
    its output as the answer. None for a reasoning row."""
    output = row["output"].removesuffix("<|eot_id|>").strip()
    if row.get("reasoning", "off") != "off" or "<think>" in output:
        return None
    given = row["input"]
    turns = [{"role": m["role"], "content": m["content"]} for m in given] if isinstance(given, list) else \
        [{"role": r, "content": c} for r, c in _LLAMA3_TURN.findall(given)] or [{"role": "user", "content": given}]
    if turns and turns[-1]["role"] == "assistant" and not turns[-1]["content"].strip():
        turns.pop()  # v1's text ends with the header of the answer
    system = (row.get("system_prompt") or "").strip()
    turns = [{"role": "system", "content": system}] * bool(system) + turns
    turns = [t for t in turns if not (t["role"] == "system" and t["content"].strip() in _THINKING)]
    if not output or not turns or turns[-1]["role"] != "user":
        raise ValueError("a row must end with a user turn and have an output")
    return {"messages": [*turns, {"role": "assistant", "content": output}], "tools": []}


def openai(row: Record) -> Record:
    return {"messages": row["messages"], "tools": row.get("tools") or []}


FORMATS: dict[str, Callable[[Record], Record | None]] = {
    "sharegpt": sharegpt, "glaive_v2": glaive_v2, "toolace": toolace, "magicoder": magicoder, "nemotron": nemotron,
    "openai": openai}


@dataclass(frozen=True)
class HubSet:
    format: str
    split: str = "train"  # the default split
    files: str | None = None  # the split's data files in the repository ({split} filled); else every data file
    rewrite: bool = False  # the paper rewrote its prompts and responses with a stronger model (train/data/rewrite.py)


HUB: dict[str, HubSet] = {
    "Team-ACE/ToolACE": HubSet("toolace"),
    "Salesforce/APIGen-MT-5k": HubSet("sharegpt"),
    "glaiveai/glaive-function-calling-v2": HubSet("glaive_v2"),
    "llamafactory/glaive_toolcall_en": HubSet("sharegpt"),
    "ise-uiuc/Magicoder-Evol-Instruct-110K": HubSet("magicoder"),
    "ise-uiuc/Magicoder-OSS-Instruct-75K": HubSet("magicoder"),
    "allenai/tulu-3-sft-personas-instruction-following": HubSet("openai", rewrite=True),
    "allenai/tulu-3-sft-mixture": HubSet("openai"),
    # only the split's files: the SFT config's math and code splits are tens of GB
    "nvidia/Llama-Nemotron-Post-Training-Dataset": HubSet("nemotron", "chat", "SFT/{split}/*.jsonl", rewrite=True),
}
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def _convert(rows: list[Record], fmt: str, where: str, stats: DataStats, on_bad_line: str) -> list[Record]:
    out = []
    for i, row in enumerate(rows, 1):
        try:
            record = FORMATS[fmt](row)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            if on_bad_line == "fail":
                raise DataError(f"{where}: row {i} is not {fmt} data ({type(e).__name__}: {e})") from e
            stats.bad_lines.append(i)
            continue
        if record is None:
            stats.filtered += 1
        else:
            out.append(record)
    return out


def read_rows(path: Path, on_bad_line: str, stats: DataStats, pattern: str | None = None) -> list[Record]:
    """The rows of a JSONL, JSON (a list of rows) or Parquet file, or of every such file in a folder (`pattern`
    picks some, as a glob in it), in file-name order."""
    if path.is_dir():
        files = sorted(f for f in (path.glob(pattern) if pattern else path.rglob("*"))
                       if f.suffix in DATA_SUFFIXES and not any(p.startswith(".") for p in f.relative_to(path).parts))
        if not files:
            raise DataError(f"no {', '.join(DATA_SUFFIXES)} files in {path}"
                            + (f" matching {pattern}" if pattern else ""))
        rows = []
        for f in files:
            try:
                rows += read_rows(f, on_bad_line, stats)
            except DataError as e:  # a repository's metadata beside its data (dataset_info.json)
                log.warning("%s: skipped, %s", f, e)
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet

        return pyarrow.parquet.read_table(path).to_pylist()
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:  # JSON lines under a .json name
            return list(read_jsonl(path, on_bad_line, stats, chat=False))
        if not isinstance(rows, list):
            raise DataError(f"{path}: a JSON data file must hold a list of rows")
        return rows
    return list(read_jsonl(path, on_bad_line, stats, chat=False))


def _hub_rows(hub_id: str, split: str, hub_dir: str | None, on_bad_line: str, stats: DataStats) -> list[Record]:
    spec = HUB[hub_id]
    files = spec.files.format(split=split) if spec.files else None
    if hub_dir:
        local = Path(hub_dir) / hub_id
        if not local.is_dir():
            raise DataError(f"no local copy of {hub_id} in {hub_dir}: get one with `huggingface-cli download "
                            f"--repo-type dataset {hub_id} --local-dir {local}`")
        return read_rows(local, on_bad_line, stats, files)
    import datasets

    if files:
        return [dict(r) for r in datasets.load_dataset(hub_id, data_files={split: files}, split=split)]
    return [dict(r) for r in datasets.load_dataset(hub_id, split=split)]


def load_records(source: str, on_bad_line: str = "skip", stats: DataStats | None = None, hub_dir: str | None = None
                 ) -> list[Record]:
    stats = stats or DataStats()
    if source.startswith("synthetic:"):
        from rstar2_agent.synthetic import conversations

        _, n, *rest = source.split(":")
        try:
            return conversations(int(rest[0]) if rest else 0, int(n), rest[1] if len(rest) > 1 else None)
        except ValueError as e:
            raise DataError(f"{source}: {e} (synthetic:N[:SEED[:FAMILIES]])") from e
    if source.startswith("asks:"):
        from . import asks

        _, n, *rest = source.split(":")
        try:
            return asks.conversations(int(rest[0]) if rest else 0, int(n), float(rest[1]) if len(rest) > 1 else 0.0)
        except ValueError as e:
            raise DataError(f"{source}: {e} (asks:N[:SEED[:ERROR_SHARE]])") from e
    if source.startswith("tooltasks:"):
        from . import tool_tasks

        _, n, *rest = source.split(":")
        seed = int(rest[0]) if rest else 0
        share = float(rest[1]) if len(rest) > 1 else tool_tasks.DEFAULT_ERROR_SHARE
        return tool_tasks.conversations(seed, int(n), share)
    if source.startswith("hub:"):
        hub_id, _, split = source[4:].partition(":")
        if hub_id not in HUB:
            raise DataError(f"no converter for {hub_id}; known: {', '.join(HUB)} (or convert it to chat JSONL)")
        rows = _hub_rows(hub_id, split or HUB[hub_id].split, hub_dir, on_bad_line, stats)
        return _convert(rows, HUB[hub_id].format, source, stats, on_bad_line)
    fmt, _, path = source.partition(":") if source.split(":", 1)[0] in FORMATS else ("", "", source)
    if not Path(path).exists():
        raise DataError(f"no data file {path}")
    fmt = fmt or "openai"
    if fmt == "openai" and path.endswith(".jsonl"):
        return list(read_jsonl(path, on_bad_line, stats))
    return _convert(read_rows(Path(path), on_bad_line, stats), fmt, path, stats, on_bad_line)
