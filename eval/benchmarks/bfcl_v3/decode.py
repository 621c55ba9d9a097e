"""BFCL scoring reads the model's raw text as the leaderboard's handler for the model family does, not with the
product's own parser (rstar2_agent/tool_calls.py, which serve, chat and RL keep).

The `<tool_call>` JSON form (our hermes and rStar2 formats write Qwen's) is decoded as bfcl-eval 2025.6.8's
`QwenFCHandler` does (model_handler/local_inference/qwen_fc.py): what follows the last `</think>` is the response
(`_parse_query_response_prompting`); each `<tool_call>\\n...\\n</tool_call>` (newlines required, the tag written
exactly) is read with json.loads; one block that is not a JSON object makes the whole output "no call"; an object
without "name" or "arguments", or with arguments that are not an object, makes decoding fail. Then, as
`eval_runner` does: for AST categories a failure is `ast_decoder:decoder_failed`; for relevance categories a
failed or empty decode is "no call" (`is_empty_output`).
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


def decode_ast(text: str) -> list[dict[str, Any]]:
    """`QwenFCHandler.decode_ast`, exactly: `[{name: arguments}]`; raises where it raises."""
    blocks: list[Any] = []
    for block in TOOL_CALL.findall(text):
        try:
            block = json.loads(block)
        except Exception:  # noqa: BLE001, S110 - the handler keeps the unreadable block as text
            pass
        blocks.append(block)
    if any(type(b) is not dict for b in blocks):
        return []
    return [{b["name"]: {k: v for k, v in b["arguments"].items()}} for b in blocks]


def decode(text: str) -> Decoded:
    """A model's raw response text -> its calls, as the leaderboard reads them."""
    try:
        official = decode_ast(response_text(text))
    except Exception as e:  # noqa: BLE001 - what the handler raises is what eval_runner reports
        return Decoded(error=f"{type(e).__name__}: {e}")
    return Decoded([{"name": name, "arguments": args} for item in official for name, args in item.items()])
