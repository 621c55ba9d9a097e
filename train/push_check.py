"""The checked weight push: after every push of new weights to the rollout engine, the engine and the learner each
score one fixed probe sequence, and a push whose scores differ by more than a bound stops the run.

Why: a push that silently does nothing looks like a run that learns slowly. The rollouts keep sampling from the
old policy, the PPO ratio is taken against the learner's own logprobs (learner/update.py), so the loss, the
gradient norm and the reward curve all look plausible (verl's users met it with LoRA: the adapter never reached
the rollout engine). The step's rollout-mismatch metrics (`logp_mismatch_*`) would show it only as a drift, on
tokens that differ each step; the probe is the same ids every step, so its figure compares across steps and runs.

The probe: the chat format's rendering of one fixed math problem (`PROBE_PROBLEM`), then the first
`probe_tokens` tokens of a fixed response (`PROBE_RESPONSE`, repeated if it is short). Scored are the response
tokens, each given its whole prefix (teacher-forced), at temperature 1 with no top-p: the model's own
distribution, the one the update's logprobs use. The engine's side is `Engine.score_each` (vLLM: prompt logprobs
of a one-token request; hf: one forward pass; a Ray pool: every rollout worker, since the push reaches each one),
the learner's `Learner.score` (the update's own forward path; under FSDP every rank takes part, rank 0's result
is used). Per push the step records `push_probe_max_abs_diff`, the largest |engine - learner| logprob over the
probe's tokens (and over the replicas), `push_probe_mean_abs_diff` and `push_probe_s` (the check's seconds, not
in `time_weight_sync`: it runs after the push, once a colocated engine's KV cache is awake again; a step that kept
nothing pushes nothing and records no figure). The hf engine on the learner's own model (one process,
`rollout_engine: hf`) needs no push, and is still checked: its figure (0 with an fp32 learner) shows the shared
path holds. An engine that cannot score (a remote OpenAI-compatible server) is not checked: one warning, and no
figure recorded.

The bound (`auto_bound`, or the recipe's `push_check.bound`): the scores of two correct copies of the same weights
differ by their numerics only.
- fp32 on both sides: `FP32_BOUND` = 1e-3. Measured on CPU (SmolLM2-135M and its 2-layer variant): exactly 0, for
  the hf engine on the learner's own model and on its own fp32 copy alike (the same kernels). Other fp32 kernel
  paths differ by float rounding: the hf engine's KV-cached decoding against the learner's forward is ~2e-6 a token
  on average (test_train_rl.py); reasoned, a GPU engine's fp32 kernels likewise stay orders of magnitude under
  1e-3. 1e-3 is far above that and still below what one update moves (below).
- bf16 on either side (vLLM's default on a GPU and on this CPU; a learner whose matmuls run in bf16, under
  autocast or FSDP's mixed precision): `BF16_BOUND` = 1.0. Measured on CPU with SmolLM2-135M (30 layers, 49K-word
  head): an fp32 learner against vLLM in bf16, max 0.18-0.21 over a 64-token probe (mean 0.03), 0.28 over 256; a
  bf16 learner against vLLM in bf16, max 0.23-0.33 over 64 tokens, 0.45 over 256. Reasoned, for the paper's
  Qwen3-14B (40 layers, a 152K-word head): bf16 keeps 8 bits of mantissa, so a logit of magnitude 20-30 carries
  ~0.1 of rounding before any accumulation through the layers, and the engine's and the learner's kernels round
  differently (the "training-inference mismatch" verl measures); the max over the probe's tokens is the tail of
  that spread, and is not smaller on a deeper model with a larger head. So the bound is twice the largest gap
  measured here. A push that did not happen after real training, a wrong model or tokenizer, or random layers
  move logprobs by whole units, and are caught. fp16 and unknown dtypes (a quantized engine) take the bf16 bound.

Blind spot: a stale engine differs from the learner by what the updates it missed moved, and at the paper's rate
that is small. Measured on CPU (fp32, an update on other text than the probe): one update at lr 1e-6 moves the
probe's logprobs by up to 0.013 on SmolLM2-135M (mean 0.001), 2.5e-4 on its 2-layer variant, and the drift grows
about linearly with the updates missed. That is below bf16 noise, so in bf16 a single push that did nothing
passes, and a persistently stale engine is caught only once its drift reaches the bound (here tens of updates).
In fp32 the bound is 1e-3: SmolLM2 is caught at the first skipped push; the 2-layer model, trained on the probe
itself, at the third (`test_a_persistently_stale_engine_is_caught_within_steps`: the first skipped push passes).
The figure is recorded at every push, so a steady climb of `push_probe_max_abs_diff` (and of its mean) over the
steps shows a drift long before the bound. Raise the bound for an engine with other numerics (fp8, int4) or turn
the check off: `push_check: {bound: 2.0}`, `push_check: {enabled: false}`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import Engine

log = logging.getLogger(__name__)

FP32_BOUND = 1e-3
BF16_BOUND = 1.0
PROBE_PROBLEM = "Find the sum of all positive integers n such that n + 2 divides n^2 + 12."
PROBE_RESPONSE = (
    "We need every positive integer n for which n + 2 divides n^2 + 12. Since n^2 + 12 = (n + 2)(n - 2) + 16, "
    "n + 2 divides n^2 + 12 exactly when it divides 16. The divisors of 16 greater than 2 are 4, 8 and 16, so n "
    "is 2, 6 or 14. Let me check this with a short program.\n"
    "```python\nprint(sum(n for n in range(1, 1000) if (n * n + 12) % (n + 2) == 0))\n```\n"
    "The program prints 22, which matches 2 + 6 + 14 = 22. Checking each: 16 / 4 = 4, 48 / 8 = 6, 208 / 16 = 13, "
    "all whole numbers.\n<answer>\nThe sum is \\boxed{22}.\n</answer>")


@dataclass
class PushCheck:
    """The recipe's `push_check`: on (`enabled`), the bound on the largest per-token logprob difference (None: from
    the engine's and the learner's dtypes, `auto_bound`), and the probe's scored tokens."""
    enabled: bool = True
    bound: float | None = None
    probe_tokens: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.probe_tokens, int) or self.probe_tokens < 1:
            raise ValueError(f"push_check.probe_tokens is the number of probe tokens scored, at least 1, not "
                             f"{self.probe_tokens!r}")
        if self.bound is not None and not self.bound > 0:
            raise ValueError(f"push_check.bound is a positive logprob difference (null: from the dtypes), not "
                             f"{self.bound!r}")


class PushCheckError(RuntimeError):
    """A weight push left the rollout engine scoring the probe differently from the learner: the run stops."""


def auto_bound(engine_dtype: str | None, learner_dtype: str | None) -> float:
    """FP32_BOUND when both sides compute in fp32, else BF16_BOUND (bf16 or fp16 on either side, or a side whose
    dtype is unknown). See the module docstring for what is measured and what is reasoned."""
    return FP32_BOUND if engine_dtype == learner_dtype == "fp32" else BF16_BOUND


def probe_ids(fmt: ChatFormat, tokens: int) -> tuple[list[int], int]:
    """The probe's ids and where its scored part starts: the rendered prompt of PROBE_PROBLEM, then `tokens` ids
    of PROBE_RESPONSE (repeated when it is shorter)."""
    prompt = fmt.render_prompt(PROBE_PROBLEM)
    response = fmt.encode(PROBE_RESPONSE)
    response = (response * (tokens // len(response) + 1))[:tokens]
    return prompt + response, len(prompt)


def abs_diffs(engine: list[float], learner: list[float]) -> list[float]:
    if len(engine) != len(learner):
        raise PushCheckError(f"the engine scored {len(engine)} probe tokens and the learner {len(learner)}: they "
                             f"read the probe differently (a tokenizer or context mismatch)")
    return [abs(a - b) for a, b in zip(engine, learner, strict=True)]


@functools.cache
def _warn_cannot_score(engine_name: str) -> None:
    log.warning("the %s rollout engine cannot score a sequence (a remote server): weight pushes are not checked, "
                "and no push_probe figure is recorded", engine_name)


async def check_push(cfg: PushCheck, fmt: ChatFormat, engine: Engine, learner: Any, step: int
                     ) -> dict[str, float]:
    """Score the probe on every copy of the engine's weights and on the learner; the figures for the step's
    metrics, or {} when the check is off or the engine cannot score. Raises PushCheckError past the bound."""
    if not cfg.enabled:
        return {}
    t0 = time.perf_counter()
    ids, start = probe_ids(fmt, cfg.probe_tokens)
    try:
        replicas = await engine.score_each(ids, start)
    except NotImplementedError:
        _warn_cannot_score(getattr(engine, "name", type(engine).__name__))
        return {}
    theirs = await asyncio.to_thread(learner.score, ids, start)
    diffs = [abs_diffs(scores, theirs) for scores in replicas]
    worst = max(max(d) for d in diffs)
    engine_dtype, learner_dtype = getattr(engine, "compute_dtype", None), getattr(learner, "compute_dtype", None)
    bound = cfg.bound if cfg.bound is not None else auto_bound(engine_dtype, learner_dtype)
    if worst > bound:
        raise PushCheckError(failure(step, [max(d) for d in diffs], bound, cfg.bound is None, engine_dtype,
                                     learner_dtype, len(theirs)))
    return {"push_probe_max_abs_diff": worst, "push_probe_mean_abs_diff": max(sum(d) / len(d) for d in diffs),
            "push_probe_s": time.perf_counter() - t0}


def failure(step: int, per_replica: list[float], bound: float, auto: bool, engine_dtype: str | None,
            learner_dtype: str | None, tokens: int) -> str:
    """The error of a failed check: what was measured, the likely causes, and what to do."""
    over = [str(i) for i, d in enumerate(per_replica) if d > bound]
    where = (f" on replica{'s' if len(over) > 1 else ''} {', '.join(over)} of {len(per_replica)}"
             if len(per_replica) > 1 else "")
    how = (f"from the dtypes: engine {engine_dtype or 'unknown'}, learner {learner_dtype or 'unknown'}" if auto
           else "push_check.bound")
    return (f"the weight push after update {step} did not check out: the rollout engine's logprobs of the fixed "
            f"probe ({tokens} tokens) differ from the learner's by up to {max(per_replica):.4g} per token{where}, "
            f"over the bound {bound:.4g} ({how}). The rollouts would sample from another policy than the one "
            "trained, while the loss and reward look plausible. Likely causes: (1) the weights did not reach the "
            "engine: a failed or skipped load, parameter names the engine does not load (a wrapper's prefix, a "
            "renamed module), a LoRA adapter not merged into the pushed weights; (2) a dtype or precision "
            "mismatch larger than the bound allows (an fp8 or quantized engine, fp16 overflow); (3) the engine and "
            "the learner hold different models or tokenizers (check that both load the same model path). What to "
            "do: read the push's log lines for weights not loaded, compare the engine's and the learner's model "
            "and dtype, merge any adapter before the push; if the difference is the engine's known numerics, "
            "raise push_check.bound in the recipe, or set push_check.enabled: false to run unchecked")
