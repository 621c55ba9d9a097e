"""`placement: colocated`: the learner and the rollout engines on the same GPUs, as verl's hybrid engine, OpenRLHF's
`colocate_all` and TRL's `vllm_mode="colocate"` put them; the separate placement gives each GPUs of its own.

With separate GPUs the paper's synchronous step leaves half of them idle: the learners wait for the rollouts, then
the engines for the update. Colocated, every GPU does both, one after the other, and the engine gives its memory
back while the learner works. One step:

    engines awake -> roll out -> sleep(sleep_level) -> the old-logprob pass and the update -> release the
    learner's cached memory -> wake the engines' weights -> push the new weights in place -> release again (the
    push's transients) -> wake the KV cache -> the next step (a step that keeps nothing skips the cycle: at level 2
    a wake without a push would leave the engine without weights)

- vLLM's sleep mode: level 1 moves the weights to host memory and drops the KV cache (KV is rebuilt empty on waking,
  which a synchronous step does not miss: no rollout is in flight); level 2 drops the weights too (the push brings
  them back). The weights wake before the push because vLLM loads the new weights into its own parameters; the KV
  cache wakes after it, so the push's transient and the KV cache are never on the GPU together.
- The push in place: the new weights go to the engine on the same GPU without a host copy (vLLM's CUDA IPC weight
  transfer: the engine maps the learner's tensors; push/vllm.py push_in_place, and from FSDP ranks
  ray_group.join_vllm_ipc). vLLM's CPU build has neither sleep mode nor
  CUDA: there the engine stays awake (a warning) and the push takes the CPU path, so the control flow runs and is
  tested on a CPU; what it frees is measured on a GPU only (bench/gpu_check.sh).
- Steps are synchronous: `max_staleness` >= 1 (rollouts beside the update) is refused for this placement.

`Colocation` is what the RL step calls around its update; it records the order of its calls (`calls`), which the
tests assert and a run's log shows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rstar2_agent.engines.base import TrainableEngine

log = logging.getLogger(__name__)


@dataclass
class Colocation:
    engine: TrainableEngine
    level: int = 1
    # the learner's cached accelerator memory back to the GPU after the update, before the engine wakes (else the
    # update's peak stays reserved beside vLLM's KV cache: the memory plan's rollout phase assumes it is released)
    release: Callable[[], None] | None = None
    calls: list[str] = field(default_factory=list)  # the order of the calls: sleep(1), wake(weights), push, ...
    asleep: bool = False  # the KV cache (and, unless a push woke them, the weights) given back
    weights_awake: bool = True

    async def sleep(self) -> None:
        """After the rollouts, before the update: the engine's memory back to the learner."""
        self.calls.append(f"sleep({self.level})")
        await self.engine.sleep(self.level)
        self.asleep, self.weights_awake = True, False

    async def push(self, push: Callable[[], Awaitable[None]]) -> None:
        """The new weights into the engine: its weights woken first (vLLM writes into its own parameters)."""
        if not self.weights_awake:
            await self._release()
            self.calls.append("wake(weights)")
            await self.engine.wake_up(["weights"])
            self.weights_awake = True
        self.calls.append("push")
        await push()

    async def wake(self) -> None:
        """Before the next rollouts: the KV cache (after the push's transients are released too), and the weights
        when no push woke them."""
        if not self.asleep:
            return
        await self._release()
        tags = ["kv_cache"] if self.weights_awake else None
        self.calls.append(f"wake({'kv_cache' if tags else 'all'})")
        await self.engine.wake_up(tags)
        self.asleep, self.weights_awake = False, True

    async def _release(self) -> None:
        if self.release is not None:
            self.calls.append("release")
            await asyncio.to_thread(self.release)
