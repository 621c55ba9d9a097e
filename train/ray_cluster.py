"""Ray for a training run: `connect` joins the recipe's cluster (`ray.address`) or starts one on this machine, for
the learner group (learner/ray_group.py) and the rollout workers (rollout/workers.py) alike; `COLOCATED_SHARE` splits
a colocated bundle's GPU between the two."""

from __future__ import annotations

import os
from typing import Any

from .config import RayConfig

# colocated: the share of each bundle's GPU that Ray accounts to the learner rank; the rollout worker takes the rest.
# Ray's accounting only (both processes see the whole GPU): what each may hold is the memory plan's (train/plan/),
# the engine's through gpu_memory_utilization
COLOCATED_SHARE = 0.5


def connect(cfg: RayConfig) -> bool:
    """Connect this process to Ray; True when this call started it (a local cluster, or a connection to
    `address`), False when the process was connected already (then whoever connected it also disconnects)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"address": cfg.address, "ignore_reinit_error": True, "log_to_driver": False,
                              "include_dashboard": False}
    if cfg.address is None:  # a local cluster: the actors share this machine's cores
        kwargs["num_cpus"] = max(os.cpu_count() or 1, int(-(-cfg.cpus_needed() // 1)))
    ray.init(**kwargs)
    return True
