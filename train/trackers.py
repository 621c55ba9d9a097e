"""Live curves of a training run (SFT and RL alike): TensorBoard and Weights & Biases, each only when asked for
(`tensorboard: true`, `wandb_project: NAME` in a recipe or as key=value overrides) and installed. The store stays
the record (`rstar2 train report`); these are for watching a run as it goes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Trackers:
    """TensorBoard events under `out/tensorboard`, and/or a Weights & Biases run named `name` in `wandb_project`.

    `first_step` is the first step this process logs: TensorBoard hides the events a killed attempt wrote from that
    step on (`purge_step`), so a resumed run's curves show each step once, as the store does."""

    def __init__(self, out: str | Path, name: str, config: dict[str, Any], *, tensorboard: bool = False,
                 wandb_project: str | None = None, first_step: int = 1):
        self.writer: Any = None
        self.wandb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning("tensorboard is not installed (pip install tensorboard): no TensorBoard curves")
            else:
                self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=first_step)
        if wandb_project:
            try:
                import wandb
            except ImportError:
                log.warning("wandb is not installed (pip install wandb): no Weights & Biases curves")
            else:
                self.wandb = wandb.init(project=wandb_project, name=name, config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k, v, step)
            self.writer.flush()  # a live TensorBoard sees each step as it ends
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        """Idempotent."""
        writer, run, self.writer, self.wandb = self.writer, self.wandb, None, None
        if writer is not None:
            writer.close()
        if run is not None:
            run.finish()
