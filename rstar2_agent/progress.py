"""Progress for a run whose output is not a terminal (a log file, CI, nohup, a pipe): rich's bars draw nothing there
until they stop, so a 20-minute SFT or a night's eval would say nothing. `PlainProgress` prints a plain line at most
every `every_s` seconds, and the first and last; on a terminal it prints nothing (the bar shows it)."""

from __future__ import annotations

import time

from rich.console import Console

EVERY_S = 30.0


def clock(seconds: float) -> str:
    """`seconds` as m:ss, or h:mm:ss from an hour."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class PlainProgress:
    def __init__(self, console: Console, label: str, every_s: float = EVERY_S, now=time.monotonic):
        self.console, self.label, self.every_s, self.now = console, label, every_s, now
        self.start = now()
        self.last: float | None = None
        self.first: tuple[float, int] | None = None  # (when, done) at the first call: the rate is from there

    def __call__(self, done: int, total: int | None, info: str = "") -> None:
        """`done` of `total` (None: not known yet), with `info` (the loss, the accuracy so far)."""
        if self.console.is_terminal:
            return
        now = self.now()
        self.first = self.first or (now, done)
        if self.last is not None and now - self.last < self.every_s and done != total:
            return
        self.last = now
        # the time left from the rate since the first call: what came before it (loading data and a model) is no rate
        (since, at), left = self.first, ""
        if total and at < done < total:
            left = f", about {clock((now - since) / (done - at) * (total - done))} left"
        elapsed = now - self.start
        of = f"/{total}" if total else ""
        detail = f" ({info})" if info else ""
        self.console.print(f"{self.label}: {done}{of}{detail}, {clock(elapsed)} elapsed{left}", highlight=False,
                           markup=False, soft_wrap=True)
