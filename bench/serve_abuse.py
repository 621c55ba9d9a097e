"""`rstar2 bench serve-abuse`: another client's latency while one client abuses `rstar2 serve` (issue 48).

The server is the real app on the real (guarded) uvicorn, started in a process of its own with `rstar2 serve`'s
defaults, the real sandbox pool (its default: as many workers a template as cores), and a scripted engine
(SmolLM2's tokenizer; each generation is a short text, 8 tokens 2 ms apart, or, for a user turn `RUN: <code>`, that
code as a Hermes tool call, then "done"): SmolLM2 writes no tool calls, and a model's own generation time would hide
the server's. The victim (this process, from 127.0.0.1) sends, one at a time, a no-tool chat completion, a chat
whose model runs `print(6 * 7)` in the sandbox, and GET /health in turn; the attacker (a process of its own, from
127.0.0.2) runs one attack for the same time:

- `body`: 50 MB request bodies, one after another (each answered 413 at its headers; the time to the answer);
- `sleepers`: 64 chat requests at once whose code sleeps 8 s, each sent again when it returns;
- `slow`: 2,000 connections that send their headers a byte every 2 s, each opened again when it is dropped;
- `all`: the three at once.

Each attack's window is measured right after a quiet window of the same length (the baseline, side by side); the
figures are the victim's p50 and p99 in each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from .serve import _port, running

ATTACKER = "127.0.0.2"
ATTACKS = ("body", "sleepers", "slow", "all")
SLEEP_CODE = "import time; time.sleep(8)"


@dataclass
class Window:
    scenario: str  # "quiet" or an attack
    chat_p50_ms: float
    chat_p99_ms: float
    tool_p50_ms: float  # a chat whose model runs one short program (print) in the sandbox
    tool_p99_ms: float
    health_p50_ms: float
    health_p99_ms: float
    requests: int
    errors: int  # victim requests that failed or took past the timeout
    attacker: dict[str, float | int] = field(default_factory=dict)  # what the attacker saw


# ---------------------------------------------------------------------------------------------- the server
class BenchEngine:
    """The scripted engine of the benchmark's server (see the module's docstring)."""

    name, model_path = "scripted", "scripted"

    def __init__(self, tokenizer, delay: float = 0.002):
        self.tokenizer, self.delay, self.context_length = tokenizer, delay, 8192

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        from rstar2_agent.engines.base import Generation
        from rstar2_agent.sandbox.tools import STATELESS_TOOL

        tail = self.tokenizer.decode(prompt_ids[-300:])
        asked = tail.rsplit("RUN: ", 1)[1].split("<|im_end|>")[0] if "RUN: " in tail else None
        if asked is None:
            text = "ok " * 7
        elif "tool_response" in tail.rsplit("RUN: ", 1)[1]:
            text = "done"
        else:
            text = "<tool_call>\n" + json.dumps({"name": STATELESS_TOOL, "arguments": {"code": asked, "input": ""}}) \
                + "\n</tool_call>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        for i in ids:
            await asyncio.sleep(self.delay)
            if on_tokens is not None:
                on_tokens([i], [0.0])
        return Generation(ids, [0.0] * len(ids), "stop")


def serve(port: int) -> None:
    """The benchmark's server: `rstar2 serve`'s app and uvicorn configuration, hermes format, the local sandbox."""
    import uvicorn
    from transformers import AutoTokenizer

    from rstar2_agent.models import resolve_model
    from rstar2_agent.sandbox import SandboxConfig, make_sandbox
    from rstar2_agent.serve.app import create_app
    from rstar2_agent.serve.guard import uvicorn_config
    from rstar2_agent.serve.server import ServeConfig, Server

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path)
    cfg = ServeConfig(model_name="smollm2-135m", format="hermes")

    async def main() -> None:
        app = create_app(Server(BenchEngine(tokenizer), make_sandbox([], config=SandboxConfig()), cfg))
        await uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, cfg)).serve()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- the attacker
def count(seen: dict, key: str) -> None:
    seen[key] = seen.get(key, 0) + 1


async def big_bodies(host: str, port: int, until: float, seen: dict) -> None:
    """50 MB bodies, one after another, each sent whole; the time to the server's answer."""
    blob = b"x" * (50 * 10**6)
    times = []
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
        except OSError:
            count(seen, "body_connect_failed")
            await asyncio.sleep(1)
            continue
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(blob) + blob)
            line = await asyncio.wait_for(reader.readline(), 60)
            times.append(time.monotonic() - t0)
            count(seen, "body_" + (line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"))
            with contextlib.suppress(TimeoutError):  # the rest of the body goes out: the server drains it
                await asyncio.wait_for(writer.drain(), 30)
        except (OSError, TimeoutError):
            count(seen, "body_failed")
        finally:
            writer.close()
    seen["body_answer_p50_ms"] = round(statistics.median(times) * 1000, 1) if times else -1


async def sleepers(url: str, until: float, seen: dict, n: int = 64) -> None:
    """`n` chat requests at once whose code sleeps 8 s, each sent again as it returns."""
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": f"RUN: {SLEEP_CODE}"}]}
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    async with httpx.AsyncClient(transport=transport, timeout=120, limits=httpx.Limits(max_connections=n)) as c:
        async def one() -> None:
            while time.monotonic() < until:
                try:
                    r = await c.post(f"{url}/v1/chat/completions", json=body)
                    key = f"sleepers_{r.status_code}"
                except httpx.TimeoutException:
                    key = "sleepers_waited_past_120s"
                except httpx.HTTPError:
                    key = "sleepers_failed"
                count(seen, key)
                if key != "sleepers_200":
                    await asyncio.sleep(1)

        await asyncio.gather(*(one() for _ in range(n)))


async def slow_connections(host: str, port: int, until: float, seen: dict, n: int = 2000) -> None:
    """`n` connections that send a request's headers a byte every 2 s, each opened again when it is dropped."""
    lifetimes: list[float] = []

    async def one(k: int) -> None:
        await asyncio.sleep(k * 0.002)  # 2,000 opened over 4 s
        while time.monotonic() < until:
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
            except OSError:
                count(seen, "slow_connect_failed")
                await asyncio.sleep(1)
                continue
            try:
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
                answer = b""
                while time.monotonic() < until and not answer:
                    try:
                        answer = await asyncio.wait_for(reader.read(64), 2.0) or b"closed"
                    except TimeoutError:
                        writer.write(b"a")
                if answer:
                    count(seen, "slow_" + (answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else
                                           "closed"))
                    lifetimes.append(time.monotonic() - t0)
            except OSError:
                count(seen, "slow_reset")
            finally:
                writer.close()

    await asyncio.gather(*(one(k) for k in range(n)))
    seen["slow_dropped_after_p50_s"] = round(statistics.median(lifetimes), 2) if lifetimes else -1


def attack(kind: str, url: str, seconds: float) -> dict:
    host, port = url.removeprefix("http://").split(":")
    until = time.monotonic() + seconds
    seen: dict = {}

    async def main() -> None:
        work = []
        if kind in ("body", "all"):
            work.append(big_bodies(host, int(port), until, seen))
        if kind in ("sleepers", "all"):
            work.append(sleepers(url, until, seen))
        if kind in ("slow", "all"):
            work.append(slow_connections(host, int(port), until, seen))
        await asyncio.gather(*work)

    asyncio.run(main())
    return seen


# ---------------------------------------------------------------------------------------------- the victim
def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(url: str, seconds: float, scenario: str, timeout: float = 30.0) -> Window:
    """Another client for `seconds`: a no-tool chat completion, one that runs a short program, and GET /health in
    turn, one at a time."""
    chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    tool = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "RUN: print(6 * 7)"}]}
    times: dict[str, list[float]] = {"chat": [], "tool": [], "health": []}
    errors = 0
    until = time.monotonic() + seconds
    with httpx.Client(timeout=timeout) as c:
        k = 0
        while time.monotonic() < until:
            kind = ("chat", "tool", "health")[k % 3]
            k += 1
            t0 = time.monotonic()
            try:
                r = c.get(f"{url}/health") if kind == "health" else \
                    c.post(f"{url}/v1/chat/completions", json=chat if kind == "chat" else tool)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                times[kind].append(time.monotonic() - t0)
            else:
                errors += 1
            time.sleep(0.05)
    ms = {k: [x * 1000 for x in v] for k, v in times.items()}
    return Window(scenario, percentile(ms["chat"], 0.5), percentile(ms["chat"], 0.99), percentile(ms["tool"], 0.5),
                  percentile(ms["tool"], 0.99), percentile(ms["health"], 0.5), percentile(ms["health"], 0.99), k,
                  errors)


def settle(url: str, within: float = 60.0) -> None:
    """Wait until no request is in flight (the last attack's sleepers have returned)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if "rstar2_requests_in_flight 0.0" in httpx.get(f"{url}/metrics", timeout=10).text:
                return
        time.sleep(0.5)


def run_bench(seconds: float = 20.0, attacks: tuple[str, ...] = ATTACKS) -> list[Window]:
    """Per attack: a quiet window, then the attack's window, on one server."""
    port = _port()
    argv = [sys.executable, "-m", "rstar2_agent.bench.serve_abuse", "--serve", str(port)]
    rows: list[Window] = []
    with running(argv, port, timeout=300) as url:
        measure(url, 2.0, "warm-up")
        for kind in attacks:
            settle(url)
            time.sleep(12)  # the last attack's slow connections are past their header deadline (10 s)
            rows.append(measure(url, seconds, "quiet"))
            ramp = min(5.0, seconds / 4)  # the attack under way first (2,000 connections open in 4 s)
            proc = subprocess.Popen([sys.executable, "-m", "rstar2_agent.bench.serve_abuse", "--attack", kind, "--url",
                                     url, "--seconds", str(seconds + ramp + 1)], stdout=subprocess.PIPE, text=True)
            try:
                time.sleep(ramp)
                row = measure(url, seconds, kind)
                out, _ = proc.communicate(timeout=seconds + 180)
                row.attacker = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description="the server and the attacker of `rstar2 bench serve-abuse`")
    p.add_argument("--serve", type=int, help="serve the benchmark's app on this port")
    p.add_argument("--attack", choices=ATTACKS)
    p.add_argument("--url")
    p.add_argument("--seconds", type=float, default=20.0)
    a = p.parse_args()
    if a.serve:
        serve(a.serve)
    else:
        print(json.dumps(attack(a.attack, a.url, a.seconds)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
