"""SFT data: OpenAI-style chat JSONL (messages with `tool_calls` and `tool` turns, plus `tools`) rendered
through the shared chat format, so training sees the tokens serving produces; the loss covers assistant
tokens only (their text, tool calls and end-of-turn token), never prompts or tool responses; examples are
packed into fixed-length rows with a block-diagonal attention mask.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.chat_format import ChatFormat, for_format
from rstar2_agent.release_format import GENERATION_PROMPT

from .target_shape import check_target_shape, in_shape, to_shape

log = logging.getLogger(__name__)

# The tool name in records converted from code data (Magicoder): the Python tool of the chat format that renders
# the record stands in for it (its name differs between formats), so one data file serves every format.
PYTHON_TOOL = "$python_tool"


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is an assistant token (a training target)
    # every assistant turn in the rstar2-paper shape (target_shape.py), as the row was written and as trained; None
    # in a format without that shape
    shaped_as_written: bool | None = None
    shaped: bool | None = None


@dataclass
class DataStats:
    lines: int = 0
    bad_lines: list[int] = field(default_factory=list)  # line numbers skipped as malformed
    filtered: int = 0  # rows a converter leaves out by design (a reasoning row, code that is not Python)
    dropped_long: int = 0
    truncated: int = 0
    examples: int = 0
    tokens: int = 0
    target_tokens: int = 0
    shape_checked: int = 0  # examples in a format with the rstar2-paper shape (target_shape.py), of which:
    in_shape_as_written: int = 0  # every assistant turn had the full shape as written
    in_shape: int = 0  # ... as trained

    def add(self, other: DataStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def read_jsonl(path: str | Path, on_bad_line: str = "skip", stats: DataStats | None = None, chat: bool = True
               ) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file (with `chat`, each must hold a "messages" list); a malformed line is logged
    with its number and skipped, or fatal."""
    stats = stats or DataStats()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            stats.lines += 1
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("a record must be a JSON object")
                if chat and not isinstance(record.get("messages"), list):
                    raise ValueError('a record must be an object with a "messages" list')
            except ValueError as e:
                if on_bad_line == "fail":
                    raise DataError(f"{path}:{lineno}: {e}; fix the line or set on_bad_line: skip") from e
                log.warning("%s:%d: skipped, %s", path, lineno, e)
                stats.bad_lines.append(lineno)
                continue
            yield record


def render(fmt: ChatFormat, record: dict[str, Any], shape: str = "format") -> Example:
    """Token ids of the whole conversation and the assistant-token mask, from the chat template's text: each
    assistant message spans from after its header to its end-of-turn token, found by rendering prefixes. Each
    prompt run and each target run is tokenized on its own, as the agent loop sees them (the prompt's ids, then what
    the model generates): a BPE merge across the boundary (`<reason>` then `</reason>` may merge `></`) would
    otherwise train on ids the model never writes after that prompt. In the rstar2-paper format every assistant
    turn opens with the generation prompt's `<reason>` (prompt, not target: the model is always started there),
    added where a conversation's turn lacks it, and with `shape` "format" turns without the paper's shape are
    converted to it (target_shape.py)."""
    if fmt.release:
        raise DataError("SFT in the rstar2-release format is not supported: the release's template prefixes every "
                        "assistant turn without tool calls with the problem instruction, so assistant turns do not "
                        "render prefix by prefix; train with format: rstar2-paper (the same template without that "
                        "quirk) or hermes")
    if fmt.own_template:
        raise DataError("SFT in the template format is not supported (the model's own template decides how calls "
                        "and results look); train with format: rstar2-paper or hermes")
    messages = fmt.messages_for(for_format(fmt, _with_python_tool(fmt, record["messages"])), record.get("tools"))
    written = shaped = in_shape(messages) if fmt.fixed else None
    if fmt.fixed and shape == "format" and not written:
        messages = to_shape(messages)
        shaped = in_shape(messages)
    if fmt.fixed:
        opener = GENERATION_PROMPT.split("\n", 1)[1]
        messages = [{**m, "content": opener + m["content"]} if m["role"] == "assistant"
                    and not m["content"].startswith(opener) else m for m in messages]
    full = fmt._apply(messages, add_generation_prompt=False)
    # an assistant message with "weight": 0 (OpenAI's fine-tuning format) stays in the prompt, no target: an
    # error-then-fix record's failing first try, say, which the model should read but not learn to write
    weights = [m.get("weight", 1) for m in record["messages"] if m.get("role") == "assistant"]
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if 0 in weights and len(weights) != len(assistant):
        raise DataError(f"a record with a weight-0 assistant message has {len(weights)} assistant messages, which "
                        f"the format renders as {len(assistant)}: drop the weights or the record")
    untrained = {i for i, w in zip(assistant, weights, strict=True) if w == 0} if 0 in weights else set()
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i in untrained:
            continue
        prompt = fmt._apply(messages[:i], add_generation_prompt=True)
        start = len(prompt)
        if fmt.fixed:  # content, then the calls the template writes back, up to the end of the turn
            end = full.find(fmt.eos_text, start) if full.startswith(prompt) else -1
        else:
            end = start + len(m["content"]) if full.startswith(m["content"], start) else -1
        if end < 0:
            raise DataError("the chat template does not render conversations prefix by prefix; it cannot be "
                            "used for SFT with assistant-only loss")
        if full.startswith(fmt.eos_text, end):
            end += len(fmt.eos_text)  # learn to end the turn
        spans.append((start, end))
    ids, mask, at = [], [], 0
    for start, end in [*spans, (len(full), len(full))]:  # each prompt run and each target run tokenized alone
        for piece, label in ((full[at:start], 0), (full[start:end], 1)):
            if piece:
                piece_ids = fmt.tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                mask += [label] * len(piece_ids)
        at = end
    return Example(ids, mask, written, shaped)


def _with_python_tool(fmt: ChatFormat, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with PYTHON_TOOL calls named as the format's Python tool (its first tool)."""
    if not any(c["function"]["name"] == PYTHON_TOOL for m in messages for c in m.get("tool_calls") or []):
        return messages
    name = fmt.tools[0]["function"]["name"]
    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "name": name}}
                                 if c["function"]["name"] == PYTHON_TOOL else c for c in m["tool_calls"]]}
            if m.get("tool_calls") else m for m in messages]


def load_examples(fmt: ChatFormat, records: list[dict[str, Any]], max_len: int, overlong: str = "drop",
                  stats: DataStats | None = None, shape: str = "format") -> list[Example]:
    """Render every record; one longer than max_len is dropped or truncated (counted either way)."""
    check_target_shape(shape)
    stats = stats or DataStats()
    out = []
    for record in records:
        ex = render(fmt, record, shape)
        if len(ex.ids) > max_len:
            if overlong == "drop":
                stats.dropped_long += 1
                continue
            stats.truncated += 1
            ex = Example(ex.ids[:max_len], ex.mask[:max_len], ex.shaped_as_written, ex.shaped)
        if not any(ex.mask):
            continue
        out.append(ex)
        stats.examples += 1
        if ex.shaped is not None:
            stats.shape_checked += 1
            stats.in_shape_as_written += bool(ex.shaped_as_written)
            stats.in_shape += ex.shaped
        stats.tokens += len(ex.ids)
        stats.target_tokens += sum(ex.mask)
    return out


@dataclass
class Row:
    """One packed training row: several examples end to end. With a shared prefix (`prefix` > 0) the first
    `prefix` tokens of every example are the same and hold no target (a conversation's system prompt and tool
    list): the row holds them once, and each example holds only the rest, attending to the prefix and itself."""
    docs: list[Example]
    prefix: int = 0

    @property
    def length(self) -> int:
        return self.prefix + sum(len(d.ids) - self.prefix for d in self.docs)

    @property
    def shared(self) -> int:
        """The prefix its examples share (0 for a row of one example, which holds it as its own)."""
        return self.prefix if len(self.docs) > 1 else 0


def shareable(ex: Example) -> int:
    """How many leading tokens of `ex` a shared prefix may take: those before the token that precedes the first
    target (the target's prediction is made at the token before it, which must sit in the example's own part)."""
    first = next((i for i, m in enumerate(ex.mask) if m), len(ex.ids))
    return max(0, first - 1)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit], strict=False):
        if x != y:
            break
        n += 1
    return n


def pack(examples: list[Example], seq_len: int, seed: int, share_prefix: bool = False) -> list[Row]:
    """First-fit packing of the examples (in a seeded order) into rows of at most seq_len tokens. With
    `share_prefix`, the examples of a row share their common leading tokens (see Row): the same loss and gradients
    as the examples packed apart (each still sees its whole prompt at the same positions), fewer tokens computed;
    a tool-use conversation is mostly its system prompt."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    rows: list[Row] = []
    for i in order:
        ex = examples[i]
        placed = False
        for row in rows:
            prefix = common_prefix(row.docs[0].ids, ex.ids, min(row.prefix, shareable(ex))) if share_prefix else 0
            length = prefix + sum(len(d.ids) - prefix for d in row.docs) + len(ex.ids) - prefix
            if length <= seq_len:
                row.docs.append(ex)
                row.prefix = prefix
                placed = True
                break
        if not placed:
            rows.append(Row([ex], shareable(ex) if share_prefix else 0))
    return rows


SHARED = -2  # the doc index of a row's shared prefix in collate's mask


def collate(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, labels (-100 off target), position_ids restarting per example (continuing after a shared
    prefix), and a (B, 1, L, L) boolean block-diagonal causal attention mask so packed examples do not see each
    other; every example sees its row's shared prefix."""
    width = max(r.length for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    doc = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        at = p = row.shared
        if p:
            ids[b, :p] = torch.tensor(row.docs[0].ids[:p])
            pos[b, :p] = torch.arange(p)
            doc[b, :p] = SHARED
        for d, ex in enumerate(row.docs):
            n = len(ex.ids) - p
            ids[b, at:at + n] = torch.tensor(ex.ids[p:])
            labels[b, at:at + n] = torch.where(torch.tensor(ex.mask[p:], dtype=torch.bool), torch.tensor(ex.ids[p:]),
                                               -100)
            pos[b, at:at + n] = torch.arange(p, p + n)
            doc[b, at:at + n] = d
            at += n
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    same = (doc[:, :, None] == doc[:, None, :]) | ((doc[:, None, :] == SHARED) & (doc[:, :, None] >= 0))
    mask = same & causal & (doc[:, :, None] != -1)
    mask |= torch.eye(width, dtype=torch.bool)  # padding attends to itself (no all-masked rows)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": mask[:, None]}


def collate_shared(row: Row, pad_id: int) -> dict[str, torch.Tensor]:
    """One row with a shared prefix as two passes' inputs: `prefix_ids` [1, prefix], then the examples' own parts as
    a batch (input_ids, labels, position_ids continuing after the prefix, right-padded) whose `attention_mask`
    [examples, prefix + width] covers the prefix's keys and values and each example's own tokens. The same loss and
    gradients as `collate`'s block mask; each example attends only to what it sees, not to the whole row."""
    p = row.shared
    if not p:
        raise ValueError("collate_shared takes a row whose examples share a prefix")
    width = max(len(d.ids) for d in row.docs) - p
    ids = torch.full((len(row.docs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(row.docs), width), -100, dtype=torch.long)
    attention = torch.zeros((len(row.docs), p + width), dtype=torch.long)
    attention[:, :p] = 1
    for b, ex in enumerate(row.docs):
        part, target = torch.tensor(ex.ids[p:]), torch.tensor(ex.mask[p:], dtype=torch.bool)
        if target[0]:  # predicted at the prefix's last position, which is not computed here: shareable() forbids it
            raise ValueError("a shared prefix must end before the token that precedes an example's first target")
        ids[b, :len(part)] = part
        labels[b, :len(part)] = torch.where(target, part, -100)
        attention[b, p:p + len(part)] = 1
    pos = torch.arange(p, p + width).expand(len(row.docs), -1).clone()
    return {"prefix_ids": torch.tensor([row.docs[0].ids[:p]]), "input_ids": ids, "labels": labels,
            "position_ids": pos, "attention_mask": attention}
