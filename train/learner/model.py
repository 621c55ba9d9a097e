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

from .head import install as install_head

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


class TorchLearner:
    def __init__(self, model_path: str, optim: OptimConfig, total_steps: int, *, dtype: str = "auto",
                 gradient_checkpointing: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.rank, self.world = distributed()
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
        if dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype must be auto, bf16 or fp32, not {dtype!r}")
        self.bf16 = dtype == "bf16" or (dtype == "auto" and bf16_supported(self.device))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.head = install_head(self.model)  # before FSDP shards it: see head.py
        if self.world > 1:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if self.bf16 else torch.float32,
                                      reduce_dtype=torch.float32)
            for layer in self.model.model.layers:
                fully_shard(layer, mp_policy=mp)
            fully_shard(self.model, mp_policy=mp)
        self.optim_cfg, self.total_steps = optim, total_steps
        self.optimizer = self._new_optimizer()
        self.step = 0

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
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and self.world == 1):
            return self.model(**batch, use_cache=False).logits.float()

    def chunked_logprobs(self, batch: dict[str, torch.Tensor], temperature: float, chunk: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's logprob of the next input token under softmax(logits / temperature) and that
        distribution's entropy, [batch, width - 1] each, the head `chunk` tokens at a time inside the model's forward
        (head.py): no full-vocabulary logits."""
        batch = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        with (torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and self.world == 1),
              self.head.targets(batch["input_ids"][:, 1:], temperature, chunk)):
            out = self.model(**batch, use_cache=False).logits
        return out[..., 0], out[..., 1]

    def sft_loss(self, batch: dict[str, torch.Tensor], denominator: int) -> torch.Tensor:
        """Summed token cross-entropy on the labelled tokens / denominator (all target tokens of the step,
        so micro-batches of any size weigh each token the same). Backward is the caller's: under FSDP, times the
        world size (FSDP averages the ranks' gradients; sft.py)."""
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
        if self.world > 1:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict()

    def optimizer_state(self) -> dict[str, Any]:
        """The whole optimizer state (under FSDP gathered from the shards: every rank must call it)."""
        if self.world > 1:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            return get_optimizer_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.world > 1:
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
        if self.world > 1:
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
