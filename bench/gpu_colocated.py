"""Part 6 of the GPU check (bench/gpu_check.py): two RL steps as `placement: colocated` runs them on one GPU.

One GPU holds the learner (`LocalLearner`: fp32 weights and AdamW, bf16 autocast) and an hf engine with weights of
its own (bf16; vLLM is absent on the device machine), driven by the placement's own `Colocation`: the engine
generates (--gen-batch requests of --gen-tokens) -> sleeps (its model to host memory) -> the learner updates on what
it generated (the old-logprob pass, the PPO-clip pass, the optimizer step) -> the learner's cached memory is released,
the engine's weights wake and the new weights are pushed in place (GPU to GPU) -> the engine wakes -> both score the
push check's probe. Per step: the peak allocated memory of each phase (absolute on a GPU: what must fit; on CPU, the
tiny mode's, above the process's resident set) beside the memory
plan's figure for the same parts, the learner's tokens/s and MFU, the probe's largest difference against its
dtype-aware bound, and the order of the placement's calls. Step 1 is the one to read: step 0's rollout phase runs
before AdamW's moments exist.

The plan's figure here: rollout phase = the learner's resident fp32 weights, gradients and AdamW moments
(16 bytes a parameter; gradients are zeroed to None after a step, so this over-counts by 4) + the engine's bf16
weights (the hf engine's KV cache and activations are not planned); update phase = the learner's 16 bytes a
parameter + its bf16 compute copies + the activations of one micro-batch (train/plan/formulas.py `activations`,
`compute_copies`) + nothing of the sleeping engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch


def colocated_step(folder: Path, info: dict[str, Any], args: argparse.Namespace, device: torch.device,
                   meter: Any, say: Any) -> dict[str, Any]:
    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.colocated import Colocation
    from rstar2_agent.train.learner.local import LocalLearner
    from rstar2_agent.train.push_check import auto_bound
    from rstar2_agent.train.rollout.trainable import TrainableHFEngine

    learner = LocalLearner(str(folder), OptimConfig(lr=1e-5, warmup_steps=0), total_steps=2,
                           dtype="bf16" if device.type == "cuda" else "auto")
    engine = TrainableHFEngine(str(folder), device=str(device), max_batch=max(32, args.gen_batch))
    colocation = Colocation(engine, level=1, release=learner.release_memory)
    loop = asyncio.new_event_loop()
    try:
        plan = _plan(folder, args, device)
        steps = [loop.run_until_complete(_step(k, learner, engine, colocation, info, plan, args, device, meter, say))
                 for k in range(2)]
        loop.run_until_complete(engine.close())
    finally:
        loop.close()
    bound = auto_bound(engine.compute_dtype, learner.compute_dtype)
    out = {"steps": steps, "calls": colocation.calls, "probe_bound": bound,
           "probe_ok": all(s["probe_max_abs_diff"] <= bound for s in steps)}
    del learner, engine
    return out


async def _step(k: int, learner: Any, engine: Any, colocation: Any, info: dict[str, Any], plan: dict[str, float],
                args: argparse.Namespace, device: torch.device, meter: Any, say: Any) -> dict[str, Any]:
    from rstar2_agent.engines.base import SamplingParams
    from rstar2_agent.train.learner.update import UpdateConfig, UpdateItem, policy_update

    prompts = _random_ids(args.gen_batch, args.gen_prompt, info["vocab"], seed=10 + k)
    meter.start()
    gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, seed=i, max_tokens=args.gen_tokens,
                                                                    ignore_eos=True)) for i, p in enumerate(prompts)))
    absolute = meter.base if device.type == "cuda" else 0  # on a GPU what it must hold; on CPU above the process's
    rollout_peak = meter.peak() + absolute
    await colocation.sleep()
    items = [UpdateItem(p, g.token_ids, [1] * len(g.token_ids), g.logprobs, 1.0 if i % 2 else -1.0)
             for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]
    tokens = sum(len(p) + len(g.token_ids) for p, g in zip(prompts, gens, strict=True))
    meter.start()
    t0 = time.perf_counter()
    metrics = policy_update(learner, items, UpdateConfig(micro_batch=args.micro_batch, pad_id=0),
                            sum(len(i.response_ids) for i in items))
    metrics |= learner.optimizer_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    update_s = time.perf_counter() - t0
    update_peak = meter.peak() + absolute
    t1 = time.perf_counter()
    from rstar2_agent.train.push import Chunked

    await colocation.push(lambda: Chunked().push(learner, engine))
    await colocation.wake()
    push_s = time.perf_counter() - t1
    probe = _random_ids(1, 48, info["vocab"], seed=99)[0]
    diff = max(abs(a - b) for a, b in zip(await engine.score(probe, 16), learner.score(probe, 16), strict=True))
    tok_s = tokens / update_s
    out = {"rollout_peak_gib": rollout_peak / 2**30, "update_peak_gib": update_peak / 2**30,
           **{f"plan_{phase}_gib": v / 2**30 for phase, v in plan.items()},
           "update_s": update_s, "learner_tokens_per_s": tok_s, "mfu": 8 * info["params"] * tok_s / (
               args.peak_tflops * 1e12), "push_and_wake_s": push_s, "probe_max_abs_diff": diff,
           "loss": metrics["loss"]}
    say(f"colocated step {k}: rollout peak {out['rollout_peak_gib']:.2f} GiB (plan {out['plan_rollout_gib']:.2f}), "
        f"update peak {out['update_peak_gib']:.2f} GiB (plan {out['plan_update_gib']:.2f}), learner {tok_s:,.0f} "
        f"tokens/s, MFU {out['mfu']:.1%}, push + wake {push_s:.2f}s, probe diff {diff:.3g}")
    return out


def _plan(folder: Path, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """The memory plan's figures for the two phases of this step (see the module docstring for what they hold)."""
    from rstar2_agent.train.model_shape import from_config
    from rstar2_agent.train.plan.formulas import activations, compute_copies

    shape = from_config(json.loads((folder / "config.json").read_text()))
    n = shape.params()
    precision = "autocast" if device.type == "cuda" else "fp32"
    seq = args.gen_prompt + args.gen_tokens
    act = activations(shape, args.micro_batch * seq, seq, precision=precision, checkpointing=False, masked=False)
    resident = 16 * n
    return {"rollout": resident + 2 * n, "update": resident + compute_copies(shape, precision, False, 1) + act.total}


def _random_ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


