"""`rstar2 bench rollout`: rollout throughput of an RL step against the bare engine, and one step's time split.

Side by side in one process, on the recipe's engine (the in-process hf engine, or the Ray rollout workers):
(rl) one step's rollouts through the agent loop: multi-turn, tool calls in the sandbox, each turn's prompt
re-fed; (bare) `engine.generate` on the same first prompts, each generating exactly as many tokens as its
trajectory did (ignore_eos), all at once as the step issues them. Same tokens, same seeds; rounds alternate the
order (after one warm-up rollout step that also measures the lengths). Then one full step (rollout, grading,
update, weight push) gives the time split.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.train.config import RLConfig
from rstar2_agent.train.data.pool import draw, stage_pool
from rstar2_agent.train.rl import RLRun


@dataclass
class RolloutBench:
    rollouts: int
    bare_tok_s: list[float]  # per round
    rl_tok_s: list[float]
    split: dict[str, float]

    @property
    def ratio(self) -> float:
        """RL rollout tokens/s as a fraction of the bare engine's (best round of each)."""
        return max(self.rl_tok_s) / max(self.bare_tok_s)


async def bench_rollout(cfg: RLConfig, rounds: int = 2) -> RolloutBench:
    cfg = replace(cfg, out=cfg.out + "-bench", db=None, save_every=0)
    run = RLRun(cfg)
    try:
        await run.start()
        stage, rollouts = cfg.stages[0], run.rollouts
        pool = stage_pool(stage, cfg)
        prompts = draw(pool, cfg.prompts_per_step, cfg.seed, 0)
        n = cfg.rollouts_per_prompt
        groups = await rollouts.groups(prompts, n, stage, 0)  # warm-up, and the lengths the bare run reproduces
        trajs = [t for g in groups for t, _ in g]

        async def rl() -> float:
            again = await rollouts.groups(prompts, n, stage, 0)
            return sum(t.num_generated_tokens for g in again for t, _ in g) / rollouts.times["time_rollout"]

        async def bare() -> float:
            t0 = time.perf_counter()
            gens = await asyncio.gather(*(rollouts.engine.generate(t.prompt_ids, SamplingParams(
                temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=max(1, t.num_generated_tokens), seed=k,
                ignore_eos=True)) for k, t in enumerate(trajs)))
            return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)

        out: dict[str, list[float]] = {"bare": [], "rl": []}
        for r in range(rounds):
            for name in (("bare", "rl") if r % 2 == 0 else ("rl", "bare")):
                out[name].append(await (bare() if name == "bare" else rl()))
        metrics = await run.step(0, stage, pool, None, None)
        split = {k: metrics[k] for k in ("time_rollout", "time_grading", "time_update", "time_push")}
        return RolloutBench(len(trajs), out["bare"], out["rl"], split)
    finally:
        await run.close()
