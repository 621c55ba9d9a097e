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
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.config import OptimConfig, RayConfig, RLConfig
    from rstar2_agent.train.learner.ray_group import LearnerGroup
    from rstar2_agent.train.push.collective import nbytes
    from rstar2_agent.train.rollout.workers import start_rollout

    resolved = resolve_model(model)
    cfg = RayConfig(learners=1, cpus_per_learner=cpus, rollout_workers=workers, cpus_per_rollout_worker=cpus,
                    sandbox_actors=0, weight_bucket_mb=bucket_mb)
    group = LearnerGroup(cfg, resolved.path, OptimConfig(), 1, dtype=dtype)
    pool = None
    try:
        pool, _ = await start_rollout(RLConfig(ray=cfg), resolved.path, min(resolved.spec.context_length, 2048), 64)
        for mode in MODES:  # warm-up: the collective's group, every page touched once
            await group.push(pool, mode)
        row = PushBench(model, workers,
                        nbytes(group.plan) / 2**20,
                        {m: [] for m in MODES})
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                t0 = time.perf_counter()
                await group.push(pool, mode)
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


VLLM_MODES = ("one message", "chunked")


@dataclass
class VLLMPushBench:
    """The in-process vLLM engine's push (`rstar2 bench push --engine vllm`): the whole state dict in one message
    (what every push was before the message cap; a 14B one cannot be encoded so) against messages of whole layers
    under `max_message_mb`, as a 14B push goes at the 2 GiB default."""

    model: str
    megabytes: float  # the state dict as the learner holds it (fp32)
    max_message_mb: float
    messages: dict[str, int] = field(default_factory=dict)  # per mode, per push
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per mode, per round
    added_mib: dict[str, list[float]] = field(default_factory=dict)  # peak resident memory over the resting, per round

    def median(self, mode: str, what: str = "seconds") -> float:
        return statistics.median(getattr(self, what)[mode])

    @property
    def ratios(self) -> dict[str, float]:
        """Chunked over one message (medians): seconds, and memory added at the peak."""
        return {w: self.median("chunked", w) / max(self.median("one message", w), 1e-9)
                for w in ("seconds", "added_mib")}


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def bench_vllm_push(model: str = "smollm2-135m", rounds: int = 3, max_message_mb: float = 64.0,
                          kv_cache_gib: float = 1.0) -> VLLMPushBench:
    """Time and peak memory of pushes into one in-process vLLM engine (its CPU build here), each mode in turn.
    Memory is resident memory of this process and the engine's (its engine core and workers): the peak of each
    during the push (Linux's VmHWM, reset before it through /proc/PID/clear_refs) less its resting size, summed."""
    import os

    from safetensors.torch import load_file

    from rstar2_agent import processes
    from rstar2_agent.engines.base import SamplingParams
    from rstar2_agent.models import resolve_model
    from rstar2_agent.train.rollout.trainable import TrainableVLLMEngine

    resolved = resolve_model(model)
    state = load_file(os.path.join(resolved.path, "model.safetensors"))
    engine = TrainableVLLMEngine(resolved.path, context_length=2048, kv_cache_gib=kv_cache_gib)
    caps = {"one message": 4095.0, "chunked": max_message_mb}
    row = VLLMPushBench(model, sum(v.numel() * v.element_size() for v in state.values()) / 2**20, max_message_mb,
                        seconds={m: [] for m in VLLM_MODES}, added_mib={m: [] for m in VLLM_MODES})
    real, count = engine.engine.collective_rpc, {"n": 0}

    async def counting(method, *args, **kwargs):
        count["n"] += method == "load_weight_chunk"
        return await real(method, *args, **kwargs)

    engine.engine.collective_rpc = counting
    try:
        ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 * 7?"}],
                                                   add_generation_prompt=True, tokenize=True, return_dict=False)
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        before = await engine.generate(ids, greedy)
        for mode in VLLM_MODES:  # warm-up, and the message counts
            count["n"] = 0
            await engine.load_weights(state, max_message_bytes=int(caps[mode] * 2**20))
            row.messages[mode] = count["n"]
        for r in range(rounds):
            for mode in (VLLM_MODES if r % 2 == 0 else VLLM_MODES[::-1]):
                pids = [os.getpid(), *processes.descendants(os.getpid())]
                rest = {p: _status_kib(p, "VmRSS") for p in pids}
                for p in pids:
                    try:
                        with open(f"/proc/{p}/clear_refs", "w") as f:
                            f.write("5")  # resets the process's peak resident size (VmHWM) to its current
                    except OSError:
                        pass
                t0 = time.perf_counter()
                await engine.load_weights(state, max_message_bytes=int(caps[mode] * 2**20))
                row.seconds[mode].append(time.perf_counter() - t0)
                row.added_mib[mode].append(sum(max(0, _status_kib(p, "VmHWM") - rest[p]) for p in pids) / 1024)
                log.info("round %d %s: %.2f s, +%.0f MiB", r + 1, mode, row.seconds[mode][-1],
                         row.added_mib[mode][-1])
        if (await engine.generate(ids, greedy)).token_ids != before.token_ids:
            raise RuntimeError("the engine answers otherwise after pushing its own weights: a push went wrong")
        return row
    finally:
        engine.engine.collective_rpc = real
        await engine.close()
