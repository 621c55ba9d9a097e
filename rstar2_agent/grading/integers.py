"""The integer fast path of the math grader: math-verify's verdict on a prediction against an integer gold, decided
without math-verify for the forms models write an integer in.

Each form below is there because math-verify's verdict on it is a function of the integers written in it, the same
for every value: mostly the integer comparison (`42`, `-042`, `42.0`, `$42$`, `42^\\circ`, `42\\text{ cm}`, `(42)`,
`\\frac{84}{2}`, `1{,}000`, `x = 42`, `42;`, ...), elsewhere what math-verify reads the form as
(tests/core/test_grading_forms.py checks every form against math-verify over seeded values: zero, negatives, leading
zeros, numbers of hundreds of digits):

- `42\\%` is 42/100, and math-verify also compares a percentage's number itself: right against 42, and `4200\\%`
  against 42; `-42\\%` and `42.0\\%` only the second way (the minus is outside the percentage; a decimal's
  percentage is a float);
- `4\\,2`, `4 2`, `4\\;2` are the mixed number 4 + 2 (latex2sympy's `2 \\frac{1}{2}` rule), `4\\,0` is 4 x 0;
- `4,2` is the set {4, 2} (equal to an integer only when both are it), `4,200` and `4{,}200` the number 4200;
- `\\text{42}` is compared as text: right only when written as Python writes the gold (`\\text{042}`, `\\text{+42}`
  and `\\text{-0}` are wrong);
- `-42.` is -42 written without leading zeros, otherwise nothing (wrong); `+42.` and U+2212 `42.` are wrong;
- `42.5` (a fraction digit that is not 0) is not an integer: wrong;
- `\\text{The answer is }42`, `42 is the answer` and `\\pm 42` are a product with symbols (or the set {-42, 42}):
  right only when both are 0; `42e0` is 42 x e x 0: right only against 0;
- `\\sqrt{1764}` is 42; `5!` is 120, computed up to 449!; from 450! on a factorial has more than 1,000 digits, more
  than any gold read here: wrong, as math-verify says when it finishes (on `898871!` it runs for minutes; the pool
  cuts it at its timeout, wrong there too);
- digits of other scripts (Arabic-Indic, fullwidth, ...): math-verify parses nothing and compares the text, never
  equal to the gold's ASCII digits: wrong; an empty answer: wrong.

Where math-verify's LaTeX parser fails on a form (`42;`, `42_{8}.`, `answer: 42`, `42\\%.`) it reads the digits with
a plain-number pattern of its own, which takes neither `+` nor U+2212 and misreads `-042`: those forms are read
here with a minus or no sign, and with leading zeros only unsigned. Inside $$...$$ only a plain integer is, and a
trailing `\\text{}` inside `$ ... $` with spaces is not (math-verify drops a unit's text only at the very end).
Forms whose verdict depends on more than the integers (`4~2` reads only the 4, `~42` is unlike `42~`, `+42\\%`,
`01,500` is the decimal 1.5, words outside the unit list math-verify strips, ...) go to math-verify.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from math import factorial, isqrt

# An integer gold: digits 0-9 only, at most 1,000 of them (past Python's int-string limit of 4,300 math-verify's parse
# fails and it compares strings instead; the fast path's integers stay below that too).
_INT_GOLD = re.compile(r"\s*(-?)([0-9]{1,1000})\s*", re.ASCII)

_D = "[0-9]{1,1000}"  # the digits of an integer in a prediction
_INT = rf"(?P<s>[-+\u2212]?)(?P<d>{_D})"  # a signed integer: -, + or U+2212
# Words math-verify's unit list (latex2sympy2_extended's `units`) removes after a number, as models write them.
_UNIT_WORDS = ("cm", "mm", "km", "m", "kg", "g", "units", "unit", "ways", "days", "hours", "minutes", "seconds",
               "students", "degrees", "meters", "inches", "feet", "years", "cents", "apples", "sq units")
# Words in a \\text{} that math-verify rewrites before it reads the text (`and`/`or` become a comma, `percent` a
# percent sign): such a text is left to it.
_REWRITTEN_WORDS = frozenset({"and", "or", "percent", "percentage", "pct", "inf", "infinity"})


def _value(sign: str, digits: str) -> int:
    return -int(digits) if sign in ("-", "\u2212") else int(digits)


def _eq(m: re.Match[str], gold: int) -> bool | None:
    return _value(m["s"], m["d"]) == gold


def _unsigned_zeros(m: re.Match[str], gold: int) -> bool | None:
    """The integer, in a form math-verify reads with its plain-number pattern: leading zeros only without a minus
    (it misreads `-042`)."""
    if m["s"] and m["d"][0] == "0" and len(m["d"]) > 1:
        return None
    return _value(m["s"], m["d"]) == gold


def _signed_period(m: re.Match[str], gold: int) -> bool | None:
    """`-42.` is -42 (`-0.`, `-00.` are 0); `-042.`, `+42.`, U+2212 `42.` are wrong."""
    d = m["d"]
    return m["s"] == "-" and (d[0] != "0" or d.strip("0") == "") and -int(d) == gold


def _percent(m: re.Match[str], gold: int) -> bool | None:
    """`42\\%` is right against 42 and against 0.42 (that is, 42 = 100 x gold); `-42\\%` only as -0.42. With leading
    zeros math-verify reads it otherwise: left to it."""
    if m["d"][0] == "0" and len(m["d"]) > 1:
        return None
    v = _value(m["s"], m["d"])
    return v == 100 * gold or (m["s"] == "" and v == gold)


def _hundredths(m: re.Match[str], gold: int) -> bool | None:
    """`42.0\\%`: a decimal's percentage, only 0.42."""
    return _value(m["s"], m["d"]) == 100 * gold


def _text(m: re.Match[str], gold: int) -> bool | None:
    """`\\text{42}` is compared as text: right only when it is the gold's integer as Python writes it."""
    return m["c"] == str(gold)


def _units(m: re.Match[str], gold: int) -> bool | None:
    if _REWRITTEN_WORDS.intersection(m["u"].lower().split()):
        return None
    return _value(m["s"], m["d"]) == gold


def _zero_product(m: re.Match[str], gold: int) -> bool | None:
    """A number times symbols (`\\text{The answer is }42`, `42 is the answer`) or ±42: equal to an integer only when
    both are 0. A minus after a text is a subtraction: `\\text{...}-42` is never an integer."""
    if "t" in m.re.groupindex and _REWRITTEN_WORDS.intersection(m["t"].lower().split()):
        return None
    return m["s"] == "" and int(m["d"]) == 0 and gold == 0


def _times_e(m: re.Match[str], gold: int) -> bool | None:
    """`42e0` is 42 x e x 0; `42e3` 42 x e x 3, never an integer."""
    return gold == 0 and (int(m["d"]) == 0 or int(m["k"]) == 0)


def _fraction(m: re.Match[str], gold: int) -> bool | None:
    q = int(m["q"])
    if q == 0:
        return None
    f = Fraction(_value(m["ps"], m["p"]), q)
    return (-f if m["n"] else f) == gold


def _mixed(m: re.Match[str], gold: int) -> bool | None:
    """`4\\,2` is the mixed number 4 + 2; `4\\,0` is 4 x 0."""
    a, b = int(m["a"]), int(m["b"])
    v = a + b if b > 0 else 0
    return (-v if m["s"] else v) == gold


def _joined(m: re.Match[str], gold: int) -> bool | None:
    """`4\\!2` and `4{,}200`: math-verify drops the `\\!` and the thousands commas."""
    return _value(m["s"], re.sub(r"\D", "", m["d"])) == gold


def _comma(m: re.Match[str], gold: int) -> bool | None:
    """`4,200` is 4200 (a first group of 1-3 digits without a leading zero, then groups of three); `4,2` the set {4, 2};
    `04,200` math-verify reads as a decimal: left to it."""
    a, b = m["a"], m["b"]
    if len(b) == 3 and len(a) <= 3:
        return None if a[0] == "0" else _value(m["s"], a + b) == gold
    return {_value(m["s"], a), int(b)} == {gold}


def _pair(m: re.Match[str], gold: int) -> bool | None:
    """`4, 2`, `4 or 2`, `4 and 2`: the set {4, 2}."""
    return {_value(m["s"], m["d"]), _value(m["s2"], m["d2"])} == {gold}


def _arith(m: re.Match[str], gold: int) -> bool | None:
    a, b, op = _value(m["s"], m["d"]), int(m["b"]), m["op"]
    return (a + b if op == "+" else a - b if op == "-" else a * b) == gold


def _power_of_ten(m: re.Match[str], gold: int) -> bool | None:
    return _value(m["s"], m["d"]) * 10 ** int(m["k"].strip("{}")) == gold


def _sqrt(m: re.Match[str], gold: int) -> bool | None:
    v = int(m["d"])
    r = isqrt(v)
    return r * r == v and r == gold


def _factorial(m: re.Match[str], gold: int) -> bool | None:
    """`5!` is 120, `-5!` -120; past 449! the factorial has more than 1,000 digits, more than any gold here."""
    v = int(m["d"])
    return v <= 449 and (-factorial(v) if m["s"] else factorial(v)) == gold


def _wrong(m: re.Match[str], gold: int) -> bool | None:
    return False


_DEGREES = r"(?:\^\\circ|\^\{\\circ\}|\u00b0)"
_OTHER_DIGITS = "[\u0660-\u0669]+|[\u06f0-\u06f9]+|[\u0966-\u096f]+|[\uff10-\uff19]+"
_UNIT = r"(?:\\ )?\\(?:text|mbox|mathrm)\{ ?(?P<u>[A-Za-z]{1,20}(?: [A-Za-z]{1,20}){0,3}) ?\}(?:\^[23]|\^\{[23]\})?"
_TEXT_WORDS = r"(?P<t>[A-Za-z]{2,20}(?: [A-Za-z]{1,20}){0,5}) ?"
_PUNCT = r"(?:;|:|\\\\|\\text\{[.,]\}|\\,\.?|,|\\;\.?|\\quad| \.|\\!|~)"
_SPACE = r"(?:\\,|\\!|\\quad ?|\\;|\\ |\\displaystyle ?)"
_BRACKETS = (r"\( ?{} ?\)", r"\[{}\]", r"\\\{{{}\\\}}", r"\\left\({}\\right\)", r"\\left\[{}\\right\]",
             r"\\left\\\{{{}\\right\\\}}", r"\{{{}\}}")

# (form, reader): the first form that matches the whole prediction decides. Plain integers first (most answers).
Reader = Callable[[re.Match[str], int], bool | None]
_FORMS: list[tuple[re.Pattern[str], Reader]] = [(re.compile(p, re.ASCII), f) for p, f in [
    (rf"{_INT}(?:\.0+)?", _eq),  # 42, -042, +42.0, U+2212 42
    (rf"(?P<s>)(?P<d>{_D})(?:\.0*)?(?:\^\\circ|\^\{{\\circ\}}|\u00b0)?\.?", _eq),  # 42., 42.0., 42^{\circ}., 42°
    (rf"(?P<s>)(?P<d>{_D})(?:\.0*)? ?{_DEGREES}\.?", _eq),  # 42 ^\circ, 042.^{\circ}.
    (rf"(?P<s>-)(?P<d>[1-9][0-9]{{0,999}}|0)(?:\.0*)? ?{_DEGREES}\.?", _eq),  # -42^\circ, -42.0 °.
    (rf"{_INT}(?:\.0)? ?(?:\^\\circ|\^\{{\\circ\}})", _eq),  # +42^\circ, U+2212 042.0 ^{\circ} (not °, no period)
    (rf"(?P<s>[-+\u2212])(?P<d>{_D})\.", _signed_period),  # -42., +42., -042.
    (rf"[-+\u2212]?{_D}\.[0-9]{{0,100}}[1-9][0-9]{{0,100}}", _wrong),  # 42.5, -0.001
    (rf"(?P<s>-?)(?P<d>{_D}) ?\\?%", _percent),  # 42\%, 42%, 42 \%, -42\%
    (rf"(?P<s>-?)(?P<d>{_D})\\%\.", _unsigned_zeros),  # 42\%., -42\%. (not -042\%.)
    (rf"(?P<s>-?)(?P<d>{_D})\.0+ ?\\%", _hundredths),  # 42.0\%
    (rf"[A-Za-z] ?= ?{_INT}", _eq),  # x=42, n = -042
    (rf"\\(?:text|textbf|mathbf|mathrm)\{{ *(?P<c>[-+\u2212]?{_D}) *\}}", _text),  # \text{42}, \mathbf{-42}
    (rf"{_INT} ?{_UNIT}", _units),  # 42\text{ cm}, -42 \mbox{ square units}, 42\ \text{cm}^2
    (rf"{_INT} ?(?:{'|'.join(_UNIT_WORDS)})", _eq),  # 42 cm, 42 apples
    (rf"(?:[Aa]nswer:|[Tt]he answer is|answer is) (?P<s>-?)(?P<d>{_D})", _unsigned_zeros),  # answer: 42, answer is -42
    (rf"\\text\{{{_TEXT_WORDS}\}}(?P<s>-?)(?P<d>{_D})", _zero_product),  # \text{The answer is }42
    (rf"(?P<s>-?)(?P<d>{_D}) is the (?:final )?answer", _zero_product),  # 42 is the answer
    (rf"\\pm ?(?P<s>)(?P<d>{_D})", _zero_product),  # \pm 42
    (rf"(?P<s>-?)(?P<d>{_D})e(?P<k>[0-9]{{1,3}})", _times_e),  # 42e0
    (rf"(?P<n>-?)\\[dt]?frac\{{(?P<ps>-?)(?P<p>{_D})\}}\{{(?P<q>{_D})\}}", _fraction),  # \frac{84}{2}, -\dfrac{84}{2}
    (rf"(?P<n>)(?P<ps>-?)(?P<p>{_D})/(?P<q>{_D})", _fraction),  # 84/2, 42/1
    *((b.format(_INT), _eq) for b in _BRACKETS),  # (42), [42], \{42\}, \left(42\right), {42}
    (rf"(?P<s>-?)(?P<d>{_D}){_PUNCT}", _unsigned_zeros),  # 42;  42:  42\\  42\text{.}  42\,  42,  42\;.
    (rf"{_SPACE}{_INT}", _eq),  # \,42  \quad 42  \displaystyle 42
    (rf"(?P<s>-?)(?P<d>{_D})_(?:\{{\(?[0-9]{{1,2}}\)?\}}|[0-9])\.?", _unsigned_zeros),  # 42_{10}, 42_8
    (rf"\\\$ ?(?:\\,)?{_INT}", _eq),  # \$42, \$ 42
    (rf"{_INT} ?\\\$", _eq),  # 42\$
    (rf"(?P<s>-?)(?P<a>{_D})(?:\\,|\\;|\\:|\\ |\\quad |\\qquad | )(?P<b>{_D})", _mixed),  # 4\,2, 12 345
    (rf"(?P<s>-?)(?P<d>{_D}\\!{_D})", _joined),  # 4\!2
    (r"(?P<s>-?)(?P<d>[1-9][0-9]{0,2}(?:(?:,|\{,\})[0-9]{3}){2,})", _joined),  # 1,234,567, 1{,}234{,}567
    (rf"(?P<s>-?)(?P<a>{_D})(?:,|\{{,\}})(?P<b>{_D})", _comma),  # 4,200, 4{,}200, 4,2
    (rf"(?P<s>-?)(?P<d>{_D})(?:,| or| and|, or|, and|,? ?\\text\{{ ?(?:or|and) ?\}}) (?P<s2>-?)(?P<d2>{_D})",
     _pair),  # 4, 2  4 or 2  4 \text{ and } 2
    (rf"(?P<s>-?)(?P<d>{_D}) ?(?P<op>[-+*]|\\cdot|\\times) ?(?P<b>{_D})", _arith),  # 42 + 0, 42\cdot 1, 39 + 3
    (rf"{_INT}\^\{{?1\}}?", _eq),  # 42^1, 42^{1}
    (rf"(?P<s>-?)(?P<d>{_D}) ?\\times ?10\^(?P<k>[0-9]|\{{[0-9]\}})", _power_of_ten),  # 42 \times 10^0, 10^{3}
    (rf"\\sqrt\{{(?P<d>{_D})\}}", _sqrt),  # \sqrt{1764}
    (rf"(?P<s>-?)(?P<d>{_D})!", _factorial),  # 5!
    (rf"-?(?:{_OTHER_DIGITS})", _wrong),  # other scripts' digits
    ("", _wrong),  # nothing in the box
]]


_ENDS_IN_TEXT = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}(?:\^[23]|\^\{[23]\})?$")


def _unwrap(text: str) -> str:
    """The prediction without what math-verify reads the same inside as without: surrounding spaces, and one pair of
    $...$ (the spaces inside it too)."""
    text = text.strip()
    if len(text) > 2 and text[0] == "$" and text[-1] == "$":
        text = text[1:-1].strip(" ")
    return text


def read_form(predicted: str) -> tuple[int, re.Match[str]] | None:
    """(the index in _FORMS of the form that reads `predicted`, its match), None when none does. Inside $$...$$ only a
    plain integer reads the same as without."""
    text = predicted.strip()
    if len(text) > 4 and text.startswith("$$") and text.endswith("$$"):
        m = _FORMS[0][0].fullmatch(text[2:-2].strip(" "))
        return None if m is None else (0, m)
    inner = _unwrap(text)
    if text[-2:] == " $" and _ENDS_IN_TEXT.search(inner):
        return None  # math-verify drops a trailing \text{} only at the very end: `$42\text{ cm} $` keeps it
    for i, (form, _) in enumerate(_FORMS):
        m = form.fullmatch(inner)
        if m is not None:
            return i, m
    return None


def integer_verdict(predicted: str, gold: str) -> bool | None:
    """math-verify's verdict on `predicted` against `gold`, decided without it when the gold is an integer and the
    prediction one of the forms above; None when this cannot decide (then ask math-verify)."""
    g = _INT_GOLD.fullmatch(gold)
    if g is None:
        return None
    found = read_form(predicted)
    if found is None:
        return None
    i, m = found
    return _FORMS[i][1](m, _value(g[1], g[2]))
