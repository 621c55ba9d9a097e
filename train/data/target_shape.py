"""SFT targets in the rstar2-paper format's full shape, the shape the RL reward reads. The paper's traces (its
Figures 2, 10, 11) open every assistant turn in `<reason>` (the generation prompt writes that), close `</reason>`
before each tool call, and end the answer in `<answer>...</answer>` (with `\\boxed{}` for a math answer); RL's reward
is 0 without a well-formed answer block. Most SFT sources are plain chat or function-calling rows: a Tulu 3 answer is
`Leaves fall softly down.`, a ToolACE turn a bare call. Trained as written, they teach the model to ignore the
instruction every RL prompt gives it.

`target_shape` (the SFT recipe's):
- `format` (default): where an assistant turn lacks the shape, it is converted deterministically: a turn with calls
  gets `</reason>` after its text (the text is its reasoning); a turn without calls gets an empty reasoning closed
  and its text as the answer block, `</reason><answer>TEXT</answer>`, unless it already has one. Turns already in
  shape (the synthetic math conversations, a rewrite that wrote them so) are left as they are.
- `as_written`: the rows' own text.

Both are reported per source (`rstar2 train data --json`, the SFT run's info): the share of conversations whose
every assistant turn was in shape as written, and as trained.
"""

from __future__ import annotations

import re
from typing import Any

TARGET_SHAPES = ("format", "as_written")
OPEN, CLOSE = "<reason>", "</reason>"
ANSWER = re.compile(r"<answer>.*?</answer>\s*$", re.DOTALL)


def check_target_shape(shape: str) -> None:
    if shape not in TARGET_SHAPES:
        raise ValueError(f"target_shape must be one of {', '.join(TARGET_SHAPES)}, not {shape!r} (format: targets "
                         "converted to the rstar2-paper shape where they lack it; as_written: the rows' own text)")


def turn_in_shape(message: dict[str, Any]) -> bool:
    """An assistant turn as the paper writes one: `</reason>` before its calls, or, without calls, its reasoning
    closed and its text ending in an `<answer>` block."""
    text = message.get("content") or ""
    if message.get("tool_calls"):
        return CLOSE in text
    head, closed, tail = text.partition(CLOSE)
    return bool(closed) and bool(ANSWER.search(tail))


def in_shape(messages: list[dict[str, Any]]) -> bool:
    turns = [m for m in messages if m.get("role") == "assistant"]
    return bool(turns) and all(turn_in_shape(m) for m in turns)


def to_shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each assistant turn converted as the module says (turns in shape unchanged)."""
    out = []
    for m in messages:
        if m.get("role") != "assistant" or turn_in_shape(m):
            out.append(m)
            continue
        text = (m.get("content") or "").removeprefix(OPEN)
        if m.get("tool_calls"):
            body = text.rstrip() + CLOSE
        elif CLOSE in text:  # reasoning closed, the answer not in a block
            reasoning, _, answer = text.partition(CLOSE)
            body = f"{reasoning}{CLOSE}<answer>{answer.strip()}</answer>"
        else:
            body = f"{CLOSE}<answer>{text.strip()}</answer>"
        out.append({**m, "content": OPEN + body})
    return out
