"""An RL stage's problem pool, the data side of a step: the stage's `data` names a problem source, chosen once from
SOURCES (a generator's name, or curated problems: files and the sources `rstar2 train problems` reads), and a step's
prompts are drawn from the pool as a function of (seed, step), so a resumed step draws the same ones.

A source is a function (argument, stage, recipe) -> problems, the argument being what follows the name's colon
("synthetic:primes+fib" -> "primes+fib"). Every source's answers are integers the math grader checks.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rstar2_agent import synthetic
from rstar2_agent.problem import Problem

from ..config import RLConfig, Stage
from . import tool_tasks
from .problems import parse_source, sample, stage_problems

ProblemSource = Callable[[str, Stage, RLConfig], list[Problem]]
GENERATED = 512  # a generator's count when the stage gives no data_size


def _synthetic(families: str, stage: Stage, cfg: RLConfig) -> list[Problem]:
    size = GENERATED if stage.data_size is None else stage.data_size
    return list(synthetic.problems(stage.data_seed, size, families or None))


def _tool_tasks(argument: str, stage: Stage, cfg: RLConfig) -> list[Problem]:
    if argument:
        raise ValueError(f"tooltasks takes no argument, not {stage.data!r}")
    return list(tool_tasks.problems(stage.data_seed, GENERATED if stage.data_size is None else stage.data_size))


def _curated(argument: str, stage: Stage, cfg: RLConfig) -> list[Problem]:
    """Problems files or sources (curated once into the run folder), sampled to the stage's data_size."""
    return sample(stage_problems(stage.data, cfg.data_dir, cfg.out), stage.data_size, stage.data_seed)


SOURCES: dict[str, ProblemSource] = {"synthetic": _synthetic, "tooltasks": _tool_tasks, "problems": _curated}
GENERATORS = ("synthetic", "tooltasks")  # the sources that make their problems from a seed


def source_name(data: str | list[str]) -> str:
    """The SOURCES key a stage's `data` names: a generator (synthetic, synthetic:FAMILIES, tooltasks), or problems
    (a list, a .jsonl file, KIND:PATH, hub:ID)."""
    if isinstance(data, str) and data.partition(":")[0] in GENERATORS:
        return data.partition(":")[0]
    if not isinstance(data, str) or ":" in data or data.endswith(".jsonl"):
        return "problems"
    raise ValueError(f"stage data must be one of synthetic, synthetic:FAMILIES, tooltasks, a problems file (.jsonl) "
                     f"or sources (hub:ID, dapo:PATH, ...), not {data!r}")


def stage_pool(stage: Stage, cfg: RLConfig, kept: list[str] | None = None) -> dict[str, Problem]:
    """The stage's problems by id, less those its filter dropped (`kept`: the ids it kept, in order; None: all)."""
    name = source_name(stage.data)
    argument = stage.data.partition(":")[2] if name in GENERATORS else ""
    problems = {p.id: p for p in SOURCES[name](argument, stage, cfg)}
    if kept is not None:
        return {i: problems[i] for i in kept if i in problems}
    return problems


def draw(pool: dict[str, Problem], count: int, seed: int, step: int) -> list[Problem]:
    """A step's prompts: `count` problems of the pool, a function of (seed, step)."""
    ids = sorted(pool)
    chosen = random.Random(seed * 1000003 + step).sample(ids, min(count, len(ids)))
    return [pool[i] for i in chosen]


def missing_local_data(data: str | list[str]) -> list[str]:
    """The local files a stage's data names that are not there (hub sources and generators are not checked)."""
    try:
        if source_name(data) != "problems":
            return []
    except ValueError:  # the pool says so at the stage start
        return []
    specs = [data] if isinstance(data, str) else list(data)
    return [str(s.path) for s in map(parse_source, specs) if s.path is not None and not s.path.exists()]
