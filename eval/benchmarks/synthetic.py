"""Held-out synthetic tool-use problems (rstar2_agent/synthetic.py with a seed training does not use): integer
answers a short program computes. Measures what the SFT stage teaches: a well-formed tool call in the first
turn and the answer in <answer>\\boxed{}</answer> (see the format shares in the report)."""

from __future__ import annotations

from .base import PAPER, MathBenchmark

HELD_OUT_SEED = 1_000_003  # training recipes use small seeds


class Synthetic(MathBenchmark):
    name = "synth"
    count = 200
    defaults = PAPER  # ours, not an author's: the paper's math settings

    def __init__(self, families: str | None = None):
        from rstar2_agent.synthetic import parse_families

        self.families = "+".join(parse_families(families))  # `--categories`: the problem families (default all)

    def load(self, data_dir=None, limit=None):
        from rstar2_agent.synthetic import problems

        return list(problems(HELD_OUT_SEED, limit or self.count, self.families))  # each a Problem
