"""What SFT and RL do around their steps, in one place: the recipe saved beside the run, the run's row in the
store (what a killed attempt recorded past the checkpoint forgotten first), the live trackers, each step's record,
the save cadence, checkpoints with their meta and the `last` link, and the run's final status (finished, or
interrupted by an error, Ctrl-C or SIGTERM)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2_agent.store import Store

from .recipe import dump
from .trackers import Trackers

log = logging.getLogger(__name__)


def checkpoints(out: str | Path) -> list[Path]:
    """The run folder's checkpoints, oldest first."""
    return sorted(Path(out).glob("checkpoint-*[0-9]"), key=lambda p: int(p.name.split("-")[1]))


def resume_from(out: str | Path, resume: bool) -> Path | None:
    """The checkpoint a resumed run starts from (the newest), or None (not resuming, or nothing to resume)."""
    if not resume:
        return None
    found = checkpoints(out)
    if not found:
        log.warning("nothing to resume in %s: starting from the recipe's model", out)
    return found[-1] if found else None


def link_last(checkpoint: Path) -> None:
    """`out/last` points at the newest checkpoint, so recipes can name the previous stage's result."""
    link = checkpoint.parent / "last"
    link.unlink(missing_ok=True)
    link.symlink_to(checkpoint.name)


def save_checkpoint(learner: Any, cfg: Any, stage: str, step: int, context_length: int,
                    extra: dict[str, Any] | None = None, answer_extraction: str = "") -> Path:
    """`out/checkpoint-STEP` (an HF folder, the trainer state and `extra`), with the meta `rstar2` reads back (the
    format the model was trained with, how RL's reward read its answers, its context, where it came from), then
    `out/last` points at it."""
    meta = {"format": cfg.format, "context_length": context_length, "stage": stage, "trained_from": cfg.model,
            "step": step, **({"answer_extraction": answer_extraction} if answer_extraction else {})}
    path = learner.save(Path(cfg.out) / f"checkpoint-{step}", extra or {}, meta)
    if getattr(learner, "rank", 0) == 0:  # under torchrun every rank saves; one of them moves the link and prunes
        link_last(path)
        prune(cfg.out, cfg.checkpoint.keep)
    return path


def prune(out: str | Path, keep: int) -> None:
    """Deletes all but the newest `keep` checkpoints of `out` (0: none), after the newest was renamed into place
    and `last` points at it, so a kill at any moment leaves a whole checkpoint to resume from."""
    for old in checkpoints(out)[:-keep] if keep else []:
        log.info("checkpoint.keep is %d: deleting %s", keep, old)
        shutil.rmtree(old, ignore_errors=True)


def run_name(cfg: Any) -> str:
    """A training run's name in the store: the recipe's `run`, else its `out` folder's name."""
    return cfg.run or Path(cfg.out).resolve().name


class RunFrame:
    """A training run's record, around its steps: `with RunFrame(...) as frame:` then `frame.record(step, metrics)`
    after each step. `done` is the step the run starts from (its checkpoint's): `forget(store, run_id, done)`
    deletes what the store holds past it (default: the metrics of later steps). `primary` False (an FSDP rank
    other than 0 under torchrun): nothing is written."""

    def __init__(self, cfg: Any, kind: str, done: int, info: dict[str, Any] | None = None, *, primary: bool = True,
                 forget: Callable[[Store, int, int], None] | None = None):
        self.cfg = cfg
        self.name = run_name(cfg)
        self.store: Store | None = None
        self.run_id: int | None = None
        self.trackers: Trackers | None = None
        if not primary:
            return
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        (Path(cfg.out) / "recipe.yaml").write_text(dump(cfg))
        self.store = Store(cfg.db)
        recipe = dataclasses.asdict(cfg)
        self.run_id = self.store.open_run(self.name, kind, cfg.model, {}, {"recipe": recipe, **(info or {})},
                                          kind=kind).id
        (forget or _forget_metrics)(self.store, self.run_id, done)
        self.trackers = Trackers(cfg.out, self.name, recipe, tensorboard=cfg.tensorboard,
                                 wandb_project=cfg.wandb_project, first_step=done + 1)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """The step's metrics to the store (replacing any earlier record of that step) and the trackers."""
        if self.store is not None:
            self.store.add_metrics(self.run_id, step, metrics)
        if self.trackers is not None:
            self.trackers.log(step, metrics)

    def periodic_save(self, step: int) -> bool:
        """`save_every` says this step saves."""
        return bool(self.cfg.save_every) and step % self.cfg.save_every == 0

    def __enter__(self) -> RunFrame:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        try:
            if self.store is not None:
                self.store.set_status(self.run_id, "finished" if kind is None else "interrupted")
        finally:
            if self.trackers is not None:
                self.trackers.close()


def _forget_metrics(store: Store, run_id: int, done: int) -> None:
    store.forget_steps(run_id, done + 1)
