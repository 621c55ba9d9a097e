"""Weight push by a collective: a torch.distributed group of the learner's rank 0 (rank 0 here) and every rollout
worker (ranks 1..N), apart from the learner's own FSDP group, over gloo on CPU and NCCL on GPUs (RCCL on ROCm
answers to the same name).

The group is stateless: a TCPStore that rank 0 hosts is the rendezvous, and the process group object is held
by whoever made it (it is not torch.distributed's default group, so a learner rank that already runs FSDP can
join it too, and a replacement rollout worker can be given a fresh group without touching the learner's).
Rank 0 sends the state dict as flat buckets (one dtype each, whole layers, at most `bucket_mb`, in a fixed order
that the `plan` gives every rank beforehand); the workers receive into buffers of the same layout and cut them
back into named tensors, one bucket at a time, each handed to the engine before the next is received (so the
receive buffers on a rollout GPU beside vLLM are one bucket, not the model). Names that share one tensor (tied
embeddings) travel once. Every wait (the rendezvous, each bucket) has a timeout and fails with a
`PushGroupError` that names what was awaited.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .weight_chunks import units

log = logging.getLogger(__name__)


SHUTDOWN_TIMEOUT_S = 30.0


class PushGroupError(RuntimeError):
    pass


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    offset: int  # in elements, inside its bucket
    numel: int
    same_as: str | None = None  # a name whose tensor this one shares (tied weights): it takes no space


@dataclass(frozen=True)
class Bucket:
    dtype: str  # "float32", "bfloat16", ...
    numel: int
    entries: tuple[Entry, ...]


def plan(shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]], bucket_mb: float = 256.0,
         aliases: dict[str, str] | None = None) -> list[Bucket]:
    """The buckets for a state dict given as {name: (dtype, shape)}: whole layers (weight_chunks.units, in the
    order of their first name) grouped by dtype, a new bucket when the next layer would take the current one past
    `bucket_mb` (a layer larger than that is a bucket alone), so a receiver that hands each bucket to its engine
    before the next never hands on part of a layer and holds at most max(bucket_mb, the largest layer).
    `aliases`: {name: an earlier name holding the same tensor}; those names travel as references."""
    aliases = aliases or {}
    limit = int(bucket_mb * 2**20)
    open_: dict[torch.dtype, list[Entry]] = {}
    sizes: dict[torch.dtype, int] = {}
    out: list[Bucket] = []

    def close(dtype: torch.dtype) -> None:
        entries = open_.pop(dtype, [])
        if entries:
            out.append(Bucket(str(dtype).removeprefix("torch."), sizes.pop(dtype), tuple(entries)))

    def numel(shape: tuple[int, ...]) -> int:
        n = 1
        for d in shape:
            n *= int(d)
        return n

    for names in units(shapes).values():
        need: dict[torch.dtype, int] = {}  # the layer's bytes per dtype
        for name in names:
            dtype, shape = shapes[name]
            if name not in aliases:
                need[dtype] = need.get(dtype, 0) + numel(shape) * torch.empty((), dtype=dtype).element_size()
        for dtype, n in need.items():
            item = torch.empty((), dtype=dtype).element_size()
            if open_.get(dtype) and sizes[dtype] * item + n > limit:
                close(dtype)
        for name in names:
            dtype, shape = shapes[name]
            entries = open_.setdefault(dtype, [])
            offset = sizes.setdefault(dtype, 0)
            if name in aliases:
                entries.append(Entry(name, tuple(int(d) for d in shape), 0, 0, aliases[name]))
                continue
            entries.append(Entry(name, tuple(int(d) for d in shape), offset, numel(shape)))
            sizes[dtype] = offset + numel(shape)
    for dtype in list(open_):
        close(dtype)
    return out


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def unpack(flats: list[torch.Tensor], buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    """Named views of the flat buckets (a name that shares a tensor gets the same view)."""
    out: dict[str, torch.Tensor] = {}
    for part in unpack_each(flats, buckets):
        out.update(part)
    return {e.name: out[e.name] for b in buckets for e in b.entries}


def unpack_each(flats: Iterable[torch.Tensor], buckets: list[Bucket]) -> Iterator[dict[str, torch.Tensor]]:
    """Named views of each flat bucket as it comes (`flats` may be a generator that receives them). Only a
    tensor that a later name refers to (tied weights) is kept past its bucket, so a consumer that drops each
    part holds one bucket."""
    referred = {e.same_as for b in buckets for e in b.entries if e.same_as is not None}
    kept: dict[str, torch.Tensor] = {}
    received = iter(flats)
    for b in buckets:  # not zip(): its reused result tuple would hold each buffer until the next had arrived
        flat = next(received)
        part: dict[str, torch.Tensor] = {}
        for e in b.entries:
            if e.same_as is None:
                part[e.name] = flat[e.offset:e.offset + e.numel].view(e.shape)
                if e.name in referred:
                    kept[e.name] = part[e.name]
        for e in b.entries:
            if e.same_as is not None:
                part[e.name] = kept[e.same_as]
        del flat
        yield part
        del part  # before the next bucket is received


def nbytes(buckets: list[Bucket]) -> int:
    return sum(b.numel * torch.empty((), dtype=getattr(torch, b.dtype)).element_size() for b in buckets)


class WeightGroup:
    """One member of a push group. `open` blocks until all `world` members have joined (or `timeout_s`)."""

    def __init__(self, host: str, port: int, rank: int, world: int, *, device: str = "cpu",
                 timeout_s: float = 600.0):
        self.rank, self.world, self.device, self.timeout_s = rank, world, device, timeout_s
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.backend = backend_for(device)
        try:
            self.store = torch.distributed.TCPStore(host, port, world, is_master=rank == 0, timeout=self.timeout,
                                                    wait_for_workers=True)
            if self.backend == "nccl":
                opts = torch.distributed.ProcessGroupNCCL.Options()
                opts._timeout = self.timeout
                self.pg: Any = torch.distributed.ProcessGroupNCCL(self.store, rank, world, opts)
            else:
                self.pg = torch.distributed.ProcessGroupGloo(self.store, rank, world, self.timeout)
        except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/DistStoreError with the cause
            raise PushGroupError(
                f"push group rank {rank}/{world} could not meet the others at {host}:{port} within "
                f"{timeout_s:.0f} s ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
                f": a rollout worker did not join (dead or unreachable); check that the port is open between "
                f"the nodes, or use weight_push=object_store") from e

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        try:
            self.pg.broadcast([tensor], torch.distributed.BroadcastOptions()).wait(self.timeout)
        except Exception as e:  # noqa: BLE001
            raise PushGroupError(
                f"weight push ({what}) failed on rank {self.rank}/{self.world} after at most {self.timeout_s:.0f} s "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}): a member of "
                f"the push group died or stalled; it is rebuilt at the next push") from e
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def send(self, state: dict[str, torch.Tensor], buckets: list[Bucket]) -> dict[str, torch.Tensor]:
        """Rank 0: broadcast every bucket of `state` (cast to the plan's dtypes). Returns what was sent, as a
        state dict on the CPU (views of the sent buckets: the copy rank 0 keeps costs nothing more on CPU)."""
        flats = []
        for k, b in enumerate(buckets):
            flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=self.device)
            for e in b.entries:
                if e.same_as is None:
                    flat[e.offset:e.offset + e.numel].copy_(state[e.name].reshape(-1), non_blocking=True)
            self._broadcast(flat, f"bucket {k + 1}/{len(buckets)}")
            flats.append(flat.to("cpu"))
        return unpack(flats, buckets)

    def receive(self, buckets: list[Bucket], device: str | None = None) -> dict[str, torch.Tensor]:
        """Ranks 1..N: the state dict rank 0 sends, as views of the received buckets (on `device`)."""
        out: dict[str, torch.Tensor] = {}
        for part in self.receive_each(buckets, device):
            out.update(part)
        return out

    def receive_each(self, buckets: list[Bucket], device: str | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Ranks 1..N: the state dict rank 0 sends, one bucket at a time (its named views, on `device`): a bucket
        is received when the previous part has been taken, so a consumer that loads each part before asking for
        the next holds one bucket of receive buffers (on a rollout GPU, beside vLLM), not the whole model."""
        def flats() -> Iterator[torch.Tensor]:
            for k, b in enumerate(buckets):
                flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=self.device)
                self._broadcast(flat, f"bucket {k + 1}/{len(buckets)}")
                yield flat if device is None else flat.to(device)
                del flat

        return unpack_each(flats(), buckets)

    def close(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Shut the group down, waiting at most `timeout_s`: NCCL's shutdown of a communicator whose peer died can
        block forever, so it runs in a daemon thread that is left behind (with a warning) when it does not end."""
        import threading

        pg, self.pg = getattr(self, "pg", None), None
        if pg is not None and hasattr(pg, "shutdown"):
            def shut() -> None:
                try:
                    pg.shutdown()
                except Exception:  # noqa: BLE001 - a broken group: dropping it is all that is left
                    pass

            worker = threading.Thread(target=shut, name="weight-group-shutdown", daemon=True)
            worker.start()
            worker.join(timeout_s)
            if worker.is_alive():
                log.warning("the push group did not shut down within %.0f s (a member died inside a "
                            "collective?): abandoned; the next push builds a new one", timeout_s)
        self.store = None
