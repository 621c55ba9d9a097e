"""The released rStar2-Agent's Python tool: `python_code_with_standard_io(code, input)`, as the checkpoint saw it.

What the release did (microsoft/rStar, rstar2_agent/tools/code_judge_utils.py and code_judge_tool.py): every call
is a fresh program that runs the model's code in a small executor. The executor splits off a final bare
expression and prints its `repr` when it is not None; on an exception it writes one line to stderr,
`ErrorType at line N: message` and then the offending line indented by two spaces (`ErrorType: message` when the
line is unknown), and ends the process with `os._exit(1)`. The tool's answer is "Tool call success" or
"Tool call failure" with `reason`, `stdout`, `stderr` and `execution time`, a part left out when empty.

This module reproduces that behaviour; it does not include the release's code. `program(code)` is the program
the sandbox runs for one call (our executor: the same split, the same line arithmetic, including its quirks:
the line number is the innermost traceback frame's, and a failing final expression is run a second time as a
statement). `response(result)` is the text inside `<tool_response>`.

Named deviations, where the release's behaviour depends on its sandbox service (code-judge) and not on its code:
- stdout on a failure: `os._exit(1)` drops what a block-buffered stdout had not flushed yet. The program keeps
  stdout in 8192-character blocks (Python's buffer size) and drops the unflushed rest on a failure, as the
  release's process would; the block boundary is counted in characters, not bytes. An explicit flush
  (`print(..., flush=True)`, `sys.stdout.flush()`) and a normal exit (`sys.exit`, `exit()`) write it out, as
  they would there; the real stdout's attributes (`encoding`, `buffer`, `reconfigure`) stay reachable.
- a timeout's stderr carries our sandbox's own line ("TimeoutError: the program ran past its wall-time limit
  and was killed"); the failure reason is `worker_timeout`, as code-judge names it.
"""

from __future__ import annotations

from typing import Any

from .types import ExecResult, Status

RELEASE_TOOL = "python_code_with_standard_io"

# The schema as the release's tool config declares it (the key order is what the prompt shows).
RELEASE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RELEASE_TOOL,
        "description": "Execute Python code with standard input and capture standard output. This function takes a "
        "Python code string and an input string, provides the input string through standard input (stdin) to the "
        "code, and captures and returns any output produced through standard output (stdout). If the executed "
        "code raises an exception, the error message will be captured and returned instead.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "A string containing Python code to be executed. The code "
                         "can read from standard input using the input() function."},
                "input": {"type": "string", "description": "A string that will be provided as standard input to "
                          "the code when it calls input()."},
            },
            "required": ["code", "input"],
        },
    },
}

# code-judge's failure reasons by our status; a runtime error (an exception, a non-zero exit) has none.
REASONS = {Status.TIMEOUT: "worker_timeout", Status.QUEUE_TIMEOUT: "queue_timeout",
           Status.INTERNAL_ERROR: "internal_error"}

_EXECUTOR = r'''
def _rstar2_release(code):
    import os, sys

    class Blocks:  # a block-buffered stdout: what os._exit drops is the unflushed rest
        def __init__(self, out):
            self.out, self.buf = out, ""
        def write(self, s):
            self.buf += s
            while len(self.buf) >= 8192:
                self.out.write(self.buf[:8192])
                self.out.flush()
                self.buf = self.buf[8192:]
            return len(s)
        def flush(self):  # print(..., flush=True) and sys.stdout.flush() reach the pipe, as in the release
            self.out.write(self.buf)
            self.buf = ""
            self.out.flush()
        def __getattr__(self, name):  # encoding, buffer, fileno, isatty, reconfigure, ... of the real stdout
            if name == "buffer":
                self.flush()
            return getattr(self.out, name)

    def message(e, text, offset=0):
        if hasattr(e, "lineno"):
            lineno = e.lineno
        else:
            tb = e.__traceback__
            if tb:
                while tb.tb_next:
                    tb = tb.tb_next
                lineno = tb.tb_lineno
            else:
                lineno = -1
        if lineno != -1:
            lineno += offset
            lines = text.splitlines()
            if 0 <= lineno - 1 < len(lines):
                return f"{type(e).__name__} at line {lineno}: {e}\n  {lines[lineno - 1]}"
        return f"{type(e).__name__}: {e}"

    def fail(text):  # the release prints the error and leaves with os._exit(1), never flushing stdout
        print(text, file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    real = sys.stdout
    sys.stdout = out = Blocks(real)
    try:
        _rstar2_release_run(code, fail, message)
    finally:  # a normal end or exit (sys.exit, exit()) flushes stdout; fail's os._exit(1) never comes here
        sys.stdout = real
        out.flush()


def _rstar2_release_run(code, fail, message):
    import ast
    env = {"__name__": "__main__", "__file__": "<string>", "__builtins__": __builtins__}
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        fail(message(e, code))
    main, last = code, None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        node, lines = tree.body[-1], code.splitlines()
        main = "\n".join(lines[:node.lineno - 1])
        last = "\n".join(lines[node.lineno - 1:getattr(node, "end_lineno", node.lineno)])
    if main:
        try:
            exec(compile(main, "<string>", "exec"), env)
        except Exception as e:
            fail(message(e, main))
    if last:
        try:
            value = eval(compile(last, "<string>", "eval"), env)
            if value is not None:
                print(repr(value))
        except Exception:
            try:
                exec(compile(last, "<string>", "exec"), env)
            except Exception as e:
                fail(message(e, last, len(main.splitlines()) if main else 0))
'''


def program(code: str) -> str:
    """The program the sandbox runs for one call of the release's tool on `code`. The code is embedded as a
    string literal, so the sandbox still sees the modules it names (and picks its preloaded template)."""
    return f"{_EXECUTOR}\n_rstar2_release({code!r})\n"


def response(result: ExecResult) -> str:
    """The tool response text for a call that ran, as the release writes it."""
    if result.status == Status.OK:
        parts = ["Tool call success"]
    else:
        parts = ["Tool call failure", f"reason: {REASONS.get(result.status, '')}"]
    if result.stdout:
        parts.append(f"stdout: {result.stdout}")
    stderr = stderr_of(result)
    if stderr:
        parts.append(f"stderr: {stderr}")
    parts.append(f"execution time: {result.duration:.2f}s")
    return "\n".join(parts)


def stderr_of(result: ExecResult) -> str:
    """The program's stderr without our sandbox's closing note on a non-zero exit (code-judge adds none)."""
    exited = f"the program exited with code {result.exit_code}"
    if result.status == Status.ERROR and result.stderr.endswith(exited):
        return result.stderr[:-len(exited)]
    return result.stderr
