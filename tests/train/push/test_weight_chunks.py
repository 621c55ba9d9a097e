"""How a weight push is cut (train/push/weight_chunks.py, and the collective's buckets in collective.plan), over the
real names and sizes of SmolLM2's state dict (read from its safetensors header): no message and no bucket ever
holds part of a layer, every message stays under its cap, a layer over the cap is refused naming it and the
setting, and the loaded-names check allows exactly vLLM's stacked and tied names."""

from __future__ import annotations

import pytest
import torch

from rstar2_agent.engines.base import EngineError
from rstar2_agent.train.push.collective import plan
from rstar2_agent.train.push.weight_chunks import chunks, message_bytes, not_loaded, unit_of, units

MiB = 2**20


@pytest.fixture(scope="module")
def smol_shapes(smol) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """SmolLM2's state dict as the learner pushes it to vLLM: every name, in bf16, with a tied lm_head."""
    from safetensors import safe_open

    with safe_open(f"{smol.path}/model.safetensors", "pt") as f:
        shapes = {k: (torch.bfloat16, tuple(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    return shapes


def sizes_of(shapes) -> dict[str, int]:
    return {k: torch.Size(shape).numel() * dt.itemsize for k, (dt, shape) in shapes.items()}


def test_units_are_decoder_layers_and_modules():
    assert unit_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert unit_of("model.layers.3.mlp.experts.7.w1.weight") == "model.layers.3"  # the outermost index: the layer
    assert unit_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert unit_of("lm_head.weight") == "lm_head" and unit_of("w") == "w"


def test_the_chunker_never_splits_a_layer_of_smollm2(smol_shapes):
    """Over many caps (from just above the largest layer, the embeddings at 54 MiB, to the whole model in one), every
    layer's names are all in one chunk, each chunk's message fits the cap, and nothing is lost or reordered within
    a layer. The layers are those of vLLM's own layerwise grouping (the decoder layers)."""
    from vllm.distributed.weight_transfer.base import layerwise_groups

    sizes = sizes_of(smol_shapes)
    layer_of = {n: unit for unit, names in units(sizes).items() for n in names}
    for group in layerwise_groups(list(sizes)):  # vLLM's decoder-layer groups are each one of our units
        if any(part.isdigit() for part in group[0].split(".")):
            assert len({layer_of[n] for n in group}) == 1 and set(group) == set(units(sizes)[layer_of[group[0]]])
    biggest = max(message_bytes({k: sizes[k] for k in names}) for names in units(sizes).values())
    caps = [biggest, biggest + 1, 57 * MiB, 60 * MiB, 64 * MiB, 100 * MiB, 128 * MiB, 200 * MiB, 1024 * MiB]
    for cap in caps:
        cut = chunks(sizes, cap)
        assert [n for c in cut for n in c] == [n for names in units(sizes).values() for n in names]
        for c in cut:
            assert message_bytes({k: sizes[k] for k in c}) <= cap
        where = {}
        for i, c in enumerate(cut):
            for n in c:
                where.setdefault(layer_of[n], set()).add(i)
        assert all(len(ix) == 1 for ix in where.values()), cap
        if cap <= 64 * MiB:
            assert len(cut) >= 6, (cap, len(cut))  # a 135M model in many messages, as a 14B one at 2 GiB
    assert len(chunks(sizes, 1024 * MiB)) == 1


def test_a_layer_over_the_cap_is_refused_naming_it_and_the_setting(smol_shapes):
    with pytest.raises(EngineError, match=r"the weights of model\.embed_tokens \(54\.0 MiB\) do not fit one "
                                          r"message of max_message_mb=16\.0 MiB.*raise max_message_mb to at least 55"):
        chunks(sizes_of(smol_shapes), 16 * MiB)


def test_the_loaded_names_check_allows_vllms_stacked_and_tied_names():
    sent = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight",
            "model.layers.0.mlp.down_proj.bias"]
    loaded = {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
              "model.layers.0.mlp.down_proj.weight"}
    assert not_loaded(sent, loaded, tied_embeddings=True) == ["model.layers.0.mlp.down_proj.bias"]
    assert not_loaded(sent, loaded) == ["lm_head.weight", "model.layers.0.mlp.down_proj.bias"]


def test_the_collectives_buckets_hold_whole_layers(smol_shapes):
    """At 8 MB a bucket (a decoder layer of SmolLM2 is 7 MB in bf16) the 135M push runs in one bucket per layer or
    so, as a 14B one does at 256 MB; the embeddings, larger than a bucket, are one alone; tied lm_head travels as a
    reference."""
    buckets = plan(smol_shapes, bucket_mb=8, aliases={"lm_head.weight": "model.embed_tokens.weight"})
    assert len(buckets) >= 20
    where: dict[str, set[int]] = {}
    for i, b in enumerate(buckets):
        assert b.numel * 2 <= 8 * MiB or len({unit_of(e.name) for e in b.entries if e.same_as is None}) == 1
        for e in b.entries:
            where.setdefault(unit_of(e.name), set()).add(i)
    assert all(len(ix) == 1 for ix in where.values())
    assert sum(len(b.entries) for b in buckets) == len(smol_shapes)
