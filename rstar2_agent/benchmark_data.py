"""Where benchmark data comes from: a local JSONL mirror in a data dir (`--data-dir`, then $RSTAR2_DATA_DIR), else
the Hugging Face Hub through `datasets`. Eval reads its benchmarks through this module and training reads the same
problems to keep them out of its data (decontamination), so both see the same text from the same place."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_ENV = "RSTAR2_DATA_DIR"


class DataError(ValueError):
    """Data that cannot be found, read or used (benchmarks, RL problems, SFT rows); the message says where it looked
    (the file and line) and what to do."""


def data_dirs(data_dir: str | os.PathLike | None) -> list[Path]:
    dirs = [data_dir] if data_dir else []
    if os.environ.get(DATA_ENV):
        dirs.append(os.environ[DATA_ENV])
    return [Path(d) for d in dirs]


def numbered_jsonl(path: str | os.PathLike, example: str = "") -> Iterator[tuple[int, Any]]:
    """(line number, value) for each JSON line of a file (blank lines skipped); a line that is not JSON, or a file
    that is not UTF-8, is a DataError naming it (`example`: a good line to show)."""
    hint = f"each line must be one JSON object, e.g. {example}" if example else "fix or replace the file"
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield lineno, json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); {hint}") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}); save the file as UTF-8") from e


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL file one by one (blank lines skipped); a bad line is a DataError naming it."""
    return (row for _, row in numbered_jsonl(path))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


def hub_rows(hub_id: str, config: str | None, split: str, streaming: bool = False, **options: Any):
    """A hub dataset's split through `datasets` (an iterable of row dicts when streaming); HF_HUB_OFFLINE stops it
    before any network wait. Raises whatever `datasets` raises: the caller knows what advice to give."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ConnectionError("HF_HUB_OFFLINE is set")  # datasets reads it only when first imported
    import datasets

    return datasets.load_dataset(hub_id, config, split=split, streaming=streaming, **options)


@dataclass(frozen=True)
class BenchmarkSource:
    """One benchmark's data: the hub dataset, its local mirror's file name, the columns read, and the column
    holding the problem text."""
    name: str
    hub_id: str
    split: str
    file: str  # the local JSONL mirror (same columns as the hub dataset), looked up in the data dirs
    columns: tuple[str, ...]  # the columns it reads, for error messages
    question: str = "problem"  # the column with the problem text
    hub_config: str | None = None

    def rows(self, data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
        """The local JSONL mirror when there is one in the data dirs, else the hub dataset."""
        dirs = data_dirs(data_dir)
        for d in dirs:
            if (d / self.file).is_file():
                return read_jsonl(d / self.file)
        try:
            return [dict(r) for r in hub_rows(self.hub_id, self.hub_config, self.split)]
        except Exception as e:  # noqa: BLE001 - offline, gated, missing: all end in the same advice
            looked = ", ".join(str(d) for d in dirs) or f"nowhere (neither --data-dir nor ${DATA_ENV} is set)"
            raise DataError(
                f"no data for {self.name}: no {self.file} in {looked}, and the hub dataset {self.hub_id}"
                f"{'/' + self.hub_config if self.hub_config else ''} (split {self.split}) could not be loaded "
                f"({type(e).__name__}: {str(e)[:200]}). Put a JSONL file named {self.file} with the hub's columns "
                f"({', '.join(self.columns)}) in a folder and pass --data-dir FOLDER or set ${DATA_ENV}, or give "
                f"this machine access to the Hugging Face Hub.") from e

    def questions(self, data_dir: str | os.PathLike | None = None) -> list[str]:
        """The problem texts, stripped."""
        return [str(r[self.question]).strip() for r in self.rows(data_dir)]


AIME24 = BenchmarkSource("aime24", "HuggingFaceH4/aime_2024", "train", "aime24.jsonl", ("id", "problem", "answer"))
AIME25 = BenchmarkSource("aime25", "math-ai/aime25", "test", "aime25.jsonl", ("id", "problem", "answer"))
HMMT25 = BenchmarkSource("hmmt25", "MathArena/hmmt_feb_2025", "train", "hmmt_feb_2025.jsonl",
                         ("problem_idx", "problem", "answer"))
MATH500 = BenchmarkSource("math500", "HuggingFaceH4/MATH-500", "test", "math500.jsonl",
                          ("unique_id", "problem", "answer", "subject", "level"))
GPQA_DIAMOND = BenchmarkSource("gpqa_diamond", "Idavidrein/gpqa", "train", "gpqa_diamond.jsonl",
                               ("Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                                "Incorrect Answer 3"), question="Question", hub_config="gpqa_diamond")

# The evaluation sets the paper keeps out of its RL data (rStar2-Agent section 4.2 names MATH-500, AIME24/25 and
# HMMT25; GPQA-Diamond is evaluated too, so it is kept out as well).
SOURCES: dict[str, BenchmarkSource] = {s.name: s for s in (AIME24, AIME25, HMMT25, MATH500, GPQA_DIAMOND)}
