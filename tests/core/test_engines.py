"""The vllm engine in-process (vLLM's CPU build here, about half a minute to start, so marked slow; CI runs it).
The openai engine against vLLM's own server is in test_vllm_server.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import EngineError, SamplingParams

from conftest import VLLM_CONTEXT, push_group_members
from conftest import count_prompt as prompt

pytestmark = pytest.mark.slow
CONTEXT = VLLM_CONTEXT


async def test_vllm_generates_ids_and_logprobs_and_streams(vllm_engine):
    ids = prompt(vllm_engine.tokenizer)
    streamed: list[int] = []
    gen = await vllm_engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=24, seed=1),
                                     lambda new, lps: streamed.extend(new))
    assert 0 < len(gen.token_ids) <= 24 and len(gen.logprobs) == len(gen.token_ids)
    assert streamed == gen.token_ids and all(lp <= 0 for lp in gen.logprobs)
    again = await vllm_engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=24, seed=1))
    assert again.token_ids == gen.token_ids  # seeded sampling is reproducible
    stop = await vllm_engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=64, stop=["5"]))
    text = vllm_engine.tokenizer.decode(stop.token_ids)
    assert stop.stop_text == "5" and text.endswith("5")  # the stop string is kept, ids and text agree


async def test_vllm_prompts_go_in_rendered_with_their_exact_ids(vllm_engine, monkeypatch):
    """A raw prompt makes vLLM warn "Passing raw prompts to InputProcessor is deprecated" (and it will stop taking
    them): the engine hands it the renderer's output, an engine input of type "token" holding the very ids. (A raw
    prompt would go through `process_inputs_async`, which holds the unpatched method: `seen` would stay empty.)"""
    processor = vllm_engine.engine.input_processor
    real, seen = processor.process_inputs, []

    def spy(request_id, engine_input, *args, **kwargs):
        seen.append(engine_input)
        return real(request_id, engine_input, *args, **kwargs)

    monkeypatch.setattr(processor, "process_inputs", spy)
    ids = prompt(vllm_engine.tokenizer)
    gen = await vllm_engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=4))
    assert gen.token_ids and len(seen) == 1
    assert seen[0]["type"] == "token" and seen[0]["prompt_token_ids"] == ids


async def test_vllm_agent_loop_and_weight_reload(vllm_engine, sandbox):
    fmt = ChatFormat(vllm_engine.tokenizer, "markdown")
    cfg = AgentConfig(max_turns=2, max_response_tokens=120, sampling=SamplingParams(temperature=0.0, max_tokens=60))
    trajs = await asyncio.gather(*(run_agent("What is 2**100? Use Python.", vllm_engine, sandbox, fmt, cfg)
                                   for _ in range(3)))
    for t in trajs:
        assert len(t.response_ids) == len(t.response_mask) == len(t.logprobs) and t.stop_reason
    from safetensors.torch import load_file

    ids = prompt(vllm_engine.tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    before = await vllm_engine.generate(ids, greedy)
    weights = load_file(os.path.join(vllm_engine.model_path, "model.safetensors"))
    await vllm_engine.load_weights({k: v * 1.5 for k, v in weights.items()})
    changed = await vllm_engine.generate(ids, greedy)
    await vllm_engine.load_weights(weights)
    restored = await vllm_engine.generate(ids, greedy)
    assert changed.token_ids != before.token_ids and restored.token_ids == before.token_ids


async def test_vllm_seeded_requests_survive_a_prefill_split_across_steps(vllm_engine):
    """Regression: on vLLM's CPU build a seeded request whose prefill is split over two engine steps crashed the
    engine ("CPU Generator does not use offset"). RL rollouts are seeded and arrive together, so with a step
    budget of 2048 tokens some prefills split. Two prompts of about 1,200 tokens each: the second one's prefill
cannot fit in the first step beside the first. They differ from their first token (no shared prefix)."""
    base = prompt(vllm_engine.tokenizer)
    prompts = [[1000 + k] + base * (1200 // len(base) + 1) for k in range(2)]
    assert all(len(p) < CONTEXT - 8 for p in prompts) and 2048 < sum(map(len, prompts)) < 2 * 2048
    gens = await asyncio.gather(*(vllm_engine.generate(p, SamplingParams(temperature=1.0, max_tokens=8, seed=s))
                                  for s, p in enumerate(prompts)))
    assert all(0 < len(g.token_ids) <= 8 for g in gens)
    again = await vllm_engine.generate(prompts[1], SamplingParams(temperature=1.0, max_tokens=8, seed=1))
    assert again.token_ids == gens[1].token_ids


async def test_rl_pushes_the_learners_weights_into_the_in_process_vllm_engine(vllm_engine):
    """`rollout_engine: vllm` in one process: after the learner's push the engine samples from the learner's
    current policy (its logprobs match the learner's on the sampled ids), where before it sampled the stale one."""
    import torch
    from safetensors.torch import load_file

    from rstar2_agent.train.config import OptimConfig
    from rstar2_agent.train.learner.local import LocalLearner
    from rstar2_agent.train.loss import token_logprobs

    learner = LocalLearner(vllm_engine.model_path, OptimConfig(), total_steps=1, dtype="fp32")
    ids = prompt(vllm_engine.tokenizer)
    sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=5)

    async def gap() -> float:
        """Mean |engine logprob - learner logprob| over the engine's sampled tokens."""
        gen = await vllm_engine.generate(ids, sampling)
        with torch.no_grad():
            logits = learner.logits({"input_ids": torch.tensor([ids + gen.token_ids])})[0, len(ids) - 1:-1]
        mine = token_logprobs(logits, torch.tensor(gen.token_ids), 1.0)
        return float((mine - torch.tensor(gen.logprobs)).abs().mean())

    same = await gap()
    with torch.no_grad():  # a policy update, as far as the engine can tell
        for name, p in learner.model.named_parameters():
            if "down_proj" in name:
                p.mul_(1.1)
    stale = await gap()
    try:
        from rstar2_agent.train.push import Chunked

        await Chunked().push(learner, vllm_engine)  # what the RL step's sync does with this engine (chunked)
        fresh = await gap()
    finally:
        await vllm_engine.load_weights(load_file(f"{vllm_engine.model_path}/model.safetensors"))
    assert same < 0.1 and fresh < 0.1 and stale > 5 * max(fresh, 0.02), (same, stale, fresh)


def test_the_in_process_vllm_share_of_a_gpu_is_what_the_learner_left_free():
    """vLLM checks at start that gpu_memory_utilization of the whole device is free. Beside a learner holding
    60 of 80 GiB the default share is what is free less a margin, a share that cannot be free is refused before
    vLLM loads (naming the setting that works and the one that does not), and an unused device keeps vLLM's
    usual share. (Pure arithmetic on the figures torch would report: no GPU here.)"""
    from rstar2_agent.engines.vllm import DEFAULT_GPU_SHARE, gpu_share

    gib = 2**30
    assert gpu_share(None, 80 * gib, 80 * gib) == DEFAULT_GPU_SHARE
    assert gpu_share(None, 20 * gib, 80 * gib) == pytest.approx(0.20)
    assert gpu_share(0.1, 20 * gib, 80 * gib) == 0.1
    with pytest.raises(EngineError, match=r"at most 0\.20.*kv_cache_gib sizes the cache only on a CPU"):
        gpu_share(0.85, 20 * gib, 80 * gib)
    with pytest.raises(EngineError, match="distributed: ray"):
        gpu_share(None, 3 * gib, 80 * gib)
    assert gpu_share(0.5, 0, 0) == 0.5  # not measured (CUDA not initialized here): vLLM checks it itself


def _spy_rpc(engine, monkeypatch) -> list[tuple[str, tuple]]:
    """Record every collective_rpc the engine sends to its workers (method, args), passing them on."""
    real, calls = engine.engine.collective_rpc, []

    async def spy(method, timeout=None, args=(), kwargs=None):
        calls.append((method, args))
        return await real(method, timeout=timeout, args=args, kwargs=kwargs)

    monkeypatch.setattr(engine.engine, "collective_rpc", spy)
    return calls


async def test_a_push_in_many_messages_gives_what_one_message_gives(vllm_engine, monkeypatch):
    """A changed policy pushed at a cap of 56 MiB (just over SmolLM2's 54 MiB embeddings) goes in many messages of
    whole layers, each under the cap as vLLM's own msgpack encoder encodes it (the cap stands in for its 4 GiB
    limit, scaled down), in the engine's dtype; the engine then samples exactly what it samples after the same
    policy in one message: the same ids and logprobs."""
    import torch
    from safetensors.torch import load, load_file
    from vllm.v1.serial_utils import MsgpackEncoder

    from rstar2_agent.train.push.weight_chunks import unit_of

    original = load_file(os.path.join(vllm_engine.model_path, "model.safetensors"))
    changed = {k: v * 1.1 if "down_proj" in k else v for k, v in original.items()}
    ids = prompt(vllm_engine.tokenizer)
    sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=3)
    cap = 56 * 2**20
    try:
        await vllm_engine.load_weights(changed)  # one message (the default cap is 2 GiB)
        whole = await vllm_engine.generate(ids, sampling)
        await vllm_engine.load_weights(original)
        calls = _spy_rpc(vllm_engine, monkeypatch)
        await vllm_engine.load_weights(changed, max_message_bytes=cap)
        monkeypatch.undo()
        cut = await vllm_engine.generate(ids, sampling)
    finally:
        monkeypatch.undo()
        await vllm_engine.load_weights(original)
    messages = [args[0] for method, args in calls if method == "load_weight_chunk"]
    assert [m for m, _ in calls] == ["begin_weight_push"] + ["load_weight_chunk"] * len(messages) + ["end_weight_push"]
    assert len(messages) >= 5  # the embeddings alone, then 7 or 8 decoder layers a message
    encoder = MsgpackEncoder()
    seen: dict[str, int] = {}
    for i, blob in enumerate(messages):
        assert sum(len(memoryview(b)) for b in encoder.encode(("load_weight_chunk", (blob,)))) <= cap + 1024
        tensors = load(blob)
        assert all(t.dtype == vllm_engine.weights_dtype == torch.bfloat16 for t in tensors.values())
        for k in tensors:
            assert seen.setdefault(unit_of(k), i) == i, f"{unit_of(k)} split across messages"
    assert sorted(k for m in messages for k in load(m)) == sorted(original)
    assert cut.token_ids == whole.token_ids and cut.logprobs == whole.logprobs


async def test_a_layer_over_the_message_cap_is_refused_before_anything_is_sent(vllm_engine, monkeypatch):
    from safetensors.torch import load_file

    from rstar2_agent.engines.base import EngineError

    weights = load_file(os.path.join(vllm_engine.model_path, "model.safetensors"))
    calls = _spy_rpc(vllm_engine, monkeypatch)
    with pytest.raises(EngineError, match=r"model\.embed_tokens \(54\.0 MiB\) do not fit one message of "
                                          r"max_message_mb=16\.0 MiB"):
        await vllm_engine.load_weights(weights, max_message_bytes=16 * 2**20)
    assert calls == []
    monkeypatch.undo()
    gen = await vllm_engine.generate(prompt(vllm_engine.tokenizer), SamplingParams(temperature=0.0, max_tokens=4))
    assert gen.token_ids  # the engine generates on, untouched


async def test_a_weight_vllm_does_not_load_fails_the_push_naming_it(vllm_engine):
    """vLLM's loader skips an unexpected `.bias` (it does so for GPTQ checkpoints) with no error, and its reload
    only logs what it did not load: the push compares the names vLLM reports loaded with those sent (q/k/v and
    gate/up stacked, lm_head tied) and fails naming the one missing."""
    import torch
    from safetensors.torch import load_file

    from rstar2_agent.engines.base import EngineError

    weights = load_file(os.path.join(vllm_engine.model_path, "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # tied, as the learner's state dict has it
    await vllm_engine.load_weights(weights)  # every real name passes the check
    bogus = {**weights, "model.layers.0.mlp.down_proj.bias": torch.zeros(576)}
    with pytest.raises(EngineError, match=r"did not load 1 of the 274 weights pushed "
                                          r"\(model\.layers\.0\.mlp\.down_proj\.bias\): the engine's model has no"):
        await vllm_engine.load_weights(bogus)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    ids = prompt(vllm_engine.tokenizer)
    before = await vllm_engine.generate(ids, greedy)
    await vllm_engine.load_weights(weights)
    assert (await vllm_engine.generate(ids, greedy)).token_ids == before.token_ids  # the real weights went in


async def test_a_collective_push_loads_into_vllm_bucket_by_bucket(vllm_engine, monkeypatch):
    """The rollout worker's side of the collective push (EngineActor.receive_weights, in this process over a real
    gloo group): SmolLM2 in bf16 at 8 MB a bucket arrives in 20 and more buckets, each handed to vLLM as a part
    before the next is received, and the engine then samples exactly as after the same weights in one push."""
    import threading

    import torch
    from safetensors.torch import load_file

    from rstar2_agent.train.push.collective import plan
    from rstar2_agent.train.rollout.ray_engine import EngineActor

    original = load_file(os.path.join(vllm_engine.model_path, "model.safetensors"))
    changed = {k: (v * 1.1 if "down_proj" in k else v).to(torch.bfloat16) for k, v in original.items()}
    ids = prompt(vllm_engine.tokenizer)
    sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=4)
    buckets = plan({k: (v.dtype, tuple(v.shape)) for k, v in changed.items()}, bucket_mb=8)
    assert len(buckets) >= 20
    actor = EngineActor("vllm", vllm_engine.model_path, CONTEXT, {})
    actor.engine = vllm_engine
    sender, actor.group = push_group_members(2, timeout_s=120)
    real, parts = vllm_engine.load_weight_parts, []

    async def counting(stream, **kw):
        async def each():
            async for part in stream:
                parts.append(len(part))
                yield part
                del part

        return await real(each(), **kw)

    monkeypatch.setattr(vllm_engine, "load_weight_parts", counting)
    try:
        thread = threading.Thread(target=sender.send, args=(changed, buckets))
        thread.start()
        assert await actor.receive_weights(buckets) == len(changed)
        thread.join(60)
        monkeypatch.undo()
        collective = await vllm_engine.generate(ids, sampling)
        await vllm_engine.load_weights(changed)
        whole = await vllm_engine.generate(ids, sampling)
    finally:
        monkeypatch.undo()
        actor.leave_weight_group()
        sender.close()
        await vllm_engine.load_weights(original)
    assert len(parts) == len(buckets) and sum(parts) == len(changed)
    assert collective.token_ids == whole.token_ids and collective.logprobs == whole.logprobs
