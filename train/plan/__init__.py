"""The memory plan (`rstar2 train plan`, and the check before a GPU run): what each GPU of a recipe's placement
holds at its peak, and whether it fits, before a GPU is rented.

formulas.py    bytes per token and GiB per GPU (the learner's state and activations, vLLM's share, the push's
               buffers), PlanError, what makes a learner fit
records.py     GPU, Host, Plan, and the plan as text and JSON
colocated_phases.py  `placement: colocated`: each GPU's rollout and update phases, and the host memory
planner.py     plan_rl (separate, one process, or colocated), plan_sft, check_before_run
"""

from .planner import check_before_run, plan_rl, plan_sft

__all__ = ["check_before_run", "plan_rl", "plan_sft"]
