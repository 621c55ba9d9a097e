"""Plain progress lines where the output is not a terminal (rstar2_agent/progress.py): the first and the last step
and at most one line per interval between; nothing on a terminal, where the bar shows it."""

from __future__ import annotations

import io

from rich.console import Console

from rstar2_agent.progress import PlainProgress, clock


def _run(console: Console, every_s: float) -> None:
    plain = PlainProgress(console, "SFT steps", every_s=every_s)
    for step in range(1, 6):
        plain(step, 5, f"loss {1 / step:.2f}")


def test_a_log_gets_the_first_and_last_step_and_one_line_per_interval():
    buf = io.StringIO()
    _run(Console(file=buf, force_terminal=False, width=80), every_s=3600)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0] == "SFT steps: 1/5 (loss 1.00), 0:00 elapsed"  # no rate yet: no time left to give
    assert lines[1] == "SFT steps: 5/5 (loss 0.20), 0:00 elapsed"  # the last: no time left to give
    every = io.StringIO()
    _run(Console(file=every, force_terminal=False, width=80), every_s=0)
    lines = every.getvalue().splitlines()
    assert len(lines) == 5 and lines[1].startswith("SFT steps: 2/5 (loss 0.50), 0:00 elapsed, about 0:00 left")


def test_the_time_left_is_from_the_rate_since_the_first_step_not_the_wait_before_it():
    """Loading took 60 s before step 1; steps then take 2 s each: at step 3 of 10, 7 steps left, about 14 s."""
    now = [0.0]
    buf = io.StringIO()
    plain = PlainProgress(Console(file=buf, force_terminal=False, width=80), "SFT steps", every_s=0,
                          now=lambda: now[0])
    for step, t in ((1, 60.0), (2, 62.0), (3, 64.0)):
        now[0] = t
        plain(step, 10)
    assert buf.getvalue().splitlines()[-1] == "SFT steps: 3/10, 1:04 elapsed, about 0:14 left"


def test_a_terminal_gets_no_plain_lines():
    buf = io.StringIO()
    _run(Console(file=buf, force_terminal=True, width=80), every_s=0)
    assert buf.getvalue() == ""


def test_clock():
    assert (clock(0), clock(75.9), clock(3600 + 62)) == ("0:00", "1:15", "1:01:02")
