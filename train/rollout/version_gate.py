"""Bounded staleness for `rstar2 train rl` (`max_staleness: k`): which policy version generated each token, and
how new weights reach a rollout engine that is still generating.

`VersionGate` wraps the rollout engine the agent loop calls. It counts the policy versions the engine has served
(version v: the weights after v updates) and records, per trajectory, the version of the tokens each generation
produced. `push(load)` loads new weights in one of two ways:

- whole rollouts (the default): no trajectory starts while a push waits, and the push waits for the trajectories
  in flight to finish, so every token of a trajectory comes from one version;
- partial rollouts (`partial_rollouts: true`, as AReaL's interruptible generation): the generations in flight are
  interrupted at once, the weights load, and each interrupted generation continues from the tokens it had, under
  the new version (the prefix is prefilled again with the new weights: vLLM's prefix cache is reset on a load).
  The long tail never holds a push back; a trajectory then holds tokens of several versions, and its version for
  the staleness bound is its oldest. It needs an engine that streams its tokens (vLLM in this process), since the
  tokens of an interrupted generation are what it heard before the interruption.

Each token keeps the logprob of the policy that sampled it (the behaviour policy of the decoupled loss,
learner/update.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rstar2_agent.engines.base import Engine, Generation, OnTokens, SamplingParams


@dataclass
class Versions:
    """What one trajectory's generations came from: (version, tokens) per generated piece, and the seconds it
    spent waiting at a closed gate (a push in progress)."""
    start: int = 0  # the version when it started (its version if it generated nothing)
    pieces: list[tuple[int, int]] = field(default_factory=list)
    gate_wait: float = 0.0

    @property
    def oldest(self) -> int:
        return min((v for v, _ in self.pieces), default=self.start)


_current: contextvars.ContextVar[Versions | None] = contextvars.ContextVar("rstar2_rollout_versions", default=None)


class VersionGate(Engine):
    """The rollout engine as the asynchronous schedule sees it (see the module docstring)."""

    def __init__(self, inner: Engine, *, partial: bool = False, drain_timeout: float = 3600.0):
        if partial and not getattr(inner, "streams", True):
            raise ValueError(f"partial_rollouts needs a rollout engine that streams its tokens (vLLM in this "
                             f"process, rollout_engine: vllm); the {inner.name} engine returns a generation whole: "
                             "set partial_rollouts: false")
        self.inner, self.partial, self.drain_timeout = inner, partial, drain_timeout
        self.name, self.tokenizer, self.model_path = inner.name, inner.tokenizer, inner.model_path
        self.context_length, self.streams = inner.context_length, getattr(inner, "streams", True)
        self.version = 0
        self._open = asyncio.Event()
        self._open.set()
        self._busy = 0  # trajectories in flight (whole rollouts) or generations in flight (partial)
        self._idle = asyncio.Event()
        self._idle.set()
        self._interrupt = asyncio.Event()
        self.interrupted = 0  # generations a push interrupted (partial)

    # ------------------------------------------------------------------ counting what is in flight
    async def _enter(self, versions: Versions | None) -> None:
        if not self._open.is_set():
            t0 = time.perf_counter()
            await self._open.wait()
            if versions is not None:
                versions.gate_wait += time.perf_counter() - t0
        self._busy += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def trajectory(self) -> AsyncIterator[Versions]:
        """Around one trajectory: yields its Versions (filled in by `generate`); with whole rollouts, it waits
        while a push is in progress, and a push waits for it."""
        versions = Versions(self.version)
        token = _current.set(versions)
        try:
            if self.partial:
                yield versions
                return
            await self._enter(versions)
            versions.start = self.version
            try:
                yield versions
            finally:
                self._leave()
        finally:
            _current.reset(token)

    # ------------------------------------------------------------------ generating
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        versions = _current.get()
        if not self.partial:
            version = self.version  # as it starts (a step that kept nothing advances it without a push)
            out = await self.inner.generate(prompt_ids, sampling, on_tokens)
            if versions is not None:
                versions.pieces.append((version, len(out.token_ids)))
            return out
        ids: list[int] = []
        logprobs: list[float] = []
        while True:
            await self._enter(versions)
            version = self.version
            heard: list[tuple[list[int], list[float]]] = []

            def hear(new: list[int], lps: list[float], heard: list = heard) -> None:
                heard.append((new, lps))
                if on_tokens is not None:
                    on_tokens(new, lps)

            rest = dataclasses.replace(sampling, max_tokens=sampling.max_tokens - len(ids))
            task = asyncio.ensure_future(self.inner.generate(prompt_ids + ids, rest, hear))
            stop = asyncio.ensure_future(self._interrupt.wait())
            try:
                await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                if not task.done():  # interrupted (or cancelled from outside): vLLM aborts the request
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                self._leave()
            if task.done() and not task.cancelled():
                out = task.result()  # raises the engine's error
                if versions is not None:
                    versions.pieces.append((version, len(out.token_ids)))
                return Generation(ids + out.token_ids, logprobs + out.logprobs, out.finish_reason, out.stop_text)
            self.interrupted += 1
            got = [t for new, _ in heard for t in new]
            ids += got
            logprobs += [lp for _, lps in heard for lp in lps]
            if versions is not None and got:
                versions.pieces.append((version, len(got)))
            if len(ids) >= sampling.max_tokens:
                return Generation(ids, logprobs, "length")

    # ------------------------------------------------------------------ new weights
    async def push(self, load: Callable[[], Awaitable[None]]) -> float:
        """Close the gate, wait for (whole) or interrupt (partial) what is in flight, load, open; returns the
        seconds spent waiting for trajectories in flight to finish (0 with partial rollouts)."""
        self._open.clear()
        t0 = time.perf_counter()
        try:
            if self.partial:
                self._interrupt.set()
            try:
                await asyncio.wait_for(self._idle.wait(), self.drain_timeout)
            except TimeoutError:
                raise TimeoutError(f"a weight push waited {self.drain_timeout:.0f} s for {self._busy} rollouts in "
                                   "flight to finish; the rollout engine or the sandbox is stuck (see the log), "
                                   "or rollouts are longer than that: use partial_rollouts: true") from None
            drained = time.perf_counter() - t0
            self._interrupt.clear()
            await load()
            self.version += 1
            return drained if not self.partial else 0.0
        finally:
            self._interrupt.clear()
            self._open.set()

    def advance(self) -> None:
        """The learner took a step that left the weights as they were (nothing kept): the next version, no load."""
        self.version += 1

    # ------------------------------------------------------------------ the rest is the engine's
    def stats(self) -> dict[str, Any]:
        return self.inner.stats()

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:  # end_trajectory, history, engines... of a replica pool
        return getattr(self.inner, name)


def lag_metrics(step_version: int, oldest: list[int]) -> dict[str, float]:
    """policy_lag_max and policy_lag_mean over the trained trajectories: the learner's version (updates done
    before this step's) minus each trajectory's oldest token's version."""
    lags = [step_version - v for v in oldest]
    return {"policy_lag_max": float(max(lags, default=0)),
            "policy_lag_mean": sum(lags) / len(lags) if lags else 0.0}
