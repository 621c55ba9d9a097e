"""`rstar2 eval` end to end: load the benchmarks' data (failing before any engine starts), build the engine or
endpoint client, the sandbox and the grader, run each benchmark as a stored run, print the table, write the
reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_agent.engines.spec import EngineSpec, build
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.sandbox import Sandbox, SandboxConfig, make_sandbox
from rstar2_agent.store import Store

from .benchmarks import Benchmark, Context, get_benchmark
from .chat_api import ChatAPIAgent
from .report import bfcl_table, load, results_table, write_outputs
from .report import console as wide_console
from .runner import EvalConfig, make_agent, rich_progress, run_benchmark

log = logging.getLogger(__name__)


@dataclass
class Source(EngineSpec):
    """Where the samples come from: a local model on an engine (several: a replica pool), or an OpenAI-compatible
    endpoint (several `urls`: a replica pool over them); `model` with urls: where the tokenizer comes from. The
    response budget and the tool protocol come from the run's EvalConfig."""
    sandbox_urls: list[str] = field(default_factory=list)
    isolation: bool = True
    grader_timeout: float = 10.0

    def label(self) -> str:
        return self.served_model or self.model or self.url or "smollm2-135m"

    @property
    def url(self) -> str | None:
        return self.urls[0] if self.urls else None


def default_run_name(source: Source, cfg: EvalConfig) -> str:
    name = Path(source.label()).name if Path(source.label()).exists() else source.label().replace("/", "_")
    return f"{name}-t{cfg.temperature:g}" + ("" if cfg.use_tools else "-notools") + (
        "-chat" if cfg.api == "chat" else "")


async def evaluate(bench_names: list[str], source: Source, cfg: EvalConfig, store: Store, run_name: str | None = None,
                   data_dir: str | None = None, out: str | None = None, console: Console | None = None,
                   benchmarks: dict[str, Benchmark] | None = None) -> str:
    """Run (or resume) every benchmark; returns the run name. `benchmarks` overrides by name (tests, BFCL)."""
    console = console or wide_console(stderr=True)
    run_name = run_name or default_run_name(source, cfg)
    benches = [(benchmarks or {}).get(n) or get_benchmark(n) for n in bench_names]
    problems = {b.name: b.load(data_dir, cfg.limit) for b in benches}  # missing data fails here, before engines
    sandbox = make_sandbox(source.sandbox_urls, config=SandboxConfig(isolation=source.isolation)) \
        if cfg.use_tools else _NoSandbox()
    grader = MathGrader(timeout=source.grader_timeout)
    engine = chat_agent = None
    try:
        if cfg.api == "chat":
            if not source.url:
                raise click_error("--api chat needs --url (an OpenAI-compatible chat server)")
            chat_agent = ChatAPIAgent(source.url, source.served_model, source.api_key, sandbox)
            fmt = None
        else:
            engine, fmt = build_engines(source, cfg, console)
            cfg.format = fmt.protocol.name
        await sandbox.start()
        agent = make_agent(cfg, engine, fmt, sandbox, chat_agent)
        ctx = Context(agent=agent, math_grader=grader, seed=cfg.seed, use_tools=cfg.use_tools,
                      extra={"engine": engine, "fmt": fmt, "sandbox": sandbox, "config": cfg})
        for bench in benches:
            info = {"n": cfg.n, "limit": cfg.limit, "problems": len(problems[bench.name]), "engine": (
                engine.name if engine else "chat-api"), "urls": source.urls, "replicas": source.replicas,
                "data_dir": data_dir}
            run = store.open_run(run_name, bench.name, source.label(), cfg.settings(), info)
            bar, update = rich_progress(console, bench.name)
            status = "interrupted"
            try:
                with bar:
                    await run_benchmark(bench, problems[bench.name], ctx, cfg, store, run.id, update)
                status = "finished"
            finally:
                store.set_status(run.id, status)
    finally:
        grader.close()
        await sandbox.close()
        if engine is not None:
            await engine.close()
        if chat_agent is not None:
            await chat_agent.close()
    results = [r for r in load(store, run_name) if r.run.benchmark in bench_names]
    console.print(results_table(results, f"{run_name} ({source.label()})"))
    for table in filter(None, map(bfcl_table, results)):
        console.print(table)
    if out:
        for path in write_outputs(store, run_name, out):
            console.print(f"wrote {path}")
    return run_name


def build_engines(source: Source, cfg: EvalConfig, console: Console):
    """One engine, or a replica pool over several `--url` servers or `--replicas N` local engines (each trajectory
    stays on one replica; see rstar2_agent/engines/replicas.py)."""
    with console.status("") as status:
        return build(replace(source, max_tokens=cfg.max_tokens, format=cfg.format), status.update)


def click_error(message: str) -> Exception:
    import click

    return click.UsageError(message)


class _NoSandbox(Sandbox):
    """--no-tools: nothing runs code; starting no workers keeps the run light."""

    async def run(self, code, stdin="", timeout=None):
        from rstar2_agent.sandbox import ExecResult, Status

        return ExecResult.failure(Status.INTERNAL_ERROR, "tools are off in this run")

    async def open_session(self) -> str:
        raise RuntimeError("tools are off in this run")

    async def run_in_session(self, session_id, code, stdin="", timeout=None):
        return await self.run(code)

    async def close_session(self, session_id: str) -> None:
        pass

    async def stats(self) -> dict[str, Any]:
        return {}
