"""The openai engine against vLLM's own OpenAI server (a subprocess on loopback, serving the session's SFT
checkpoint), and against a server that is not there. Its own module, so the in-process vLLM engine of
test_engines.py is closed before this server starts: an idle vLLM engine still takes CPU."""

from __future__ import annotations

import sys
import warnings

import pytest

from rstar2_agent.agent import AgentConfig, run_agent
from rstar2_agent.bench.serve import running
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines.base import EngineError, SamplingParams
from rstar2_agent.engines.openai import OpenAIEngine

from conftest import count_prompt as prompt
from conftest import free_port

pytestmark = pytest.mark.slow
CONTEXT = 2048


@pytest.fixture(scope="module")
def vllm_server(sft_checkpoint, request, tmp_path_factory):
    """vLLM's own OpenAI server (a subprocess), serving the session's SFT checkpoint as "smol": the openai engine
    tests drive it, and it shows that our checkpoints load in vLLM. Module-scoped: an idle vLLM server still
    costs CPU, so it stops before the rest of the suite runs."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(sft_checkpoint[0]),
            "--served-model-name", "smol", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--max-model-len", str(CONTEXT), "--enforce-eager"]  # stats on: /metrics reports the KV cache size
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    failed = request.session.testsfailed
    with running(argv, port, {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}, timeout=240,
                 log=log) as url:
        yield url
    if request.session.testsfailed > failed:  # a test here failed: what the server said ("see stack trace above")
        warnings.warn(f"vLLM's server log, its last 3000 characters:\n{log.read_text(errors='replace')[-3000:]}",
                      stacklevel=1)


async def test_an_sft_checkpoint_loads_in_vllms_server(sft_checkpoint, vllm_server):
    """The server was started on the checkpoint's own folder (config, tokenizer, weights as SFT saved them)."""
    import httpx

    async with httpx.AsyncClient(timeout=120) as c:
        served = (await c.get(f"{vllm_server}/v1/models")).json()["data"][0]
        r = await c.post(f"{vllm_server}/v1/completions", json={"model": "smol", "prompt": "2 + 2 =", "max_tokens": 4,
                                                               "temperature": 0})
    assert served["root"] == str(sft_checkpoint[0])
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


async def test_openai_engine_token_ids_in_and_out(vllm_server, smol, sandbox):
    engine = OpenAIEngine(vllm_server, model="smol", tokenizer_path=smol.path)
    try:
        ids = prompt(engine.tokenizer)
        gen = await engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=20))
        assert engine.context_length == CONTEXT  # read from /v1/models
        assert 0 < len(gen.token_ids) <= 20 and len(gen.logprobs) == len(gen.token_ids)
        streamed: list[int] = []
        again = await engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=20),
                                      lambda new, lps: streamed.extend(new))
        assert streamed == again.token_ids == gen.token_ids
        fmt = ChatFormat(engine.tokenizer, "markdown")
        cfg = AgentConfig(max_turns=2, max_response_tokens=100,
                          sampling=SamplingParams(temperature=0.0, max_tokens=50))
        traj = await run_agent("What is 2**100? Use Python.", engine, sandbox, fmt, cfg)
        assert traj.stop_reason != "engine_error" and len(traj.response_ids) == len(traj.response_mask)
    finally:
        await engine.close()


async def test_an_unreachable_engine_ends_in_the_trajectory(smol, sandbox):
    dead = f"http://127.0.0.1:{free_port()}"
    engine = OpenAIEngine(dead, tokenizer_path=smol.path)
    try:
        with pytest.raises(EngineError, match="is it running"):
            await engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
        traj = await run_agent("1+1?", engine, sandbox, ChatFormat(engine.tokenizer, "markdown"))
        assert traj.stop_reason == "engine_error" and "is it running" in traj.error and traj.turns == []
    finally:
        await engine.close()


async def test_a_pool_over_vllm_servers_reads_their_kv_capacity(vllm_server, smol):
    """The KV-aware pool learns each server's KV cache from its /metrics at the first request: 1 GiB of bf16 KV
    (VLLM_CPU_KVCACHE_SPACE=1) for SmolLM2-135M (30 layers x 3 KV heads x 64 dims x K and V x 2 bytes = 23,040
    bytes a token) holds about 46,600 tokens, far more than the fallback of one context per replica."""
    from rstar2_agent.engines.replicas import ReplicaPool

    engines = [OpenAIEngine(vllm_server, model="smol", tokenizer_path=smol.path) for _ in range(2)]
    pool = ReplicaPool(engines, "kv_aware")
    try:
        await pool.generate(prompt(pool.tokenizer), SamplingParams(temperature=0.0, max_tokens=4))
        assert pool.context_length == CONTEXT  # from the servers' /v1/models
        assert all(40_000 < load.capacity <= (1 << 30) // 23_040 for load in pool.loads)
    finally:
        await pool.close()
