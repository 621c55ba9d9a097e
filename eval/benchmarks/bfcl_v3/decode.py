"""BFCL scoring reads the model's raw text as the leaderboard's handler for the model family does, not with the
product's own parser (rstar2_agent/tool_calls.py, which serve, chat and RL keep).

The `<tool_call>` JSON form (our hermes and rStar2 formats write Qwen's) is decoded as bfcl-eval 2025.6.8's
`QwenFCHandler` does (model_handler/local_inference/qwen_fc.py): what follows the last `</think>` is the response
(`_parse_query_response_prompting`); each `<tool_call>\\n...\\n</tool_call>` (newlines required, the tag written
exactly) is read with json.loads; one block that is not a JSON object makes the whole output "no call"; an object
without "name" or "arguments", or with arguments that are not an object, makes decoding fail. Then, as
`eval_runner` does: for AST categories a failure is `ast_decoder:decoder_failed`; for relevance categories a
failed or empty decode is "no call" (`is_empty_output`).

The multi-turn categories read each step as the handler's `decode_execute` does: the same blocks, each
`{name: arguments}` (arguments given as a JSON string are json.loads'ed, as bfcl_eval's `convert_to_function_call`
does; anything else must be an object), rendered as `name(k=repr(v),...)` strings that BFCL executes. A step whose
decoding raises or finds no call ends the user turn (`inference_multi_turn_prompting`), and its evaluation skips
it (`multi_turn_runner`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


@dataclass
class Decoded:
    """The calls as `[{"name", "arguments"}]`, or the reason decoding failed (`error`)."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def made_call(self) -> bool:
        """BFCL's relevance test: decoded, and not empty (`is_empty_output`: [] or [{}])."""
        return self.error is None and bool(self.calls)


def response_text(text: str) -> str:
    """What the handler decodes: the text after the reasoning's `</think>`, if any."""
    return text.split("</think>")[-1].lstrip("\n") if "</think>" in text else text


def tool_call_blocks(text: str) -> list[tuple[Any, str]]:
    """`QwenFCHandler._extract_tool_calls`: each block json.loads'ed (kept as text when it is not JSON), with the
    block's whole `<tool_call>...</tool_call>` text beside it."""
    blocks: list[tuple[Any, str]] = []
    for match in TOOL_CALL.finditer(text):
        block: Any = match.group(1)
        try:
            block = json.loads(block)
        except Exception:  # noqa: BLE001, S110 - the handler keeps the unreadable block as text
            pass
        blocks.append((block, match.group(0)))
    return blocks


def decode_ast(text: str) -> list[dict[str, Any]]:
    """`QwenFCHandler.decode_ast`, exactly: `[{name: arguments}]`; raises where it raises."""
    blocks = [b for b, _ in tool_call_blocks(text)]
    if any(type(b) is not dict for b in blocks):
        return []
    return [{b["name"]: {k: v for k, v in b["arguments"].items()}} for b in blocks]


def execute_calls(text: str) -> list[tuple[Any, dict[str, Any], str]]:
    """`QwenFCHandler.decode_execute` before its calls become strings: (name, arguments, the block's text) per
    call, in order; raises where it raises (a name that is not hashable, a key missing, arguments that are not an
    object nor a JSON string of one)."""
    found = tool_call_blocks(text)
    if any(type(b) is not dict for b, _ in found):
        return []
    pairs = [({b["name"]: b["arguments"]}, raw) for b, raw in found]
    out = []
    for call, raw in pairs:  # convert_to_function_call
        for name, value in call.items():
            if type(value) is str:
                value = json.loads(value)
            out.append((name, {k: v for k, v in value.items()}, raw))
    return out


def call_text(name: Any, arguments: dict[str, Any], args: tuple = ()) -> str:
    """A call as bfcl_eval's `convert_to_function_call` writes it for execution: `name(k=repr(v),...)`."""
    return f"{name}({','.join([*map(repr, args), *(f'{k}={v!r}' for k, v in arguments.items())])})"


def decode_execute(text: str) -> list[str]:
    """`QwenFCHandler.decode_execute`, exactly: the call strings BFCL executes; raises where it raises."""
    return [call_text(name, arguments) for name, arguments, _ in execute_calls(text)]


def decode(text: str) -> Decoded:
    """A model's raw response text -> its calls, as the leaderboard reads them."""
    try:
        official = decode_ast(response_text(text))
    except Exception as e:  # noqa: BLE001 - what the handler raises is what eval_runner reports
        return Decoded(error=f"{type(e).__name__}: {e}")
    return Decoded([{"name": name, "arguments": args} for item in official for name, args in item.items()])
