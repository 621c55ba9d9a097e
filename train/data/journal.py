"""An append-only JSONL journal: what a resumable command has been told so far (a rewrite's answers, a verify
run's verdicts). Each line is written, flushed and synced as it comes, so a kill loses at most the line being
written; on reopening, a torn last line is cut off the file, so the next line starts clean and the work it held
is asked for again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.is_file() else b""
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
        self.rows: list[dict[str, Any]] = []
        for lineno, line in enumerate(self.path.read_text(encoding="utf-8").splitlines() if data else [], 1):
            if not line.strip():
                continue
            try:
                self.rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{self.path}:{lineno} is not a JSON line ({e}); remove the file to start over") from e
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open while the command runs

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
