"""Template processes: which modules each preloads, and which template a program goes to.

Forking a template costs in proportion to its heap (page tables to copy, pages to fault in), so the
pool keeps several: plain Python, numpy, numpy + sympy. A program goes to the smallest template that
has already imported every preloaded module the program names; a program that names none goes to the
smallest. A program that imports something its template lacks still works, it just pays the import.
"""

from __future__ import annotations

import re

BASE = ("math", "fractions", "decimal", "itertools", "functools", "collections", "re")
# numpy 2 imports numpy.random lazily: preloading it saves ~15 ms in every call that uses it.
NUMPY = (*BASE, "numpy", "numpy.random", "numpy.linalg")
FULL = (*NUMPY, "mpmath", "sympy")
DEFAULT_TEMPLATES: tuple[tuple[str, ...], ...] = (BASE, NUMPY, FULL)


def _tops(modules: tuple[str, ...]) -> set[str]:
    return {m.split(".")[0] for m in modules}


class TemplateRouter:
    def __init__(self, templates: tuple[tuple[str, ...], ...]):
        if not templates:
            raise ValueError("need at least one template")
        self.templates = sorted({tuple(t) for t in templates}, key=len)
        self._tops = [_tops(t) for t in self.templates]
        common = set.intersection(*self._tops)
        names = sorted(set.union(*self._tops) - common)
        self._pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None

    @property
    def largest(self) -> tuple[str, ...]:
        return self.templates[-1]

    def pick(self, code: str) -> tuple[str, ...]:
        if self._pattern is None:
            return self.templates[0]
        named = set(self._pattern.findall(code))
        for template, tops in zip(self.templates, self._tops, strict=True):
            if named <= tops:
                return template
        return self.largest
