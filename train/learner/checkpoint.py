"""The learner's checkpoints: the state a resume needs, sharded with torch's distributed checkpoint (DCP), beside an
HF export of the weights for serve, eval and the next stage.

    checkpoint-N/
      config.json, generation_config.json, model.safetensors   the HF export (model-0000i-of-0000n.safetensors and
      (or model-*.safetensors + model.safetensors.index.json)    an index past `export_shard_mb`), in `export_dtype`
      tokenizer files, rstar2.json                              what `--model` reads (rstar2.json: format, context)
      dcp/                                                      fp32 weights and the AdamW state: each rank writes its
                                                                own shards (__R_0.distcp), rank 0 the .metadata
      trainer_state.pt                                          step, schedule, RNG, the run's extra: small, rank 0's

Every rank writes its shards at once, so nobody waits on one writer (at 14B one rank wrote ~177 GB while the others
sat in a barrier under NCCL's 10-minute timeout); a resume reads only its own shards, on any number of ranks (DCP
reshards: the keys are parameter names, the shards carry their offsets in the whole tensor). The waits of a save or
a load (DCP's own coordination, the barrier after each write) run on a separate gloo group whose timeout is
`timeout_s`, sized for the write; the learner's own group keeps its timeout for the training step's collectives.

The export is gathered one safetensors file per rank at a time: each file's tensors are gathered (in the export's
dtype, so bf16 halves the traffic) and kept by the rank that writes that file, then every rank writes its file and
they all meet in a barrier under `timeout_s`; nobody sits in the learner group's collectives while another writes,
and no rank holds more than one file. One process writes the same layout, so its checkpoints resume on Ray and back.
The folder must be one every learner rank sees (a shared filesystem across nodes); a save checks that first.

A checkpoint written before this layout (one trainer_state.pt holding the whole optimizer) still loads, with a
warning: every rank then reads all of it (memory-mapped, so the ranks of a node share the page cache)."""

from __future__ import annotations

import copy
import functools
import json
import logging
import random
import shutil
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.pt"
SHARDS = "dcp"
LAYOUT = 2  # 1: the HF folder and one trainer_state.pt with the whole optimizer; 2: this module's
EXPORT_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # config.EXPORT_DTYPES


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message says what to do."""


def io_group(world: int, timeout_s: float) -> Any:
    """The group a checkpoint's waits run on (every rank calls it once, in the same order), or None in one process.
    gloo: DCP coordinates with small objects on the CPU, and gloo has no watchdog to kill a rank that waits long."""
    if world == 1:
        return None
    return torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


# ---------------------------------------------------------------------------------------------------------- save
def save(learner: Any, folder: str | Path, extra: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Every rank calls it. Written to `folder`.tmp, then renamed into place by rank 0, so a failed write (a full
    disk) leaves the previous checkpoint whole; a failure on any rank fails the save on all of them."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    rank = learner.rank
    try:
        _together(learner, "making the checkpoint folder", lambda: _fresh(tmp) if rank == 0 else None)
        _together(learner, "checking the checkpoint folder", lambda: _visible(tmp, rank))
        empty = _dcp(learner, "save", tmp / SHARDS)
        export_hf(learner, tmp)
        _together(learner, "writing the trainer state", lambda: _write_rest(
            learner, tmp, {**extra, "optimizer_empty": empty}, meta) if rank == 0 else None)
        _together(learner, "renaming the checkpoint into place", lambda: _replace(tmp, folder) if rank == 0 else None)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _fresh(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)


def _visible(tmp: Path, rank: int) -> None:
    if not tmp.is_dir():
        raise CheckpointError(f"rank {rank} does not see {tmp}, which rank 0 made: every learner rank writes its own "
                              f"shards there, so put `out` on a filesystem all the learner nodes mount")


def _write_rest(learner: Any, tmp: Path, extra: dict[str, Any], meta: dict[str, Any]) -> None:
    learner.tokenizer.save_pretrained(tmp)
    (tmp / "rstar2.json").write_text(json.dumps(meta, indent=2))
    torch.save({"layout": LAYOUT, "step": learner.step, "scheduler": learner.scheduler.state_dict(),
                "rng": rng_state(), **extra}, tmp / STATE_FILE)


def _replace(tmp: Path, folder: Path) -> None:
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _together(learner: Any, what: str, work: Callable[[], None]) -> None:
    """Run this rank's part of `what`, then wait for every rank's under the checkpoint timeout: all go on, or all
    raise (a rank that failed alone would leave the others waiting for it)."""
    error: BaseException | None = None
    try:
        work()
    except Exception as e:  # noqa: BLE001 - shared with the other ranks below, then raised
        error = e
    group = learner.io_group
    if group is None:
        if error is not None:
            raise error
        return
    said: list[str | None] = [None] * torch.distributed.get_world_size(group)
    try:
        torch.distributed.all_gather_object(said, None if error is None else f"{type(error).__name__}: {error}",
                                            group=group)
    except RuntimeError as e:
        raise CheckpointError(f"{what}: rank {learner.rank} waited past checkpoint.timeout_s "
                              f"({learner.checkpoint.timeout_s:.0f} s) for another rank, or one died ({e}); for a "
                              f"slow filesystem raise checkpoint.timeout_s") from e
    if error is not None:
        raise error
    failed = [(r, s) for r, s in enumerate(said) if s]
    if failed:
        raise CheckpointError(f"{what} failed on rank {failed[0][0]}: {failed[0][1]}")


def _dcp(learner: Any, op: str, path: Path) -> bool:
    """The weights and the optimizer, each rank its own shards, through DCP (op: save or load). True when the
    optimizer had no state yet (no step had a gradient): DCP makes a zero one to have its keys, which is dropped
    again after, since AdamW's bias correction counts from the first real step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    empty = not learner.optimizer.state
    model_state, optim_state = get_state_dict(learner.model, learner.optimizer)
    state = {"model": model_state, "optim": optim_state}
    single = learner.io_group is None
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it assumes so
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            call = dcp.save if op == "save" else dcp.load
            call(state, checkpoint_id=str(path), process_group=learner.io_group, no_dist=single)
    except RuntimeError as e:
        raise CheckpointError(f"the sharded state ({path}) failed to {op} on rank {learner.rank}: {e}. If a rank "
                              f"waited past checkpoint.timeout_s ({learner.checkpoint.timeout_s:.0f} s) for a slow "
                              f"filesystem, raise it") from e
    if op == "load":
        set_state_dict(learner.model, learner.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    if empty and op == "save":
        learner.optimizer.state.clear()
    return empty


# -------------------------------------------------------------------------------------------------------- export
def export_hf(learner: Any, folder: Path) -> list[str]:
    """The weights as HF safetensors files in `folder` (config and generation config beside them), gathered a file
    per rank at a time (see the module docstring); every rank calls it. Returns the files written."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    model, cfg, rank = learner.model, learner.checkpoint, learner.rank
    world = 1 if learner.io_group is None else torch.distributed.get_world_size(learner.io_group)
    dtype = EXPORT_TORCH_DTYPES[cfg.export_dtype]
    if getattr(model, "_weight_conversions", None):
        raise CheckpointError(f"{type(model).__name__} stores its weights under other names than it loads them "
                              f"(transformers' weight conversions): the per-tensor export does not rename them")
    state = get_model_state_dict(model)  # sharded DTensors under FSDP, the parameters themselves in one process
    state = {k: v for k, v in state.items() if k not in tied_aliases(model)}
    sizes = {k: v.numel() * (dtype.itemsize if v.is_floating_point() else v.element_size()) for k, v in state.items()}
    files = plan_files(sizes, int(cfg.export_shard_mb * 2**20))
    names = file_names(len(files))
    for first in range(0, len(files), world):  # a round: file first + r is rank r's
        mine: dict[str, torch.Tensor] = {}
        for i, keys in enumerate(files[first:first + world]):
            for key in keys:  # every rank takes part in each gather; the file's owner keeps the tensor
                t = state[key].detach()
                t = t.to(dtype) if t.is_floating_point() else t
                t = t.full_tensor() if isinstance(t, DTensor) else t
                if i == rank:
                    mine[key] = t.to("cpu").contiguous()
                del t
        _together(learner, "writing the HF export", functools.partial(_write_file, mine, folder / names[first + rank]
                                                                       if mine else None))
        mine.clear()
    _together(learner, "writing the HF config", lambda: _write_config(model, folder, cfg.export_dtype, files, names,
                                                                     sizes) if rank == 0 else None)
    return names


def _write_file(tensors: dict[str, torch.Tensor], path: Path | None) -> None:
    if path is not None:
        save_file(tensors, str(path), metadata={"format": "pt"})


def tied_aliases(model: torch.nn.Module) -> set[str]:
    """Names that repeat an earlier parameter (tied embeddings): written once, under the first, as save_pretrained."""
    first: dict[int, str] = {}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), name) != name}


def plan_files(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """The tensors, in order, cut into files of at most `limit` bytes (a bigger tensor gets a file of its own)."""
    files: list[list[str]] = []
    used = 0
    for name, n in sizes.items():
        if not files or (used + n > limit and files[-1]):
            files.append([])
            used = 0
        files[-1].append(name)
        used += n
    return files


def file_names(n: int) -> list[str]:
    return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _write_config(model: Any, folder: Path, export_dtype: str, files: list[list[str]], names: list[str],
                  sizes: dict[str, int]) -> None:
    config = copy.deepcopy(model.config)
    config.dtype = {"fp32": "float32", "bf16": "bfloat16"}[export_dtype]
    config.architectures = [type(model).__name__.removeprefix("FSDP")]  # FSDP2 renames the wrapped class
    config.save_pretrained(folder)
    if model.can_generate() and model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {k: name for keys, name in zip(files, names, strict=True) for k in keys}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# ---------------------------------------------------------------------------------------------------------- load
def load(learner: Any, folder: str | Path) -> dict[str, Any]:
    """Weights, optimizer, schedule, step and RNG from `folder` (every rank calls it); the saved state, whose other
    keys are the run's `extra`."""
    folder = Path(folder)
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{folder} has no {STATE_FILE}: it is a model folder, not a checkpoint to resume. To "
                              f"start a new run from its weights, name it as the recipe's model and drop --resume")
    state = torch.load(state_file, weights_only=False, mmap=True)
    if "optimizer" in state:
        log.warning("%s is a checkpoint of the earlier layout (the whole optimizer in %s): every rank reads all of it. "
                    "The run's next checkpoint is sharded", folder, STATE_FILE)
        learner.load_optimizer_state(state.pop("optimizer"))
    elif (folder / SHARDS / ".metadata").is_file():
        _dcp(learner, "load", folder / SHARDS)
        if state.pop("optimizer_empty", False):
            learner.optimizer.state.clear()
    else:
        raise CheckpointError(f"{folder} has no sharded state ({SHARDS}/.metadata is missing: a copy that left it "
                              f"out, or a write that did not finish): resume from an earlier checkpoint")
    learner.scheduler.load_state_dict(state["scheduler"])
    learner.step = state["step"]
    set_rng_state(state["rng"])
    return state


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
