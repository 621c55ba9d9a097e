"""Weight push by a collective: a torch.distributed group of the learner's rank 0 (rank 0 here) and every rollout
worker (ranks 1..N), apart from the learner's own FSDP group, over gloo on CPU and NCCL on GPUs (RCCL on ROCm
answers to the same name).

The group is stateless: a TCPStore that rank 0 hosts is the rendezvous, and the process group object is held
by whoever made it (it is not torch.distributed's default group, so a learner rank that already runs FSDP can
join it too, and a replacement rollout worker can be given a fresh group without touching the learner's).
Rank 0 sends the state dict as flat buckets (one dtype each, at most `bucket_mb`, in a fixed order that the
`plan` gives every rank beforehand); the workers receive into buffers of the same layout and cut them back
into named tensors. Names that share one tensor (tied embeddings) travel once. Every wait (the rendezvous, each
bucket) has a timeout and fails with a `WeightSyncError` that names what was awaited.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
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
    """The buckets for a state dict given as {name: (dtype, shape)}: names in their order, grouped by dtype,
    a new bucket when the current one would pass `bucket_mb` (a tensor larger than that is a bucket alone).
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

    for name, (dtype, shape) in shapes.items():
        if name in aliases:
            open_.setdefault(dtype, []).append(Entry(name, tuple(int(d) for d in shape), 0, 0, aliases[name]))
            sizes.setdefault(dtype, 0)
            continue
        numel = 1
        for d in shape:
            numel *= int(d)
        item = torch.empty((), dtype=dtype).element_size()
        if open_.get(dtype) and (sizes[dtype] + numel) * item > limit:
            close(dtype)
        entries = open_.setdefault(dtype, [])
        offset = sizes.get(dtype, 0)
        entries.append(Entry(name, tuple(int(d) for d in shape), offset, numel))
        sizes[dtype] = offset + numel
    for dtype in list(open_):
        close(dtype)
    return out


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def unpack(flats: list[torch.Tensor], buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    """Named views of the flat buckets (a name that shares a tensor gets the same view)."""
    out: dict[str, torch.Tensor] = {}
    for flat, b in zip(flats, buckets, strict=True):
        for e in b.entries:
            if e.same_as is None:
                out[e.name] = flat[e.offset:e.offset + e.numel].view(e.shape)
    for b in buckets:
        for e in b.entries:
            if e.same_as is not None:
                out[e.name] = out[e.same_as]
    return {e.name: out[e.name] for b in buckets for e in b.entries}


def nbytes(buckets: list[Bucket]) -> int:
    return sum(b.numel * torch.empty((), dtype=getattr(torch, b.dtype)).element_size() for b in buckets)


class WeightGroup:
    """One member of a weight-sync group. `open` blocks until all `world` members have joined (or `timeout_s`)."""

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
            raise WeightSyncError(
                f"weight-sync group rank {rank}/{world} could not meet the others at {host}:{port} within "
                f"{timeout_s:.0f} s ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
                f": a rollout worker did not join (dead or unreachable); check that the port is open between "
                f"the nodes, or use weight_push=object_store") from e

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        try:
            self.pg.broadcast([tensor], torch.distributed.BroadcastOptions()).wait(self.timeout)
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(
                f"weight push ({what}) failed on rank {self.rank}/{self.world} after at most {self.timeout_s:.0f} s "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}): a member of "
                f"the weight-sync group died or stalled; it is rebuilt at the next push") from e
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
        flats = []
        for k, b in enumerate(buckets):
            flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=self.device)
            self._broadcast(flat, f"bucket {k + 1}/{len(buckets)}")
            flats.append(flat if device is None else flat.to(device))
        return unpack(flats, buckets)

    def close(self) -> None:
        pg, self.pg = getattr(self, "pg", None), None
        if pg is not None and hasattr(pg, "shutdown"):
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - a broken group: dropping it is all that is left
                pass
        self.store = None
