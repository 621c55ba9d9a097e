"""The weight push is chosen once, by one knob (train/push): what `auto` picks for each placement, what a named
backend is refused with, and the replaced knobs refused with the new spelling."""

from __future__ import annotations

import pytest

from rstar2_agent.train.config import RayConfig, RLConfig
from rstar2_agent.train.push import Chunked, InPlace, Shared, ThroughGroup, choose, make_push
from rstar2_agent.train.recipe import RecipeError, load

from conftest import tiny


@pytest.mark.parametrize("change,gpu,backend,transfer", [
    (dict(), False, "shared", None),
    (dict(rollout_engine="vllm"), False, "chunked", None),
    (dict(rollout_engine="vllm"), True, "chunked", None),
    (dict(rollout_engine="vllm", placement="colocated"), True, "ipc", "ipc"),
    (dict(rollout_engine="vllm", placement="colocated"), False, "chunked", None),
    (dict(distributed="ray"), False, "collective", None),
    (dict(distributed="ray", rollout_engine="vllm", ray=RayConfig(gpus_per_learner=1)), True, "nccl", "nccl"),
    (dict(distributed="ray", placement="colocated", rollout_engine="vllm", ray=RayConfig(gpus_per_learner=1)),
     True, "ipc", "ipc"),
])
def test_auto_picks_by_the_placement(tmp_path, change, gpu, backend, transfer):
    choice = choose(tiny(tmp_path, **change), on_gpu=gpu)
    assert (choice.backend, choice.engine_transfer) == (backend, transfer)
    push = make_push(choice, change.get("distributed", "none"))
    kinds = {"shared": Shared, "chunked": Chunked, "ipc": InPlace if "distributed" not in change else ThroughGroup}
    assert isinstance(push, kinds.get(backend, ThroughGroup)) and push.name == backend


@pytest.mark.parametrize("change,fragment", [
    (dict(weight_push="nccl"), "not a one-process push"),
    (dict(weight_push="ipc"), "needs rollout_engine: vllm"),
    (dict(weight_push="shared", rollout_engine="vllm"), "shared is the hf engine"),
    (dict(weight_push="chunked", distributed="ray"), "not a Ray push"),
    (dict(weight_push="sideways"), "weight_push is one of"),
])
def test_a_push_that_cannot_run_here_is_refused_by_name(tmp_path, change, fragment):
    with pytest.raises(ValueError, match=fragment):
        choose(tiny(tmp_path, **change), on_gpu=False)


@pytest.mark.parametrize("override,spelling", [
    ("ray.weight_push=object_store", "weight_push: collective or object_store"),
    ("ray.vllm_weight_transfer=false", "weight_push: nccl (true) or collective (false)"),
    ("engine_options.weight_transfer=fallback", "weight_push: ipc, nccl or chunked"),
])
def test_the_replaced_knobs_are_refused_with_the_new_spelling(override, spelling):
    with pytest.raises(RecipeError, match="is gone: use " + spelling.replace("(", r"\(").replace(")", r"\)")):
        load(RLConfig, "rl-smollm2-cpu", [override])
