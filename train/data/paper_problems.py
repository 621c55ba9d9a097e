"""The paper's RL problem set as one resumable chain (rStar2-Agent, section 4: 17K DAPO problems, the
OpenMathReasoning AoPS problems whose integer label Qwen3-32B reproduces at least twice in 16 samples, 937 Project
Euler problems; 42K after cleaning, decontaminated by 8-grams against the evaluation sets).

Steps, in `out_dir`, each skipped on a rerun once it finished (its counts are recorded in `STEP.done.json`):
1. `aops`: the AoPS problems of OpenMathReasoning with a forum-extracted integer answer -> `aops.jsonl`
   (`rstar2 train problems omr:...`).
2. `aops-verified`: those the verifier model reproduces (`rstar2 train problems-verify`, which resumes
   problem by problem from its own progress file) -> `aops-verified.jsonl`.
3. `merge`: DAPO, the verified AoPS problems and Project Euler, deduplicated and decontaminated together
   -> `rl-problems.jsonl`, what an RL stage's `data:` names.

DAPO: open-r1's processed copy of BytedTsinghua-SIA/DAPO-Math-17k (whose 1.79M rows repeat about 17K problems)
has three configs (its create_dataset.py): `all`, the deduplicated 17K the paper counts; `en`, those without
Chinese text; `cn`, the rest. `all` is the paper's; `en` is a named choice (`--dapo`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rstar2_agent.benchmark_data import DataError

from .problems import BENCHMARKS, BOILERPLATE_PROBLEMS, build
from .problems_verify import VerifyConfig, VerifyCounts, verify

PAPER_DAPO = "hub:open-r1/DAPO-Math-17k-Processed:all"
PAPER_AOPS = "hub:nvidia/OpenMathReasoning"
PAPER_EULER = "hub:alexandonian/project-euler"
STEPS = ("aops", "aops-verified", "merge")
# what the paper kept of each source (section 4): 17K DAPO, 937 Project Euler, 42K in all, so about 24K verified AoPS
PAPER_KEPT = {"dapo": 17_000, "openmathreasoning": 42_000 - 17_000 - 937, "project-euler": 937}
PAPER_TOTAL = 42_000
RESULT = "rl-problems.jsonl"  # the chain's output in its --out folder: what an RL stage's data names
WITHOUT_VERIFIER = [PAPER_DAPO, PAPER_EULER]  # the named alternative: about 18K, no AoPS (GPUs to verify)


def missing_problems_error(stage: int, missing: list[str]) -> str:
    """What a recipe whose problems file is not built yet says, before anything starts."""
    folder = str(Path(missing[0]).parent) if Path(missing[0]).name == RESULT else "DIR"
    return (f"stage {stage}'s data {', '.join(missing)} does not exist. The paper's 42K RL problems are built once "
            f"(resumable, step by step): `rstar2 train problems-paper --out {folder} --url URL --data-dir DIR`, URL "
            "an OpenAI-compatible server of the verifier (the paper: Qwen3-32B). Or train on the 18K without the "
            f"verifier (DAPO and Project Euler, no AoPS): set the stages' data to {json.dumps(WITHOUT_VERIFIER)}")


def beside_paper(merge: dict[str, Any]) -> list[tuple[str, int, int | None]]:
    """(source, kept here, kept by the paper) for the merge step's counts, then the total."""
    ours = merge.get("kept_by_source") or {}
    rows = [(name, int(ours.get(name, 0)), paper) for name, paper in PAPER_KEPT.items()]
    rows += [(name, int(n), None) for name, n in ours.items() if name not in PAPER_KEPT]
    return [*rows, ("total", int(merge.get("kept", 0)), PAPER_TOTAL)]


@dataclass
class PaperSources:
    dapo: str = PAPER_DAPO
    aops: str = PAPER_AOPS
    euler: str = PAPER_EULER


@dataclass
class StepResult:
    step: str
    out: str
    counts: dict[str, Any]
    done_before: bool  # finished by an earlier run: not run again


@dataclass
class PaperProblems:
    steps: list[StepResult] = field(default_factory=list)

    @property
    def out(self) -> str:
        return self.steps[-1].out

    def as_json(self) -> dict[str, Any]:
        return {"out": self.out, "steps": [vars(s) for s in self.steps]}


def _done(out_dir: Path, step: str) -> Path:
    return out_dir / f"{step}.done.json"


def _record(out_dir: Path, step: str, counts: dict[str, Any], settings: dict[str, Any]) -> None:
    path = _done(out_dir, step)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"counts": counts, "settings": settings}))
    os.replace(tmp, path)  # a kill leaves the step either done or not


def _recorded(out_dir: Path, step: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    path = _done(out_dir, step)
    if not path.exists():
        return None
    done = json.loads(path.read_text())
    if done["settings"] != settings:
        changed = ", ".join(f"{k}: {done['settings'].get(k)!r} -> {v!r}" for k, v in settings.items()
                            if done["settings"].get(k) != v)
        raise DataError(f"{out_dir}: step {step} was built with other settings ({changed}); use another --out, or "
                        f"delete {path} and what follows it to rebuild")
    return done["counts"]


async def build_paper_problems(out_dir: str | os.PathLike, verifier: VerifyConfig, data_dir: str | None = None,
                               sources: PaperSources | None = None, benchmarks: Iterable[str] = BENCHMARKS,
                               boilerplate: int = BOILERPLATE_PROBLEMS,
                               on_step: Callable[[str], None] | None = None,
                               on_problem: Callable[[int, int], None] | None = None) -> PaperProblems:
    """Run the steps not yet done, in order; every step's counts (recorded ones for steps done before)."""
    sources, benchmarks = sources or PaperSources(), list(benchmarks)
    verifier = replace(verifier)  # verify() fills in the server's model: the recorded settings are the ones given
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    aops, verified, merged = out / "aops.jsonl", out / "aops-verified.jsonl", out / RESULT
    plan: list[tuple[str, Path, dict[str, Any], Callable[[], Awaitable[Any]]]] = [  # each run's counts: as_json()
        ("aops", aops, {"source": sources.aops, "benchmarks": benchmarks, "boilerplate": boilerplate},
         lambda: asyncio.to_thread(build, [sources.aops], aops, data_dir, benchmarks, boilerplate)),
        ("aops-verified", verified, {"verifier": verifier.settings(), "min_agree": verifier.min_agree},
         lambda: _verify(aops, verified, verifier, on_problem)),
        ("merge", merged, {"dapo": sources.dapo, "euler": sources.euler, "benchmarks": benchmarks,
                           "boilerplate": boilerplate},
         lambda: asyncio.to_thread(build, [sources.dapo, f"problems:{verified}", sources.euler], merged, data_dir,
                                   benchmarks, boilerplate)),
    ]
    result = PaperProblems()
    for step, path, settings, run in plan:
        counts = _recorded(out, step, settings)
        done = counts is not None and path.exists()
        if not done:
            if on_step:
                on_step(step)
            counts = (await run()).as_json()
            _record(out, step, counts, settings)
        result.steps.append(StepResult(step, str(path), counts, done))
    return result


async def _verify(inp: Path, out: Path, cfg: VerifyConfig, on_problem: Callable[[int, int], None] | None
                  ) -> VerifyCounts:
    counts = await verify(inp, out, cfg, on_problem)
    if counts.failed:
        raise DataError(f"{counts.failed} AoPS problems got no answer from {cfg.url} (see the warnings); run the same "
                        f"command again to ask only those ({counts.asked + counts.done_before} are recorded)")
    return counts
