"""The benchmarks `rstar2 eval` knows, by name: this is the one list (the commands, the paper's table and the report
read it)."""

from __future__ import annotations

from .aime24 import AIME24
from .aime25 import AIME25
from .arena_hard import ArenaHard, JudgeSpec
from .base import PAPER, Benchmark, Context, DataError, Outcome, Problem, RunDefaults
from .bfcl_v3 import BFCLv3
from .gpqa_diamond import DEFAULT_GPQA_EXTRACTION, GPQA_EXTRACTIONS, GPQADiamond
from .hmmt25 import HMMT25
from .ifeval import IFEval
from .jsonl_file import PREFIX as JSONL_PREFIX
from .jsonl_file import JSONLFile
from .math500 import MATH500
from .synthetic import Synthetic

__all__ = ["BENCHMARKS", "DEFAULT_GPQA_EXTRACTION", "GPQA_EXTRACTIONS", "JSONL_PREFIX", "PAPER", "Benchmark", "Context",
           "DataError", "JudgeSpec", "Outcome", "Problem", "RunDefaults", "benchmark_type", "get_benchmark",
           "get_benchmarks"]

BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (AIME24, AIME25, HMMT25, MATH500, GPQADiamond, BFCLv3,
                                                                    IFEval, ArenaHard, Synthetic)}


def get_benchmark(name: str, categories: str = "all", judge: JudgeSpec | None = None,
                  gpqa_extraction: str = DEFAULT_GPQA_EXTRACTION) -> Benchmark:
    """A benchmark by name, or `jsonl:PATH` for a file of the user's own problems (jsonl_file.py); `categories` are
    BFCL v3's (a comma list of categories or groups) or the synthetic problem families of `synth`; `judge` is
    Arena-Hard's; `gpqa_extraction` GPQA-Diamond's (GPQA_EXTRACTIONS: how the letter is asked for and read)."""
    if name.startswith(JSONL_PREFIX):
        return JSONLFile(name)
    if name not in BENCHMARKS:
        raise DataError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)} or {JSONL_PREFIX}PATH "
                        "(several at once as a comma list)")
    if name == BFCLv3.name:
        return BFCLv3(categories=categories)
    if name == Synthetic.name:
        try:
            return Synthetic(categories)
        except ValueError as e:
            raise DataError(f"synth --categories: {e}") from e
    if name == GPQADiamond.name:
        return GPQADiamond(gpqa_extraction)
    return ArenaHard(judge) if name == ArenaHard.name else BENCHMARKS[name]()


def benchmark_type(name: str) -> type[Benchmark] | None:
    """The class of a stored run's benchmark (`jsonl:<stem>@<hash>` names a JSONLFile), None for one unknown here."""
    return JSONLFile if name.startswith(JSONL_PREFIX) else BENCHMARKS.get(name)


def get_benchmarks(names: list[str], categories: str = "all", judge: JudgeSpec | None = None,
                   gpqa_extraction: str = DEFAULT_GPQA_EXTRACTION) -> dict[str, Benchmark]:
    return {n: get_benchmark(n, categories, judge, gpqa_extraction) for n in names}
