"""`rstar2 bench serve`: `rstar2 serve` (vllm engine) against vLLM's own OpenAI server, side by side in one run.

Tools off: the same token-id prompts through `/v1/completions` (streaming, every request generating exactly
`max_tokens`), at concurrency 1 and 16; output tokens/s and time to first token. Both servers are up at once
and are measured in alternating rounds (A B, then B A, ...), one at a time, so that a drift of the shared
machine falls on both; the ratio is taken per round and reported as the median and range over rounds.
Tools on: on `rstar2 serve`, the time a tool call adds beyond the program's own run time (the loop's tool
wall time minus the sandbox's `duration`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from rstar2_agent.bench.engines import QUESTIONS
from rstar2_agent.processes import FateShare, end_tree

log = logging.getLogger(__name__)


@dataclass
class ServeRow:
    server: str
    concurrency: int
    requests: int
    tokens_per_s: float
    ttft_median_ms: float
    ttft_p90_ms: float
    errors: int = 0  # requests that failed, stalled or ran past the request timeout (not in the figures)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(argv: list[str], port: int, env: dict[str, str] | None = None, timeout: float = 300,
            log: str | Path | None = None) -> Iterator[str]:
    """A server process, up and answering /health, ended with everything under it on the way out (on an error,
    SIGTERM or SIGINT too; and, through a FateShare, if this process is killed). Its log goes to `log` when given
    (kept, for a server that fails later in the run), else to a temporary file read only if it fails to start."""
    with running_all([(argv, port, env, log)], timeout) as (url,):
        yield url


@contextlib.contextmanager
def running_all(servers: list[tuple[list[str], int, dict[str, str] | None, str | Path | None]],
                timeout: float = 300) -> Iterator[list[str]]:
    """`running` for several servers ((argv, port, env, log) each): all are started at once, then each is awaited
    on /health, so that their starts overlap; their URLs in order."""
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(_started(argv, port, env, log)) for argv, port, env, log in servers]
        deadline = time.monotonic() + timeout
        for up in started:
            up(deadline, timeout)
        yield [f"http://127.0.0.1:{port}" for _, port, _, _ in servers]


@contextlib.contextmanager
def _started(argv: list[str], port: int, env: dict[str, str] | None, log: str | Path | None):
    """A server process started (not yet awaited), ended with everything under it on the way out; a function
    that waits until it answers /health (until `deadline`) or raises, saying why."""
    # never an unread pipe: a server blocked writing its log would stall
    log_file = open(log, "w+b") if log else tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally)
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=log_file, start_new_session=True)
    fate = FateShare([proc.pid])
    url = f"http://127.0.0.1:{port}"

    def up(deadline: float, timeout: float) -> None:
        while True:
            if proc.poll() is not None:
                log_file.seek(0)
                raise RuntimeError(f"{argv[:3]} exited: {log_file.read().decode(errors='replace')[-1500:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[:3]} did not start in {timeout:.0f} s")
            time.sleep(1)

    try:
        yield up
    finally:
        end_tree(proc.pid, grace=30)
        proc.wait()
        fate.release()
        log_file.close()


class RequestFailed(RuntimeError):
    """A streamed request answered with an error event, or stopped short of max_tokens."""


async def _stream_one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int
                      ) -> tuple[int, float]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.7, "stream": True,
            "ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True, "logprobs": 0}
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RequestFailed(event["error"].get("message", "an error event"))
            choice = event["choices"][0]
            n = len(choice.get("token_ids") or (choice.get("logprobs") or {}).get("tokens") or [])
            if n and ttft is None:
                ttft = time.perf_counter() - t0
            tokens += n
    if tokens != max_tokens:
        raise RequestFailed(f"{tokens} of {max_tokens} tokens")
    return tokens, ttft or 0.0


async def measure(url: str, name: str, model: str, prompts: list[list[int]], conc: int, max_tokens: int,
                  request_timeout: float = 300.0) -> ServeRow:
    """Every request ends within `request_timeout` seconds (and `request_timeout / 2` without a byte); one that
    does not, or fails, is counted in `errors` and left out of the figures: a stall is an error, not a hang."""
    sem = asyncio.Semaphore(conc)
    ttfts: list[float] = []
    total, errors = [0], [0]

    async def one(client: httpx.AsyncClient, p: list[int]) -> None:
        async with sem:
            try:
                n, ttft = await asyncio.wait_for(_stream_one(client, url, model, p, max_tokens), request_timeout)
            except (httpx.HTTPError, TimeoutError, RequestFailed, ValueError) as e:
                errors[0] += 1
                log.warning("%s: a request failed (%s: %s)", name, type(e).__name__, e)
                return
        total[0] += n
        ttfts.append(ttft)

    timeout = httpx.Timeout(request_timeout / 2, connect=10)
    async with httpx.AsyncClient(timeout=timeout) as client:
        await one(client, prompts[0])  # warm-up
        total[0], errors[0], ttfts[:] = 0, 0, []
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, p) for p in prompts))
        wall = time.perf_counter() - t0
    ttfts.sort()
    if not ttfts:
        return ServeRow(name, conc, len(prompts), 0.0, float("nan"), float("nan"), errors[0])
    return ServeRow(name, conc, len(prompts), total[0] / wall, statistics.median(ttfts) * 1e3,
                    ttfts[int(0.9 * (len(ttfts) - 1))] * 1e3, errors[0])


async def tool_overhead(url: str, model: str, calls: int = 12) -> tuple[float, float, int]:
    """Median per call of (the loop's tool wall time - the program's run time), ms, over the requests that ran
    a program; and the programs' median run time."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    extra: list[float] = []
    own: list[float] = []
    for i in range(calls):
        r = await client.chat.completions.create(
            model=model, temperature=0.7, seed=i,
            messages=[{"role": "user", "content": "Compute 2**100 with Python: write the code in a ```python block."}],
            max_tokens=120, extra_body={"max_turns": 2, "format": "markdown"})
        ext = r.choices[0].message.model_extra["rstar2"]
        durations = [c["duration"] for t in ext["turns"] for c in t["tool_calls"] if c["status"] == "ok"]
        if durations:
            extra.append((ext["timings"]["tools"] - sum(durations)) / len(durations) * 1e3)
            own.append(statistics.mean(durations) * 1e3)
    if not extra:
        return float("nan"), float("nan"), 0
    return statistics.median(extra), statistics.median(own), len(extra)


def run_bench(model_path: str, concurrencies=(1, 16), max_tokens: int = 64, requests: int = 8, rounds: int = 3,
              request_timeout: float = 300.0):
    """Rows for every (round, concurrency, server), and the tool-call overhead. Each measurement sends
    max(requests, concurrency) prompts."""
    from transformers import AutoTokenizer

    from rstar2_agent.chat_format import ChatFormat

    tok = AutoTokenizer.from_pretrained(model_path)
    fmt = ChatFormat(tok, "hermes")
    prompts = [fmt.render_prompt(QUESTIONS[i % len(QUESTIONS)]) for i in range(max(requests, *concurrencies))]
    rows: list[ServeRow] = []
    vllm_port, ours_port = _port(), _port()
    vllm_argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
                 "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(vllm_port), "--dtype",
                 "bfloat16", "--max-model-len", "8192", "--enforce-eager", "--max-num-seqs", "64",
                 "--disable-log-stats"]
    ours_argv = [str(Path(sys.executable).with_name("rstar2")), "serve", "--engine", "vllm", "--model", model_path,
                 "--served-model-name", "m", "--port", str(ours_port), "--max-concurrency", "64"]
    # both start at once: their start-ups (imports, weights, vLLM's warm-up) overlap
    with running_all([(vllm_argv, vllm_port, {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}, None),
                      (ours_argv, ours_port, None, None)]) as (theirs, ours):
        servers = [(VLLM_SERVER, theirs), (RSTAR2_SERVE, ours)]
        for k in range(rounds):
            for conc in concurrencies:
                for name, url in servers if k % 2 == 0 else servers[::-1]:
                    batch = prompts[: max(requests, conc)]
                    rows.append(asyncio.run(measure(url, name, "m", batch, conc, max_tokens, request_timeout)))
        tools = asyncio.run(tool_overhead(ours, "m"))
    return rows, tools


VLLM_SERVER, RSTAR2_SERVE = "vLLM OpenAI server", "rstar2 serve (vllm)"


def summarize(rows: list[ServeRow]) -> list[tuple[int, ServeRow, ServeRow, list[float]]]:
    """Per concurrency: each server's median row over rounds, and the per-round throughput ratios (ours/vLLM)."""
    out = []
    for conc in sorted({r.concurrency for r in rows}):
        theirs = [r for r in rows if r.concurrency == conc and r.server == VLLM_SERVER]
        ours = [r for r in rows if r.concurrency == conc and r.server == RSTAR2_SERVE]
        ratios = [b.tokens_per_s / a.tokens_per_s if a.tokens_per_s else float("nan")
                  for a, b in zip(theirs, ours, strict=True)]
        median = [sorted(side, key=lambda r: r.tokens_per_s)[len(side) // 2] for side in (theirs, ours)]
        out.append((conc, median[0], median[1], ratios))
    return out
