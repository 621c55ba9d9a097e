"""The vllm engine in-process (vLLM's CPU build here, about half a minute to start, so marked slow; CI runs it).
The openai engine against vLLM's own server is in test_vllm_server.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import EngineError, SamplingParams

from conftest import VLLM_CONTEXT
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
    budget of 2048 tokens some prefills split. The prompts differ from their first token (no shared prefix)."""
    base = prompt(vllm_engine.tokenizer)
    prompts = [[1000 + k] + base * 30 for k in range(4)]
    assert all(len(p) < CONTEXT - 8 for p in prompts) and sum(map(len, prompts)) > 2 * 2048
    gens = await asyncio.gather(*(vllm_engine.generate(p, SamplingParams(temperature=1.0, max_tokens=8, seed=s))
                                  for s, p in enumerate(prompts)))
    assert all(0 < len(g.token_ids) <= 8 for g in gens)
    again = await vllm_engine.generate(prompts[3], SamplingParams(temperature=1.0, max_tokens=8, seed=3))
    assert again.token_ids == gens[3].token_ids


async def test_rl_pushes_the_learners_weights_into_the_in_process_vllm_engine(vllm_engine):
    """`rollout_engine: vllm` in one process: after the learner's push the engine samples from the learner's
    current policy (its logprobs match the learner's on the sampled ids), where before it sampled the stale one."""
    import torch
    from safetensors.torch import load_file

    from rstar2_agent.train.learner.local import LocalLearner
    from rstar2_agent.train.learner.model import OptimConfig
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
        await learner.push(vllm_engine)  # what the RL step's sync does with this engine
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
