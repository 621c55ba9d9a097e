"""`rstar2 bench grading`: a seeded corpus of (gold, response) pairs, and graded answers per second
through the integer fast path against math-verify in the process pool, side by side in one process.

Three rows: rollouts as a policy writes them (`\\boxed{N}` in the answer block), the corpus, and integer golds
answered in the forms and places models write an integer in (`varied_pairs`: FORMS x PLACES with the corpus's
weights, integer golds only; 16,384 answers, a paper step's rollouts).

The corpus: golds from the benchmarks whose JSONL mirrors are in the data dirs (AIME24/25, HMMT25, MATH-500: every
gold, integer or not) and from the training data (synthetic.py's and tool_tasks.py's answers, DAPO-like integers
from 0 to 2^300, negatives, golds with leading zeros), plus golds that only look like integers ("42.0", "1,000",
"+5", ...). Each response writes a right or a wrong value in one of FORMS (plain, `042`, `42.0`, `4\\,2`, `42.`,
`$42$`, `4 2`, `+42`, `42\\%`, `x=42`, `42^\\circ`, `\\text{42}`, `42,000`, `-0`, U+2212, other scripts' digits,
...) and places it in one of PLACES (the answer block, a bare box, nested boxes, no box, a cut-off box, ...).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from rstar2_agent.chat_format import extract_answer
from rstar2_agent.eval.benchmarks import get_benchmark
from rstar2_agent.eval.benchmarks.base import data_dirs
from rstar2_agent.grading.math import MathGrade, MathGrader, integer_verdict, verify_answer


@dataclass(frozen=True)
class Pair:
    gold: str
    response: str
    kind: str  # "<form>/<place>/<right|wrong: the value drawn>/gold:<source>", to group disagreements by


BENCHMARK_GOLDS = ("aime24", "aime25", "hmmt25", "math500")
# Golds that look like integers but are not strictly one: the fast path must leave them to math-verify.
NEAR_INTEGER_GOLDS = ("42.0", "1,000", "+5", "x = 5", "90^\\circ", "25\\%", "\\text{12}", "4\\,2", "12 345", "٤٢",
                      "\\frac{14}{3}", "2\\sqrt{3}", "-0.0", "1e3")
LETTERS = "xnkmNaeEiIpqtyz"

Form = Callable[[int, random.Random], "str | None"]


def _split(*seps: str) -> Form:
    """The digits with one of `seps` between two of them (4\\,2, 4 2, 4{,}2): None for one digit."""
    def form(v: int, r: random.Random) -> str | None:
        s = str(abs(v))
        if len(s) < 2:
            return None
        i = r.randint(1, len(s) - 1)
        return ("-" if v < 0 else "") + s[:i] + r.choice(seps) + s[i:]
    return form


def _digits(zero: str) -> Form:
    """The digits written in another script (zero: that script's 0)."""
    return lambda v, r: str(v).translate({ord(c): ord(zero) + int(c) for c in "0123456789"})


FORMS: dict[str, Form] = {
    "plain": lambda v, r: str(v),
    "leading zero": lambda v, r: ("-" if v < 0 else "") + "0" * r.randint(1, 3) + str(abs(v)),
    "aime width": lambda v, r: f"{v:03d}",
    "plus": lambda v, r: f"+{v}",
    "negated": lambda v, r: f"-{abs(v)}",
    "minus zero": lambda v, r: r.choice(["-0", "+0", "-00", "\u22120"]) if v == 0 or r.random() < 0.3 else str(v),
    "unicode minus": lambda v, r: f"\u2212{abs(v)}",
    "decimal zero": lambda v, r: f"{v}." + "0" * r.randint(1, 3),
    "decimal": lambda v, r: f"{v}.{r.choice(['5', '0001', '0000001', '000000000000000001', '9'])}",
    "trailing period": lambda v, r: f"{v}.",
    "signed period": lambda v, r: f"{r.choice(['+', '-', chr(0x2212)])}{'0' * r.randint(0, 1)}{abs(v)}.",
    "dollars": lambda v, r: r.choice(["${}$", "$ {} $", "$${}$$", "\\${}", "{}\\$", "$\\displaystyle {}$"]).format(v),
    "thin space": _split("\\,"),
    "space": _split(" "),
    "other space": _split("\\;", "\\ ", "~", "\\!", "\\quad "),
    "thousands": lambda v, r: f"{v:,}",
    "thousands braces": lambda v, r: f"{v:,}".replace(",", "{,}"),
    "comma digits": _split(",", "{,}"),
    "degrees": lambda v, r: f"{v}" + r.choice(["^\\circ", "^{\\circ}", "°", "^\\circ.", "°.", " ^\\circ"]),
    "percent": lambda v, r: f"{v}" + r.choice(["\\%", "\\%.", "%", " \\%"]),
    "decimal percent": lambda v, r: f"{v}.0\\%",
    "assignment": lambda v, r: f"{r.choice(LETTERS)}{r.choice(['=', ' = ', '= '])}{v}",
    "signed assignment": lambda v, r: f"{r.choice(LETTERS)}={r.choice(['+', '-', chr(0x2212)])}"
                                      f"{'0' * r.randint(0, 1)}{abs(v)}",
    "text": lambda v, r: r.choice(["\\text{{{}}}", "\\textbf{{{}}}", "\\mathbf{{{}}}", "\\mathrm{{{}}}"]).format(
        r.choice(["", "0"]) + str(v)),
    "units": lambda v, r: f"{v}" + r.choice(["\\text{ cm}", " \\text{ dollars}", "\\text{ ways}", " cm", " apples"]),
    "sentence": lambda v, r: r.choice(["\\text{{The answer is }}{}", "answer: {}", "{} is the answer"]).format(v),
    "fraction": lambda v, r: r.choice(["\\frac{{{}}}{{2}}", "\\dfrac{{{}}}{{2}}", "{}/2"]).format(2 * v),
    "over one": lambda v, r: f"{v}/1",
    "brackets": lambda v, r: r.choice(["({})", "[{}]", "\\{{{}\\}}", "\\left({}\\right)", "{{{}}}"]).format(v),
    "punctuation": lambda v, r: f"{v}" + r.choice([";", ":", "\\\\", "\\text{.}", "\\,", "!", ",", "\\;."]),
    "spacing": lambda v, r: r.choice(["\\,{}", "\\!{}", "\\quad{}", "{}\\,", "\\displaystyle {}"]).format(v),
    "subscript": lambda v, r: f"{v}_{{{r.choice(['10', '8'])}}}",
    "two values": lambda v, r: r.choice(["{}, {}", "{} or {}", "{} and {}", "\\pm {}"]).format(v, v + 1),
    "expression": lambda v, r: r.choice(["{} + 0", "{} \\cdot 1", "{}^1", "{}\\times 1", "\\sqrt{{{}}}"]).format(
        v) if r.random() < 0.5 else f"{v - 3} + 3",
    "scientific": lambda v, r: f"{v}e0" if r.random() < 0.5 else f"{v} \\times 10^0",
    "arabic digits": _digits("\u0660"),
    "fullwidth digits": _digits("\uff10"),
    "empty": lambda v, r: "",
}
# How often each form is drawn for an integer gold: plain answers dominate (30%), as in rollouts; each other form
# gets about 1.8%, enough draws to cover its variants.
FORM_WEIGHTS = {name: (30.0 if name == "plain" else 1.8) for name in FORMS}

PLACES: dict[str, str] = {
    "answer block": "{why}<answer>The answer is \\boxed{{{a}}}.</answer>",
    "bare answer block": "<answer>\\boxed{{{a}}}</answer>",
    "box only": "{why} So the answer is $\\boxed{{{a}}}$.",
    "earlier box": "At first I got \\boxed{{{w}}}. {why}<answer>\\boxed{{{a}}}</answer>",
    "box outside block": "{why}<answer>The answer is {w}.</answer> \\boxed{{{a}}}",
    "nested boxes": "<answer>\\boxed{{\\boxed{{{a}}}}}</answer>",
    "two blocks": "<answer>\\boxed{{{w}}}</answer> Wait, no. <answer>\\boxed{{{a}}}</answer>",
    "fbox": "{why}<answer>\\fbox{{{a}}}</answer>",
    "no box": "{why}<answer>{a}</answer>",
    "cut off": "{why}<answer>The answer is \\boxed{{{a}",
}
PLACE_WEIGHTS = {"answer block": 12.0, "bare answer block": 3.0, "box only": 3.0, **{p: 1.0 for p in list(PLACES)[3:]}}


def _why(r: random.Random, repeats: int = 1) -> str:
    """Reasoning text before the answer: a tool call and its result, with numbers that are not the answer, said
    `repeats` times (about 240 characters each)."""
    a, b = r.randint(2, 999), r.randint(2, 999)
    text = (f"We need the value asked for. Let me compute {a} \\times {b} first.\n<tool_call>\n"
            f'{{"name": "python", "arguments": {{"code": "print({a} * {b})"}}}}\n</tool_call>\n'
            f"<tool_response>{a * b}</tool_response>\nSo the product is ${a * b}$, and the rest follows. ")
    return text * repeats


def _wrong(v: int, r: random.Random) -> int:
    s = str(abs(v))
    return r.choice([v + 1, v - 1, v * 10, -v if v else 1, int(s[::-1]) * (1 if v >= 0 else -1), v + 1000,
                     r.randint(0, 999), 0, v // 10])


def _golds(seed: int, data_dir: str | None) -> list[tuple[str, str]]:
    """(gold, source): the benchmarks' golds whose mirrors are present, then the training answers."""
    out: list[tuple[str, str]] = []
    dirs = data_dirs(data_dir)
    for name in BENCHMARK_GOLDS:
        bench = get_benchmark(name)
        if any((d / bench.source.file).is_file() for d in dirs):  # only local mirrors: no hub lookups from a corpus
            out += [(p.answer, name) for p in bench.load(data_dir)]
    from rstar2_agent import synthetic
    from rstar2_agent.train.data import tool_tasks

    out += [(p.answer, "synthetic") for p in synthetic.problems(seed, 200)]
    out += [(p.answer, "tool tasks") for p in tool_tasks.problems(seed, 200)]
    r = random.Random(seed)
    for _ in range(400):  # DAPO-like: mostly small non-negative integers, some large, negative or huge
        k = r.random()
        v = (r.randint(0, 999) if k < 0.55 else r.randint(1000, 10 ** 6) if k < 0.75 else -r.randint(1, 1000)
             if k < 0.85 else 2 ** r.randint(40, 300) if k < 0.95 else 0)
        out.append((f"{v:03d}" if 0 <= v < 100 and r.random() < 0.3 else str(v), "dapo-like"))
    out += [(g, "near integer") for g in NEAR_INTEGER_GOLDS]
    return out


def _as_int(gold: str) -> int | None:
    return int(gold) if re.fullmatch(r"\s*-?[0-9]+\s*", gold) else None


def answer_corpus(size: int = 10_000, seed: int = 0, data_dir: str | None = None, integers_only: bool = False
                  ) -> list[Pair]:
    """`size` (gold, response) pairs, the same for the same seed and data; half right, half wrong by value.
    `integers_only`: integer golds only, every answer in one of FORMS."""
    r = random.Random(seed)
    golds = [(g, s) for g, s in _golds(seed, data_dir) if not integers_only or _as_int(g) is not None]
    forms, form_w = list(FORM_WEIGHTS), list(FORM_WEIGHTS.values())
    places, place_w = list(PLACE_WEIGHTS), list(PLACE_WEIGHTS.values())
    out: list[Pair] = []
    while len(out) < size:
        gold, source = r.choice(golds)
        place = r.choices(places, place_w)[0]
        right = r.random() < 0.5
        v = _as_int(gold)
        if v is None:  # a non-integer gold: itself (right) or an integer in some form (wrong)
            form, answer = ("gold itself", gold) if right else ("integer", str(r.randint(0, 999)))
        else:
            form = r.choices(forms, form_w)[0]
            answer = FORMS[form](v if right else _wrong(v, r), r)
            if answer is None:
                continue
        text = PLACES[place].format(why=_why(r), a=answer, w=_wrong(v or 7, r))
        out.append(Pair(gold, text, f"{form}/{place}/{'right' if right else 'wrong'}/gold:{source}"))
    return out


def varied_pairs(count: int, seed: int = 0) -> list[Pair]:
    """Integer golds answered in the ways models write an integer: the corpus's forms and places with its weights
    (plain 30%, each other form about 1.8%; the answer block 12 in 25), right or wrong by half, integer golds only
    (the generated ones: the varied row needs no data)."""
    return answer_corpus(count, seed, None, integers_only=True)


def rollout_pairs(count: int, seed: int = 0) -> list[Pair]:
    """Integer golds answered as a policy writes them: 0.25 to 29 KB of reasoning and tool calls (about 70 to
    8,000 tokens; a paper stage-1 rollout is at most 8K), then `<answer>...\\boxed{N}.</answer>` with N right or
    wrong; one in ten cut off before an answer."""
    r = random.Random(seed)
    golds = [(g, s) for g, s in _golds(seed, None) if _as_int(g) is not None]
    out = []
    for _ in range(count):
        gold, _ = r.choice(golds)
        v = int(gold)
        place = "cut off" if r.random() < 0.1 else "answer block"
        a = str(v if r.random() < 0.5 else _wrong(v, r))
        out.append(Pair(gold, PLACES[place].format(why=_why(r, r.randint(1, 120)), a=a, w=""), f"plain/{place}"))
    return out


def math_verify_grade(pair: Pair, timeout: int | None = None) -> bool:
    """math-verify's verdict on a pair, in process (the oracle the fast path is checked against); a comparison past
    `timeout` seconds (math-verify's own timeouts: the main thread only) is wrong, as the grader's pool makes it."""
    predicted = extract_answer(pair.response)
    return predicted is not None and verify_answer(predicted, pair.gold, timeout)


def fast_disagreements(pairs: list[Pair], timeout: int = 10) -> tuple[int, list[tuple[Pair, bool, bool]]]:
    """(pairs the fast path decides, [(pair, fast verdict, math-verify's) where they differ]); math-verify cut at
    `timeout` seconds as the grader cuts it (`7123456!` runs for minutes): call it from the main thread."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    decided, differ = 0, []
    for pair in pairs:
        predicted = extract_answer(pair.response)
        fast = None if predicted is None else integer_verdict(predicted, pair.gold)
        if fast is None:
            continue
        decided += 1
        slow = math_verify_grade(pair, timeout)
        if fast != slow:
            differ.append((pair, fast, slow))
    return decided, differ


@dataclass
class GradingRow:
    name: str
    answers: int
    fast_per_s: float  # MathGrader(): the fast path, math-verify in the pool for the rest
    pool_per_s: float  # MathGrader(fast=False): everything through math-verify in the pool
    decided: int  # answers the fast path decided
    agree: int  # answers both graders gave the same verdict
    differ: list[tuple[Pair, MathGrade, MathGrade]]

    @property
    def ratio(self) -> float:
        return self.fast_per_s / self.pool_per_s


async def _timed(grader: MathGrader, pairs: list[Pair]) -> tuple[float, list[MathGrade]]:
    t0 = time.perf_counter()
    grades = await asyncio.gather(*(grader.grade(p.response, p.gold) for p in pairs))
    return len(pairs) / (time.perf_counter() - t0), grades


async def bench_grading(size: int = 10_000, rollouts: int = 2_000, seed: int = 0, data_dir: str | None = None,
                        varied: int = 16_384) -> list[GradingRow]:
    """Three rows: policy-like rollouts on integer golds, the whole corpus, and `varied` integer-gold answers in the
    forms and places models write them (`varied_pairs`); each graded by MathGrader() and by MathGrader(fast=False)
    (math-verify in the pool for every answer), the pool warm, in this order."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rows = []
    fast, pool = MathGrader(), MathGrader(fast=False)
    try:
        for g in (fast, pool):
            await g.grade("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5")  # processes up, math-verify imported
        for name, pairs in (("rollouts, integer golds", rollout_pairs(rollouts, seed)),
                            ("corpus", answer_corpus(size, seed, data_dir)),
                            ("varied integer forms", varied_pairs(varied, seed))):
            fast_s, fast_grades = await _timed(fast, pairs)
            pool_s, pool_grades = await _timed(pool, pairs)
            decided = sum(1 for p in pairs if (a := extract_answer(p.response)) is not None
                          and integer_verdict(a, p.gold) is not None)
            differ = [(p, f, s) for p, f, s in zip(pairs, fast_grades, pool_grades, strict=True)
                      if f.correct != s.correct]
            rows.append(GradingRow(name, len(pairs), fast_s, pool_s, decided, len(pairs) - len(differ), differ))
    finally:
        fast.close()
        pool.close()
    return rows
