"""The ablation's held-out probe: one fixed set of tool tasks, disjoint from the training problems, on which every
policy of the ablation (the SFT start, each arm's midpoint and final checkpoints, every seed) is sampled the same
way, through the training run's own `Rollouts` (the shared agent loop, the sandbox, the math grader), with no
learner: a policy checkpoint in its own engine.

Disjoint: the probe's problems come from the training generator with another data seed, and any question that
is also a training question (of the RL stages, and of the SFT recipe stored beside the start model when it used
a generator) is dropped before the probe takes its first `prompts`; `check_disjoint` then fails loudly if one
is left. Paired: every policy sees the same prompts, `samples` rollouts each at the training temperature, and a
rollout's sampling seed is a function of (sampling seed, prompt, sample index) only, so at one seed both arms'
rollouts of a prompt draw the same random numbers. A finished probe is a JSON file, re-used when its settings
match (a resumed ablation does not run it again).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rstar2_agent import synthetic
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.models import resolve_model
from rstar2_agent.problem import Problem

from ..config import RLConfig, Stage
from ..data import tool_tasks
from ..rollout.rollouts import Rollouts, rollout_stats
from ..rollout.workers import local_engine, local_sandbox

log = logging.getLogger(__name__)

PROBE_STEP = -2  # the `step` of the probe's rollout keys (training steps are >= 0; the stage filter uses -1)
GENERATORS: dict[str, Callable[[int, int], list[Problem]]] = {"synthetic": synthetic.problems,
                                                          "tooltasks": tool_tasks.problems}
# per rollout: (numerator, denominator) of each probe metric; a metric is sum(numerators) / sum(denominators)
METRICS: dict[str, Callable[[dict[str, Any]], tuple[float, float]]] = {
    "tool_error_ratio_among_positives": lambda r: (r["failed"], r["calls"]) if r["reward"] > 0 else (0, 0),
    "accuracy": lambda r: (r["reward"], 1),
    "tokens": lambda r: (r["tokens"], 1),
    "format_violations": lambda r: (0 if r["well_formed"] else 1, 1),
}


class ProbeError(ValueError):
    """The probe cannot be built as asked (its problems overlap training, or the data is not a generator)."""


@dataclass
class ProbeSettings:
    prompts: int = 64
    samples: int = 4  # rollouts per prompt, at the recipe's temperature
    data_seed: int = 1009  # the generator's seed for the probe's problems (training uses the recipe's data_seed)


# ---------------------------------------------------------------------------------------------- the problems
def _generator(data: Any, where: str) -> Callable[[int, int], list[Problem]]:
    if not isinstance(data, str) or data not in GENERATORS:
        raise ProbeError(f"the probe draws held-out problems from a generator ({', '.join(GENERATORS)}); {where} "
                         f"trains on {data!r}: use a recipe whose stages use a generator")
    return GENERATORS[data]


def training_questions(cfg: RLConfig) -> dict[str, set[str]]:
    """Every question the policy trained on that a generator made: the RL stages', and the SFT recipe's when
    the start model's run folder keeps one (`recipe.yaml` beside the checkpoint, data `synthetic:N:SEED` or
    `tooltasks:N:SEED[:SHARE]`). Keyed by where they come from."""
    out: dict[str, set[str]] = {}
    for i, stage in enumerate(cfg.stages):
        make = _generator(stage.data, f"stage {i}")
        problems = make(stage.data_seed, 512 if stage.data_size is None else stage.data_size)
        out.setdefault("rl", set()).update(p.text for p in problems)
    recipe = Path(cfg.model).resolve().parent / "recipe.yaml"
    if recipe.is_file():
        data = (yaml.safe_load(recipe.read_text()) or {}).get("data") or []
        for source in data if isinstance(data, list) else [data]:
            kind, _, rest = str(source).partition(":")
            if kind in GENERATORS and rest:
                n, *seed = rest.split(":")
                problems = GENERATORS[kind](int(seed[0]) if seed else 0, int(n))
                out.setdefault("sft", set()).update(p.text for p in problems)
    return out


def check_disjoint(problems: list[Problem], trained: dict[str, set[str]]) -> None:
    """Raise ProbeError when a probe question is one the policy trained on."""
    for where, questions in trained.items():
        overlap = [p.id for p in problems if p.text in questions]
        if overlap:
            raise ProbeError(f"{len(overlap)} probe problem(s) are {where} training problems ({', '.join(overlap[:5])}"
                             f"): the probe must be held out; choose another --probe-seed")


def probe_problems(cfg: RLConfig, settings: ProbeSettings) -> tuple[list[Problem], int]:
    """The probe's problems, and how many drawn problems were dropped as training problems."""
    last = cfg.stages[-1]
    make = _generator(last.data, "the last stage")
    trained = training_questions(cfg)
    seen = set().union(*trained.values())
    drawn = make(settings.data_seed, 4 * settings.prompts)  # the first n of a seed's draws are the same for any n
    kept: list[Problem] = []
    dropped = 0
    for p in drawn:
        if len(kept) == settings.prompts:
            break
        if p.text in seen:
            dropped += 1
        else:
            kept.append(p)
    if len(kept) < settings.prompts:
        raise ProbeError(f"only {len(kept)} of {len(drawn)} problems from seed {settings.data_seed} are not training "
                         f"problems; choose another --probe-seed")
    check_disjoint(kept, trained)
    return kept, dropped


# ---------------------------------------------------------------------------------------------- the rollouts
class ProbeRun:
    """The training run's `Rollouts` with no learner: a policy checkpoint in its own engine (vLLM in this process, or
    the hf engine on its own weights, as the recipe's `rollout_engine` says), the sandbox and the grader, as the
    training run has them. `load` swaps the policy."""

    def __init__(self, cfg: RLConfig, model: str):
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.resolved = resolve_model(model)
        self.fmt = ChatFormat(AutoTokenizer.from_pretrained(self.resolved.path), cfg.format,
                              self.resolved.spec.chat_template)
        self.rollouts = Rollouts(cfg, self.fmt)
        self.model = self.resolved.path

    async def start(self) -> None:
        self.engine = engine = await local_engine(self.cfg, self.resolved)
        sandbox = local_sandbox(self.cfg)
        self.rollouts.attach(engine, sandbox)
        await sandbox.start()

    async def close(self) -> None:
        await self.rollouts.close()

    async def load(self, model: str) -> None:
        """Another checkpoint of the same model: its weights pushed into the running engine."""
        if Path(model).resolve() == Path(self.model).resolve():
            return
        from safetensors.torch import load_file

        files = sorted(Path(resolve_model(model).path).glob("*.safetensors"))
        if not files:
            raise ProbeError(f"{model} has no .safetensors weights to probe")
        state = {k: v for f in files for k, v in load_file(str(f)).items()}
        await self.engine.load_weights(state)
        self.model = model

    async def probe(self, problems: list[Problem], samples: int, stage: Stage, sampling_seed: int
                    ) -> dict[str, Any]:
        """`samples` rollouts of every problem; per rollout what the probe metrics read."""
        t0 = time.perf_counter()  # the rollout keys: f"{sampling_seed}:{PROBE_STEP}:{id}:{k}"
        groups = await self.rollouts.groups(problems, samples, stage, PROBE_STEP, seed=sampling_seed)
        seconds = time.perf_counter() - t0
        out = []
        for problem, group in zip(problems, groups, strict=True):
            rows = []
            for traj, reward in group:
                s = rollout_stats(traj, reward, self.fmt)
                rows.append({"reward": reward, "calls": s.tool_calls, "failed": s.tool_errors,
                             "tokens": traj.num_generated_tokens, "well_formed": s.well_formed_answer,
                             "stop": traj.stop_reason})
            out.append({"id": problem.id, "rollouts": rows})
        return {"prompts": out, "seconds": seconds, "rollouts": len(problems) * samples}


@dataclass
class ProbeJob:
    name: str  # the record's file stem: start, or ARM-seedS-stepK
    model: str  # the checkpoint folder (or the start model)
    sampling_seed: int


def probe_settings(cfg: RLConfig, settings: ProbeSettings, problems: list[Problem]) -> dict[str, Any]:
    """What a stored probe must match to be re-used."""
    stage = cfg.stages[-1]
    return {**dataclasses.asdict(settings), "data": stage.data, "max_response_tokens": stage.max_response_tokens,
            "max_turns": stage.max_turns, "temperature": cfg.temperature, "top_p": cfg.top_p, "format": cfg.format,
            "prompt_ids": [p.id for p in problems]}


def stored(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A finished probe record at `path` made with these settings, or None."""
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.get("settings") != settings:
        log.warning("%s was probed with other settings: probing again", path)
        return None
    return record


async def run_probes(cfg: RLConfig, jobs: list[ProbeJob], problems: list[Problem],
                     settings: ProbeSettings, folder: Path,
                     on_probe: Callable[[str, dict[str, Any], bool], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every job's record: read back when stored with these settings, else probed (one engine for all the jobs
    that need it, the weights swapped between them) and stored at once."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = probe_settings(cfg, settings, problems)
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for job in jobs:
        record = stored(folder / f"{job.name}.json", wanted)
        if record is None:
            todo.append(job)
        else:
            records[job.name] = record
            if on_probe:
                on_probe(job.name, record, False)
    if not todo:
        return records
    run = ProbeRun(cfg, todo[0].model)
    try:
        await run.start()
        for job in todo:
            await run.load(job.model)
            result = await run.probe(problems, settings.samples, cfg.stages[-1], job.sampling_seed)
            record = {"name": job.name, "model": job.model, "sampling_seed": job.sampling_seed, "settings": wanted,
                      **result}
            tmp = folder / f"{job.name}.json.tmp"
            tmp.write_text(json.dumps(record))
            tmp.rename(folder / f"{job.name}.json")  # a probe is stored whole or not at all
            records[job.name] = record
            if on_probe:
                on_probe(job.name, record, True)
    finally:
        await run.close()
    return records


def cells(record: dict[str, Any], metric: str) -> tuple[list[float], list[float]]:
    """A probe record's per-prompt numerators and denominators of `metric` (summed over its rollouts)."""
    read = METRICS[metric]
    nums, dens = [], []
    for prompt in record["prompts"]:
        pairs = [read(r) for r in prompt["rollouts"]]
        nums.append(float(sum(n for n, _ in pairs)))
        dens.append(float(sum(d for _, d in pairs)))
    return nums, dens


def value(record: dict[str, Any], metric: str) -> float:
    nums, dens = cells(record, metric)
    return sum(nums) / sum(dens) if sum(dens) else float("nan")
