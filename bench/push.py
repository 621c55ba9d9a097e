"""`rstar2 bench push`: seconds per weight push to the Ray rollout workers, by the collective against
through Ray's object store, side by side in one process.

One learner group and one set of rollout workers (hf engines on CPU; the same code path as `distributed: ray`)
on a local Ray cluster; after one warm-up push each way (the collective builds its group then), `rounds` rounds
push the learner's weights both ways, alternating which goes first. A push is timed from the call to
`LearnerGroup.push` until every worker has loaded the weights into its engine: rank 0's gather, the transfer,
and the load (for the collective also the copy rank 0 keeps for a replacement worker). Afterwards every worker
answers a greedy prompt as the learner's weights do, so the pushes were real.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
MODES = ("collective", "object_store")


@dataclass
class PushBench:
    model: str
    workers: int
    megabytes: float  # the state dict as the collective sends it (tied weights once)
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per mode, per round

    def median(self, mode: str) -> float:
        return statistics.median(self.seconds[mode])

    @property
    def ratio(self) -> float:
        """Object-store seconds over collective seconds (medians): above 1, the collective is faster."""
        return self.median("object_store") / self.median("collective")


async def bench_push(model: str = "smollm2-135m", workers: int = 2, rounds: int = 3, *, dtype: str = "fp32",
                     bucket_mb: float = 256.0, cpus: float = 0.5) -> PushBench:
    import ray

    from rstar2_agent.engines.base import SamplingParams
    from rstar2_agent.engines.weight_sync import nbytes
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.learner.model import OptimConfig
    from rstar2_agent.train.learner.ray_group import LearnerGroup, RayConfig, start_rollout

    resolved = resolve_model(model)
    cfg = RayConfig(learners=1, cpus_per_learner=cpus, rollout_workers=workers, cpus_per_rollout_worker=cpus,
                    sandbox_actors=0, weight_bucket_mb=bucket_mb)
    group = LearnerGroup(cfg, resolved.path, OptimConfig(), 1, dtype=dtype)
    pool = None
    try:
        pool, _ = await start_rollout(cfg, resolved.path, min(resolved.spec.context_length, 2048), 64)
        for mode in MODES:  # warm-up: the collective's group, every page touched once
            cfg.weight_push = mode
            await group.push(pool)
        row = PushBench(model, workers,
                        nbytes(group.plan) / 2**20,
                        {m: [] for m in MODES})
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                cfg.weight_push = mode
                t0 = time.perf_counter()
                await group.push(pool)
                row.seconds[mode].append(time.perf_counter() - t0)
                log.info("round %d %s: %.2f s", r + 1, mode, row.seconds[mode][-1])
        prompt = pool.tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 * 7?"}],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False)
        answers = [await w.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8)) for w in pool.engines]
        if any(a.token_ids != answers[0].token_ids for a in answers):
            raise RuntimeError("the rollout workers disagree after the pushes: a push went wrong")
        return row
    finally:
        if pool is not None:
            await pool.close()
        group.close()
        if ray.is_initialized():
            ray.shutdown()
