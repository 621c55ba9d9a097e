"""`rstar2 train sft`: the non-reasoning SFT stage (instruction following, the tool-call and answer formats).

Data (chat records, see data/converters.py) is rendered through the shared chat format with an assistant-only
loss mask, packed, and trained for `epochs` (or `max_steps`) with the learner. Every step's metrics go to the
store; checkpoints are an HF export beside the sharded trainer state (learner/checkpoint.py), and `resume`
continues from the last one exactly: the data order is a function of (seed, epoch) and the position is the step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.models import resolve_model

from .config import SFTConfig
from .data.chat_data import DataStats, Example, Row, collate, collate_shared, pack
from .data.sft_mix import load_mix, render_parts, report
from .learner.model import TorchLearner
from .run_frame import RunFrame, resume_from, save_checkpoint

log = logging.getLogger(__name__)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 1000003 + epoch).shuffle(order)
    return order


def step_rows(rows: list[Any], step: int, per_step: int, seed: int) -> list[Any]:
    """The rows (or examples) of optimizer step `step`: a pure function of (seed, step), so a resume takes the same
    ones."""
    steps_per_epoch = max(1, len(rows) // per_step)
    epoch, k = divmod(step, steps_per_epoch)
    order = epoch_order(len(rows), seed, epoch)
    return [rows[i] for i in order[k * per_step:(k + 1) * per_step]]


class SFTRun:
    def __init__(self, cfg: SFTConfig, resume: bool = False):
        self.cfg = cfg
        resolved = resolve_model(cfg.model)
        last = resume_from(cfg.out, resume)
        self.parts = load_mix(cfg.data, cfg.seed, cfg.on_bad_line, cfg.hub_dir)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        self.fmt = ChatFormat(tokenizer, cfg.format, resolved.spec.chat_template)
        examples = render_parts(self.fmt, self.parts, cfg.seq_len, cfg.overlong, cfg.target_shape)
        self.stats = DataStats()
        for part in self.parts:
            self.stats.add(part.stats)
            log.info("%s: %d rows, %d examples, %d tokens", part.source, len(part.records), part.stats.examples,
                     part.stats.tokens)
        if not examples:
            raise ValueError(f"no usable training examples in {cfg.data} (see the warnings above)")
        if cfg.batch_examples < 0:
            raise ValueError(f"batch_examples is a number of examples per step (0: packed rows per step), not "
                             f"{cfg.batch_examples!r}")
        self.examples = examples
        self.rows = [] if cfg.batch_examples else pack(examples, cfg.seq_len, cfg.seed, cfg.share_prefix)
        self.learner_init = (str(last) if last else resolved.path)
        self.base_spec = resolved.spec
        self.last = last

    def prepare(self) -> TorchLearner:
        cfg = self.cfg
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.per_step = cfg.batch_examples or cfg.micro_batch * cfg.grad_accum * self.world
        steps_per_epoch = max(1, len(self.examples if cfg.batch_examples else self.rows) // self.per_step)
        self.total = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
        learner = TorchLearner(self.learner_init, cfg.optim, self.total, dtype=cfg.dtype,
                               gradient_checkpointing=cfg.gradient_checkpointing, frozen_layers=cfg.frozen_layers,
                               checkpoint=cfg.checkpoint, neftune_alpha=cfg.neftune_alpha, seed=cfg.seed,
                               group_timeout_s=cfg.group_timeout_s)
        if self.last is not None:
            learner.load_state(self.last)
        return learner

    def train_step(self, learner: TorchLearner) -> dict[str, float]:
        cfg = self.cfg
        rows = self.step_rows(learner.step)
        mine = rows[learner.rank::self.world]
        denominator = sum(sum(ex.mask) for r in rows for ex in r.docs)
        pad_id = self.fmt.tokenizer.pad_token_id or 0
        # every rank runs as many forward passes (FSDP's collectives line up): a rank with fewer rows pads with a
        # one-token row that has no target
        passes = math.ceil(math.ceil(len(rows) / self.world) / cfg.micro_batch)
        parts = [mine[i * cfg.micro_batch:(i + 1) * cfg.micro_batch] or [Row([Example([pad_id], [0])])]
                 for i in range(passes)]
        # a row's shared prefix in its own pass (collate_shared) on one process; under FSDP every rank must make the
        # same number of forward passes, and gradient checkpointing keeps no keys and values: the block mask
        two_pass = cfg.share_prefix and self.world == 1 and not cfg.gradient_checkpointing
        t0 = time.perf_counter()
        loss = 0.0
        for micro in parts:
            if two_pass and len(micro) == 1 and micro[0].shared:
                part = learner.sft_loss(collate_shared(micro[0], pad_id), denominator)
            else:
                part = learner.sft_loss(collate(micro, pad_id), denominator)
            # each rank's loss is its share of the step's sum (the denominator counts every rank's tokens), and FSDP
            # averages the gradients over the ranks: times the world size, their mean is the sum, the gradient of
            # the whole step's loss, whatever the number of ranks (as RL's `scale`)
            (part * learner.world).backward()
            loss += part.item()
        if self.world > 1:
            t = torch.tensor([loss], device=learner.device)
            torch.distributed.all_reduce(t)
            loss = t.item()
        out = learner.optimizer_step()
        tokens = sum(r.length for r in rows)
        return {"loss": loss, "tokens_per_s": tokens / (time.perf_counter() - t0), "target_tokens": denominator, **out}

    def step_rows(self, step: int) -> list[Row]:
        """The packed rows of optimizer step `step`: `per_step` rows, or with `batch_examples` that many examples
        (a seeded order per epoch, as the rows') packed for this step."""
        if not self.cfg.batch_examples:
            return step_rows(self.rows, step, self.per_step, self.cfg.seed)
        examples = step_rows(self.examples, step, self.per_step, self.cfg.seed)
        return pack(examples, self.cfg.seq_len, self.cfg.seed * 1000003 + step, self.cfg.share_prefix)

    def save(self, learner: TorchLearner) -> Path:
        return save_checkpoint(learner, self.cfg, "sft", learner.step, self.base_spec.context_length)


def run_sft(cfg: SFTConfig, resume: bool = False, on_step: Callable[[int, int, dict[str, float]], None] | None = None
            ) -> tuple[Path, list[dict[str, float]]]:
    """Train; returns the final checkpoint folder and each step's metrics."""
    run = SFTRun(cfg, resume)
    learner = run.prepare()
    info = {"data": dataclasses.asdict(run.stats), "sources": report(run.parts)["sources"], "rows": len(run.rows),
            "examples": len(run.examples), "total_steps": run.total}
    history = []
    with RunFrame(cfg, "sft", learner.step, info, primary=learner.rank == 0) as frame:
        while learner.step < run.total:
            metrics = run.train_step(learner)
            history.append(metrics)
            frame.record(learner.step, metrics)
            if on_step:
                on_step(learner.step, run.total, metrics)
            if frame.periodic_save(learner.step) and learner.step < run.total:
                run.save(learner)
        final = run.save(learner)
    learner.close()  # under torchrun: the ranks end their groups together
    return final, history
