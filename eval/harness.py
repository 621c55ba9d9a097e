"""`rstar2 eval` end to end: load the benchmarks' data (failing before any engine starts), build the engine or
endpoint client, the sandbox and the grader, run each benchmark as a stored run with its own defaults where the
flags leave a setting open, print the table, write the reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rstar2_agent.chat_format import default_extraction
from rstar2_agent.engines.spec import EngineSpec, build
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.models import resolve_model, trained_extraction
from rstar2_agent.sandbox import Sandbox, SandboxConfig, make_sandbox
from rstar2_agent.store import Store

from .benchmarks import Benchmark, Context, DataError, RunDefaults, get_benchmark
from .chat_api import ChatAPIAgent
from .report import benchmark_tables, load, results_table, write_outputs
from .report import console as wide_console
from .runner import EvalConfig, make_agent, rich_progress, run_benchmark

log = logging.getLogger(__name__)


@dataclass
class ModelSource(EngineSpec):
    """Where the samples come from: a local model on an engine (several: a replica pool), or an OpenAI-compatible
    endpoint (several `urls`: a replica pool over them); `model` with urls: where the tokenizer comes from. The
    response budget and the format come from the run's EvalConfig."""
    sandbox_urls: list[str] = field(default_factory=list)
    isolation: bool = True
    grader_timeout: float = 10.0

    def label(self) -> str:
        return self.served_model or self.model or self.url or "smollm2-135m"

    @property
    def url(self) -> str | None:
        return self.urls[0] if self.urls else None


def default_run_name(source: ModelSource, cfg: EvalConfig, defaults: RunDefaults | None = None) -> str:
    """The model and the temperature, then each of top_p, max_tokens and max_turns that differs from the
    benchmark's `defaults`: the same effective settings give the same name, so the same command resumes, and other
    settings give another run instead of a clash. `cfg` is resolved for the benchmark."""
    name = Path(source.label()).name if Path(source.label()).exists() else source.label().replace("/", "_")
    name += f"-t{cfg.temperature:g}"
    if defaults is not None:
        name += "".join(f"-{tag}{getattr(cfg, key):g}" for key, tag in (
            ("top_p", "top_p"), ("max_tokens", "tokens"), ("max_turns", "turns"))
            if getattr(cfg, key) != getattr(defaults, key))
    return name + ("" if cfg.use_tools else "-notools") + ("-chat" if cfg.api == "chat" else "")


async def evaluate(bench_names: list[str], source: ModelSource, cfg: EvalConfig, store: Store,
                   run_name: str | None = None, data_dir: str | None = None, out: str | None = None,
                   console: Console | None = None, benchmarks: dict[str, Benchmark] | None = None, engine=None,
                   skipped: dict[str, str] | None = None) -> dict[str, str]:
    """Run (or resume) every benchmark, each with its own defaults for what `cfg` leaves None; returns each
    benchmark's run name (`run_name`, else the default name of its effective settings). `benchmarks` overrides by
    name (tests, BFCL). `engine`: one already started, used instead of building one from `source` and left open.
    `skipped`: when given, a benchmark whose data cannot be loaded is left out and its reason recorded there,
    instead of failing the command."""
    console = console or wide_console(stderr=True)
    benches = [(benchmarks or {}).get(n) or get_benchmark(n) for n in bench_names]
    problems = {}
    for b in benches:  # missing data fails here, before engines
        try:
            problems[b.name] = b.load(data_dir, cfg.limit)
        except DataError as e:
            if skipped is None:
                raise
            skipped[b.name] = str(e)
    benches = [b for b in benches if b.name in problems]
    if not benches:
        return {}
    sandbox = make_sandbox(source.sandbox_urls, config=SandboxConfig(isolation=source.isolation)) \
        if cfg.use_tools else _NoSandbox()
    grader = MathGrader(timeout=source.grader_timeout)
    own_engine, chat_agent = engine is None, None
    names: dict[str, str] = {}
    try:
        if cfg.api == "chat":
            if not source.url:
                raise click_error("--api chat needs --url (an OpenAI-compatible chat server)")
            chat_agent = ChatAPIAgent(source.url, source.served_model, source.api_key, sandbox)
            fmt = None
        elif engine is None:
            engine, fmt = build_engines(source, cfg, benches, console)
            cfg.format = fmt.rules.name
            await engine.probe()  # a --url that nothing answers fails now, once, not once per sample after retries
        else:
            fmt = replace(source, format=cfg.format or None).chat_format(engine, resolve_model(source.model))
            cfg.format = fmt.rules.name
        # unset: how RL's reward read this checkpoint's answers (what the model was trained to write), else the format's
        cfg.answer_extraction = (cfg.answer_extraction or (trained_extraction(source.model) if fmt else "")
                                 or default_extraction(cfg.format or "hermes"))
        grader.extraction = cfg.answer_extraction
        await sandbox.start()
        for bench in benches:
            bcfg = cfg.resolve(bench.defaults)
            name = names[bench.name] = run_name or default_run_name(source, bcfg, bench.defaults) + bench.run_tag()
            info = {"n": bcfg.n, "limit": bcfg.limit, "problems": len(problems[bench.name]), "engine": (
                engine.name if engine else "chat-api"), "urls": source.urls, "replicas": source.replicas,
                "data_dir": data_dir}
            run = store.open_run(name, bench.name, source.label(), bcfg.settings() | bench.settings(), info)
            ctx = Context(agent=make_agent(bcfg, engine, fmt, sandbox, chat_agent), math_grader=grader,
                          seed=bcfg.seed, use_tools=bcfg.use_tools,
                          extra={"engine": engine, "fmt": fmt, "sandbox": sandbox, "config": bcfg, "store": store,
                                 "run_id": run.id})
            flags = ", ".join("--" + k.replace("_", "-") for k in cfg.given())
            console.print(f"[bold]{bench.name}[/bold] (run {escape(name)}): {bcfg.describe()} ("
                          + (f"benchmark defaults; flags: {flags}" if flags else "benchmark defaults") + ")")
            bar, update = rich_progress(console, bench.name)
            status = "interrupted"
            try:
                with bar:
                    await run_benchmark(bench, problems[bench.name], ctx, bcfg, store, run.id, update)
                status = "finished"
            finally:
                store.set_status(run.id, status)
    finally:
        grader.close()
        for bench in benches:
            await bench.close()
        await sandbox.close()
        if engine is not None and own_engine:
            await engine.close()
        if chat_agent is not None:
            await chat_agent.close()
    for name in dict.fromkeys(names.values()):
        results = [r for r in load(store, name) if names.get(r.run.benchmark) == name]
        console.print(results_table(results, f"{name} ({source.label()})"))
        for table in (t for r in results for t in benchmark_tables(r)):
            console.print(table)
        if out:
            for path in write_outputs(store, name, out if len(set(names.values())) == 1 else Path(out) / name):
                console.print(f"wrote {path}")
    return names


def build_engines(source: ModelSource, cfg: EvalConfig, benches: list[Benchmark], console: Console):
    """One engine, or a replica pool over several `--url` servers or `--replicas N` local engines (each trajectory
    stays on one replica; see rstar2_agent/engines/replicas.py), planned for the largest response budget."""
    budget = max(cfg.resolve(b.defaults).max_tokens for b in benches)
    with console.status("") as status:
        return build(replace(source, max_tokens=budget, format=cfg.format), status.update)


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
