"""The vllm engine in-process (vLLM's CPU build here, about half a minute to start, so marked slow; CI runs it).
The openai engine against vLLM's own server is in test_vllm_server.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import SamplingParams

from conftest import count_prompt as prompt

pytestmark = pytest.mark.slow
CONTEXT = 2048


@pytest.fixture(scope="module")
async def vllm_engine(smol):
    from rstar2_agent.engines.vllm import VLLMEngine

    engine = VLLMEngine(smol.path, context_length=CONTEXT, kv_cache_gib=1.0)
    yield engine
    await engine.close()


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
