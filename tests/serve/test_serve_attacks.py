"""Red-team tests of `rstar2 serve` (issue 48, the server half): one client, as an attacker, against the real app on a
real uvicorn started the way `rstar2 serve` starts it (the guarded protocol), with a scripted engine that writes the
attacker's tool calls (SmolLM2 writes none by itself) and the real sandbox. Each test is one attack; what it asserts
is that the hole is closed and that another client is still served.

The attacker and the victim come from different loopback addresses (127.0.0.2 and 127.0.0.1): the server's budgets
are per client address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import time

import httpx
import pytest

from rstar2_agent.engines.base import Generation
from rstar2_agent.sandbox.tools import STATELESS_TOOL
from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.guard import FairGate, too_deep, uvicorn_config
from rstar2_agent.serve.responses_state import ResponseStore, Stored
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import free_port, timeout_scale

MODEL = "smollm2-135m"
ATTACKER = "127.0.0.2"
CODE = [{"type": "code_interpreter", "container": {"type": "auto"}}]


def call(code: str) -> str:
    payload = json.dumps({"name": STATELESS_TOOL, "arguments": {"code": code, "input": ""}})
    return f"<tool_call>\n{payload}\n</tool_call>"


class Attacker:
    """A scripted engine: a conversation whose last user text holds `RUN: <code>` gets that code as a Hermes tool
    call, then (after the tool response) "done"; any other prompt gets "ok". `calls`: generations so far."""

    name, model_path = "scripted", "scripted"

    def __init__(self, tokenizer):
        self.tokenizer, self.context_length, self.calls = tokenizer, 8192, 0

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        self.calls += 1
        tail = self.tokenizer.decode(prompt_ids[-400:])
        last = tail.rsplit("<|im_start|>", 2)
        asked = tail.rsplit("RUN: ", 1)[1].split("<|im_end|>")[0] if "RUN: " in tail else None
        text = call(asked) if asked is not None and "tool_response" not in "".join(last[-2:]) else \
            "done" if asked is not None else "ok"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        if on_tokens is not None:
            on_tokens(ids, [0.0] * len(ids))
        return Generation(ids, [0.0] * len(ids), "stop")


@contextlib.asynccontextmanager
async def serving(engine, sandbox, **cfg):
    """The app as `rstar2 serve` runs it (hermes profile), on a free loopback port; yields (url, app)."""
    import uvicorn

    server = Server(engine, sandbox, ServeConfig(model_name=MODEL, format="hermes", **cfg))
    port = free_port()
    app = create_app(server, manage=False)
    uv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, server.cfg))
    task = asyncio.create_task(uv.serve())
    while not uv.started:
        if task.done():
            raise RuntimeError(f"server did not start: {task.exception()}")
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        uv.should_exit = True
        await task


def client(address: str = "127.0.0.1", **kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), timeout=60, **kw)


def chat(text: str = "hi", **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **kw}


async def timed(c: httpx.AsyncClient, method: str, url: str, **kw) -> tuple[float, httpx.Response]:
    t0 = time.monotonic()
    r = await c.request(method, url, **kw)
    return time.monotonic() - t0, r


async def victim(url: str, until: asyncio.Event | asyncio.Task, n: int = 200) -> list[float]:
    """Another client's latencies (a no-tool chat, then /health, in turn) while `until` is not done."""
    out: list[float] = []
    async with client() as c:
        for i in range(n):
            if (until.is_set() if isinstance(until, asyncio.Event) else until.done()) and out:
                break
            if i % 2:
                dt, r = await timed(c, "GET", f"{url}/health")
            else:
                dt, r = await timed(c, "POST", f"{url}/v1/chat/completions", json=chat(max_tokens=8))
            assert r.status_code == 200, r.text
            out.append(dt)
            await asyncio.sleep(0.02)
    return out


def raw(url: str, address: str = ATTACKER) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30, source_address=(address, 0))
    return s


def response_of(s: socket.socket, timeout: float) -> bytes:
    """What the server sends before it closes the connection (or `timeout` passes)."""
    s.settimeout(timeout)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            got += chunk
            if b"\r\n\r\n" in got and b"content-length" in got.lower():
                head, _, body = got.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    return got


@pytest.fixture(scope="module")
async def attacked(smol_tokenizer, sandbox):
    """One server for the attacks that need no configuration of their own (defaults, small timeouts)."""
    engine = Attacker(smol_tokenizer)
    async with serving(engine, sandbox, header_timeout=1.0, body_timeout=2.0, max_connections_per_client=20,
                       max_concurrency=4, max_concurrency_per_client=2, max_tool_timeout=20,
                       max_stored_mb=0.05) as (url, app):
        yield url, app, engine


# ---------------------------------------------------------------------------------------------- large bodies
async def test_a_50_mb_body_is_refused_fast_while_another_client_is_served(attacked):
    url, _, _ = attacked
    blob = b"x" * (50 * 2**20)

    def upload() -> tuple[float, bytes, bytes]:
        t0 = time.monotonic()
        s = raw(url)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n" % len(blob) + blob[: 2**20])
        early = response_of(s, 5)  # 1 MiB of 50 sent: the answer comes now, not after the rest
        s.close()
        s = raw(url)
        with contextlib.suppress(OSError):  # the whole body, as fast as the socket takes it
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(blob)
                      + blob)
        whole = response_of(s, 10)
        s.close()
        return time.monotonic() - t0, early, whole

    done = asyncio.Event()

    async def attack():
        try:
            return await asyncio.to_thread(upload)
        finally:
            done.set()

    (took, early, whole), seen = await asyncio.gather(attack(), victim(url, done))
    assert early.startswith(b"HTTP/1.1 413") and b"8 MiB" in early, early[:300]
    assert whole.startswith(b"HTTP/1.1 413"), whole[:300]
    assert took < 20 * timeout_scale(), f"refusing two 50 MB bodies took {took:.1f} s"
    assert seen and max(seen) < 2.0 * timeout_scale(), \
        f"the other client waited {max(seen):.2f} s (of {len(seen)} requests)"
    async with client() as c:  # a body without a length is cut off at the limit too
        async def chunks():
            for _ in range(20):
                yield b"y" * 2**20
        r = await c.post(f"{url}/v1/chat/completions", content=chunks())
    assert r.status_code == 413 and "--max-body-mb" in r.json()["error"]["message"]


@pytest.mark.slow
async def test_tokenizing_a_large_prompt_does_not_freeze_health(attacked):
    """A body under the limit whose prompt takes seconds to render and tokenize: /health keeps answering."""
    url, _, _ = attacked
    async with client() as c:
        big = asyncio.create_task(c.post(f"{url}/v1/chat/completions",
                                         json=chat("the quick brown fox jumps over 12345 lazy dogs. " * 60000)))
        seen = []
        while not big.done():
            dt, r = await timed(c, "GET", f"{url}/health")
            assert r.status_code == 200
            seen.append(dt)
            await asyncio.sleep(0.05)
        r = await big
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(seen) >= 3 and max(seen) < 2.0 * timeout_scale(), \
        f"/health took up to {max(seen):.2f} s while the prompt rendered"


# ---------------------------------------------------------------------------------------------- slow clients
async def test_slow_clients_are_dropped_and_one_address_cannot_take_every_connection(attacked):
    url, _, _ = attacked

    def trickle(head: bytes, rest: bytes) -> tuple[float, bytes]:
        """Send `head`, then `rest` one byte every 0.2 s (never complete before the deadline) until the server
        answers or closes; what it answered, and when."""
        s = raw(url)
        t0 = time.monotonic()
        s.sendall(head)
        s.settimeout(0.2)
        got = b""
        for i in range(len(rest)):
            try:
                s.sendall(rest[i:i + 1])
                got = s.recv(4096)
                break  # an answer, or the connection closed (b"")
            except TimeoutError:
                continue
            except OSError:
                break
        got += response_of(s, 3)
        s.close()
        return time.monotonic() - t0, got

    slow_headers = asyncio.to_thread(trickle, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n",
                                     b"x-slow: " + b"a" * 100)
    slow_body = asyncio.to_thread(trickle, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 500"
                                  b"\r\ncontent-type: application/json\r\n\r\n", b'{"model": "' + b"m" * 400)
    (t_head, head), (t_body, body) = await asyncio.gather(slow_headers, slow_body)
    assert head.startswith(b"HTTP/1.1 408") and t_head < 3, (t_head, head[:200])  # header deadline: 1 s
    assert body.startswith(b"HTTP/1.1 408") and t_body < 4, (t_body, body[:200])  # body deadline: 2 s

    def hold() -> tuple[list[socket.socket], bytes]:
        held = [raw(url) for _ in range(20)]  # the address's cap (20 here): the next one is refused
        extra = raw(url)
        answer = response_of(extra, 3)
        extra.close()
        return held, answer

    held, answer = await asyncio.to_thread(hold)
    try:
        assert answer.startswith(b"HTTP/1.1 429"), answer
        async with client() as c:  # another address is served
            dt, r = await timed(c, "GET", f"{url}/health")
        assert r.status_code == 200 and dt < 2
    finally:
        for s in held:
            s.close()


# ---------------------------------------------------------------------------------------------- metrics, store
async def test_metrics_stay_bounded_after_2000_requests_to_unknown_paths(smol_tokenizer, sandbox):
    async with serving(Attacker(smol_tokenizer), sandbox, api_key="k") as (url, _):
        async with client(headers={"authorization": "Bearer k"}) as c:
            before = len((await c.get(f"{url}/metrics")).text)
            async with client() as anonymous:
                for i in range(1000):
                    path = f"/{random.randbytes(8).hex()}/{i}"
                    assert (await anonymous.get(url + path)).status_code == 401
                    assert (await c.get(url + path + "?q=1")).status_code == 404
            after = (await c.get(f"{url}/metrics")).text
    assert len(after) - before < 4000, f"/metrics grew by {len(after) - before} bytes"
    assert 'path="<unmatched>",status="401"} 1000.0' in after
    assert 'path="<unmatched>",status="404"} 1000.0' in after


async def test_the_response_store_is_bounded_by_bytes_and_metadata_by_openais_limits(attacked):
    url, app, _ = attacked
    async with client() as c:
        ids = []
        for i in range(12):  # each stores its 8 KB input: 50 KB hold about six
            r = await c.post(f"{url}/v1/responses", json={"model": MODEL, "input": f"{i} " + "w" * 8000})
            assert r.status_code == 200
            ids.append(r.json()["id"])
        assert (await c.get(f"{url}/v1/responses/{ids[0]}")).status_code == 404
        assert (await c.get(f"{url}/v1/responses/{ids[-1]}")).status_code == 200
        for metadata, param in [({f"k{i}": "v" for i in range(17)}, "metadata"), ({"k" * 65: "v"}, "metadata"),
                                ({"k": "v" * 513}, "metadata.k")]:
            r = await c.post(f"{url}/v1/responses", json={"model": MODEL, "input": "hi", "metadata": metadata})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        ok = await c.post(f"{url}/v1/responses", json={"model": MODEL, "input": "hi",
                                                       "metadata": {f"k{i}": "v" * 512 for i in range(16)}})
        assert ok.status_code == 200
    store = app.state.responses.store
    assert store.bytes <= 0.05 * 2**20 and len(store.items) < 12


async def test_code_output_is_stored_once(smol_tokenizer, sandbox):
    async with serving(Attacker(smol_tokenizer), sandbox) as (url, _), client() as c:
        r = await c.post(f"{url}/v1/responses", json={"model": MODEL, "input": "RUN: print('z' * 200000)",
                                                      "tools": CODE})
        assert r.status_code == 200, r.text
        body = r.json()
        logs = next(i for i in body["output"] if i["type"] == "code_interpreter_call")["outputs"][0]["logs"]
        assert len(logs) > 200000
        stored = (await c.get(f"{url}/v1/responses/{body['id']}")).json()
    size = len(json.dumps(stored))
    assert size < 1.2 * 200000, f"the stored response is {size} bytes for 200,000 bytes of output"


def test_store_counts_bytes_and_drops_the_least_recently_used():
    store = ResponseStore(cap=100, max_bytes=3000)
    for i in range(5):
        store.put(Stored({"id": f"r{i}", "text": "x" * 900}, []))
    assert store.bytes <= 3000 and list(store.items) == ["r2", "r3", "r4"]
    store.put(Stored({"id": "huge", "text": "x" * 5000}, []))  # larger than the whole store: not kept
    assert "huge" not in store.items and store.bytes <= 3000


# ---------------------------------------------------------------------------------------------- budgets
async def test_one_client_holding_its_concurrency_budget_does_not_block_another(attacked):
    """The attacker fills its share (2 of 4 slots) with requests whose code sleeps; the victim is served at once."""
    url, _, _ = attacked
    async with client(ATTACKER) as a:
        sleepers = [asyncio.create_task(a.post(f"{url}/v1/chat/completions",
                                               json=chat("RUN: import time; time.sleep(2.5)", tool_timeout=5)))
                    for _ in range(4)]
        await asyncio.sleep(0.5)
        async with client() as c:
            dt, r = await timed(c, "POST", f"{url}/v1/chat/completions", json=chat(max_tokens=8))
        results = await asyncio.gather(*sleepers)
    assert r.status_code == 200 and dt < 1.5, f"the other client waited {dt:.2f} s"
    assert all(x.status_code == 200 for x in results)


async def test_a_newcomers_tool_call_does_not_wait_behind_every_call_of_the_client_that_filled_the_sandbox(
        smol_tokenizer, sandbox):
    """The attacker's share (8 loops) is more than the sandbox's 2 workers: its calls queue, and one worker is kept
    for a client with none running: the victim's call runs at once (first come, first served would queue it behind
    the attacker's 4 calls of 2.5 s)."""
    async with serving(Attacker(smol_tokenizer), sandbox, max_concurrency_per_client=8) as (url, _):
        async with client(ATTACKER) as a:
            sleepers = [asyncio.create_task(a.post(f"{url}/v1/chat/completions",
                                                   json=chat("RUN: import time; time.sleep(2.5)")))
                        for _ in range(4)]
            await asyncio.sleep(0.5)
            async with client() as c:
                dt, r = await timed(c, "POST", f"{url}/v1/chat/completions", json=chat("RUN: print(7)"))
            await asyncio.gather(*sleepers)
    ran = r.json()["choices"][0]["message"]["rstar2"]["turns"][0]["tool_calls"][0]
    assert ran["stdout"] == "7\n" and dt < 2.0, f"the other client's call waited {dt:.1f} s"


async def test_the_sandbox_gate_keeps_a_worker_for_a_newcomer_and_hands_out_the_rest_fairly():
    async def three() -> int:
        return 3

    gate, order = FairGate(three), []

    async def call(who: str, i: int, hold: float) -> None:
        async with gate.slot(who):
            order.append((who, i))
            await asyncio.sleep(hold)

    attacker = [asyncio.create_task(call("a", i, 0.1)) for i in range(6)]
    await asyncio.sleep(0.02)
    assert order == [("a", 0), ("a", 1)]  # the last worker is kept for a client with no call running
    newcomer = asyncio.create_task(call("n", 0, 0.3))
    await asyncio.sleep(0.02)
    gone = asyncio.create_task(call("w", 0, 0))  # waits (no worker free), then goes away
    victim = asyncio.create_task(call("v", 0, 0))
    await asyncio.sleep(0.02)
    gone.cancel()
    await asyncio.gather(*attacker, newcomer, victim)
    assert order[2] == ("n", 0) and order[3] == ("v", 0) and ("w", 0) not in order, order  # not behind a2..a5
    assert gate.total == 0 and not gate.waiting and not gate.running
    alone = FairGate(three)  # one client alone uses all but one worker
    slots = [alone.slot("a") for _ in range(3)]
    held = [asyncio.create_task(cm.__aenter__()) for cm in slots]
    await asyncio.sleep(0.02)
    assert alone.total == 2 and len(alone.waiting["a"]) == 1
    for h in held:
        h.cancel()


async def test_turn_and_tool_timeout_caps_are_the_servers(attacked):
    url, _, _ = attacked
    async with client() as c:
        for extra, param in [({"max_turns": 100}, "max_turns"), ({"tool_timeout": 600}, "tool_timeout")]:
            for path, body in [("/v1/chat/completions", chat(**extra)),
                               ("/v1/responses", {"model": MODEL, "input": "hi", "tools": CODE, **extra})]:
                r = await c.post(url + path, json=body)
                assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_a_client_past_its_tool_time_budget_gets_429(smol_tokenizer, sandbox):
    async with serving(Attacker(smol_tokenizer), sandbox, tool_seconds_per_client=1.0) as (url, _):
        async with client(ATTACKER) as a:
            first = await a.post(f"{url}/v1/chat/completions", json=chat("RUN: import time; time.sleep(1.5)"))
            assert first.status_code == 200
            second = await a.post(f"{url}/v1/chat/completions", json=chat("RUN: print(1)"))
        async with client() as c:  # another client's budget is its own
            other = await c.post(f"{url}/v1/chat/completions", json=chat("RUN: print(1)"))
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1, second.text
    assert other.status_code == 200
    ran = other.json()["choices"][0]["message"]["rstar2"]["turns"][0]["tool_calls"][0]
    assert ran["status"] == "ok" and ran["stdout"] == "1\n"


# ---------------------------------------------------------------------------------------------- containers
async def test_the_container_past_the_cap_is_a_429_before_anything_runs(smol_tokenizer, sandbox):
    engine = Attacker(smol_tokenizer)
    async with serving(engine, sandbox, max_containers=2) as (url, _), client(ATTACKER) as a:
        body = {"model": MODEL, "input": "RUN: import time; time.sleep(2)", "tools": CODE}
        holders = [asyncio.create_task(a.post(f"{url}/v1/responses", json=body)) for _ in range(2)]
        await asyncio.sleep(0.8)
        calls = engine.calls
        r = await a.post(f"{url}/v1/responses", json=body)
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_containers", r.text
        assert engine.calls == calls  # refused before it generated anything
        assert all(h.status_code == 200 for h in await asyncio.gather(*holders))
        assert (await a.post(f"{url}/v1/responses", json=body)).status_code == 200  # free again


class SlowToOpen:
    """The shared sandbox, with sessions that take a second to open (a container starting)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def open_session(self):
        session = await self.inner.open_session()
        await asyncio.sleep(1.0)
        return session


async def test_a_container_started_for_a_request_that_went_away_is_reaped(smol_tokenizer, sandbox):
    before = (await sandbox.stats())["sessions"]
    async with serving(Attacker(smol_tokenizer), SlowToOpen(sandbox)) as (url, _), client(ATTACKER) as a:
        for wait in (0.0, 1.8):  # the client goes away while its container starts, or while its code runs
            body = {"model": MODEL, "input": "RUN: import time; time.sleep(3)", "tools": CODE, "stream": True}
            async with a.stream("POST", f"{url}/v1/responses", json=body) as r:
                async for line in r.aiter_lines():
                    if line == "event: response.code_interpreter_call.interpreting":
                        await asyncio.sleep(wait)
                        break

        async def settled():
            return (await sandbox.stats())["sessions"] == before

        deadline = time.monotonic() + 10
        while not await settled():
            assert time.monotonic() < deadline, f"{(await sandbox.stats())['sessions'] - before} sessions left open"
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------- malformed input
MALFORMED = [
    {"input": [{"type": "reasoning", "content": "x"}]},
    {"input": [{"type": "reasoning", "content": ["x"]}]},
    {"input": [{"type": "reasoning", "summary": 5}]},
    {"input": [{"type": "code_interpreter_call", "outputs": 5}]},
    {"input": [{"type": "code_interpreter_call", "outputs": [{"logs": 5}]}]},
    {"input": [{"type": "code_interpreter_call", "id": 5}]},
    {"input": "x", "tools": [{"type": "code_interpreter", "container": {"type": "auto", "network_policy": 5}}]},
]


def mutations(body, rng: random.Random, n: int):
    """`n` copies of `body`, each with one value (at any depth) replaced by a value of another type."""
    odd = [None, 5, -1.5, "", "x", [], {}, [None], {"type": 5}, True, [[[]]], {"": {}}]
    paths = []

    def walk(v, at):
        paths.append(at)
        for k, x in (v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()):
            walk(x, (*at, k))

    walk(body, ())
    for _ in range(n):
        copy = json.loads(json.dumps(body))
        at = rng.choice(paths[1:])
        target = copy
        for k in at[:-1]:
            target = target[k]
        target[at[-1]] = rng.choice(odd)
        yield copy


async def test_malformed_items_and_deeply_nested_json_are_4xx(smol_tokenizer, sandbox):
    server = Server(Attacker(smol_tokenizer), sandbox, ServeConfig(model_name=MODEL, format="hermes"))
    transport = httpx.ASGITransport(app=create_app(server, manage=False), raise_app_exceptions=False)
    good_response = {"model": MODEL, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}], "content": [{"text": "t"}]},
        {"type": "code_interpreter_call", "id": "ci", "code": "1", "outputs": [{"type": "logs", "logs": "1"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "o"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
        "metadata": {"a": "b"}, "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"}}
    good_chat = chat("hi", tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}], stop=["x"], messages=[
        {"role": "system", "content": [{"type": "text", "text": "s"}]}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {
            "name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "1", "content": "r"}])
    rng = random.Random(48)
    bodies = [("/v1/responses", {"model": MODEL, **b}) for b in MALFORMED]
    bodies += [("/v1/responses", b) for b in mutations(good_response, rng, 250)]
    bodies += [("/v1/chat/completions", b) for b in mutations(good_chat, rng, 250)]
    deep = [("/v1/responses", '{"input": "x", "metadata": ' + "[" * d + "]" * d + "}") for d in (100, 965, 5000)]
    deep += [("/v1/chat/completions", '{"messages": [{"role": "user", "content": ' + '{"a": ' * d + "1" + "}" * d
              + "}]}") for d in (100, 965, 5000)]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        for path, body in bodies + deep:
            r = await (c.post(path, json=body) if isinstance(body, dict) else
                       c.post(path, content=body, headers={"content-type": "application/json"}))
            assert r.status_code < 500, f"{path} {json.dumps(body)[:300]} -> {r.status_code} {r.text[:300]}"
            if r.status_code >= 400:
                assert "error" in r.json() and r.json()["error"]["message"], r.text


def test_json_depth_is_counted_outside_strings_in_linear_time():
    def nest(depth: int, rng: random.Random):
        if depth == 0:
            return rng.choice(['a\\"[{', "\\", 1, "x"])  # quotes, backslashes and brackets inside strings
        return [nest(depth - 1, rng)] if rng.random() < 0.5 else {'k\\"[': nest(depth - 1, rng)}

    rng = random.Random(48)
    for _ in range(200):
        depth = rng.randint(55, 75)
        body = json.dumps({"pad": "[{" * rng.randint(0, 40), "v": nest(depth, rng)}).encode()
        assert too_deep(body) == (depth + 1 > 64), depth
    assert too_deep(b"[" * 65 + b"]" * 65) and not too_deep(b"[" * 64 + b"]" * 64)
    t0 = time.monotonic()
    assert too_deep(b"[" * 2**23) and not too_deep(b'{"a": "' + b'\\"[' * 2**21 + b'"}')
    assert time.monotonic() - t0 < 5 * timeout_scale()  # 8 MiB bodies, any content: no quadratic scan


# ---------------------------------------------------------------------------------------------- auth, logs
async def test_the_key_is_compared_in_constant_time(smol_tokenizer, sandbox, monkeypatch):
    import hmac

    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    async with serving(Attacker(smol_tokenizer), sandbox, api_key="sekret") as (url, _), client() as c:
        assert (await c.get(f"{url}/v1/models", headers={"authorization": "Bearer sekret"})).status_code == 200
        assert (await c.get(f"{url}/v1/models", headers={"authorization": "Bearer sekreT"})).status_code == 401
        assert (await c.get(f"{url}/v1/models", headers={"authorization": "Bearer s"})).status_code == 401
    assert len(compared) >= 3 and all(len(a) == len(b) == 32 for a, b in compared)  # sha256 digests, equal length


async def test_health_and_metrics_need_the_key_unless_said_public(smol_tokenizer, sandbox):
    key = {"authorization": "Bearer k"}
    async with serving(Attacker(smol_tokenizer), sandbox, api_key="k") as (url, _), client() as c:
        for path in ("/health", "/metrics", "/docs", "/openapi.json", "/v1/models"):
            assert (await c.get(url + path)).status_code == 401, path
            assert (await c.get(url + path, headers=key)).status_code == 200, path
    async with serving(Attacker(smol_tokenizer), sandbox, api_key="k", public_health=True,
                       public_metrics=True) as (url, _), client() as c:
        assert (await c.get(f"{url}/health")).status_code == 200
        assert (await c.get(f"{url}/metrics")).status_code == 200
        assert (await c.get(f"{url}/v1/models")).status_code == 401


async def test_client_provided_names_are_escaped_in_the_log(attacked, caplog):
    url, _, _ = attacked
    with caplog.at_level(logging.WARNING):
        async with client() as c:
            body = chat(max_tokens=4, **{"evil\nINFO forged line\x1b[31m": 1})
            assert (await c.post(f"{url}/v1/chat/completions", json=body)).status_code == 200
            body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, "x\r\ny": 1}
            assert (await c.post(f"{url}/v1/responses", json=body)).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(lines) == 2 and not any(ch in line for line in lines for ch in "\n\r\x1b"), lines
    assert "forged line" in lines[0]
