"""The `rstar2-paper` format: what the public rStar2-Agent-14B checkpoint (`rstar2-reproduce/rStar2-Agent-14B`)
saw in training, as far as the paper (arXiv 2508.20722) fixes it.

The release's README says its migrated training code "hasn't been used to train a complete model": the checkpoint
was trained in the paper's internal framework, whose format the paper shows in its prompt figure (Figure 3) and its
trace figures. What they fix, and what this format renders:

- The system turn: Figure 3's system prompt (PAPER_SYSTEM; it differs from the release's in four places: "The user
  asks", "provides the user", "The reasoning process and answer are enclosed within <reason> </reason> and
  <answer> </answer> tags", and no space between `</reason>` and `<answer>`; the release's wording stays in the
  `rstar2-release` format), then the Hermes "# Tools" block with one tool,
  `execute_python_code_with_standard_io`, whose schema is the release's (description, `code` and `input`, both
  required) plus a `return` entry (PAPER_SCHEMA).
- The user turn: "You must put your answer inside <answer> </answer> tags, ... This is the problem:\\n{problem}".
- A call: `<tool_call>{"name": "execute_python_code_with_standard_io", "arguments": {...}}</tool_call>`.
- A tool response, in a `user` turn of `<tool_response>` blocks: the program's bare output on success (its stdout,
  with the IPython-like echo of a final expression); `tool call failed` / `reason: error message: <traceback>` on
  failure; a call that does not decode gets its error message the same way. The next assistant turn opens `<reason>`.

Where the PDF's text loses whitespace, or the paper is silent, we chose (each a named deviation, not a guess
hidden in the code):
- Line breaks: as the release's template writes the same parts (the system block, `<tool_call>\\n...\\n</tool_call>`
  in history, `<tool_response>\\n...\\n</tool_response>`), and `tool call failed\\nreason: error message: ...`.
- The generation prompt: `<|im_start|>assistant\\n<reason>`. Figure 3's text ends with `<think>`, but its system
  prompt asks for `<reason>` and every trace figure opens assistant turns with `<reason>`, as the release does.
- Assistant turns without calls are written as they are (the release's template prefixes them with the problem
  instruction, a quirk of its code that the paper does not show), so SFT can render this format.
- On a failure only stderr is shown (the figure shows the traceback alone); a timeout or a memory kill reads
  `reason: error message: <our sandbox's message>`.
- Tool responses are inserted as the template renders the whole conversation: a newline after the model's
  `<|im_end|>`, then the user turn (the release's loop inserts none there; SFT renders the newline, so RL does too).
- The response is cut to 2,048 characters around `...(truncated)...` (the paper gives no limit; the release's
  verl default is 256); one call is answered a turn, as the release (verl's `max_parallel_calls`).
"""

from __future__ import annotations

from typing import Any

from .release_format import ReleaseFormat, truncate
from .sandbox.release_tool import RELEASE_SCHEMA, RELEASE_TOOL, stderr_of
from .sandbox.tools import STATELESS_TOOL
from .sandbox.types import ExecResult, Status
from .tool_calls import ToolCall

PAPER_TOOL = STATELESS_TOOL  # "execute_python_code_with_standard_io"
PAPER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PAPER_TOOL,
        "description": RELEASE_SCHEMA["function"]["description"],
        "parameters": RELEASE_SCHEMA["function"]["parameters"],
        "return": {"type": "string", "description": "str: The output produced by the executed code through standard "
                   "output. If an error occurs during execution, the error message will be returned."},
    },
}
# Figure 3's system prompt, as the paper prints it
PAPER_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "Assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <reason> </reason> and <answer> </answer> tags, "
    "respectively, i.e., <reason> reasoning process here </reason><answer> answer here </answer>."
)
FAILED = "tool call failed"
MAX_RESPONSE_CHARS = 2048


class PaperFormat(ReleaseFormat):
    name = "rstar2-paper"
    system = PAPER_SYSTEM
    python_tool = PAPER_TOOL
    alias = RELEASE_TOOL
    max_tool_output_chars = MAX_RESPONSE_CHARS

    @staticmethod
    def failure(message: str) -> str:
        return f"{FAILED}\nreason: error message: {message}"

    @classmethod
    def invalid_input(cls) -> str:
        return cls.failure("the input must be a string")

    @classmethod
    def result_text(cls, call: ToolCall, result: ExecResult | None, max_chars: int) -> str:
        if call.error is not None:
            return truncate(call.error, max_chars)
        assert result is not None
        if result.status == Status.OK:
            return truncate(result.stdout, max_chars)
        return truncate(cls.failure(stderr_of(result) or str(result.status)), max_chars)


def default_tools() -> list[dict[str, Any]]:
    return [PAPER_SCHEMA]
