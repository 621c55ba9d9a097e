"""`rstar2 eval jsonl:PATH`: the user's own math problems, as lighteval's custom tasks allow, graded like the paper's
math benchmarks (math-verify against the answer, the paper's defaults unless flags say otherwise). PATH is relative
to the current directory (`~` expanded) and holds no comma: the command splits its argument into benchmarks there.

The file: one JSON object a line (blank lines skipped). The keys are the ones the project's other problem readers
take (training's problems files, the hub schemas), first found wins:
  text    "question", "problem" or "prompt" (a string)
  answer  "answer", "gold", "expected_answer", "numerical_answer" (a string or a number: an integer or an
          expression math-verify reads), else "solution": a worked solution, graded against its last \\boxed{}
          (MATH's rows), or against all of it when it has no box
  id      optional, a string or an integer, unique in the file; without one a problem is named by its line number

The stored benchmark name is `jsonl:<file stem>@<8 hex digits>`, the digits a hash of the problems as read (ids,
texts, answers, in file order): the same problems under the same file name resume the same run wherever the file
lies and however its JSON is spelled, and a changed file (an answer fixed, a problem added) is another benchmark,
so it starts a new run instead of mixing samples of two versions under one name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import numbered_jsonl
from rstar2_agent.chat_format import last_boxed

from .base import PAPER, DataError, MathBenchmark, Problem

PREFIX = "jsonl:"
TEXT_KEYS = ("question", "problem", "prompt")
ANSWER_KEYS = ("answer", "gold", "expected_answer", "numerical_answer")
SOLUTION_KEY = "solution"
EXAMPLE = '{"id": "p1", "question": "What is 6 * 7?", "answer": "42"}'


class JSONLFile(MathBenchmark):
    defaults = PAPER  # ours for a user's problems: the paper's math settings

    def __init__(self, spec: str):
        """`spec` is `jsonl:PATH`, the path relative to the current directory (`~` expanded). The file is read
        here: the stored name hashes its problems, and a bad file fails before any engine starts."""
        raw = spec.removeprefix(PREFIX).strip()
        if not raw:
            raise DataError(f"{spec!r} names no file: give jsonl:PATH, e.g. jsonl:problems.jsonl")
        self.path = Path(os.path.expanduser(raw))
        self.problems = read_problems(self.path)
        self.name = f"{PREFIX}{self.path.stem}@{content_hash(self.problems)}"
        self.problems = [Problem(p.id, p.text, p.answer, self.name, p.meta) for p in self.problems]

    def load(self, data_dir=None, limit=None) -> list[Problem]:
        return self.problems[:limit] if limit else list(self.problems)


def content_hash(problems: list[Problem]) -> str:
    payload = json.dumps([[p.id, p.text, p.answer] for p in problems], ensure_ascii=False)
    return hashlib.blake2b(payload.encode(), digest_size=4).hexdigest()


def read_problems(path: Path) -> list[Problem]:
    """The file's problems in order; any line that is not one is a DataError naming the line and what to fix."""
    if not path.is_file():
        where = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise DataError(f"jsonl:{path}: {path.resolve()} {where}; give the path of a JSONL file of problems "
                        "(relative to the current directory)")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, row in numbered_jsonl(path, EXAMPLE):
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: a JSON {type(row).__name__}, not an object; each line must be one JSON "
                            f"object, e.g. {EXAMPLE}")
        problem = _problem(row, lineno, where)
        if problem.id in seen:
            raise DataError(f"{where}: the id {problem.id!r} is also line {seen[problem.id]}'s"
                            f"{'' if 'id' in row else ' (this line has no id: its line number is its id)'}; "
                            "ids must be unique in the file")
        seen[problem.id] = lineno
        problems.append(problem)
    if not problems:
        raise DataError(f"{path}: no problems in the file; write one JSON object a line, e.g. {EXAMPLE}")
    return problems


def _problem(row: dict[str, Any], lineno: int, where: str) -> Problem:
    text = next((row[k].strip() for k in TEXT_KEYS if isinstance(row.get(k), str) and row[k].strip()), None)
    if text is None:
        raise DataError(f"{where}: no question; give the problem's text as a non-empty string under one of "
                        f"{', '.join(map(repr, TEXT_KEYS))} (keys here: {', '.join(map(repr, row)) or 'none'})")
    answer = next((a for a in (_answer(row.get(k)) for k in ANSWER_KEYS) if a is not None), None)
    if answer is None and (solution := _answer(row.get(SOLUTION_KEY))) is not None:
        answer = last_boxed(solution) or solution
    if not answer:
        raise DataError(f"{where}: no answer; give it as a string or a number under one of "
                        f"{', '.join(map(repr, (*ANSWER_KEYS, SOLUTION_KEY)))} (a solution is graded against its "
                        "last \\boxed{})")
    pid = row.get("id", lineno)
    if isinstance(pid, bool) or not isinstance(pid, str | int) or not str(pid).strip():
        raise DataError(f"{where}: the id {pid!r} is not a non-empty string or an integer; fix it or leave the "
                        "id out (the line number is then the id)")
    return Problem(str(pid).strip(), text, answer)


def _answer(value: Any) -> str | None:
    """A gold answer as the grader reads it: a string, or a number written as an integer where it is one (the
    integer fast path then decides), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return value.strip() or None
    return None
