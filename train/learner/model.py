"""The learner: a transformers causal LM in torch, AdamW with warm-up then cosine (or constant) decay,
gradient accumulation and clipping, and checkpoints that are standard HF folders (`--model PATH` takes them
anywhere) plus the state needed to resume exactly.

Weights and optimizer state stay fp32; matmuls run in bf16 where the hardware has it (CUDA GPUs with bf16,
CPUs with AMX: about 2x on this machine's 2 cores), through autocast. On several GPUs the same code runs
under torchrun with FSDP2 (`fully_shard` per decoder layer, bf16 compute, fp32 reductions); on CPU it is one
process. SFT and RL share it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.pt"


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_ratio: float = 0.04  # of the total steps
    warmup_steps: int | None = None  # overrides warmup_ratio
    schedule: str = "cosine"  # cosine (to min_lr_ratio * lr) or constant, after warm-up
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(round(cfg.warmup_ratio * total))
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return "amx_bf16" in open("/proc/cpuinfo").read()  # without AMX, bf16 on CPU is slower than fp32
    except OSError:
        return False


def distributed() -> tuple[int, int]:
    """(rank, world size); initializes the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank = torch.distributed.get_rank() if world > 1 else 0
    return rank, world


def shard(model: torch.nn.Module, bf16: bool) -> None:
    """FSDP2 over the default process group: each decoder layer a unit, then the rest; parameters gathered in bf16
    for the forward when `bf16` (fp32 master weights stay sharded), gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def load_model(model_path: str, device: torch.device, *, rank: int, world: int, sharded: bool, bf16: bool,
               gradient_checkpointing: bool) -> torch.nn.Module:
    """The fp32 model on `device`, sharded when `sharded`. Over several ranks only rank 0 reads the checkpoint (into
    host memory); the others build the model on the meta device. Once FSDP2 has sharded it, rank 0's weights go to
    every rank shard by shard, and the buffers whole (rotary tables are not in the state dict): a node of 8 ranks
    holds one host copy of the fp32 model while it loads (59 GB at 14B), not 8."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if world == 1:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if sharded:
            shard(model, bf16)
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if rank == 0:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=torch.float32)
    full = model.state_dict() if rank == 0 else {}
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    shard(model, bf16)
    model = model.to(device) if rank == 0 else model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, src=0)
    return model


class TorchLearner:
    def __init__(self, model_path: str, optim: OptimConfig, total_steps: int, *, dtype: str = "auto",
                 gradient_checkpointing: bool = False, fsdp: bool = False):
        """`fsdp`: shard with FSDP2 even as the only rank (the GPU check's one-rank group); more than one rank always
        shards."""
        from transformers import AutoTokenizer

        self.rank, self.world = distributed()
        self.sharded = self.world > 1 or fsdp
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
        if dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype must be auto, bf16 or fp32, not {dtype!r}")
        self.bf16 = dtype == "bf16" or (dtype == "auto" and bf16_supported(self.device))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = load_model(model_path, self.device, rank=self.rank, world=self.world, sharded=self.sharded,
                                bf16=self.bf16, gradient_checkpointing=gradient_checkpointing)
        self.optim_cfg, self.total_steps = optim, total_steps
        self.optimizer = self._new_optimizer()
        self.step = 0

    @classmethod
    def around(cls, model: torch.nn.Module, device: torch.device, *, bf16: bool) -> TorchLearner:
        """A learner's forward passes around a model built elsewhere, one rank, no optimizer (the GPU check's
        memory probe runs `policy_update` on random models of a 14B shape)."""
        learner = cls.__new__(cls)
        learner.model, learner.device, learner.bf16 = model, device, bf16
        learner.rank, learner.world, learner.sharded = 0, 1, False
        return learner

    def _new_optimizer(self) -> torch.optim.Optimizer:
        c = self.optim_cfg
        opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, self.total_steps, c))
        return opt

    def reset_optimizer(self, total_steps: int | None = None) -> None:
        """A fresh optimizer and schedule (RL's stage 3 does this)."""
        self.total_steps = total_steps or self.total_steps
        self.optimizer = self._new_optimizer()

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and not self.sharded):
            return self.model(**batch).logits.float()

    def sft_loss(self, batch: dict[str, torch.Tensor], denominator: int) -> torch.Tensor:
        """Summed token cross-entropy on the labelled tokens / denominator (all target tokens of the step,
        so micro-batches of any size weigh each token the same). Backward is the caller's."""
        logits = self.logits(batch)[:, :-1]
        labels = batch["labels"][:, 1:].to(self.device)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                                 ignore_index=-100, reduction="sum") / max(1, denominator)

    def optimizer_step(self) -> dict[str, float]:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"grad_norm": float(grad_norm), "lr": float(lr)}

    # ------------------------------------------------------------------ checkpoints
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict()

    def optimizer_state(self) -> dict[str, Any]:
        """The whole optimizer state (under FSDP gathered from the shards: every rank must call it)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            return get_optimizer_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state,
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(state)

    def save(self, folder: str | Path, extra: dict[str, Any], meta: dict[str, Any]) -> Path:
        """Write the HF folder and the trainer state to a temporary folder, then rename it into place, so a
        failed write (a full disk) leaves the previous checkpoint whole."""
        folder = Path(folder)
        tmp = folder.with_name(folder.name + ".tmp")
        state, optim = self.full_state_dict(), self.optimizer_state()
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                self.model.save_pretrained(tmp, state_dict=state)
                self.tokenizer.save_pretrained(tmp)
                (tmp / "rstar2.json").write_text(json.dumps(meta, indent=2))
                torch.save({"step": self.step, "optimizer": optim,
                            "scheduler": self.scheduler.state_dict(), "rng": rng_state(), **extra}, tmp / STATE_FILE)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            old = folder.with_name(folder.name + ".old")
            if folder.exists():
                folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        if self.sharded:
            torch.distributed.barrier()
        return folder

    def load_state(self, folder: str | Path) -> dict[str, Any]:
        """Optimizer, scheduler, step and RNG from a checkpoint whose weights this learner was built from."""
        state = torch.load(Path(folder) / STATE_FILE, weights_only=False)
        self.load_optimizer_state(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
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
