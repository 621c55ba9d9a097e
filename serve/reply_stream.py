"""A model's reply read as OpenAI clients expect it: content, reasoning and tool calls, incrementally.

One parser for both forms of a response, so that a streamed reply reassembles to the non-streamed one by
construction: the non-streamed answer feeds the whole text at once, the stream feeds each decoded delta as it
comes. What it holds back between feeds is only what the next text could still change (the start of a tag, a
call's head before its name is known, whitespace that may end a part), so where the text is cut never changes what
comes out (tests/serve/test_reply_stream.py replays recorded replies cut at every boundary).

The split, as vLLM's and SGLang's reasoning parsers make it:
- rStar2 formats (`rstar2-paper`, `rstar2-release`): the `<answer>` block(s), tags kept, are the content (the part
  the reward and eval read, so a client that grades reads what RL rewarded); everything else the model wrote
  (its `<reason>` blocks, tags dropped, and what lies between) is the reasoning.
- other formats: the text inside `<think>` ... `</think>` is the reasoning (tags dropped; a reply whose prompt ends in
  an open `<think>` starts inside it); the rest is the content.
- Each part is stripped of the whitespace at its ends (a part of whitespace alone is no part).

Tool calls (client tools, the Hermes form every format but markdown writes: `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`): a call is decided at its head. When the block opens `{"name": "<one of the tools>",
"arguments": {`, the call is announced (index, id, name) and its arguments object streams as written, fragment by
fragment, to its closing brace. Any other block (other key order, arguments as a string, an unknown name, broken JSON)
waits for `</tool_call>` and is then a call if it parses to a known name with an object as arguments (sent whole,
re-serialized), else text of the part it stands in, as the model wrote it. A call cut off by the end of the reply keeps
the arguments written so far (the finish reason says `length`). `parallel=False` keeps the first call and drops the
others. In the server's own loop (`calls_as_reasoning`) a call block is part of the reasoning, as written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from rstar2_agent.chat_format import FIXED_TEMPLATE
from rstar2_agent.tool_calls import new_call_id

OPEN_CALL, CLOSE_CALL = "<tool_call>", "</tool_call>"
RSTAR2_PROFILES = FIXED_TEMPLATE  # the rStar2 formats: the answer block is the content
_WS = " \t\r\n"


@dataclass
class Delta:
    kind: Literal["content", "reasoning", "call", "arguments"]
    text: str = ""  # content, reasoning, or a fragment of a call's arguments
    index: int = 0  # the call's index in the reply (call, arguments)
    id: str = ""  # call
    name: str = ""  # call


class _Part:
    """One output part (content or reasoning): its ends stripped of whitespace, streamed without the whitespace that
    may turn out to end it."""

    def __init__(self) -> None:
        self.pending, self.started = "", False

    def write(self, text: str) -> str:
        out = self.pending + text
        body = out.rstrip(_WS)
        self.pending = out[len(body):]
        if not self.started:
            body = body.lstrip(_WS)
            self.started = bool(body)
            if not body:
                self.pending = ""
        return body


@dataclass
class _Call:
    """The call block being read: its text so far and, once announced, the arguments scanner's state."""

    body: str = ""
    slow: bool = False  # the head is not the streaming form: wait for </tool_call>
    announced: bool = False
    closed: bool = False  # the arguments object is complete; what follows up to </tool_call> is dropped
    depth: int = 0
    in_string: bool = False
    escaped: bool = False


def _head(body: str, tool_names: set[str]) -> tuple[str, int, str]:
    """Read a call's head: ("more", ...) while it could still be `{"name": "<tool>", "arguments": {`;
    ("match", i, name) with i the index of the arguments' `{` and a name in tool_names; ("slow", ...) otherwise."""
    i, name = 0, ""

    def skip() -> None:
        nonlocal i
        while i < len(body) and body[i] in _WS:
            i += 1

    for expected in ("{", '"name"', ":", None, ",", '"arguments"', ":", "{"):
        skip()
        rest = body[i:]
        if expected is None:  # the name, a JSON string
            if not rest:
                return "more", 0, ""
            if rest[0] != '"':
                return "slow", 0, ""
            j, escaped = 1, False
            while j < len(rest) and (escaped or rest[j] != '"'):
                escaped = not escaped and rest[j] == "\\"
                j += 1
            if j == len(rest):
                return "more", 0, ""
            try:
                name = json.loads(rest[: j + 1])
            except ValueError:
                return "slow", 0, ""
            if name not in tool_names:
                return "slow", 0, ""
            i += j + 1
            continue
        if len(rest) < len(expected):
            return ("more" if expected.startswith(rest) else "slow"), 0, ""
        if not rest.startswith(expected):
            return "slow", 0, ""
        i += len(expected)
    return "match", i - 1, name


def _whole_call(body: str, tool_names: set[str]) -> tuple[str, dict[str, Any]] | None:
    """A closed block that did not stream: a call when it is a JSON object with a known name (a string), no keys but
    "name" and "arguments", and object arguments (or a string holding one; none: {}, as the Hermes parser reads it)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in tool_names \
            or set(obj) - {"name", "arguments"}:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return (obj["name"], args) if isinstance(args, dict) else None


def _held(text: str, markers: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a marker (held back until the next feed)."""
    start = text.rfind("<")
    if start < 0:
        return 0
    tail = text[start:]
    return len(tail) if any(m.startswith(tail) and m != tail for m in markers) else 0


class ReplyParser:
    """Feed a reply's text as it is generated; get what it adds to the content, the reasoning and the calls."""

    def __init__(self, fmt_name: str, start_in_reasoning: bool = False, tools: list[dict[str, Any]] | None = None,
                 parallel: bool = True, calls_as_reasoning: bool = False, split: bool = True):
        self.rstar2, self.split = fmt_name in RSTAR2_PROFILES, split
        self.start_in_reasoning = start_in_reasoning
        self.tool_names = {t.get("function", t).get("name") for t in tools or []}
        self.parallel, self.calls_as_reasoning = parallel, calls_as_reasoning
        tags = [] if not split else ["<reason>", "</reason>", "<answer>", "</answer>"] if self.rstar2 else [
            "<think>", "</think>"]
        self.markers = tags + ([OPEN_CALL, CLOSE_CALL] if self.tool_names or calls_as_reasoning else [])
        self.parts = {"content": _Part(), "reasoning": _Part()}
        self.calls = 0
        self.buf = ""
        self.call: _Call | None = None
        self._reset_turn()

    def _reset_turn(self) -> None:
        self.in_think, self.in_answer, self.in_raw_call = self.start_in_reasoning and self.split, False, False

    # ------------------------------------------------------------------ feeding
    def feed(self, text: str) -> list[Delta]:
        self.buf += text
        out: list[Delta] = []
        self._run(out, final=False)
        return out

    def end_turn(self) -> list[Delta]:
        """Between two generated turns of one reply (the server's own loop): flush and start the next turn as the
        first started; a paragraph break separates two turns' text in a part."""
        out = self.finish()
        self._reset_turn()
        for part in self.parts.values():  # what follows in a part starts a new paragraph
            part.pending = "\n\n" if part.started else ""
        return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        self._run(out, final=True)
        if self.call is not None:  # the reply ended inside a call block
            call, self.call = self.call, None
            if not call.announced:
                self._emit(out, self._part(), OPEN_CALL + call.body + self.buf)
                self.buf = ""
        return out

    # ------------------------------------------------------------------ the machine
    def _part(self) -> str:
        if not self.split:
            return "content"
        if self.in_raw_call:
            return "reasoning"
        if self.rstar2:
            return "content" if self.in_answer else "reasoning"
        return "reasoning" if self.in_think else "content"

    def _emit(self, out: list[Delta], kind: str, text: str) -> None:
        if kind in self.parts:
            text = self.parts[kind].write(text)
        if text:
            if out and out[-1].kind == kind and kind != "call":
                out[-1].text += text
            else:
                out.append(Delta(kind, text, index=self.calls - 1 if kind == "arguments" else 0))

    def _run(self, out: list[Delta], final: bool) -> None:
        """Step while a step decides something; each step returns False when it needs more text."""
        while self.buf:
            if self.call is None:
                progressed = self._text(out, final)
            elif self.call.announced:
                progressed = self._arguments(out, final)
            else:
                progressed = self._call_head(out)
            if not progressed:
                break

    def _text(self, out: list[Delta], final: bool) -> bool:
        markers = [CLOSE_CALL] if self.in_raw_call else self.markers
        found = [(i, m) for i, m in ((self.buf.find(m), m) for m in markers) if i >= 0]
        if not found:
            keep = 0 if final else _held(self.buf, markers)
            self._emit(out, self._part(), self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        i, marker = min(found)
        self._emit(out, self._part(), self.buf[:i])
        self.buf = self.buf[i + len(marker):]
        self._marker(out, marker)
        return True

    def _marker(self, out: list[Delta], marker: str) -> None:
        if marker == OPEN_CALL:
            if self.calls_as_reasoning:  # on its own line in the reasoning
                self.in_raw_call = True
                self._emit(out, "reasoning", "\n" + marker)
            else:
                self.call = _Call()
        elif marker == CLOSE_CALL:  # the end of a call block written in the reasoning, or a close with no open
            self._emit(out, self._part(), marker)
            self.in_raw_call = False
        elif marker == "<answer>":
            self.in_answer = True
            self._emit(out, "content", marker)
        elif marker == "</answer>":
            self._emit(out, "content" if self.in_answer else self._part(), marker)
            self.in_answer = False
        elif marker in ("<think>", "</think>"):
            self.in_think = marker == "<think>"
        # <reason> and </reason> are dropped: everything outside the answer is reasoning

    def _kept(self) -> bool:
        """The current call is returned (parallel_tool_calls false keeps only the first)."""
        return self.parallel or self.calls == 1

    def _announce(self, out: list[Delta], name: str) -> bool:
        """A new call; False when it is dropped."""
        self.calls += 1
        if self._kept():
            out.append(Delta("call", index=self.calls - 1, id=new_call_id(), name=name))
        return self._kept()

    def _call_head(self, out: list[Delta]) -> bool:
        call, text = self.call, self.call.body + self.buf
        end = text.find(CLOSE_CALL, max(0, len(call.body) - len(CLOSE_CALL) + 1))  # the body so far holds none
        if not call.slow:
            state, at, name = _head(text, self.tool_names)
            if state == "match":
                self.buf, call.body, call.announced = text[at:], "", True
                self._announce(out, name)
                return True
            call.slow = state == "slow"
        if end < 0:
            call.body, self.buf = text, ""
            return False
        body, self.buf, self.call = text[:end], text[end + len(CLOSE_CALL):], None
        whole = _whole_call(body, self.tool_names)
        if whole is None:
            self._emit(out, self._part(), OPEN_CALL + body + CLOSE_CALL)
        elif self._announce(out, whole[0]):
            self._emit(out, "arguments", json.dumps(whole[1], ensure_ascii=False))
        return True

    def _arguments(self, out: list[Delta], final: bool) -> bool:
        """Stream the arguments object as written, to its closing brace; then drop the rest of the block."""
        call, buf = self.call, self.buf
        keep = self._kept()
        if call.closed:
            end = buf.find(CLOSE_CALL)
            if end >= 0:
                self.buf, self.call = buf[end + len(CLOSE_CALL):], None
                return True
            self.buf = buf[len(buf) - (0 if final else _held(buf, [CLOSE_CALL])):]
            return False
        i = 0
        while i < len(buf):
            c = buf[i]
            if call.in_string:
                call.in_string = call.escaped or c != '"'
                call.escaped = not call.escaped and c == "\\"
            elif c == '"':
                call.in_string = True
            elif c in "{[":
                call.depth += 1
            elif c in "}]":
                call.depth -= 1
                if call.depth == 0:
                    call.closed = True
                    i += 1
                    break
            elif c == "<" and buf.startswith(CLOSE_CALL, i):  # the block ended inside the arguments
                if keep:
                    self._emit(out, "arguments", buf[:i])
                self.buf, self.call = buf[i + len(CLOSE_CALL):], None
                return True
            elif c == "<" and not final and CLOSE_CALL.startswith(buf[i:]):
                break
            i += 1
        if keep:
            self._emit(out, "arguments", buf[:i])
        self.buf = buf[i:]
        return call.closed


def starts_in_reasoning(prompt_tail: str) -> bool:
    """Whether a reply starts inside a reasoning block: its prompt (the end of it, as text) opened one."""
    for open_tag, close_tag in (("<think>", "</think>"), ("<reason>", "</reason>")):
        if prompt_tail.rfind(open_tag) > prompt_tail.rfind(close_tag):
            return True
    return False


class LoopReader:
    """The server's own agent loop read live: its events (agent.py `OnEvent`) fed to a ReplyParser. A turn's text is
    flushed (`end_turn`) before its calls' activity, since the loop runs a turn's calls before it ends the turn, and
    at the turn's end; `event` returns the deltas each event adds."""

    def __init__(self, parser: ReplyParser, eos_text: str):
        self.parser, self.eos_text, self.turn_open = parser, eos_text, False

    def event(self, kind: str, payload: Any) -> list[Delta]:
        if kind == "text":
            self.turn_open = True
            return self.parser.feed(payload.replace(self.eos_text, ""))
        if kind in ("tool_call", "tool_result", "turn_end") and self.turn_open:
            self.turn_open = False
            return self.parser.end_turn()
        return []

    def finish(self) -> list[Delta]:
        return self.parser.finish()


@dataclass
class Reply:
    content: str | None = None
    reasoning: str | None = None
    calls: list[dict[str, str]] = field(default_factory=list)  # {"id", "name", "arguments"}


def reply_of(deltas: list[Delta]) -> Reply:
    """The whole reply that a sequence of deltas adds up to (what a client reassembles from a stream)."""
    content, reasoning, calls = [], [], {}
    for d in deltas:
        if d.kind == "content":
            content.append(d.text)
        elif d.kind == "reasoning":
            reasoning.append(d.text)
        elif d.kind == "call":
            calls[d.index] = {"id": d.id, "name": d.name, "arguments": ""}
        else:
            calls[d.index]["arguments"] += d.text
    return Reply("".join(content) or None, "".join(reasoning) or None, [calls[k] for k in sorted(calls)])


def parse_reply(turns: list[str], parser: ReplyParser) -> Reply:
    """The non-streamed reply: each generated turn's text fed whole to a new parser."""
    deltas: list[Delta] = []
    for k, text in enumerate(turns):
        deltas += parser.feed(text)
        deltas += parser.end_turn() if k < len(turns) - 1 else parser.finish()
    return reply_of(deltas)
