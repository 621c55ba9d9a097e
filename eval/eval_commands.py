"""`rstar2 eval BENCH[,BENCH...]` and `rstar2 eval report|compare|bench`."""

from __future__ import annotations

import click

from rstar2_agent.chat_format import FORMATS
from rstar2_agent.cli_options import replica_options
from rstar2_agent.store import StoreError

from .benchmarks import BENCHMARKS, DataError


class _EvalGroup(click.Group):
    """`rstar2 eval aime24 ...` runs a benchmark; `rstar2 eval report RUN` etc. are subcommands."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("eval", cls=_EvalGroup)
def eval_group() -> None:
    """Evaluate a model with the tool: `rstar2 eval aime24` (benchmarks: aime24, aime25, hmmt25, math500,
    gpqa_diamond, bfcl_v3, synth; a comma list runs several). Results are stored; the same --run name resumes."""


@eval_group.command("run")
@click.argument("benchmarks")
@click.option("--model", default=None, help="Registry name (default smollm2-135m), local folder or Hugging Face id; "
              "with --url: where the tokenizer comes from.")
@click.option("--engine", type=click.Choice(["auto", "vllm", "hf"]), default="auto", show_default=True,
              help="auto: vllm on GPU machines, hf on CPU.")
@click.option("--url", "urls", multiple=True, help="An OpenAI-compatible server to evaluate instead of a local engine; "
              "several: a replica pool over them.")
@replica_options
@click.option("--served-model", default=None, help="The model name on that server (default: its first).")
@click.option("--api-key", envvar="RSTAR2_API_KEY", default=None)
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="completions: token level (vLLM, SGLang, rstar2 serve); chat: the tool loop runs here over "
              "/v1/chat/completions with `tools` (hosted APIs).")
@click.option("--n", type=click.IntRange(1), default=16, show_default=True, help="Samples per problem.")
@click.option("--temperature", type=click.FloatRange(0), default=0.6, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=30000, show_default=True,
              help="Response budget per sample (generated and tool tokens).")
@click.option("--max-turns", type=click.IntRange(1), default=30, show_default=True)
@click.option("--no-tools", is_flag=True, help="One turn, no Python tool.")
@click.option("--format", "format_name", type=click.Choice(FORMATS), default=None,
              help="Default: the model's (registry).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Only the first K problems (BFCL: per category).")
@click.option("--categories", default="all", show_default=True, help="bfcl_v3: categories or groups (non_live, live, "
              "multi_turn, single_turn), comma-separated.")
@click.option("--concurrency", type=click.IntRange(1), default=64, show_default=True, help="Samples in flight.")
@click.option("--retries", type=click.IntRange(0), default=3, show_default=True,
              help="Retries of a sample whose engine or endpoint failed (with back-off).")
@click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL (default $RSTAR2_HOME/rstar2.db).")
@click.option("--run", "run_name", default=None, help="Run name; the same name resumes (default: model and settings).")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="Write results.json, samples.jsonl, "
              "report.html here.")
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="Folder with JSONL mirrors of the hub datasets (default: $RSTAR2_DATA_DIR, else the hub).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--grader-timeout", type=click.FloatRange(0.1), default=10.0, show_default=True)
@click.option("--sandbox-url", "sandbox_urls", multiple=True, help="Use `rstar2 sandbox serve` servers.")
@click.option("--unsafe-no-isolation", "unsafe", is_flag=True, help="Run tool code without bubblewrap.")
def run_cmd(benchmarks, model, engine, urls, replicas, replica_policy, served_model, api_key, api, n, temperature,
            top_p, max_tokens, max_turns, no_tools, format_name, limit, categories, concurrency, retries, db,
            run_name, out, data_dir, seed, grader_timeout, sandbox_urls, unsafe) -> None:
    """Run (or resume) BENCHMARKS, e.g. aime24 or aime24,aime25,hmmt25."""
    import asyncio

    from rstar2_agent.engines import EngineError
    from rstar2_agent.models import ModelError
    from rstar2_agent.sandbox import SandboxError
    from rstar2_agent.store import Store

    from .harness import Source, evaluate
    from .runner import EvalConfig

    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    unknown = [b for b in names if b not in known_benchmarks()]
    if unknown:
        raise click.UsageError(f"unknown benchmark(s) {', '.join(unknown)}; "
                               f"choose from {', '.join(known_benchmarks())}")
    cfg = EvalConfig(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, max_turns=max_turns,
                     use_tools=not no_tools, seed=seed, api=api, format=format_name or "", limit=limit,
                     concurrency=concurrency, retries=retries)
    source = Source(model=model, engine=engine, urls=list(urls), replicas=replicas, replica_policy=replica_policy,
                    served_model=served_model, api_key=api_key,
                    sandbox_urls=list(sandbox_urls), isolation=not unsafe, grader_timeout=grader_timeout)
    try:
        store = Store(db)
        extra = extra_benchmarks(names, categories)
        asyncio.run(evaluate(names, source, cfg, store, run_name, data_dir, out, benchmarks=extra))
    except (DataError, StoreError, ModelError, EngineError, SandboxError) as e:
        raise click.ClickException(str(e)) from e
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; finished samples are stored, run the same command to resume") from None


def known_benchmarks() -> list[str]:
    return [*BENCHMARKS, "bfcl_v3"]


def extra_benchmarks(names: list[str], categories: str = "all") -> dict:
    """Benchmarks that are not plain registry entries (BFCL v3 with its categories)."""
    if "bfcl_v3" not in names:
        return {}
    from .benchmarks.bfcl_v3 import BFCLv3

    return {"bfcl_v3": BFCLv3(categories=categories)}


@eval_group.command("report")
@click.argument("run_name")
@click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL.")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="Also write the report files here.")
@click.option("--problems", is_flag=True, help="Print the per-problem accuracy too.")
def report_cmd(run_name, db, out, problems) -> None:
    """The results of a stored run (all its benchmarks)."""
    from rich.table import Table

    from rstar2_agent.store import Store

    from .report import bfcl_table, load, results_table, write_outputs
    from .report import console as wide_console

    console = wide_console()
    try:
        store = Store(db)
        results = load(store, run_name)
        console.print(results_table(results, f"{run_name} ({results[0].run.model})"))
        for table in filter(None, map(bfcl_table, results)):
            console.print(table)
        if problems:
            for r in results:
                table = Table(title=f"{r.run.benchmark}: per problem")
                for col in ("problem", "n", "correct", "accuracy %", "majority answer"):
                    table.add_column(col)
                for p in r.summary.get("per_problem", []):
                    table.add_row(p["problem_id"], str(p["n"]), str(p["correct"]), f"{100 * p['accuracy']:.1f}",
                                  str(p["majority_answer"]))
                console.print(table)
        if out:
            for path in write_outputs(store, run_name, out):
                console.print(f"wrote {path}")
    except StoreError as e:
        raise click.ClickException(str(e)) from e


@eval_group.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL.")
@click.option("--top", type=click.IntRange(0), default=20, show_default=True, help="Problems to list.")
def compare_cmd(run_a, run_b, db, top) -> None:
    """RUN_B against RUN_A: per benchmark and per problem."""
    from rich.table import Table

    from rstar2_agent.store import Store

    from .report import compare
    from .report import console as wide_console

    console = wide_console()
    try:
        benches, problems = compare(Store(db), run_a, run_b)
    except StoreError as e:
        raise click.ClickException(str(e)) from e
    table = Table(title=f"{run_b} vs {run_a}")
    for col in ("benchmark", "problems", f"{run_a} %", f"{run_b} %", "diff (pts)", "± s.e.", "better", "worse"):
        table.add_column(col)
    for b in benches:
        table.add_row(b["benchmark"], str(b["problems"]), f"{100 * b['a']:.1f}", f"{100 * b['b']:.1f}",
                      f"{100 * b['diff']:+.1f}", f"{100 * b['stderr']:.1f}", str(b["better"]), str(b["worse"]))
    console.print(table)
    if problems and top:
        table = Table(title=f"problems that changed (largest first, {min(top, len(problems))} of {len(problems)})")
        for col in ("benchmark", "problem", f"{run_a} %", f"{run_b} %", "diff (pts)"):
            table.add_column(col)
        for p in problems[:top]:
            table.add_row(p["benchmark"], p["problem_id"], f"{100 * p['a']:.0f}", f"{100 * p['b']:.0f}",
                          f"{100 * p['diff']:+.0f}")
        console.print(table)


@eval_group.command("bench")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--engine", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True)
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="Where aime24.jsonl is (its problems are used); default: generated synthetic problems.")
@click.option("--problems", type=click.IntRange(1), default=4, show_default=True)
@click.option("--n", type=click.IntRange(1), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(8), default=256, show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--answers", type=click.IntRange(6), default=600, show_default=True, help="Answers to grade.")
def bench_cmd(model, engine, data_dir, problems, n, max_tokens, concurrency, rounds, answers) -> None:
    """The harness's wall time against the bare engine on the same samples, and graded answers per second."""
    import asyncio

    from rich.console import Console

    from rstar2_agent.chat_format import ChatFormat
    from rstar2_agent.engines import make_engine
    from rstar2_agent.models import resolve_model

    from .benchmarks import get_benchmark
    from .harness_bench import bench_grading, bench_harness

    console = Console()
    bench = get_benchmark("aime24" if data_dir else "synth")
    probs = bench.load(data_dir, problems)
    resolved = resolve_model(model)

    async def go():
        with console.status(f"starting {engine} ..."):
            eng = make_engine(engine, resolved.path, context_length=min(resolved.spec.context_length, 4096))
        try:
            row = await bench_harness(eng, ChatFormat(eng.tokenizer, "hermes"), bench, probs, n, max_tokens,
                                      concurrency, rounds)
        finally:
            await eng.close()
        return row, await bench_grading(answers)

    row, (pool, inline, right) = asyncio.run(go())
    console.print(f"harness vs bare {engine} engine ({resolved.spec.name}): {row.samples} samples x {max_tokens} "
                  f"tokens, concurrency {concurrency}, {rounds} rounds")
    console.print(f"  bare engine {row.bare_s:.2f} s ({row.tokens / row.bare_s:.1f} tok/s), harness {row.harness_s:.2f}"
                  f" s ({row.tokens / row.harness_s:.1f} tok/s): harness / bare = {row.ratio:.3f}")
    console.print(f"grading {answers} answers ({right} correct): process pool {pool:.0f} answers/s, in-process one "
                  f"by one {inline:.0f} answers/s ({pool / inline:.2f}x)")
