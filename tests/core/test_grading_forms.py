"""The forms the integer fast path reads (grading/integers.py), each against math-verify: over seeded values (0,
negatives, leading zeros, numbers of hundreds of digits) and golds (the value itself, AIME's `073` width, what
math-verify reads the form as, near misses), wherever the fast path decides, its verdict is math-verify's; every form
of the table is met; and the bench's varied integer row has no disagreement."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from math import factorial, isqrt

import pytest

from rstar2_agent.bench.grading import FORMS as BENCH_FORMS
from rstar2_agent.bench.grading import fast_disagreements, varied_pairs
from rstar2_agent.grading import integers
from rstar2_agent.grading.math import verify_answer

# A template writes value v in one form (r: its seeded choices), with the integers math-verify may read it as (tried
# as golds besides v's own); None where the form has no way to write v.
Template = Callable[[int, random.Random], "tuple[str, tuple[int, ...]] | None"]


def _sign(v: int, r: random.Random, signs: str = "-+\u2212") -> str:
    """A sign for v: "-" or U+2212 for a negative one (or what `signs` allows), "" or "+" for the others."""
    if v < 0:
        return "-" if "\u2212" not in signs or r.random() < 0.6 else "\u2212"
    return "+" if "+" in signs and r.random() < 0.2 else ""


def _zeros(r: random.Random) -> str:
    return "0" * r.choice([0, 0, 0, 1, 2])


def _int(v: int, r: random.Random, signs: str = "-+\u2212") -> str:
    return f"{_sign(v, r, signs)}{_zeros(r)}{abs(v)}"


def _pieces(v: int, r: random.Random) -> tuple[str, str] | None:
    s = str(abs(v))
    if len(s) < 2:
        return None
    i = r.randint(1, len(s) - 1)
    return s[:i], s[i:]


def _mixed(v: int, r: random.Random) -> tuple[str, tuple[int, ...]] | None:
    p = _pieces(v, r)
    if p is None:
        return None
    sep = r.choice(["\\,", "\\;", "\\:", "\\ ", "\\quad ", "\\qquad ", " "])
    a, b = int(p[0]), int(p[1])
    return f"{'-' if v < 0 else ''}{_zeros(r)}{p[0]}{sep}{p[1]}", (a + b, -(a + b), a * b)


def _comma(v: int, r: random.Random) -> tuple[str, tuple[int, ...]] | None:
    p = _pieces(v, r)
    if p is None:
        return None
    zeros = "0" if r.random() < 0.2 else ""
    return f"{'-' if v < 0 else ''}{zeros}{p[0]}{r.choice([',', '{,}'])}{p[1]}", (int(p[0]), int(p[1]), -int(p[0]))


def _thousands(v: int, r: random.Random) -> tuple[str, tuple[int, ...]]:
    return f"{v:,}".replace(",", r.choice([",", "{,}"])), ()


def _pair(v: int, r: random.Random) -> tuple[str, tuple[int, ...]]:
    w = r.choice([v, v, v + 1, -v, 0])
    sep = r.choice([",", " or", " and", ", or", ", and", " \\text{ or }", ",\\text{and}", " \\text{and}"])
    return f"{_int(v, r, '-')}{sep} {_int(w, r, '-')}", (w,)


def _arith(v: int, r: random.Random) -> tuple[str, tuple[int, ...]]:
    b = r.choice([0, 1, 3, 12, r.randint(0, 10 ** 6)])
    op = r.choice(["+", "-", "*", "\\cdot", "\\times"])
    sp = r.choice(["", " "]), r.choice(["", " "])
    return f"{_int(v, r, '-')}{sp[0]}{op}{sp[1]}{_zeros(r)}{b}", (v + b, v - b, v * b)


def _fraction(v: int, r: random.Random) -> tuple[str, tuple[int, ...]]:
    q = r.choice([1, 2, 3, 7, 12, 10 ** 20 + 39])
    p = abs(v) * q + r.choice([0, 0, 1])
    sign = "-" if v < 0 else ""
    form = r.choice(["\\frac{{{s}{p}}}{{{q}}}", "{n}\\frac{{{p}}}{{{q}}}", "{n}\\dfrac{{{p}}}{{{q}}}",
                     "\\tfrac{{{s}{p}}}{{{q}}}", "{s}{p}/{q}"])
    return form.format(s=sign, n=sign, p=_zeros(r) + str(p), q=_zeros(r) + str(q)), (p // q, -(p // q))


def _factorial(v: int, r: random.Random) -> tuple[str, tuple[int, ...]]:
    n = abs(v) if abs(v) <= 460 else r.choice([0, 1, 2, 3, 5, 20, 100, 449, 450])
    f = factorial(n)
    return f"{'-' if v < 0 else ''}{_zeros(r)}{n}!", (f, -f, n)


def _digits(zero: str) -> Template:
    return lambda v, r: (str(v).translate({ord(c): ord(zero) + int(c) for c in "0123456789"}), ())


TEXT = ["text", "textbf", "mathbf", "mathrm"]
TEXTS = ["The answer is ", "Total", "so we get ", "Answer", "oo", "cm", "nan"]
UNITS = ["cm", "m", "ways", "dollars", "square units", "apples", "degrees", "minutes", "km per hour", "i", "and more"]

# Every form of the fast path's table, and its variants (signs, leading zeros, spacing).
FORMS: dict[str, Template] = {
    "integer": lambda v, r: (_int(v, r) + r.choice(["", ".0", ".000"]), ()),
    "period": lambda v, r: (f"{_zeros(r)}{abs(v)}" + r.choice([".", ".0.", "..", ".00"]), ()),
    "degrees": lambda v, r: (_int(v, r) + r.choice(["", ".0", ".", ".00"]) + r.choice(["", " "])
                             + r.choice(["^\\circ", "^{\\circ}", "\u00b0"]) + r.choice(["", "."]), ()),
    "signed period": lambda v, r: (r.choice(["-", "+", "\u2212"]) + _zeros(r) + f"{abs(v)}.", (-abs(v),)),
    "decimal": lambda v, r: (_int(v, r) + "." + r.choice(["5", "05", "50", "9" * r.randint(1, 30),
                                                           "0" * r.randint(1, 40) + "1"]), ()),
    "percent": lambda v, r: (f"{'-' if v < 0 else ''}{_zeros(r)}{abs(v)}" + r.choice(["", " "])
                             + r.choice(["\\%", "%"]), (v // 100, v * 100)),
    "percent period": lambda v, r: (_int(v, r) + "\\%.", (v // 100,)),
    "decimal percent": lambda v, r: (f"{'-' if v < 0 else ''}{_zeros(r)}{abs(v)}.{'0' * r.randint(1, 3)}"
                                     + r.choice(["", " "]) + "\\%", (v // 100,)),
    "assignment": lambda v, r: (r.choice(string.ascii_letters) + r.choice(["=", " = ", "= "]) + _int(v, r), ()),
    "text": lambda v, r: (f"\\{r.choice(TEXT)}{{{r.choice(['', ' '])}{_int(v, r)}{r.choice(['', ' '])}}}", ()),
    "units": lambda v, r: (_int(v, r) + r.choice(["", " "]) + r.choice(["", "\\ "])
                           + f"\\{r.choice(['text', 'mbox', 'mathrm'])}{{{r.choice(['', ' '])}{r.choice(UNITS)}}}"
                           + r.choice(["", "", "^2", "^{3}"]), ()),
    "unit words": lambda v, r: (_int(v, r) + r.choice(["", " "]) + r.choice(integers._UNIT_WORDS), ()),
    "answer phrase": lambda v, r: (r.choice(["answer:", "Answer:", "The answer is", "the answer is", "answer is"])
                                   + " " + _int(v, r, "-"), ()),
    "text prefix": lambda v, r: (f"\\text{{{r.choice(TEXTS)}}}"
                                 + r.choice(["", " "]) + _int(v, r, "-"), ()),
    "is the answer": lambda v, r: (f"{_int(v, r, '-')} is the {r.choice(['', 'final '])}answer", ()),
    "plus minus": lambda v, r: (f"\\pm{r.choice(['', ' '])}{_zeros(r)}{abs(v)}", (-abs(v),)),
    "times e": lambda v, r: (f"{_int(v, r, '-')}e{r.choice(['0', '00', '1', '3', '12', '007'])}", ()),
    "fraction": _fraction,
    **{f"brackets {b}": (lambda v, r, b=b: (b.format(_int(v, r)), ())) for b in [
        "({})", "( {} )", "[{}]", "\\{{{}\\}}", "\\left({}\\right)", "\\left[{}\\right]", "\\left\\{{{}\\right\\}}",
        "{{{}}}"]},
    "punctuation": lambda v, r: (_int(v, r) + r.choice([";", ":", "\\\\", "\\text{.}", "\\text{,}", "\\,", "\\,.", ",",
                                                        "\\;", "\\;.", "\\quad", " .", "\\!", "~"]), ()),
    "spacing": lambda v, r: (r.choice(["\\,", "\\!", "\\quad", "\\quad ", "\\;", "\\ ", "\\displaystyle ",
                                       "\\displaystyle"]) + _int(v, r), ()),
    "subscript": lambda v, r: (_int(v, r) + r.choice(["_{10}", "_{8}", "_{(10)}", "_2", "_{16}."]), ()),
    "dollar sign": lambda v, r: (r.choice(["\\${}", "\\$ {}", "\\$\\,{}", "{}\\$", "{} \\$"]).format(_int(v, r)), ()),
    "mixed": _mixed,
    "joined": lambda v, r: (lambda p: None if p is None else (f"{'-' if v < 0 else ''}{p[0]}\\!{p[1]}", ()))(
        _pieces(v, r)),
    "thousands": _thousands,
    "comma": _comma,
    "pair": _pair,
    "arithmetic": _arith,
    "power one": lambda v, r: (_int(v, r) + r.choice(["^1", "^{1}"]), ()),
    "times ten": lambda v, r: (lambda k: (f"{_int(v, r, '-')}{r.choice(['', ' '])}\\times{r.choice(['', ' '])}10^{k}",
                                          (v * 10 ** int(k.strip("{}")),)))(r.choice(["0", "2", "{3}", "{0}"])),
    "square root": lambda v, r: (lambda x: (f"\\sqrt{{{_zeros(r)}{x}}}", (isqrt(x),)))(
        r.choice([v * v, v * v + 1, abs(v), max(v * v - 1, 0)])),
    "factorial": _factorial,
    "arabic digits": _digits("\u0660"),
    "persian digits": _digits("\u06f0"),
    "devanagari digits": _digits("\u0966"),
    "fullwidth digits": _digits("\uff10"),
    "empty": lambda v, r: ("", ()),
}

VALUES = [0, 1, 2, 5, 7, 10, 42, 73, 100, 120, 999, 1000, 1764, 4200, 12_345, 10 ** 6, 2 ** 64, 3 ** 200]
WRAPS = ["{}", "{}", "{}", "${}$", "$ {} $", "$${}$$"]


def _golds(v: int, extra: tuple[int, ...]) -> list[str]:
    """Gold strings for value v: itself (with AIME's width, or a leading zero after a minus), its neighbours and
    negation, 0, and the extras."""
    out = set()
    for g in {v, v + 1, -v, 0, *extra}:
        if len(str(abs(g))) <= 1000:
            out.add(str(g))
            if 0 <= g < 100:
                out.add(f"{g:03d}")
            elif g < 0:
                out.add(f"-0{-g}")
    return sorted(out)


def _cases(seed: int, per_form: int) -> list[tuple[str, str, str]]:
    """(form name, prediction, gold): per form, `per_form` values drawn from VALUES and seeded ones (0, a negative and a
    number of hundreds of digits always among them)."""
    r = random.Random(seed)
    out = []
    for name, template in FORMS.items():
        values = [0, -r.choice(VALUES[1:]), r.randint(10 ** 200, 10 ** 300)]
        values += [r.choice(VALUES) * r.choice([1, 1, -1]) for _ in range(per_form - 3)]
        for v in values:
            made = template(v, r)
            if made is None:
                continue
            predicted, extra = made
            predicted = r.choice(WRAPS).format(predicted)
            out += [(name, predicted, g) for g in _golds(v, extra)]
    return out


def test_every_form_matches_math_verify_where_it_decides():
    decided, forms_met, differ = 0, set(), []
    for name, predicted, gold in _cases(seed=0, per_form=10):
        fast = integers.integer_verdict(predicted, gold)
        if fast is None:
            continue
        decided += 1
        forms_met.add(integers.read_form(predicted)[0])
        slow = verify_answer(predicted, gold)
        if fast != slow:
            differ.append(f"{name}: {predicted!r} against {gold!r}: fast {fast}, math-verify {slow}")
    assert not differ, "\n".join(differ[:40])
    assert decided > 1500
    missing = [integers._FORMS[i][0].pattern for i in range(len(integers._FORMS)) if i not in forms_met]
    assert not missing, f"forms of the table no case met: {missing}"


@pytest.mark.parametrize("predicted, gold, correct", [
    # the module docstring's tricky ones: what math-verify reads them as, decided the same way
    ("\\text{042}", "42", False), ("\\text{42}", "042", True), ("\\text{+42}", "42", False), ("\\text{-0}", "0", False),
    ("-5\\%", "-5", False), ("-500\\%", "-5", True), ("100\\%", "1", True), ("100\\%", "100", True),
    ("100\\%.", "1", False), ("42.0\\%", "42", False), ("4200.0\\%", "42", True),
    ("+7.", "7", False), ("\u22127.", "-7", False), ("-7.", "-7", True), ("-07.", "-7", False), ("-00.", "0", True),
    ("4\\,2", "6", True), ("4\\,2", "42", False), ("4 2", "6", True), ("4\\,0", "0", True), ("4\\,0", "4", False),
    ("12\\,345", "357", True), ("4\\!2", "42", True),
    ("42,000", "42000", True), ("4,2", "42", False), ("1,1", "1", True), ("1{,}000{,}000", "1000000", True),
    ("42, 43", "42", False), ("42 or 42", "42", True),
    ("42.5", "42", False), ("0.5", "0", False), ("42.0000000000000000001", "42", False),
    ("\\frac{84}{2}", "42", True), ("-\\dfrac{85}{2}", "-42", False), ("84/2", "42", True),
    ("\\sqrt{1764}", "42", True), ("\\sqrt{1765}", "42", False), ("5!", "120", True), ("-5!", "-120", True),
    ("\\text{The answer is }42", "42", False), ("\\text{The answer is }0", "0", True),
    ("\\text{The answer is } 42", "42", None), ("42 is the answer", "42", False),
    ("\\pm 42", "42", False), ("\\pm 0", "0", True), ("42e0", "0", True), ("42e0", "42", False),
    ("42\\text{ cm}", "42", True), ("42 \\text{ square units}", "42", True), ("42 apples", "42", True),
    ("\\$42", "42", True), ("$$42$$", "42", True), ("(42)", "42", True), ("42;", "42", True), ("42_{8}", "42", True),
    ("\u0664\u0662", "42", False), ("\uff14\uff12", "42", False), ("", "0", False),
])
def test_tricky_forms_are_decided_as_math_verify_decides(predicted, gold, correct):
    """None: left to math-verify (`\\text{The answer is } 42`, with a space, is read by its `answer` anchor)."""
    assert integers.integer_verdict(predicted, gold) is correct
    if correct is not None:
        assert verify_answer(predicted, gold) is correct


@pytest.mark.parametrize("predicted, gold", [
    ("4~2", "4"),  # math-verify reads only the 4 (and `~42` unlike `42~`)
    ("+42\\%", "42"), ("\u221242\\%", "-42"),  # percentages signed otherwise than with -
    ("01,500", "1500"), ("0,123", "123"),  # a thousands group after a leading zero is a decimal
    ("42\\text{ and more}", "42"), ("42\\text{percent}", "42"),  # texts math-verify rewrites before reading
    ("42 dollars", "42"), ("42 dogs", "42"),  # words outside math-verify's unit list
    ("\\frac{42}{0}", "0"), ("\\sqrt{-4}", "2"), ("42^2", "1764"), ("\\boxed{42}", "42"),
    ("2" * 1001, "2" * 1001), ("2" * 1001 + "!", "1"),  # more digits than the fast path reads
])
def test_forms_whose_verdict_is_not_decided_go_to_math_verify(predicted, gold):
    assert integers.integer_verdict(predicted, gold) is None


def test_a_factorial_past_449_is_wrong_without_computing_it():
    """450! has 1,001 digits, more than any gold the fast path reads; 2^40! would hold math-verify until its timeout."""
    assert integers.integer_verdict(f"{2 ** 40}!", "1") is False
    assert integers.integer_verdict("449!", str(factorial(449))) is True


def test_the_bench_varied_row_has_no_disagreement():
    """The bench's `varied integer forms` row (integer golds, every form and place drawn as the corpus draws them): on a
    seeded sample the fast path decides most answers and every verdict is math-verify's."""
    pairs = varied_pairs(1_500, seed=5)
    assert {p.kind.split("/")[0] for p in pairs} == set(BENCH_FORMS)
    decided, differ = fast_disagreements(pairs)
    assert decided > 1_000
    assert not differ, "\n".join(f"{p.gold!r} ({p.kind}): fast {f}, math-verify {s}" for p, f, s in differ[:30])
