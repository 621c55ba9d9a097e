"""The trainer's side of vLLM 0.32's own weight transfer (the engine's side: vllm_transfer_config.py):
the source every learner rank iterates, the clients that reach the engines (in this process, or Ray actors), and
one send that keeps the failure rule of push/__init__.py.

vLLM's trainer engines (`NCCLTrainerWeightTransferEngine`, `IPCTrainerWeightTransferEngine`) run on every learner
rank: all ranks iterate the source in lockstep (an FSDP parameter's `full_tensor()` is a collective; the IPC engine
also all-gathers the handles and meets at a barrier after each packed chunk), and only rank 0 calls the client. So
a rank 0 that raised inside a client call would leave the other ranks in the next collective until the group's
timeout (ten minutes, then NCCL's watchdog). Here the client never raises into vLLM's engine: it records the first
failure (`Guard`), skips every later call, and lets the trainer engine go on through its collectives (a source
tensor that failed to materialize on a rank is sent as zeros); after `send_weights` returns, every rank agrees on
the failure (one all-reduce), rank 0 aborts the transfer on every engine, and all raise the same `PushError`.

The IPC handles: torch's CUDA IPC handle is a tuple holding a tensor class, a `torch.Size`, a storage class and a
`torch.dtype`, which vLLM's msgpack wire (the engine-core client) refuses; they travel pickled in
`ipc_handles_pickled`, as vLLM's own HTTP client sends them, and the engine's `rstar2_ipc` backend unpickles that
field itself (vllm_transfer_backends.py says why vLLM's VLLM_ALLOW_INSECURE_SERIALIZATION is not used). The
IPC push is packed: one reusable buffer of `buffer_mb` per rank (vLLM's packed producer), not a copy of the model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .error import PushError

log = logging.getLogger(__name__)


@dataclass
class Guard:
    """The first failure of a push on this rank: its phase and parameter (push/__init__.py's rule)."""

    backend: str
    rank: int = 0
    phase: str = "init"
    parameter: str | None = None
    error: BaseException | None = None
    chunks: int = 0
    sent_bytes: int = 0
    names: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.phase, self.parameter, self.error, self.chunks, self.sent_bytes, self.names = "init", None, None, 0, 0, []

    def record(self, phase: str, e: BaseException, parameter: str | None = None) -> None:
        if self.error is None:
            self.phase, self.error, self.parameter = phase, e, parameter or self.parameter
            log.warning("weight push (%s) failed at %s on rank %d: %s", self.backend, phase, self.rank, e)


def pickled(update_info: Any) -> Any:
    """`ipc_handles` as vLLM's HTTP client sends them (pickled, base64, in `ipc_handles_pickled`)."""
    from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

    return _json_safe_update_payload(update_info)


class GuardedClient:
    """vLLM's `VLLMWeightSyncClient` over `inner`, recording the first failure in `guard` and never raising into
    vLLM's trainer engine (which would leave the other ranks in a collective); calls after a failure are skipped."""

    def __init__(self, inner: Any, guard: Guard):
        self.inner, self.guard = inner, guard

    def _call(self, phase: str, method: str, *args: Any, parameter: str | None = None) -> None:
        if self.guard.error is not None:
            return
        self.guard.phase = phase
        try:
            getattr(self.inner, method)(*args)
        except BaseException as e:  # noqa: BLE001 - recorded, raised by `send` once every rank has agreed
            self.guard.record(phase, e, parameter)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init", "init_weight_transfer_engine", init_info)

    def start_weight_update(self) -> None:
        self._call("start", "start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        names = list(update_info.get("names", ())) if isinstance(update_info, dict) else []
        self.guard.chunks += 1
        self.guard.names += names
        self.guard.sent_bytes += sum(update_info.get("tensor_sizes") or ()) if isinstance(update_info, dict) else 0
        self._call(f"update (chunk {self.guard.chunks})", "update_weights", pickled(update_info),
                   parameter=names[0] if names else None)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("finish", "finish_weight_update")

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("shutdown", "shutdown_weight_transfer_engine")


def source(model: torch.nn.Module, dtype: torch.dtype | None, keep: dict[str, torch.Tensor] | None = None,
           guard: Guard | None = None) -> Any:
    """A vLLM `WeightSource` over `model`'s parameters (tied ones once, as vLLM ties them itself), floating point
    cast to `dtype` before the gather: an FSDP shard is cast on its rank, so the all-gather moves the engine's dtype
    (a 14B push gathers 29.5 GB in bf16, not 59 GB of fp32 master weights cast after); `keep`, when given, receives
    a CPU copy of each tensor sent (rank 0: what a replacement rollout worker loads). With `guard`, a tensor that
    fails after its gather is recorded and sent as zeros, so the ranks stay in lockstep (the push then fails as a
    whole)."""
    from vllm.distributed.weight_transfer.base import ModuleSource, ParamMeta, materialize_full_tensor

    def cast(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    class Source(ModuleSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, cast(p), tuple(p.shape)) for n, p in model.named_parameters()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for n, p in model.named_parameters():
                full = materialize_full_tensor(p.detach().to(cast(p)))  # a collective on FSDP ranks: never skipped
                try:
                    t = full
                    if keep is not None:
                        keep[n] = t.to("cpu", copy=True)
                except Exception as e:  # noqa: BLE001 - see the docstring
                    if guard is None:
                        raise
                    guard.record("source", e, n)
                    t = torch.zeros(full.shape, dtype=cast(p), device=full.device)
                yield n, t

    return Source(model)


def agree(failed: bool) -> bool:
    """Whether any learner rank failed (an all-reduce on the learner group; this rank's flag alone when there is
    none): every rank then raises, none waits on one that left."""
    dist = torch.distributed
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return failed
    flag = torch.tensor([1.0 if failed else 0.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def send(trainer: Any, guard: Guard, abort: Any) -> None:
    """One push through vLLM's trainer engine `trainer` (made with a GuardedClient over `guard`): the send, the
    agreement, and on failure `abort()` (rank 0: every engine's transfer aborted; returns the names the engines had
    loaded) and a PushError on every rank."""
    try:
        trainer.send_weights()
    except BaseException as e:  # noqa: BLE001 - a failure inside vLLM's engine itself (the collectives lined up)
        guard.record(guard.phase, e)
    if not agree(guard.error is not None):
        return
    mixed = 0
    if guard.rank == 0:
        try:
            mixed = int(abort() or 0)
        except BaseException as e:  # noqa: BLE001
            raise PushError(guard.backend, guard.phase, guard.rank, guard.parameter,
                            f"{guard.error or 'another rank failed'}; and the abort failed too ({e}): the engines "
                            f"may not serve; restart them") from e
    raise PushError(guard.backend, guard.phase, guard.rank, guard.parameter,
                    guard.error if guard.error is not None else "another learner rank failed", mixed)


class RolloutClient:
    """vLLM's `VLLMWeightSyncClient` over the rollout workers' Ray actors (EngineActor), each call to all of them
    at once: engine i joins the group at rank offset 1 + the tensor-parallel sizes of engines 0..i-1 (NCCL; CUDA IPC
    has no group: `ipc`, each engine maps the handles of its own GPU)."""

    def __init__(self, actors: list[Any], tensor_parallel: list[int], timeout_s: float, ipc: bool = False):
        self.actors, self.tensor_parallel, self.timeout_s, self.ipc = actors, tensor_parallel, timeout_s, ipc

    def offsets(self) -> list[int]:
        return [1 + sum(self.tensor_parallel[:i]) for i in range(len(self.actors))]

    def init_payloads(self, init_info: dict[str, Any]) -> list[dict[str, Any]]:
        """vLLM's worker init info (rank offset 1, for one engine) for each engine, at its own offset."""
        if self.ipc:
            return [dict(init_info) for _ in self.actors]
        return [{**init_info, "rank_offset": o} for o in self.offsets()]

    def _all(self, method: str, *per_actor: list[Any]) -> list[Any]:
        import ray

        calls = [getattr(a, method).remote(*(args[i] for args in per_actor)) for i, a in enumerate(self.actors)]
        return ray.get(calls, timeout=self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all("init_weight_transfer", self.init_payloads(init_info))

    def start_weight_update(self) -> None:
        self._all("start_weight_transfer")

    def update_weights(self, update_info: Any) -> None:
        self._all("receive_weight_transfer", [update_info] * len(self.actors))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_transfer")

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer")

    def abort(self) -> int:
        """Every live engine's transfer aborted (a dead one is skipped: its replacement loads the last weights);
        the most names any had loaded."""
        import ray

        refs = [a.abort_weight_transfer.remote() for a in self.actors]
        out = 0
        for ref in refs:
            try:
                out = max(out, int(ray.get(ref, timeout=self.timeout_s) or 0))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                log.warning("a rollout worker did not answer the abort (%s): it is replaced at the next push", e)
        return out


class LoopClient:
    """vLLM's `VLLMWeightSyncClient` over a vLLM engine in this process, for a trainer engine driven from a thread:
    each call runs the engine's coroutine on the event loop the engine lives on and waits for it (`timeout_s`)."""

    def __init__(self, engine: Any, loop: Any, timeout_s: float):
        self.engine, self.loop, self.timeout_s = engine, loop, timeout_s

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._run(self.engine.init_weight_transfer(init_info))

    def start_weight_update(self) -> None:
        self._run(self.engine.start_weight_transfer())

    def update_weights(self, update_info: Any) -> None:
        self._run(self.engine.receive_weight_transfer(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run(self.engine.finish_weight_transfer())

    def shutdown_weight_transfer_engine(self) -> None:
        self._run(self.engine.shutdown_weight_transfer())

    def abort(self) -> int:
        return int(self._run(self.engine.abort_weight_transfer()) or 0)


def ipc_trainer(client: Any, src: Any, rank: int, buffer_mb: float) -> Any:
    """vLLM's trainer-side CUDA IPC engine, packed: one reusable buffer of `buffer_mb` per rank."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    info = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=int(buffer_mb * 2**20))
    return IPCTrainerWeightTransferEngine.trainer_init(info, client=client, source=src)


async def push_in_place(model: torch.nn.Module, engine: Any, *, buffer_mb: float = 1024.0,
                        timeout_s: float = 600.0, wrap: Any = None) -> Guard:
    """The colocated push in one process (a learner and an in-process vLLM engine on one GPU): vLLM's trainer-side
    CUDA IPC engine copies the learner's tensors (cast to the engine's dtype on the GPU: no host copy) into its
    packed buffer, and the engine's workers map and load each chunk (`rstar2_ipc`, names checked). The trainer engine
    is sync and calls the engine's async methods: it runs in a thread, the client hands each call to this event loop.
    `wrap`: a function of the client returning the client to use (tests and benchmarks inject failures there)."""
    loop = asyncio.get_running_loop()
    inner = LoopClient(engine, loop, timeout_s)
    guard = Guard("ipc")
    client = GuardedClient(wrap(inner) if wrap is not None else inner, guard)

    def run() -> None:
        trainer = ipc_trainer(client, source(model, engine.weights_dtype, guard=guard), 0, buffer_mb)
        send(trainer, guard, inner.abort)

    await asyncio.to_thread(run)
    return guard
