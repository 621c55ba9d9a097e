"""Multiple-choice grading: the letter the model chose, found robustly.

In order: the \\boxed{} answer (as chat_format.extract_answer finds it), then explicit statements such as
"the answer is (B)", "Answer: B" or "**B**" in the last <answer> block, then in the whole text; the last
statement wins. Wrapping that models add (\\text{}, parentheses, "Option", the option's text after the
letter) is tolerated; anything that does not name exactly one letter is no answer.

`simple_evals_letter` reads a response as simple-evals' gpqa_eval.py does instead: the first "Answer: X" of its regex.
"""

from __future__ import annotations

import re

from rstar2_agent.chat_format import answer_blocks, extract_answer

LETTERS = "ABCD"

# openai/simple-evals common.py ANSWER_PATTERN_MULTICHOICE (since commit 5ca150b, unchanged to ee3b031 of July 2025;
# before it: (?i)Answer\s*:\s*([A-D])), which gpqa_eval.py applies with re.search to the whole response
SIMPLE_EVALS_PATTERN = re.compile(r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_BARE = re.compile(r"^\(?\s*(?:option|choice)?\s*\(?([A-Z])\)?(?:[\s.:)\]]|$)", re.IGNORECASE)
_STATED = re.compile(
    r"(?i:answer|choice|option)\s*(?i:is|:)?\s*(?i:option\s*)?[*(\[{\s$]*([A-D])\b(?![a-z'])"  # the answer is (B)
    r"|\*\*\s*\(?([A-D])\)?\s*\*\*"  # **B**
    r"|^\s*\(?([A-D])\)\s*$",  # a line with just "(B)" or "B)"
    re.MULTILINE)


def letter_of(answer: str, letters: str = LETTERS) -> str | None:
    """'B', '(B)', '\\text{B}', 'Option B', 'B) 42 eV' -> 'B'; anything else -> None."""
    text = answer.strip()
    while (inner := _WRAPPERS.sub(r"\1", text)) != text:
        text = inner
    m = _BARE.match(text.strip().strip("$"))
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


def grade_choice(text: str, letters: str = LETTERS) -> str | None:
    """The letter the response chose, or None."""
    boxed = extract_answer(text, "release")  # a letter boxed anywhere counts, as before the stated forms
    if boxed is not None:
        return letter_of(boxed, letters)
    for scope in (*answer_blocks(text)[-1:], text):
        found = [next(g for g in m.groups() if g) for m in _STATED.finditer(scope)]
        found = [f for f in found if f in letters]
        if found:
            return found[-1]
    return None


def simple_evals_letter(text: str) -> str | None:
    """The letter as simple-evals reads it: the first match of its regex, or None. Its (?i) returns "answer: b" as
    "b", kept as written: simple-evals compares it with the gold letter, so it is never right."""
    m = SIMPLE_EVALS_PATTERN.search(text)
    return m.group(1) if m else None
