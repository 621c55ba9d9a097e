"""`rstar2 train problems`: the RL problems as rStar2-Agent curated them (arXiv 2508.20722, section 4.2).

Sources, each from the hub or from a local copy in the source's own schema (JSONL or Parquet files, or a folder
of them):
  dapo:PATH   DAPO-Math-17k: `prompt` (a string, or chat messages as in BytedTsinghua-SIA/DAPO-Math-17k) and
              `reward_model.ground_truth`. Hub: open-r1/DAPO-Math-17k-Processed, config `en` (what the release
              trains on). DAPO's answer-format instruction around the problem is removed: our chat format asks
              for `<answer>` and `\\boxed{}` itself, and dedupe and decontamination compare problem texts.
  omr:PATH    OpenMathReasoning: `problem`, `expected_answer`, `problem_type`, `problem_source`. Hub:
              nvidia/OpenMathReasoning, split `cot`. Only AoPS problems whose answer was extracted from the
              forum (`problem_type` has_answer_extracted) are read: the others carry a model's vote, not a label.
              The paper then keeps those a strong model reproduces at least twice: `rstar2 train problems-verify`.
  euler:PATH  Project Euler: `problem`, `numerical_answer`. Hub: alexandonian/project-euler, split `full`
              (918 problems; the paper had 937). Answers over MAX_EULER_DIGITS digits are not read (the paper
              drops "huge" answers and gives no bound).
  problems:PATH, or a path ending in .jsonl: this command's own output, to curate several files together.
  hub:ID[:CONFIG[:SPLIT]]: one of the hub datasets above (or BytedTsinghua-SIA/DAPO-Math-17k).

Filters, in the paper's order, each a function below: integer answers only (`integer_answers`), duplicates
removed after normalising whitespace and LaTeX spacing (`unique`), problems sharing an 8-gram of words with an
evaluation benchmark removed (`uncontaminated`). Output: JSONL lines {"problem", "answer", "source"}.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import SOURCES, DataError, hub_rows, iter_jsonl
from rstar2_agent.problem import Problem

log = logging.getLogger(__name__)

NGRAM = 8  # the paper's decontamination: 8-gram overlap
BENCHMARKS = tuple(SOURCES)  # aime24, aime25, hmmt25, math500, gpqa_diamond: read as `rstar2 eval` reads them
MAX_EULER_DIGITS = 18  # ours: a signed 64-bit integer holds every answer up to this length


def from_text(text: str, answer: str, source: str) -> Problem:
    """A curated problem; its id is stable across runs and files: a hash of its text."""
    return Problem(hashlib.blake2b(text.encode(), digest_size=8).hexdigest(), text, answer, source)


# ---------------------------------------------------------------------------------------------- sources
DAPO_INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be of "
                    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.")
DAPO_REMINDER = 'Remember to put your answer on its own line after "Answer:".'


def _dapo(row: dict[str, Any]) -> Problem:
    prompt = row["prompt"]
    if isinstance(prompt, list):  # BytedTsinghua-SIA/DAPO-Math-17k keeps the prompt as chat messages
        prompt = next(m["content"] for m in prompt if m["role"] == "user")
    text = prompt.strip().removeprefix(DAPO_INSTRUCTION).removesuffix(DAPO_REMINDER).strip()
    return from_text(text, str(row["reward_model"]["ground_truth"]).strip(), "dapo")


def _omr(row: dict[str, Any]) -> Problem | None:
    if row["problem_type"] != "has_answer_extracted" or not str(row["problem_source"]).startswith("aops"):
        return None
    return from_text(str(row["problem"]).strip(), str(row["expected_answer"]).strip(), "openmathreasoning")


def _euler(row: dict[str, Any]) -> Problem | None:
    value = row["numerical_answer"]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # a float column holds it exactly
        value = int(value)
    answer = str(value).strip()
    if (whole := integer_answer(answer)) is not None and len(whole.lstrip("-")) > MAX_EULER_DIGITS:
        return None
    return from_text(str(row["problem"]).strip(), answer, "project-euler")


def _own(row: dict[str, Any]) -> Problem:
    return from_text(str(row["problem"]), str(row["answer"]), str(row.get("source") or "problems"))


@dataclass(frozen=True)
class Schema:
    """A source's own schema: where it lives on the hub, the columns read, how a row becomes a problem (None: the
    row is not one of the source's problems, see `skips`)."""
    kind: str
    hub_id: str | None
    config: str | None
    split: str
    columns: tuple[str, ...]
    to_problem: Callable[[dict[str, Any]], Problem | None]
    skips: str = ""
    fields: str = ""  # the columns as a user reads them, when `columns` does not say it (nested ones)
    stream: bool = False  # hub: stream only `columns` (OpenMathReasoning's rows carry long solutions: 50 GB)


SCHEMAS = {s.kind: s for s in (
    Schema("dapo", "open-r1/DAPO-Math-17k-Processed", "en", "train", ("prompt", "reward_model"), _dapo,
           fields="prompt, reward_model.ground_truth"),
    Schema("omr", "nvidia/OpenMathReasoning", None, "cot",
           ("problem", "expected_answer", "problem_type", "problem_source"), _omr,
           "not AoPS problems with an answer extracted from the forum", stream=True),
    Schema("euler", "alexandonian/project-euler", None, "full", ("problem", "numerical_answer"), _euler,
           f"answers over {MAX_EULER_DIGITS} digits"),
    Schema("problems", None, None, "", ("problem", "answer", "source"), _own),
)}
HUB = {"open-r1/dapo-math-17k-processed": "dapo", "bytedtsinghua-sia/dapo-math-17k": "dapo",
       "nvidia/openmathreasoning": "omr", "alexandonian/project-euler": "euler"}


@dataclass(frozen=True)
class Source:
    spec: str
    schema: Schema
    path: Path | None = None  # a local copy; None: the hub
    hub_id: str | None = None
    config: str | None = None
    split: str = ""

    @property
    def fields(self) -> str:
        return self.schema.fields or ", ".join(self.schema.columns)

    def problems(self) -> Iterator[Problem]:
        skipped = 0
        for i, row in enumerate(self._rows()):
            try:
                problem = self.schema.to_problem(row)
            except (KeyError, TypeError, AttributeError, StopIteration) as e:
                raise DataError(f"{self.spec}: row {i} is not in the {self.schema.kind} schema "
                                f"({type(e).__name__}: {e}); its rows need the columns {self.fields}") from e
            if problem is None:
                skipped += 1
            else:
                yield problem
        if skipped:
            log.info("%s: %d rows left out (%s)", self.spec, skipped, self.schema.skips)

    def _rows(self) -> Iterator[dict[str, Any]]:
        if self.path is not None:
            yield from read_rows(self.path, self.schema.columns)
            return
        where = f"{self.hub_id}{':' + self.config if self.config else ''} (split {self.split})"
        try:
            options = {"columns": list(self.schema.columns)} if self.schema.stream else {}
            yield from hub_rows(self.hub_id, self.config, self.split, streaming=self.schema.stream, **options)
        except Exception as e:  # noqa: BLE001 - offline, missing, moved: all end in the same advice
            raise DataError(f"could not read {where} from the Hugging Face Hub ({type(e).__name__}: "
                            f"{str(e)[:200]}). Download it and give the local copy as {self.schema.kind}:PATH (JSONL "
                            f"or Parquet files, or a folder of them, with the hub's columns {self.fields}).") from e


def parse_source(spec: str) -> Source:
    """`hub:ID[:CONFIG[:SPLIT]]`, `KIND:PATH` (dapo, omr, euler, problems) or a path ending in .jsonl."""
    kind, _, rest = spec.partition(":")
    if kind == "hub":
        hub_id, config, split = (rest.split(":") + [None, None])[:3]
        if hub_id.lower() not in HUB:
            raise DataError(f"no reader for the hub dataset {hub_id!r}; known: {', '.join(sorted(HUB))}. For another "
                            "set, write it as a local file in one of the schemas (dapo:, omr:, euler:, problems:)")
        schema = SCHEMAS[HUB[hub_id.lower()]]
        config = schema.config if config is None else (config or None)  # `hub:ID::SPLIT`: no config
        return Source(spec, schema, None, hub_id, config, split or schema.split)
    if kind in SCHEMAS and rest:
        return Source(spec, SCHEMAS[kind], Path(rest))
    if spec.endswith(".jsonl"):
        return Source(spec, SCHEMAS["problems"], Path(spec))
    raise DataError(f"unknown source {spec!r}: give hub:ID[:CONFIG[:SPLIT]], dapo:PATH, omr:PATH, euler:PATH, "
                    "problems:PATH or a .jsonl file of problems")


def read_rows(path: Path, columns: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL or Parquet file, or of every such file under a folder (sorted by path); Parquet is read
    in batches of just `columns`."""
    if not path.exists():
        raise DataError(f"no file or folder {path}")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".parquet") and p.is_file())
        if not files:
            raise DataError(f"{path} holds no .jsonl or .parquet files")
        for f in files:
            yield from read_rows(f, columns)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        file = pq.ParquetFile(path)
        present = [c for c in columns if c in file.schema_arrow.names] or None
        for batch in file.iter_batches(batch_size=4096, columns=present):
            yield from batch.to_pylist()
    else:
        yield from iter_jsonl(path)


# ---------------------------------------------------------------------------------------------- filters
_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits: \d would take "１２" too


def integer_answer(answer: str) -> str | None:
    """The answer as a plain integer ("042" -> "42", "+7" -> "7") when it is written as one, else None: "4.0",
    "\\frac{1}{2}", "2^{10}", "1,000", "$5$" and "\\boxed{5}" are not. Strict on purpose: the reward compares the
    model's answer to this one, and an integer is what a rule-based check cannot misread."""
    text = answer.strip()
    return str(int(text)) if _INTEGER.fullmatch(text) else None


_LATEX_SPACE = re.compile(r"(?<!\\)\\(?:[,:;!> ]|q?quad(?![A-Za-z]))|~")  # \, \: \; \! \> "\ " \quad \qquad ~
_MATH_DELIMITER = re.compile(r"\$\$|\\[()\[\]]")  # $$ \( \) \[ \]
_WHITESPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w+")


def normalize(text: str) -> str:
    """The text as dedupe compares it: LaTeX spacing commands and all whitespace removed (neither carries meaning
    in LaTeX math, and "$x + y$" and "$x+y$" are one problem), math delimiters written as `$`. Case and everything
    else are kept."""
    return _WHITESPACE.sub("", _MATH_DELIMITER.sub("$", _LATEX_SPACE.sub(" ", text)))


def ngrams(text: str, n: int = NGRAM) -> dict[tuple[str, ...], None]:
    """The n-grams of the text's lower-cased words (letters, digits; LaTeX spacing commands are not words), in
    the text's order, each once; a text of fewer words is one gram, itself."""
    words = _WORD.findall(_LATEX_SPACE.sub(" ", text).lower())
    if len(words) < n:
        return {tuple(words): None} if words else {}
    return dict.fromkeys(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


BOILERPLATE_PROBLEMS = 3  # an n-gram in this many benchmark problems or more is the benchmarks' phrasing (0: off)


class BenchmarkIndex:
    """The n-grams of evaluation problems: a training problem that shares any one of them is contaminated, so a
    benchmark problem behind a preamble, or with a sentence added, is still caught.

    Boilerplate (a named rule, not the paper's literal one): an n-gram that `boilerplate` or more benchmark problems
    share is the competitions' phrasing, not a problem ("m and n are relatively prime positive integers find m n"
    ends a dozen AIME problems), and strikes nothing: otherwise every AIME-style training problem that uses the
    sentence is dropped, exactly those nearest the test sets. `boilerplate=0` is the paper's rule as written (any
    shared 8-gram). Each hit is counted by benchmark and by n-gram (`hits`)."""

    def __init__(self, texts: Iterable[tuple[str, str]] | Iterable[str], n: int = NGRAM,
                 boilerplate: int = BOILERPLATE_PROBLEMS):
        self.n = n
        where: dict[tuple[str, ...], set[tuple[str, int]]] = {}
        for i, item in enumerate(texts):
            name, text = item if isinstance(item, tuple) else ("", item)
            for gram in ngrams(text, n):
                where.setdefault(gram, set()).add((name, i))
        self.boilerplate = {g for g, ps in where.items() if boilerplate and len(ps) >= boilerplate}
        self.grams: dict[tuple[str, ...], set[str]] = {g: {name for name, _ in ps} for g, ps in where.items()
                                                       if g not in self.boilerplate}
        self.by_benchmark: Counter[str] = Counter()
        self.by_gram: Counter[str] = Counter()

    @classmethod
    def load(cls, names: Iterable[str] = BENCHMARKS, data_dir: str | os.PathLike | None = None,
             boilerplate: int = BOILERPLATE_PROBLEMS) -> BenchmarkIndex:
        """The named benchmarks' problems, read as `rstar2 eval` reads them (--data-dir, $RSTAR2_DATA_DIR, hub)."""
        unknown = [n for n in names if n not in SOURCES]
        if unknown:
            raise DataError(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(SOURCES)}")
        return cls(((name, q) for name in names for q in SOURCES[name].questions(data_dir)),
                   boilerplate=boilerplate)

    def contaminated(self, text: str) -> bool:
        shared = [g for g in ngrams(text, self.n) if g in self.grams]
        if not shared:
            return False
        for name in set().union(*(self.grams[g] for g in shared)):
            self.by_benchmark[name or "?"] += 1
        self.by_gram[" ".join(shared[0])] += 1  # the first in the training problem's text
        return True

    def report(self, top: int = 10) -> dict[str, Any]:
        """The hits: training problems struck per benchmark (one problem may count for several), the n-grams that
        struck most, and how many n-grams the boilerplate rule set aside."""
        return {"by_benchmark": dict(self.by_benchmark.most_common()),
                "top_ngrams": dict(self.by_gram.most_common(top)), "boilerplate_ngrams": len(self.boilerplate)}


@dataclass
class Counts:
    read: int = 0
    kept: int = 0
    non_integer: int = 0
    duplicate: int = 0
    contaminated: int = 0
    decontamination: dict[str, Any] = field(default_factory=dict)  # BenchmarkIndex.report()
    by_source: dict[str, int] = field(default_factory=dict)  # kept, per source

    def as_json(self) -> dict[str, Any]:
        return {"read": self.read, "kept": self.kept, "dropped": {
            "non_integer": self.non_integer, "duplicate": self.duplicate, "contaminated": self.contaminated},
                "kept_by_source": self.by_source, "decontamination": self.decontamination}


def integer_answers(problems: Iterable[Problem], counts: Counts) -> Iterator[Problem]:
    """Filter 1: only problems with an integer answer, the answer written plainly."""
    for p in problems:
        answer = integer_answer(p.answer)
        if answer is None:
            counts.non_integer += 1
        else:
            yield from_text(p.text, answer, p.source)


def unique(problems: Iterable[Problem], counts: Counts) -> Iterator[Problem]:
    """Filter 2: the first of the problems whose normalised texts are equal (sources in the order given)."""
    seen: set[bytes] = set()
    for p in problems:
        key = hashlib.blake2b(normalize(p.text).encode(), digest_size=16).digest()
        if key in seen:
            counts.duplicate += 1
        else:
            seen.add(key)
            yield p


def uncontaminated(problems: Iterable[Problem], index: BenchmarkIndex, counts: Counts) -> Iterator[Problem]:
    """Filter 3: no problem that shares an n-gram with an evaluation problem."""
    for p in problems:
        if index.contaminated(p.text):
            counts.contaminated += 1
        else:
            yield p


def curate(problems: Iterable[Problem], index: BenchmarkIndex, counts: Counts) -> Iterator[Problem]:
    """The three filters in the paper's order, streaming; `counts` fills as the problems pass."""
    def read(ps: Iterable[Problem]) -> Iterator[Problem]:
        for p in ps:
            counts.read += 1
            yield p

    for p in uncontaminated(unique(integer_answers(read(problems), counts), counts), index, counts):
        counts.kept += 1
        counts.by_source[p.source] = counts.by_source.get(p.source, 0) + 1
        yield p
    counts.decontamination = index.report()


# ---------------------------------------------------------------------------------------------- files
def write_problems(path: str | os.PathLike, problems: Iterable[Problem]) -> None:
    """JSONL lines {"problem", "answer", "source"}; written whole or not at all (a temporary file renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"problem": p.text, "answer": p.answer, "source": p.source}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_problems(path: str | os.PathLike) -> list[Problem]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no problems file {path}; make one with `rstar2 train problems SOURCE... --out {path}`")
    return list(_read_cached(str(path.resolve()), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int) -> tuple[Problem, ...]:
    return tuple(Source(path, SCHEMAS["problems"], Path(path)).problems())


def build(specs: Iterable[str], out: str | os.PathLike, data_dir: str | os.PathLike | None = None,
          benchmarks: Iterable[str] = BENCHMARKS, boilerplate: int = BOILERPLATE_PROBLEMS) -> Counts:
    """Read the sources in order, filter, write `out`; the counts."""
    sources = [parse_source(s) for s in specs]
    benchmarks = list(benchmarks)
    if not benchmarks:
        log.warning("no evaluation set named: the problems are not decontaminated")
    index = BenchmarkIndex.load(benchmarks, data_dir, boilerplate)
    counts = Counts()
    write_problems(out, curate((p for s in sources for p in s.problems()), index, counts))
    return counts


# ---------------------------------------------------------------------------------------------- RL stages
def stage_problems(data: str | list[str], data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike
                   ) -> list[Problem]:
    """An RL stage's problems: a curated file as it is; sources curated once into `cache_dir` (keyed by the
    sources) and read from there after."""
    specs = [data] if isinstance(data, str) else list(data)
    sources = [parse_source(s) for s in specs]
    if all(s.schema.kind == "problems" for s in sources):
        return [p for s in sources for p in read_problems(s.path)]
    key = hashlib.blake2b(json.dumps(specs).encode(), digest_size=6).hexdigest()
    cached = Path(cache_dir) / f"problems-{key}.jsonl"
    if not cached.is_file():
        counts = build(specs, cached, data_dir)
        log.info("curated %s into %s: %s", ", ".join(specs), cached, json.dumps(counts.as_json()))
    return read_problems(cached)


def sample(problems: list[Problem], size: int | None, seed: int) -> list[Problem]:
    """`size` of them drawn with `seed` (all when size is 0 or None, or not smaller than the set)."""
    if not size or size >= len(problems):
        return problems
    return random.Random(seed).sample(problems, size)
