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
distribution, the one the update's logprobs use. The engine's side is `TrainableEngine.score_each` (vLLM: prompt
logprobs of a one-token request; hf: one forward pass; a Ray pool: every rollout worker, since the push reaches each
one), the learner's `Learner.score` (the update's own forward path; under FSDP every rank takes part, rank 0's result
is used). Per push the step records `push_probe_max_abs_diff`, the largest |engine - learner| logprob over the
probe's tokens (and over the replicas), `push_probe_mean_abs_diff` and `push_probe_s` (the check's seconds, not
in `time_push`: it runs after the push, once a colocated engine's KV cache is awake again; a step that kept
nothing pushes nothing and records no figure). The hf engine on the learner's own model (one process,
`rollout_engine: hf`) needs no push, and is still checked: its figure (0 with an fp32 learner) shows the shared
path holds. An engine that cannot score (a remote OpenAI-compatible server) cannot be trained: the run refuses it
before it starts (engines/base.py `trainable`).

Calibration (`PushChecker.calibrate`, at the start of every run and every resume, before any update): the engine
and the learner hold the same weights, so their scores differ by numerics only. That gap, recorded as
`push_probe_calibration_max_abs_diff` in the run's first step, sets the bound: `calibration_factor` (2.5) times it,
never under FP32_BOUND = 1e-3 (`calibrated_bound`; the recipe's `push_check.bound` overrides it). A mean gap over
MISMATCH_MEAN (0.5 nat) stops the run at once: the two sides do not hold the same model (bf16 numerics are ~0.03 on
average; another model, tokenizer or checkpoint is off by whole units). So the bound is measured on the run's own
hardware, kernels and dtypes, not on a CPU build. Measured on CPU: 0 in fp32 on the same kernels; SmolLM2-135M
against vLLM in bf16, max 0.23 over a 64-token probe (mean 0.03); `make train`'s SFT checkpoint against vLLM in
bf16 calibrated at 0.55 (mean 0.08), and its steps' gaps were 0.48-0.68, 0.88-1.24x the calibration: the factor
leaves twice that spread, bound 1.38. An uncalibrated check (an
engine given after updates) falls back to the dtypes' constants (`auto_bound`: 1e-3 in fp32, 1.0 in bf16).

The gap alone cannot see a push that did nothing: one update at the paper's lr 1e-6 moves the probe's logprobs by
up to 0.013 on SmolLM2-135M, far under bf16 noise. So each check also compares moves (`PushChecker.check_move`):
since the anchor (the calibration, then the last decisive check) the learner's scores moved by some vector; the
engine's must have moved by the same vector, missing at most `max_move_residual` (0.25) of it in relative L2. A
push that loaded nothing makes 0% of the move; measured in fp32 on the 2-layer model at lr 1e-6: a healthy push
misses 0%, one that loaded the first half of the parameters by name 38% (it made 63%), one that loaded only the
last layer 70%. The move is decided only once it is decisive: its L2 size at least MOVE_NOISE (8) times the
calibrated gap's L2 size (the numerics offset between engine and learner may change as the weights change, by about
sqrt(2) times the gap when the rounding decorrelates, so a healthy push then misses under 18%) and at least
MOVE_FLOOR (1e-4); until then the anchor stays and the
move accumulates over pushes (`push_probe_move_decided` 0). In fp32 that is one update at lr 1e-6 on the 2-layer
model: a no-op or half push is caught at that push. In bf16 an engine's weights are the learner's rounded to 8
bits of mantissa: a move smaller than the rounding cannot reach the engine at all, so the check decides once the
learner's accumulated move outgrows bf16 noise (many steps at lr 1e-6); a persistently stale engine is then caught
by the move, long before its drift would pass the gap bound. Raise the bound for an engine with other numerics (fp8,
int4) or turn the check off: `push_check: {bound: 2.0}`, `push_check: {enabled: false}`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import TrainableEngine

from .config import PushCheck

log = logging.getLogger(__name__)

FP32_BOUND = 1e-3
BF16_BOUND = 1.0
MISMATCH_MEAN = 0.5
MOVE_NOISE = 8.0
MOVE_FLOOR = 1e-4
PROBE_PROBLEM = "Find the sum of all positive integers n such that n + 2 divides n^2 + 12."
PROBE_RESPONSE = (
    "We need every positive integer n for which n + 2 divides n^2 + 12. Since n^2 + 12 = (n + 2)(n - 2) + 16, "
    "n + 2 divides n^2 + 12 exactly when it divides 16. The divisors of 16 greater than 2 are 4, 8 and 16, so n "
    "is 2, 6 or 14. Let me check this with a short program.\n"
    "```python\nprint(sum(n for n in range(1, 1000) if (n * n + 12) % (n + 2) == 0))\n```\n"
    "The program prints 22, which matches 2 + 6 + 14 = 22. Checking each: 16 / 4 = 4, 48 / 8 = 6, 208 / 16 = 13, "
    "all whole numbers.\n<answer>\nThe sum is \\boxed{22}.\n</answer>")


class PushCheckError(RuntimeError):
    """A weight push left the rollout engine scoring the probe differently from the learner: the run stops."""


def auto_bound(engine_dtype: str | None, learner_dtype: str | None) -> float:
    """FP32_BOUND when both sides compute in fp32, else BF16_BOUND (bf16 or fp16 on either side, or a side whose
    dtype is unknown): the bound of a check that was not calibrated. See the module docstring."""
    return FP32_BOUND if engine_dtype == learner_dtype == "fp32" else BF16_BOUND


def calibrated_bound(gap: float, factor: float) -> float:
    """The gap bound from the run's own calibration: `factor` times the largest gap of two copies of the same
    weights, never under FP32_BOUND (fp32 on the same kernels calibrates at exactly 0)."""
    return max(factor * gap, FP32_BOUND)


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


def norm(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs))


@dataclass
class Move:
    """One replica's move since the anchor against the learner's: `share` of the learner's move the engine made
    (its projection, 1 healthy, 0 a push that loaded nothing) and `residual`, what it missed (relative L2)."""
    share: float
    residual: float


def move(engine_now: list[float], engine_then: list[float], learner_now: list[float], learner_then: list[float]
         ) -> Move:
    em = [a - b for a, b in zip(engine_now, engine_then, strict=True)]
    lm = [a - b for a, b in zip(learner_now, learner_then, strict=True)]
    size = sum(x * x for x in lm)
    return Move(sum(a * b for a, b in zip(em, lm, strict=True)) / size,
                norm([a - b for a, b in zip(em, lm, strict=True)]) / math.sqrt(size))


@dataclass
class Scores:
    """The probe's scores on every replica of the engine and on the learner, at one moment."""
    replicas: list[list[float]]
    learner: list[float]


class PushChecker:
    """The check across a run: `calibrate` once before any update (the engine and the learner hold the same
    weights), then `check` after every push. Two tests per push:
    - the gap: the largest |engine - learner| over the probe within the bound (the recipe's, or calibrated);
    - the move: once the learner's scores moved decisively since the anchor (the calibration, then the last
      decisive check), the engine's scores must have made that move too: it misses at most `max_move_residual`
      of it (relative L2). A push that loaded nothing misses all of it, one that loaded half, about half.
    The move is decisive when its L2 size is MOVE_NOISE times the calibrated gap's (the numerics' offset between
    engine and learner may change as the weights do, by up to about the gap itself), and at least MOVE_FLOOR."""

    def __init__(self, cfg: PushCheck, fmt: ChatFormat):
        self.cfg = cfg
        self.ids, self.start = probe_ids(fmt, cfg.probe_tokens)
        self.bound: float | None = cfg.bound
        self.anchor: Scores | None = None
        self.noise = 0.0

    async def scores(self, engine: TrainableEngine, learner: Any) -> Scores:
        replicas = await engine.score_each(self.ids, self.start)
        theirs = await asyncio.to_thread(learner.score, self.ids, self.start)
        for scores in replicas:
            abs_diffs(scores, theirs)
        return Scores(replicas, theirs)

    async def look(self, engine: TrainableEngine, learner: Any) -> tuple[Scores, list[list[float]]] | None:
        """The scores now and each replica's |engine - learner| per token; None when the check is off."""
        if not self.cfg.enabled:
            return None
        now = await self.scores(engine, learner)
        return now, [abs_diffs(r, now.learner) for r in now.replicas]

    async def calibrate(self, engine: TrainableEngine, learner: Any) -> dict[str, float]:
        """Before any update: the gap of two copies of the same weights sets the bound (unless the recipe gives
        one) and the move's noise. Raises PushCheckError when they are not the same weights (a mean gap over
        MISMATCH_MEAN: another model, tokenizer or checkpoint)."""
        t0 = time.perf_counter()
        looked = await self.look(engine, learner)
        if looked is None:
            return {}
        now, diffs = looked
        worst, mean = max(max(d) for d in diffs), max(sum(d) / len(d) for d in diffs)
        if mean > MISMATCH_MEAN:
            raise PushCheckError(
                f"before any update, the rollout engine's logprobs of the fixed probe differ from the learner's by "
                f"{mean:.3g} per token on average (over {MISMATCH_MEAN}; two copies of the same weights differ by "
                "their numerics only, 0.03 in bf16): the engine and the learner do not hold the same model. Check "
                "that both load the same model path or checkpoint, with the same tokenizer and chat format")
        self.anchor = now
        self.noise = max(norm(d) for d in diffs)
        if self.cfg.bound is None:
            self.bound = calibrated_bound(worst, self.cfg.calibration_factor)
        return {"push_probe_calibration_max_abs_diff": worst, "push_probe_calibration_mean_abs_diff": mean,
                "push_probe_bound": self.bound, "push_probe_calibration_s": time.perf_counter() - t0}

    async def check(self, engine: TrainableEngine, learner: Any, step: int) -> dict[str, float]:
        """Score the probe after the push of update `step`; the figures for the step's metrics ({} when the check
        is off or the engine cannot score). Raises PushCheckError past the bound or on a missed move."""
        t0 = time.perf_counter()
        looked = await self.look(engine, learner)
        if looked is None:
            return {}
        now, diffs = looked
        per_replica = [max(d) for d in diffs]
        engine_dtype, learner_dtype = getattr(engine, "compute_dtype", None), getattr(learner, "compute_dtype", None)
        bound = self.bound if self.bound is not None else auto_bound(engine_dtype, learner_dtype)
        if max(per_replica) > bound:
            how = ("push_check.bound" if self.cfg.bound is not None else
                   f"{self.cfg.calibration_factor:g} x the calibrated gap" if self.anchor is not None else
                   f"from the dtypes: engine {engine_dtype or 'unknown'}, learner {learner_dtype or 'unknown'}")
            raise PushCheckError(failure(step, per_replica, bound, how, len(now.learner)))
        figures = {"push_probe_max_abs_diff": max(per_replica),
                   "push_probe_mean_abs_diff": max(sum(d) / len(d) for d in diffs)}
        if self.anchor is not None:
            figures |= self.check_move(now, step)
        return figures | {"push_probe_s": time.perf_counter() - t0}

    def check_move(self, now: Scores, step: int) -> dict[str, float]:
        anchor = self.anchor
        assert anchor is not None
        size = norm([a - b for a, b in zip(now.learner, anchor.learner, strict=True)])
        if size < max(MOVE_NOISE * self.noise, MOVE_FLOOR):
            return {"push_probe_move_decided": 0.0, "push_probe_learner_move": size}
        if len(anchor.replicas) != len(now.replicas):  # the pool changed size: nothing to compare, a new anchor
            log.warning("the rollout engine scored the probe on %d replicas after the push of update %d, %d before: "
                        "the push check's move starts again from here", len(now.replicas), step,
                        len(anchor.replicas))
            self.anchor = now
            return {"push_probe_move_decided": 0.0, "push_probe_learner_move": size}
        moves = [move(e, a, now.learner, anchor.learner) for e, a in zip(now.replicas, anchor.replicas, strict=True)]
        worst = max(range(len(moves)), key=lambda i: moves[i].residual)
        if moves[worst].residual > self.cfg.max_move_residual:
            raise PushCheckError(missed_move(step, moves, worst, size, self.cfg.max_move_residual))
        self.anchor = now
        return {"push_probe_move_decided": 1.0, "push_probe_learner_move": size,
                "push_probe_move_share": min(m.share for m in moves),
                "push_probe_move_residual": moves[worst].residual}


def missed_move(step: int, moves: list[Move], worst: int, size: float, limit: float) -> str:
    """The error of a push whose engine did not follow the learner's move."""
    m = moves[worst]
    what = ("loaded nothing" if m.share < 0.1 else
            "loaded part of the weights (a half push: some names not sent or not loaded)" if m.share < 1 - limit
            else "loaded weights other than the learner's")
    where = f" (replica {worst} of {len(moves)})" if len(moves) > 1 else ""
    return (f"the weight push after update {step} {what}{where}: since the last checked push the learner's "
            f"logprobs of the fixed probe moved by {size:.3g} (L2), and the rollout engine's made {m.share:.0%} of "
            f"that move, missing {m.residual:.0%} of it (the limit, push_check.max_move_residual, is {limit:.0%}). "
            "The rollouts would sample from another policy than the one trained. What to do: read the push's log "
            "lines for weights not sent or not loaded (a wrapper's prefix, a renamed module, an unmerged LoRA "
            "adapter, a filter on the names), and check that the learner sends every parameter")


def failure(step: int, per_replica: list[float], bound: float, how: str, tokens: int) -> str:
    """The error of a failed check: what was measured, the likely causes, and what to do."""
    over = [str(i) for i, d in enumerate(per_replica) if d > bound]
    where = (f" on replica{'s' if len(over) > 1 else ''} {', '.join(over)} of {len(per_replica)}"
             if len(per_replica) > 1 else "")
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
