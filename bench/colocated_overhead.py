"""`rstar2 bench colocated`: the colocated placement against the one-process path, side by side in one process.

Both train the same few RL steps from the same weights and seeds on the embedded SmolLM2's 2-layer random variant
(`models.tiny_variant`): the one-process path with the hf engine on the learner's own model (no push), and
`placement: colocated` with an hf engine holding weights of its own that sleeps through each update, then gets the
new weights pushed in place and checked (train/learner/colocated.py, train/push_check.py). Rounds alternate the
order. What it reports: each step's loss in both (they must agree: the same rollouts, the same update), the step
time of each and their ratio (what colocation's sleep, push and check cost, on a CPU where sleeping frees nothing),
and the push's probe figure per step. The tiny random model answers nothing a grader accepts, so the reward is a
stand-in with signal (the parity of the response's token ids): the machinery is measured, not learning.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Side:
    name: str
    losses: list[list[float]] = field(default_factory=list)  # per round, per step
    grad_norms: list[list[float]] = field(default_factory=list)  # the loss of balanced GRPO groups is ~0: this moves
    step_s: list[float] = field(default_factory=list)
    probe: list[float] = field(default_factory=list)
    push_s: list[float] = field(default_factory=list)


async def _parity(traj: Any, gold: str) -> float:
    return float(sum(traj.response_ids) % 2)


async def _train(cfg: Any, steps: int) -> list[dict[str, float]]:
    from rstar2_agent.train.data.pool import stage_pool
    from rstar2_agent.train.rl import RLRun

    run = RLRun(cfg)
    run.rollouts.reward = _parity  # the stand-in reward (module docstring)
    out = []
    try:
        await run.start()
        stage = cfg.stages[0]
        pool = stage_pool(stage, cfg)
        for step in range(steps):
            t0 = time.perf_counter()
            metrics = await run.learn(await run.batch(pool, stage, step), None, None)
            out.append(metrics | {"step_s": time.perf_counter() - t0})
    finally:
        await run.close()
    return out


def run_bench(steps: int = 3, rounds: int = 2) -> tuple[Side, Side]:
    from rstar2_agent.models import resolve_model, tiny_variant
    from rstar2_agent.train.config import OptimConfig, RLConfig, Stage, StartCheck

    sides = (Side("one process (hf on the learner's model)"), Side("colocated (hf engine of its own)"))
    with tempfile.TemporaryDirectory(prefix="bench_colocated_") as tmp:
        model = str(tiny_variant(resolve_model("smollm2-135m").path, Path(tmp) / "tiny"))
        for r in range(rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                placement = "colocated" if side is sides[1] else "separate"
                cfg = RLConfig(model=model, stages=[Stage(steps=steps, max_response_tokens=16, max_turns=2,
                                                          data_size=8)],
                               prompts_per_step=2, group_size=2, roc_min_positive=1, roc_min_negative=1,
                               micro_batch=4, dtype="fp32", format="markdown", placement=placement,
                               optim=OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant"),
                               out=str(Path(tmp) / f"{placement}-{r}"), start_check=StartCheck(min_answer_share=0.0))
                history = asyncio.run(_train(cfg, steps))
                side.losses.append([h.get("loss", 0.0) for h in history])
                side.grad_norms.append([h.get("grad_norm", 0.0) for h in history])
                side.step_s += [h["step_s"] for h in history]
                side.probe += [h["push_probe_max_abs_diff"] for h in history if "push_probe_max_abs_diff" in h]
                side.push_s += [h["time_push"] for h in history]
    return sides


def summary(sides: tuple[Side, Side]) -> dict[str, Any]:
    base, colocated = sides
    pairs = [(a, b) for key in ("losses", "grad_norms")
             for ra, rb in zip(getattr(base, key), getattr(colocated, key), strict=True)
             for a, b in zip(ra, rb, strict=True)]
    same = all(abs(a - b) <= 1e-4 * max(1e-6, abs(a)) + 1e-9 for a, b in pairs)
    return {"same_losses": same, "losses": {s.name: s.losses for s in sides},
            "grad_norms": {s.name: s.grad_norms for s in sides},
            "step_s_median": {s.name: statistics.median(s.step_s) for s in sides},
            "step_time_ratio": statistics.median(colocated.step_s) / statistics.median(base.step_s),
            "push_s_median": statistics.median(colocated.push_s), "probe_max_abs_diff": colocated.probe}
