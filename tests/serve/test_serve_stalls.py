"""`rstar2 serve` never waits silently: a request that gets no token for the stall timeout is aborted with an
error naming it, counted, and its engine work cancelled; /health says so; a client that hangs up ends its work.

The wedged engine is a fake (an engine that stops producing tokens cannot be made on demand): it wraps the real
SmolLM2 engine and, for requests with the seed WEDGE, sends one token and then none."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest

from conftest import metrics_once_idle, serving

pytestmark = pytest.mark.slow
WEDGE = 1313
STALL = 5.0


class FakeEngineThatStopsProducingTokens:
    def __init__(self, inner):
        self.inner, self.tokenizer, self.model_path = inner, inner.tokenizer, inner.model_path
        self.name, self.context_length = "wedged", inner.context_length
        self.started = self.cancelled = 0

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        if sampling.seed is None or sampling.seed < WEDGE:
            return await self.inner.generate(prompt_ids, sampling, on_tokens)
        self.started += 1
        if on_tokens is not None:
            on_tokens([self.tokenizer.encode("The")[0]], [-0.1])
        try:
            await asyncio.Event().wait()  # the engine never sends another token
        except asyncio.CancelledError:
            self.cancelled += 1  # the watchdog ended it: a real engine aborts and frees the request here
            raise


@pytest.fixture(scope="module")
async def wedged(engine, sandbox):
    fake = FakeEngineThatStopsProducingTokens(engine)
    async with serving(fake, sandbox, stall_timeout=STALL) as url:
        yield url, fake


def completion(seed: int, stream: bool) -> dict:
    return {"prompt": "Count: 1, 2, 3,", "max_tokens": 8, "temperature": 0.7, "seed": seed, "stream": stream}


async def test_a_stalled_request_is_aborted_with_an_error_naming_it(wedged):
    url, fake = wedged
    before = fake.cancelled
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(f"{url}/v1/completions", json=completion(WEDGE, False))
        assert r.status_code == 504
        err = r.json()["error"]
        assert err["code"] == "engine_stalled"
        assert re.search(r"request cmpl-\w+ made no progress for 5 s", err["message"])

        events = []
        async with c.stream("POST", f"{url}/v1/completions", json=completion(WEDGE, True)) as s:
            assert s.status_code == 200
            async for line in s.aiter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
        assert events[-1] == "[DONE]"
        errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
        assert len(errors) == 1 and errors[0]["code"] == "engine_stalled" and "cmpl-" in errors[0]["message"]

        chat = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            await chat.chat.completions.create(model="smollm2-135m", seed=WEDGE, max_tokens=8,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert e.value.status_code == 504 and "chatcmpl-" in e.value.message

        metrics = (await c.get(f"{url}/metrics")).text
        health = await c.get(f"{url}/health")
        assert health.status_code == 503 and health.json()["status"] == "stalled"  # nothing produced since

        ok = await c.post(f"{url}/v1/completions", json=completion(1, False))  # an ordinary request still runs
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
        health = await c.get(f"{url}/health")
        assert health.status_code == 200 and health.json()["progress"]["aborted_stalls"] >= 3
    assert "rstar2_requests_stalled_total 3.0" in metrics
    assert "rstar2_requests_in_flight 0.0" in metrics
    assert fake.cancelled - before == 3  # each stalled generation was cancelled in the engine


async def test_a_wedged_request_does_not_hold_up_the_others(wedged):
    url, _ = wedged
    async with httpx.AsyncClient(timeout=60) as c:
        results = await asyncio.gather(*(c.post(f"{url}/v1/completions", json=completion(s, False))
                                         for s in (WEDGE + 1, 2, 3, 4)))
    assert [r.status_code for r in results] == [504, 200, 200, 200]


async def test_a_non_streaming_client_that_hangs_up_ends_its_generation(serve_url):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 4000,
            "temperature": 1.0}
    async with httpx.AsyncClient(timeout=60) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(f"{serve_url}/v1/chat/completions", json=body, timeout=1.5)
        metrics = await metrics_once_idle(c, serve_url, tries=40)  # 4,000 tokens would take minutes
    assert "rstar2_requests_in_flight 0.0" in metrics
