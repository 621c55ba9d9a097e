"""Seeded tool tasks: problems whose data sits in the question (a list of numbers, a matrix, a polynomial's
coefficients, a table) and whose program must read that data from the tool's `input` (stdin) and parse it, or
use numpy or sympy correctly. Unlike synthetic.py's one-liners, such programs fail in realistic ways (int() on
a whole line, an unskipped header row, `*` for `@`, a float index), which is what GRPO-RoC's tool-error penalty
needs to act on: a policy that sometimes calls the tool with a bug and then fixes it.

`problems(seed, n)` gives ToolProblems (a SynthProblem plus the stdin and the bugs a first try may have);
every answer is an integer the math grader checks. `conversations(seed, n, error_share)` gives SFT records in
synthetic.conversation's format, of two kinds mixed by a seeded draw: clean (one correct call, then the answer)
and error-then-fix (a call with one of the problem's bugs, the error it raises, a sentence naming the bug, the
fixed call, then the answer). The tool replies are the real sandbox's: every program is run once in a
LocalSandbox when the records are made (a few hundred programs take a few seconds) and rendered by
chat_format.format_result with a fixed execution time, so records are deterministic per seed. Every bug raises
in the user's own file (its traceback names no installed library's path), so the texts do not depend on where
the packages live. Generation checks itself: a reference program that does not print the answer, or a bug that
does not fail, raises ToolTaskError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rstar2_agent.chat_format import default_tools, problem_message, tool_message
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig, SandboxError
from rstar2_agent.sandbox.tools import STATELESS_TOOL
from rstar2_agent.sandbox.types import ExecRequest, ExecResult, Sandbox
from rstar2_agent.synthetic import SynthProblem

DEFAULT_ERROR_SHARE = 0.5
RENDERED_DURATION = 0.01  # seconds shown as the execution time of every rendered reply (real timings vary)


class ToolTaskError(RuntimeError):
    """A generated program does not behave as its task says (a bug in this module, not in the data)."""


@dataclass(frozen=True)
class Bug:
    code: str  # a program with one realistic mistake that raises when run on the task's stdin
    diagnosis: str  # what the assistant says after reading the error, before the fixed call


@dataclass(frozen=True, kw_only=True)
class ToolProblem(SynthProblem):
    stdin: str  # the data in the problem's text, as the program reads it
    bugs: tuple[Bug, ...]


@dataclass(frozen=True)
class _Task:
    text: str
    stdin: str
    code: str
    answer: int
    bugs: tuple[Bug, ...]


def _lines(rows: list[list[int]]) -> str:
    return "\n".join(" ".join(map(str, row)) for row in rows)


# ---------------------------------------------------------------------------------------------- families
# Programs are short and data small, yet with the Hermes call and reply wrappers (~40 and ~70 tokens, plus
# ~30-120 for a traceback) a clean response runs ~200-250 SmolLM2 tokens and an error-then-fix one ~450-600,
# so an RL budget that should hold one fix needs ~640 response tokens.
def _divisible_squares(r: random.Random) -> _Task:
    k = r.randint(2, 5)
    nums = [r.randint(1, 50) for _ in range(r.randint(5, 10))]
    nums[r.randrange(len(nums))] = k * r.randint(1, 50 // k)  # at least one multiple of k
    data = " ".join(map(str, nums))
    rest = f"print(sum(x * x for x in a if x % {k} == 0))"
    return _Task(f"Here are some numbers:\n{data}\nWhat is the sum of the squares of those divisible by {k}?",
                 data + "\n", f"a = list(map(int, input().split()))\n{rest}", sum(x * x for x in nums if x % k == 0), (
        Bug(f"a = int(input())\n{rest}", "int() cannot read a line of several numbers; I must split it."),
        Bug(f"a = list(map(int, input()))\n{rest}", "map goes over single characters and fails on spaces; "
            "I must split the line."),
        Bug(f"a = input().split()\n{rest}", "The numbers are still strings; I must convert them with int."),
    ))


def _det(m: list[list[int]]) -> int:
    (a, b, c), (d, e, f), (g, h, i) = m
    return a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)


def _determinant(r: random.Random) -> _Task:
    m = [[r.randint(-9, 9) for _ in range(3)] for _ in range(3)]
    data = _lines(m)
    head = "import sys\nimport numpy as np\n"
    return _Task(f"The rows of a 3x3 matrix are:\n{data}\nWhat is its determinant?", data + "\n",
                 f"{head}m = np.array(sys.stdin.read().split(), float).reshape(3, 3)\n"
                 "print(round(np.linalg.det(m)))", _det(m), (
        Bug(f"{head}m = np.array(input().split(), float).reshape(3, 3)\nprint(round(np.linalg.det(m)))",
            "input() reads only the first row; I must read all of stdin."),
        Bug(f"{head}m = np.array(sys.stdin.read().split(), float).reshape(3, 3)\nprint(round(det(m)))",
            "det is in np.linalg."),
    ))


QUADRATICS = [(1, 0, 1), (1, 0, -2), (1, 1, 1), (1, 0, -3), (2, 0, -1), (1, 1, -1)]  # no rational roots
LINEARS = [(2, -1), (3, 1), (2, 1), (3, -2)]  # rational, not integer, roots


def _times(p: list[int], q: tuple[int, ...]) -> list[int]:
    out = [0] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return out


def _integer_roots(r: random.Random) -> _Task:
    roots = [r.randint(-6, 6) for _ in range(r.randint(1, 3))]
    poly = [r.choice([1, 1, 2, 3])]
    for x in roots:
        poly = _times(poly, (1, -x))
    extra = r.choice([(), r.choice(QUADRATICS), r.choice(LINEARS)])
    if extra:
        poly = _times(poly, extra)
    data = " ".join(map(str, poly))
    rest = "print(sum(1 for t in sp.roots(sp.Poly(c, x)) if t.is_integer))"
    return _Task(f"A polynomial has the coefficients below, highest power first:\n{data}\n"
                 "How many distinct integer roots does it have?", data + "\n",
                 f"import sympy as sp\nx = sp.Symbol('x')\nc = list(map(int, input().split()))\n{rest}",
                 len(set(roots)), (
        Bug(f"import sympy as sp\nc = list(map(int, input().split()))\n{rest}", "I forgot to define x."),
        Bug(f"import sympy as sp\nx = sp.Symbol('x')\nc = int(input())\n{rest}",
            "int() cannot read a line of several numbers; I must split it."),
    ))


ITEMS = [("parcel", "weight"), ("student", "score"), ("city", "rain"), ("runner", "time"), ("shop", "sales")]
NAMES = "ABCDEFGHIJ"


def _table_median(r: random.Random) -> _Task:
    item, field = r.choice(ITEMS)
    values = [r.randint(1, 99) for _ in range(r.choice([5, 7]))]
    data = "\n".join([f"{item} {field}", *(f"{n} {v}" for n, v in zip(NAMES, values, strict=False))])
    read = "import sys\nv = sorted(int(s.split()[1]) for s in sys.stdin.read().splitlines()"
    return _Task(f"The table below lists each {item}'s {field}:\n{data}\nWhat is the median {field}?", data + "\n",
                 f"{read}[1:])\nprint(v[len(v) // 2])", sorted(values)[len(values) // 2], (
        Bug(f"{read})\nprint(v[len(v) // 2])", "The first line is the header; I must skip it."),
        Bug(f"{read}[1:])\nprint(v[len(v) / 2])", "A list index must be an int; I must use //."),
        Bug(f"{read}[1:])\nprint(statistics.median(v))", "I forgot to import statistics."),
    ))


def _product_sum(r: random.Random) -> _Task:
    a = [[r.randint(-3, 9) for _ in range(3)] for _ in range(2)]
    b = [[r.randint(-3, 9) for _ in range(2)] for _ in range(3)]
    data = _lines(a + b)
    answer = sum(sum(a[i][k] * b[k][j] for k in range(3)) for i in range(2) for j in range(2))
    read = "import sys\nimport numpy as np\nr = [s.split() for s in sys.stdin.read().splitlines()]\n"
    pair = "a, b = np.array(r[:2], int), np.array(r[2:], int)\n"
    return _Task("The first two lines below are the rows of a 2x3 matrix A, the last three the rows of a 3x2 "
                 f"matrix B:\n{data}\nWhat is the sum of the entries of AB?", data + "\n",
                 f"{read}{pair}print((a @ b).sum())", answer, (
        Bug(f"{read}{pair}print((a * b).sum())", "* multiplies entry by entry; the matrix product is @."),
        Bug(f"{read}m = np.array(r, int)\nprint((m[:2] @ m[2:]).sum())",
            "A and B have rows of different lengths; I must make two arrays."),
    ))


FAMILIES: list[Callable[[random.Random], _Task]] = [
    _divisible_squares, _determinant, _integer_roots, _table_median, _product_sum]
OPENERS = ["I'll read the data from stdin in Python.", "Let me pass the data to a program as input.",
           "I'll give the data to Python as input."]


def problems(seed: int, n: int) -> list[ToolProblem]:
    """n problems with distinct texts (a repeated draw is drawn again), the same for the same seed."""
    r = random.Random(seed)
    out: list[ToolProblem] = []
    seen: set[str] = set()
    while len(out) < n:
        t = r.choice(FAMILIES)(r)
        if t.text in seen:
            continue
        seen.add(t.text)
        out.append(ToolProblem(f"tool-{seed}-{len(out)}", t.text, str(t.answer), "tooltasks", code=t.code,
                               stdin=t.stdin, bugs=t.bugs))
    return out


# ---------------------------------------------------------------------------------------------- conversations
def _call_message(content: str, call_id: str, code: str, stdin: str) -> dict[str, Any]:
    args = {"code": code, "input": stdin} if stdin else {"code": code}
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": STATELESS_TOOL, "arguments": json.dumps(args)}}]}


def _reply(call_id: str, result: ExecResult) -> dict[str, Any]:
    return tool_message(call_id, STATELESS_TOOL, dataclasses.replace(result, duration=RENDERED_DURATION))


def conversation(p: ToolProblem, opener: str, bug: Bug | None, results: list[ExecResult], *,
                 train_bug: bool = True) -> dict[str, Any]:
    """One chat record; `results` are the sandbox's results of the calls it makes (the bug's first, if any).
    `train_bug` False: the buggy call has weight 0 (read, not learned: chat_data.render)."""
    messages: list[dict[str, Any]] = [problem_message(p.text)]  # each format gives its own system turn
    codes = [bug.code, p.code] if bug else [p.code]
    texts = [opener, bug.diagnosis] if bug else [opener]
    for k, (code, text, result) in enumerate(zip(codes, texts, results, strict=True)):
        call_id = f"call_{p.id}_{k}"
        weight = {} if train_bug or not bug or k else {"weight": 0}
        messages += [{**_call_message(text, call_id, code, p.stdin), **weight}, _reply(call_id, result)]
    messages.append({"role": "assistant", "content": f"<answer>The answer is \\boxed{{{p.answer}}}.</answer>"})
    return {"messages": messages, "tools": default_tools()}


def _check(p: ToolProblem, code: str, result: ExecResult, should_fail: bool) -> None:
    if should_fail:
        if result.ok:
            raise ToolTaskError(f"{p.id}: a bug did not fail:\n{code}")
        if 'File "<' in result.stderr or result.stderr.count('File "') != result.stderr.count('File "main.py"'):
            raise ToolTaskError(f"{p.id}: a bug's traceback leaves the user's file:\n{result.stderr}")
    elif not result.ok or result.stdout != p.answer + "\n":
        raise ToolTaskError(f"{p.id}: the reference program gave {result.status} {result.stdout!r} "
                            f"{result.stderr[-300:]!r}, not {p.answer}")


async def conversations_async(seed: int, n: int, error_share: float = DEFAULT_ERROR_SHARE,
                              sandbox: Sandbox | None = None) -> list[dict[str, Any]]:
    """n records on problems(seed, n); about `error_share` of them error-then-fix (a seeded draw per record)."""
    if not 0.0 <= error_share <= 1.0:
        raise ValueError(f"error_share must be between 0 and 1, not {error_share}")
    r = random.Random(seed + 1)
    plans = []
    for p in problems(seed, n):
        opener = r.choice(OPENERS)
        bug = r.choice(p.bugs) if r.random() < error_share else None
        plans.append((p, opener, bug))
    return await records(plans, sandbox)


async def records(plans: list[tuple[ToolProblem, str, Bug | None]], sandbox: Sandbox | None = None, *,
                  train_bug: bool = True) -> list[dict[str, Any]]:
    """The chat records of (problem, opener, bug or None) plans, every call run once in the sandbox (a pool of this
    process's own when None), each bug checked to fail in the user's file and each fix to print the answer."""
    requests = [ExecRequest(code, p.stdin) for p, _, bug in plans for code in ([bug.code] if bug else []) + [p.code]]
    if sandbox is None:
        own = await _own_sandbox()
        try:
            results = await own.run_batch(requests)
        finally:
            await own.close()
    else:
        results = await sandbox.run_batch(requests)
    out, at = [], 0
    for p, opener, bug in plans:
        mine = results[at:at + (2 if bug else 1)]
        at += len(mine)
        if bug:
            _check(p, bug.code, mine[0], should_fail=True)
        _check(p, p.code, mine[-1], should_fail=False)
        out.append(conversation(p, opener, bug, mine, train_bug=train_bug))
    return out


async def _own_sandbox() -> LocalSandbox:
    """An isolated pool when bubblewrap works here; otherwise an unisolated one (these programs are ours, and
    isolation does not change what they print)."""
    sandbox = LocalSandbox(SandboxConfig(workers=2))
    try:
        await sandbox.start()
    except SandboxError:
        sandbox = LocalSandbox(SandboxConfig(workers=2, isolation=False))
        await sandbox.start()
    return sandbox


def conversations(seed: int, n: int, error_share: float = DEFAULT_ERROR_SHARE) -> list[dict[str, Any]]:
    """conversations_async from synchronous code (also from inside a running event loop)."""
    return _run(conversations_async(seed, n, error_share))


def records_sync(plans: list[tuple[ToolProblem, str, Bug | None]], *, train_bug: bool = True
                 ) -> list[dict[str, Any]]:
    """records from synchronous code."""
    return _run(records(plans, train_bug=train_bug))


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
