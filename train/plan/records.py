"""The memory plan's records: one kind of GPU and what each holds (`GPU`), the host memory of a colocated node
(`Host`), the whole `Plan`; and the plan as text (`render`, what `rstar2 train plan` prints) and as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..model_shape import Shape


@dataclass
class GPU:
    """One kind of GPU in the placement: `count` of them, each holding `parts` (GiB)."""
    role: str
    count: int
    capacity_gib: float
    parts: dict[str, float]
    notes: list[str] = field(default_factory=list)
    ok: bool = True  # beyond the sum: e.g. the KV cache holds one sequence of the model's length

    @property
    def total_gib(self) -> float:
        return sum(v for k, v in self.parts.items() if not k.startswith("("))

    @property
    def fits(self) -> bool:
        return self.ok and self.total_gib <= self.capacity_gib

    def as_json(self) -> dict[str, Any]:
        return {"role": self.role, "count": self.count, "capacity_gib": round(self.capacity_gib, 2),
                "total_gib": round(self.total_gib, 2), "fits": self.fits,
                "components_gib": {k.strip("()"): round(v, 3) for k, v in self.parts.items()}, "notes": self.notes}


@dataclass
class Host:
    """Host memory a colocated node needs for its sleeping engines: their weights at sleep level 1 (pinned copies),
    nothing at level 2. `capacity_gib`: the node's memory when the plan runs on it (`check_before_run`), else None
    (shown, not checked)."""
    offload_gib: float
    capacity_gib: float | None = None

    @property
    def fits(self) -> bool:
        return self.capacity_gib is None or self.offload_gib <= self.capacity_gib

    def as_json(self) -> dict[str, Any]:
        return {"offload_gib": round(self.offload_gib, 2), "fits": self.fits,
                "capacity_gib": None if self.capacity_gib is None else round(self.capacity_gib, 1)}


@dataclass
class Plan:
    recipe: str
    kind: str
    model: str
    shape: Shape
    placement: str
    gpus: list[GPU]
    gpus_needed: int
    gpus_given: int | None
    settings: dict[str, Any]
    activations_gib: dict[str, float]
    advice: list[str] = field(default_factory=list)
    host: Host | None = None  # colocated: the sleeping engines' weights in host memory

    @property
    def fits(self) -> bool:
        return (all(g.fits for g in self.gpus) and (self.gpus_given is None or self.gpus_given >= self.gpus_needed)
                and (self.host is None or self.host.fits))

    def as_json(self) -> dict[str, Any]:
        out = {"recipe": self.recipe, "kind": self.kind, "model": self.model, "shape": self.shape.as_json(),
               "placement": self.placement, "gpus_needed": self.gpus_needed, "gpus_given": self.gpus_given,
               "fits": self.fits, "settings": self.settings, "activations_gib": self.activations_gib,
               "gpus": [g.as_json() for g in self.gpus], "advice": self.advice}
        if self.host is not None:
            out["host"] = self.host.as_json()
        return out


# ------------------------------------------------------------------------------------------------ output
def render(plan: Plan) -> str:
    lines = [f"{plan.kind} recipe {plan.recipe or '(given)'}: {plan.model} ({plan.shape.name or 'from config.json'}, "
             f"{plan.shape.params() / 1e9:.2f}B parameters)", f"placement: {plan.placement}"]
    st = plan.settings
    lines.append(f"learner micro-batch: {st['micro_batch_tokens']:,} tokens in rows of {st['sequence_tokens']:,}"
                 f"{' with a 4D mask' if st['attention_mask_4d'] else ''}, {st['precision']}, gradient "
                 f"checkpointing {'on' if st['gradient_checkpointing'] else 'off'}, logits {st['logits']}")
    a = plan.activations_gib
    lines.append(f"activations: {a['without_checkpointing']:.1f} GiB without checkpointing, "
                 f"{a['with_checkpointing']:.1f} GiB with")
    for g in plan.gpus:
        lines.append(f"{g.role} x{g.count}: {g.total_gib:.1f} of {g.capacity_gib:.1f} GiB "
                     f"{'fits' if g.fits else 'DOES NOT FIT'}")
        for k, v in g.parts.items():
            lines.append(f"  {k:<32} {v:8.2f} GiB")
        lines += [f"  {n}" for n in g.notes]
    if plan.host is not None:
        where = f"of {plan.host.capacity_gib:.0f} GiB here" if plan.host.capacity_gib is not None else \
            "not checked: the plan checks it on the node, before a run"
        lines.append(f"host memory for the sleeping engines' weights: {plan.host.offload_gib:.1f} GiB ({where})"
                     f"{'' if plan.host.fits else ' DOES NOT FIT'}")
    given = f" of {plan.gpus_given} given" if plan.gpus_given is not None else ""
    lines.append(f"GPUs needed: {plan.gpus_needed}{given}; fits: {'yes' if plan.fits else 'no'}")
    lines += [f"to fit: {x}" for x in plan.advice]
    return "\n".join(lines)


def to_json(plan: Plan) -> str:
    return json.dumps(plan.as_json(), indent=1)
