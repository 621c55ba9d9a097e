"""The learner: a transformers causal LM in torch, AdamW with warm-up then cosine (or constant) decay,
gradient accumulation and clipping, and checkpoints that hold an HF export (`--model PATH` takes them anywhere)
beside the sharded state a resume needs, on any number of ranks (checkpoint.py).

Weights and optimizer state stay fp32; matmuls run in bf16 where the hardware has it (CUDA GPUs with bf16,
CPUs with AMX: about 2x on this machine's 2 cores), through autocast. On several GPUs the same code runs
under torchrun with FSDP2 (`fully_shard` per decoder layer, bf16 compute, fp32 reductions); on CPU it is one
process. SFT and RL share it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..config import GROUP_TIMEOUT_S, CheckpointConfig, OptimConfig
from . import checkpoint as ckpt
from .chunked_head import install as install_head

log = logging.getLogger(__name__)


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


def learner_precision(dtype: str, device: torch.device | None = None) -> str:
    """What a learner computes in, "bf16" or "fp32": `dtype` as a recipe spells it (auto, bf16, fp32) on `device`
    (by default the one a learner takes: the GPU, else the CPU). auto is bf16 where bf16 is fast (a GPU that has it, a
    CPU with AMX), else fp32."""
    if dtype not in ("auto", "bf16", "fp32"):
        raise ValueError(f"dtype must be auto, bf16 or fp32, not {dtype!r}")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return "bf16" if dtype == "bf16" or (dtype == "auto" and bf16_supported(device)) else "fp32"


def distributed(timeout_s: float = GROUP_TIMEOUT_S) -> tuple[int, int]:
    """(rank, world size); initializes the process group under torchrun (or Ray's ranks), each of its collectives
    timing out after `timeout_s`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
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
        install_head(model)  # before FSDP shards it: see chunked_head.py
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
    install_head(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    shard(model, bf16)
    model = model.to(device) if rank == 0 else model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, src=0)
    return model


def freeze(model: torch.nn.Module, layers: int) -> None:
    """The input embeddings and the bottom `layers` decoder layers stop training (a head tied to the embeddings with
    them): their backward is never run, nor their optimizer state kept."""
    if not layers:
        return
    total = len(model.model.layers)
    if not 0 < layers < total:
        raise ValueError(f"frozen_layers must be between 0 and {total - 1} (the model has {total} decoder layers), "
                         f"not {layers}")
    model.get_input_embeddings().weight.requires_grad_(False)
    for layer in model.model.layers[:layers]:
        layer.requires_grad_(False)


@contextlib.contextmanager
def embedding_noise(model: torch.nn.Module, alpha: float, generator: torch.Generator) -> Iterator[None]:
    """NEFTune (Jain et al. 2023, arXiv 2310.05914) while the block runs: each forward pass's input embeddings get
    uniform noise in [-1, 1] scaled by alpha / sqrt(L * d), L the pass's sequence length and d the hidden size,
    drawn from `generator` (seeded by the caller, so a step's noise is the same on a resume). alpha 0: nothing."""
    if not alpha:
        yield
        return

    def add(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
        scale = alpha / math.sqrt(out.size(-2) * out.size(-1))
        noise = torch.rand(out.shape, generator=generator, dtype=torch.float32) * 2 - 1
        return out + (noise * scale).to(out.device, out.dtype)

    handle = model.get_input_embeddings().register_forward_hook(add)
    try:
        yield
    finally:
        handle.remove()


class TorchLearner:
    def __init__(self, model_path: str, optim: OptimConfig, total_steps: int, *, dtype: str = "auto",
                 gradient_checkpointing: bool = False, fsdp: bool = False, frozen_layers: int = 0,
                 checkpoint: CheckpointConfig | None = None, group_timeout_s: float = GROUP_TIMEOUT_S,
                 neftune_alpha: float = 0.0, seed: int = 0):
        """`fsdp`: shard with FSDP2 even as the only rank (the GPU check's one-rank group); more than one rank always
        shards. `frozen_layers`: see `freeze`. `neftune_alpha`: noise on the input embeddings in `sft_loss` (see
        `embedding_noise`), drawn from (`seed`, step, rank)."""
        from transformers import AutoTokenizer

        self.rank, self.world = distributed(group_timeout_s)
        self.sharded = self.world > 1 or fsdp
        self.checkpoint = checkpoint or CheckpointConfig()
        self.io_group = ckpt.io_group(self.world, self.checkpoint.timeout_s)  # a checkpoint's waits run on it
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
        self.bf16 = learner_precision(dtype, self.device) == "bf16"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = load_model(model_path, self.device, rank=self.rank, world=self.world, sharded=self.sharded,
                                bf16=self.bf16, gradient_checkpointing=gradient_checkpointing)
        self.head = install_head(self.model)  # installed before FSDP sharded it (load_model): see chunked_head.py
        freeze(self.model, frozen_layers)
        self.optim_cfg, self.total_steps = optim, total_steps
        self.optimizer = self._new_optimizer()
        self.step = 0
        if neftune_alpha < 0:
            raise ValueError(f"neftune_alpha is a noise scale (0: none; its paper uses 5 to 15), not {neftune_alpha}")
        self.neftune_alpha, self.seed = neftune_alpha, seed
        self._noise: tuple[int, torch.Generator] | None = None  # (step, its generator)

    @classmethod
    def around(cls, model: torch.nn.Module, device: torch.device, *, bf16: bool) -> TorchLearner:
        """A learner's forward passes around a model built elsewhere, one rank, no optimizer (the GPU check's
        memory probe runs `policy_update` on random models of a 14B shape)."""
        learner = cls.__new__(cls)
        learner.model, learner.device, learner.bf16 = model, device, bf16
        learner.rank, learner.world, learner.sharded = 0, 1, False
        learner.step, learner.neftune_alpha, learner.seed, learner._noise = 0, 0.0, 0, None
        learner.head = install_head(model)
        return learner

    def close(self) -> None:
        """Over several ranks: wait for every rank to finish (under the checkpoint timeout, on its gloo group), then
        end the process groups while the interpreter is whole. A rank that exits with a group alive can abort in
        gloo's threads during interpreter teardown (SIGABRT, "terminate called without an active exception"), and
        one that ends its group while another still works in it can fail that rank. One process: nothing to do."""
        if self.world == 1 or not torch.distributed.is_initialized():
            return
        torch.distributed.barrier(group=self.io_group)
        torch.distributed.destroy_process_group()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        c = self.optim_cfg
        trained = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trained, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, self.total_steps, c))
        return opt

    def release_memory(self) -> None:
        """Give the accelerator memory the caching allocator holds but no tensor uses back to the device (the
        colocated placement: the update's activations and transients, before the engine on the same GPU wakes)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reset_optimizer(self, restart_schedule: bool = False) -> None:
        """A fresh optimizer state (RL's stage 3: the paper resets the state, not the schedule): Adam's moments
        and step counts are dropped and the learning-rate schedule goes on where it was; `restart_schedule` also
        starts the schedule again, warm-up included."""
        if restart_schedule:
            self.optimizer = self._new_optimizer()
        else:
            self.optimizer.state.clear()

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and not self.sharded):
            return self.model(**batch, use_cache=False).logits.float()

    def chunked_logprobs(self, batch: dict[str, torch.Tensor], temperature: float, chunk: int,
                         select: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's logprob of the next input token under softmax(logits / temperature) and that
        distribution's entropy, [batch, width - 1] each, the head `chunk` tokens at a time inside the model's forward
        (chunked_head.py): no full-vocabulary logits. `select` ([batch, width - 1]): only those positions (the others
        0)."""
        batch = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        select = None if select is None else select.to(self.device)
        with (torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and not self.sharded),
              self.head.targets(batch["input_ids"][:, 1:], temperature, chunk, select)):
            out = self.model(**batch, use_cache=False).logits
        return out[..., 0], out[..., 1]

    @property
    def compute_dtype(self) -> str:
        """What the forward passes compute in: bf16 (autocast, or FSDP's bf16 parameters) or fp32."""
        return "bf16" if self.bf16 else "fp32"

    @torch.no_grad()
    def score(self, ids: list[int], start: int, chunk: int = 1024) -> list[float]:
        """Teacher-forced logprobs of `ids[start:]` at temperature 1, by the update's own path (the chunked head,
        autocast as the update runs it): the learner's side of the checked weight push (train/push_check.py).
        Under FSDP every rank must call it (the forward gathers the shards); each gets the same list."""
        if not 1 <= start < len(ids):
            raise ValueError(f"score needs 1 <= start < {len(ids)}, not {start}")
        training = self.model.training
        self.model.eval()
        try:
            tokens = torch.tensor([ids])
            logp, _ = self.chunked_logprobs({"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}, 1.0,
                                            chunk)
        finally:
            self.model.train(training)
        return logp[0, start - 1:].float().tolist()

    def sft_loss(self, batch: dict[str, torch.Tensor], denominator: int) -> torch.Tensor:
        """Summed token cross-entropy on the labelled tokens / denominator (all target tokens of the step,
        so micro-batches of any size weigh each token the same). Backward is the caller's: under FSDP, times the
        world size (FSDP averages the ranks' gradients; sft.py).

        The head runs only at the positions whose next token is a target in some row (the model's
        `logits_to_keep`): the other positions' logits would all be ignored, and a tool-use conversation is mostly
        prompt (the system prompt alone is hundreds of tokens), while on a small model the vocabulary's head is
        most of the compute. The loss is the same sum over the same labelled tokens.

        With `prefix_ids` (chat_data.collate_shared), the shared prefix runs first, once, and its keys and values
        (in the graph: its gradients flow) serve every example of the batch."""
        labels = batch["labels"][:, 1:].to(self.device)
        keep = (labels != -100).any(0).nonzero().flatten()
        targets = labels[:, keep]
        if keep.numel() == 0:  # a padding row with no target (sft.py): one position, whose label is ignored
            keep = torch.zeros(1, dtype=torch.long, device=self.device)
            targets = torch.full((labels.size(0), 1), -100, dtype=labels.dtype, device=self.device)
        inputs = {k: v.to(self.device) for k, v in batch.items() if k not in ("labels", "prefix_ids")}
        if self._noise is None or self._noise[0] != self.step:  # one stream a step, however many passes it makes
            stream = ((self.seed * 1000003 + self.step) << 16) + self.rank
            self._noise = (self.step, torch.Generator().manual_seed(stream))
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and not self.sharded), \
                embedding_noise(self.model, self.neftune_alpha, self._noise[1]):
            cache = None
            if "prefix_ids" in batch:
                cache = self.model(input_ids=batch["prefix_ids"].to(self.device), use_cache=True,
                                   logits_to_keep=1).past_key_values
                cache.batch_repeat_interleave(inputs["input_ids"].size(0))
            logits = self.model(**inputs, past_key_values=cache, use_cache=cache is not None,
                                logits_to_keep=keep).logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                                 ignore_index=-100, reduction="sum") / max(1, denominator)

    def optimizer_step(self, advance: bool = True) -> dict[str, float]:
        """Clip, step, zero the gradients; with `advance` (an RL step's last mini-batch, or any SFT step) also the
        schedule and `step`."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not advance:
            return {"grad_norm": float(grad_norm), "lr": float(lr)}
        self.scheduler.step()
        self.step += 1
        return {"grad_norm": float(grad_norm), "lr": float(lr)}

    # ------------------------------------------------------------------ checkpoints
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """The whole optimizer state at once (a checkpoint of the earlier layout; under FSDP each rank takes its
        shards of it)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state,
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(state)

    def save(self, folder: str | Path, extra: dict[str, Any], meta: dict[str, Any]) -> Path:
        """The sharded state and the HF export (checkpoint.py), written atomically; every rank calls it."""
        return ckpt.save(self, folder, extra, meta)

    def load_state(self, folder: str | Path) -> dict[str, Any]:
        """Weights, optimizer, scheduler, step and RNG from a checkpoint (saved on any number of ranks)."""
        return ckpt.load(self, folder)
