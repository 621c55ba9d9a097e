"""A CPU stand-in for CUDA IPC, so that vLLM's own IPC weight transfer (its trainer engine, its packed buffer, the
engine-core client and msgpack encoder, the worker's receive and layerwise load) runs on a machine with no GPU.

Substituted, and nothing else (each a CUDA primitive that has no CPU form):
- `reduce_tensor` (export a CUDA allocation as an IPC handle) -> the tensor's bytes in a file under /dev/shm, and a
  handle of the same shape as torch's (a 15-tuple: the tensor class, `torch.Size`, strides, the storage class, the
  `torch.dtype`, ..., the handle bytes): the very types vLLM's msgpack encoder refuses, so the wire is tested as a
  GPU meets it. A buffer allocated on "cuda" by vLLM's packed producer is such a file from the start (a shared
  mapping the producer reuses across chunks, as its CUDA buffer is).
- `rebuild_cuda_tensor` (open the handle in another process) -> a shared mapping of that file.
- the device's UUID, its index, stream synchronization and `ipc_collect` (the last unlinks the files exported).

`install()` patches them in this process; a vLLM worker installs it when `SUBSTITUTE_ENV` names this module (the
worker extension reads it), so the trainer and the engine core both use it. Tests and `rstar2 bench push --all` use
it; the product never does.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import types
import weakref
from typing import Any

import torch

SUBSTITUTE_ENV = "RSTAR2_CUDA_IPC_SUBSTITUTE"
MODULE = __name__
UUID = "cpu-shm-0"  # the one "GPU" every process of the substitute sees
_counter = itertools.count()
_exported: list[str] = []  # files of unpacked exports, unlinked at ipc_collect (after the consumers loaded them)
_buffers: dict[int, str] = {}  # data_ptr of a shared buffer allocated on "cuda" -> its file
_installed = False


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _shared(numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    path = os.path.join(_shm_dir(), f"rstar2-ipc-{os.getpid()}-{next(_counter)}")
    with open(path, "wb") as f:
        f.truncate(max(1, numel) * torch.empty((), dtype=dtype).element_size())
    return torch.from_file(path, shared=True, size=numel, dtype=dtype), path


def reduce_tensor(tensor: torch.Tensor) -> tuple[Any, tuple]:
    """torch's `reduce_tensor` for a CUDA tensor, in the substitute: (rebuild function, its 15 arguments)."""
    path = _buffers.get(tensor.untyped_storage().data_ptr())
    if path is None:  # an ordinary tensor: its bytes go to a file of their own (CUDA would share the allocation)
        flat, path = _shared(tensor.numel(), tensor.dtype)
        flat.copy_(tensor.reshape(-1))
        _exported.append(path)
        stride, offset = tuple(torch.empty(tensor.shape).stride()), 0
    else:
        stride, offset = tuple(tensor.stride()), tensor.storage_offset()
    nbytes = tensor.untyped_storage().nbytes()
    args = (type(tensor), tensor.size(), stride, offset, torch.UntypedStorage, tensor.dtype, 0, path.encode(),
            nbytes, 0, False, b"", 0, b"", False)
    return rebuild_cuda_tensor, args


def rebuild_cuda_tensor(tensor_cls: Any, size: Any, stride: Any, offset: int, storage_cls: Any, dtype: torch.dtype,
                        device: Any, handle: bytes, storage_bytes: int, *_: Any) -> torch.Tensor:
    """torch's `rebuild_cuda_tensor`, in the substitute: a shared mapping of the exporter's file."""
    item = torch.empty((), dtype=dtype).element_size()
    flat = torch.from_file(handle.decode(), shared=True, size=storage_bytes // item, dtype=dtype)
    return flat.as_strided(tuple(size), tuple(stride), offset)


def _empty(*args: Any, device: Any = None, dtype: torch.dtype | None = None, **kw: Any) -> torch.Tensor:
    """torch.empty as vLLM's packed producer calls it: on "cuda", a shared file the handle can name."""
    if device is None or not str(device).startswith("cuda"):
        return torch.empty(*args, device=device, dtype=dtype, **kw)
    numel = 1
    for d in (args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args):
        numel *= int(d)
    tensor, path = _shared(numel, dtype or torch.float32)
    _buffers[tensor.untyped_storage().data_ptr()] = path
    weakref.finalize(tensor, _release, tensor.untyped_storage().data_ptr(), path)
    return tensor


def _release(ptr: int, path: str) -> None:
    _buffers.pop(ptr, None)
    try:
        os.unlink(path)
    except OSError:
        pass


def ipc_collect() -> None:
    while _exported:
        try:
            os.unlink(_exported.pop())
        except OSError:
            pass


class _Stream:
    def synchronize(self) -> None:
        pass


_saved: list[tuple[Any, str, Any]] = []


def _set(owner: Any, name: str, value: Any) -> None:
    _saved.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def install() -> None:
    """Patch this process's CUDA IPC primitives (idempotent; `uninstall` puts them back)."""
    global _installed
    if _installed:
        return
    from torch.multiprocessing import reductions
    from vllm.distributed.weight_transfer import ipc_engine, packed_tensor

    props = types.SimpleNamespace(uuid=UUID, name="cuda-ipc-on-cpu", total_memory=0)
    _set(torch.cuda, "get_device_properties", lambda *_a, **_k: props)
    _set(torch.cuda, "ipc_collect", ipc_collect)
    _set(torch.cuda, "synchronize", lambda *_a, **_k: None)
    _set(torch.cuda, "current_stream", lambda *_a, **_k: _Stream())
    _set(torch.accelerator, "current_device_index", lambda: 0)
    _set(reductions, "rebuild_cuda_tensor", rebuild_cuda_tensor)  # PackedBufferImporter imports it at call time
    _set(ipc_engine, "reduce_tensor", reduce_tensor)
    _set(ipc_engine, "rebuild_cuda_tensor", rebuild_cuda_tensor)
    _set(packed_tensor, "reduce_tensor", reduce_tensor)
    # the packed producer's `torch.empty(..., device="cuda")`: the module sees torch with that one call substituted
    names = {k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")}
    _set(packed_tensor, "torch", types.SimpleNamespace(**{**names, "empty": _empty}))
    _installed = True


def uninstall() -> None:
    global _installed
    while _saved:
        owner, name, value = _saved.pop()
        setattr(owner, name, value)
    ipc_collect()
    _installed = False


def environment() -> dict[str, str]:
    """What a vLLM engine (and its child processes) needs in its environment to install the substitute."""
    return {SUBSTITUTE_ENV: MODULE}
