"""The learner side of RL and SFT: the torch model learner, the `Learner` protocol the RL step drives and its two
implementations (this process: local.py; a Ray group of FSDP ranks: ray_group.py), the policy update, checkpoints,
and the colocated placement's sleep and wake. Which one a run uses is train/placement.py's choice."""
