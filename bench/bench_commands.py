"""`rstar2 bench`: every benchmark, simulator and calibration, each measured side by side against its baseline in
one process (ratios, not absolute timings): engines, sandbox, serve, eval, grading, rollout, push, learner, gpu, the
checkers against the official ones (conformance), and the simulators `rstar2 bench simulate step|replicas`
(simulate_commands.py). Figures and their commands: docs/results.md."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import click

from rstar2_agent.sandbox.sandbox_commands import workers_option

from .simulate_commands import simulate_group


@click.group("bench")
def bench_group() -> None:
    """Benchmarks, simulators and calibration (each against its baseline, side by side)."""


bench_group.add_command(simulate_group)


@bench_group.command("engines")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--engine", "kinds", multiple=True, type=click.Choice(["hf", "vllm"]), default=("hf", "vllm"),
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(8), default=128, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
def engines_bench_cmd(model, kinds, max_tokens, rounds) -> None:
    """Tokens/s at 1 and 8 concurrent loops per engine, and the agent loop's overhead over the bare engine."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from rstar2_agent.engines import make_engine
    from rstar2_agent.models import resolve_model

    from .engines import bench_engine

    resolved = resolve_model(model)
    console = Console()

    async def go():
        rows = []
        for kind in kinds:
            with console.status(f"starting {kind} ..."):
                engine = make_engine(kind, resolved.path, context_length=min(resolved.spec.context_length, 4096))
            try:
                rows += await bench_engine(engine, kind, max_tokens=max_tokens, rounds=rounds)
            finally:
                await engine.close()
            console.log(f"{kind} done")
        return rows

    rows = asyncio.run(go())
    table = Table(title=f"engines on {resolved.spec.name}: generated tokens/s")
    for col in ("engine", "concurrent loops", "requests", "tokens", "bare engine tok/s", "agent loop tok/s",
                "wall-clock overhead", "loop's own time"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.engine, str(r.concurrency), str(r.requests), str(r.tokens), f"{r.bare_tok_s:.1f}",
                      f"{r.loop_tok_s:.1f}", f"{r.overhead * 100:+.1f}%", f"{r.loop_own * 100:.2f}%")
    console.print(table)


@bench_group.command("sandbox")
@click.option("--quick", is_flag=True, help="A tenth of the calls: a smoke run, not figures to quote.")
@workers_option
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write rows here.")
def sandbox_cmd(quick: bool, workers: int | None, json_path: str | None) -> None:
    """Fresh interpreter per call vs. our isolated pool, side by side."""
    from rich.console import Console
    from rich.table import Table

    from rstar2_agent.sandbox import SandboxError

    from .sandbox import ratios, run_bench

    console = Console()

    def progress(row):
        console.log(f"{row.system:28} {row.workload:9} c={row.concurrency:<4} {row.calls_per_s:8.1f} calls/s "
                    f"median {row.median_ms:7.1f} ms  p99 {row.p99_ms:7.1f} ms  ok {row.ok}/{row.calls}")

    try:
        rows = asyncio.run(run_bench(quick=quick, workers=workers, progress=progress))
    except SandboxError as e:
        raise click.ClickException(str(e)) from e
    table = Table(title="rstar2 bench sandbox")
    for col in ("workload", "concurrency", "system", "calls", "median ms", "p99 ms", "calls/s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.workload, str(r.concurrency), r.system, f"{r.ok}/{r.calls}", f"{r.median_ms:.1f}",
                      f"{r.p99_ms:.1f}", f"{r.calls_per_s:.1f}")
    console.print(table)
    rt = Table(title="ratio (b)/(a)")
    for col in ("workload", "concurrency", "calls/s ratio", "median latency ratio"):
        rt.add_column(col)
    rat = ratios(rows)
    for x in rat:
        rt.add_row(x["workload"], str(x["concurrency"]), f"{x['throughput_ratio']:.1f}x",
                   f"{x['median_latency_ratio']:.3f}")
    console.print(rt)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": [dataclasses.asdict(r) for r in rows], "ratios": rat}, f, indent=2)


@bench_group.command("conformance")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the report here.")
@click.option("--seed", type=int, default=0, show_default=True, help="The corpus is a function of the seed.")
@click.option("--cases", type=click.IntRange(1), default=5000, show_default=True, help="Cases per checker.")
def conformance_cmd(json_path: str | None, seed: int, cases: int) -> None:
    """Each checker's verdicts against the official implementation's (BFCL AST, BFCL raw decoding as a single-turn
    answer and as a multi-turn step, IFEval, GPQA: ours and ours under --gpqa-extraction simple-evals), the official
    packages in venvs of their own under $RSTAR2_HOME/conformance (built once). Exits 1 on a disagreement that is not
    a documented difference."""
    from rich.console import Console
    from rich.table import Table

    from .conformance import conformance

    report = conformance(seed, cases)
    table = Table(title=f"rstar2 bench conformance (seed {seed}; {report['versions']})")
    for col in ("checker", "cases", "agree", "official raises", "disagreements (class: count)", "unexplained"):
        table.add_column(col)
    for kind, b in report["benchmarks"].items():
        classes = "; ".join(f"{c}: {d['count']}{'' if d['explained'] else ' (!)'}"
                            for c, d in b["disagreements"].items())
        table.add_row(kind, str(b["cases"]), f"{b['agree']} ({b['agreement']:.2%})", str(b["official_raises"]),
                      classes or "-", str(b["unexplained"]))
    Console().print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2, default=str)
    if report["unexplained"]:
        raise SystemExit(1)


@bench_group.command("serve")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--requests", type=click.IntRange(1), default=8, show_default=True,
              help="Requests per measurement (at least the concurrency: 16 at concurrency 16).")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Alternating measurement rounds; the ratio is reported as the median and range over rounds.")
@click.option("--request-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a request may take (half of it without a byte) before it counts as an error.")
def serve_bench_cmd(model, max_tokens, requests, rounds, request_timeout) -> None:
    """rstar2 serve against vLLM's own OpenAI server: tokens/s and time to first token; tool-call overhead."""
    import statistics

    from rich.console import Console
    from rich.table import Table

    from rstar2_agent.models import resolve_model

    from .serve import run_bench, summarize

    resolved = resolve_model(model)
    console = Console()
    with console.status("starting vLLM's server and rstar2 serve, then alternating rounds ..."):
        rows, (extra_ms, own_ms, n) = run_bench(resolved.path, max_tokens=max_tokens, requests=requests,
                                                rounds=rounds, request_timeout=request_timeout)
    table = Table(title=f"serving {resolved.spec.name}, tools off (/v1/completions, streaming), median of "
                        f"{rounds} rounds")
    for col in ("server", "concurrency", "requests", "output tok/s", "TTFT median ms", "TTFT p90 ms", "errors"):
        table.add_column(col)
    summary = summarize(rows)
    for _, *median, _ in summary:
        for r in median:
            table.add_row(r.server, str(r.concurrency), str(r.requests), f"{r.tokens_per_s:.1f}",
                          f"{r.ttft_median_ms:.0f}", f"{r.ttft_p90_ms:.0f}", str(r.errors))
    console.print(table)
    for conc, _, _, ratios in summary:
        console.print(f"concurrency {conc}: rstar2 serve / vLLM throughput = {statistics.median(ratios):.3f} "
                      f"(per round: {', '.join(f'{x:.3f}' for x in ratios)})")
    for server in sorted({r.server for r in rows}):
        mine = [r for r in rows if r.server == server]
        console.print(f"{server}: {sum(r.errors for r in mine)} failed or timed-out requests of "
                      f"{sum(r.requests for r in mine)}")
    console.print(f"tools on: a tool call adds {extra_ms:.1f} ms beyond the program's own {own_ms:.1f} ms "
                  f"(median over {n} requests)")


@bench_group.command("serve-abuse")
@click.option("--seconds", type=click.FloatRange(min=2), default=20.0, show_default=True,
              help="Length of each window (a quiet one, then the attack's).")
@click.option("--attack", "attacks", multiple=True, type=click.Choice(["body", "sleepers", "slow", "all"]),
              default=("body", "sleepers", "slow", "all"), show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the rows here.")
def serve_abuse_cmd(seconds, attacks, json_path) -> None:
    """Another client's latency (p50/p99) while one client sends 50 MB bodies, 64 sleeping tool calls or 2,000 slow
    connections, against a quiet window of the same length (rstar2 serve's app with a scripted engine)."""
    from rich.console import Console
    from rich.table import Table

    from .serve_abuse import run_bench

    console = Console()
    with console.status(f"rstar2 serve (scripted engine), then a quiet and an attacked {seconds:g} s window per "
                        "attack ..."):
        rows = run_bench(seconds, tuple(attacks))
    table = Table(title="another client's latency while one client abuses rstar2 serve (ms)")
    for col in ("window", "chat p50", "chat p99", "tool chat p50", "tool chat p99", "/health p50", "/health p99",
                "requests", "errors"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.scenario, f"{r.chat_p50_ms:.0f}", f"{r.chat_p99_ms:.0f}", f"{r.tool_p50_ms:.0f}",
                      f"{r.tool_p99_ms:.0f}", f"{r.health_p50_ms:.0f}", f"{r.health_p99_ms:.0f}", str(r.requests),
                      str(r.errors))
    console.print(table)
    for r in rows:
        if r.attacker:
            seen = ", ".join(f"{k} {v}" for k, v in sorted(r.attacker.items()))
            console.print(f"{r.scenario}: the attacker saw {seen}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=2)


@bench_group.command("tool-stream")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--max-tokens", type=click.IntRange(16), default=96, show_default=True)
def tool_stream_bench_cmd(model, rounds, max_tokens) -> None:
    """Streamed tool calls: the reply parser's cost per token against the bare decoder, and the time to a forced
    call's first argument fragment against the whole non-streamed response (rstar2 serve, vllm engine)."""
    import statistics

    from rich.console import Console

    from rstar2_agent.models import resolve_model

    from .tool_stream import run

    console = Console()
    with console.status("the parser in this process, then rstar2 serve --engine vllm ..."):
        cost, lat = run(resolve_model(model).path, rounds, max_tokens)
    console.print(f"reply parser: {cost.tokens} tokens streamed one by one; decoder alone "
                  f"{cost.baseline_us_per_token:.1f} us/token, decoder + parser {cost.parsed_us_per_token:.1f} "
                  f"us/token: {statistics.median(cost.ratios):.2f}x (per round: "
                  f"{', '.join(f'{r:.2f}' for r in cost.ratios)})")
    first, total, whole = (statistics.median(x) for x in (lat.streamed_first_argument_s, lat.streamed_total_s,
                                                           lat.non_streamed_s))
    console.print(f"forced call, {lat.tokens} tokens, median of {rounds}: first argument fragment at "
                  f"{first * 1000:.0f} ms streamed; whole response {whole * 1000:.0f} ms non-streamed "
                  f"({first / whole:.2f} of it); the stream ends at {total * 1000:.0f} ms ({total / whole:.2f}x)")


@bench_group.command("colocated")
@click.option("--steps", type=click.IntRange(1), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
def colocated_bench_cmd(steps, rounds) -> None:
    """placement: colocated against the one-process path on the tiny model: the same losses, step times, the push's
    probe figure."""
    from rich.console import Console

    from .colocated_overhead import run_bench, summary

    console = Console()
    with console.status("training both ways, alternating ..."):
        out = summary(run_bench(steps, rounds))
    for name, median in out["step_s_median"].items():
        norms = "; ".join(", ".join(f"{g:.4f}" for g in r) for r in out["grad_norms"][name])
        console.print(f"{name}: median step {median:.2f} s; grad norms per round: {norms}")
    console.print(f"same losses and gradient norms: {out['same_losses']}; colocated / one process step time = "
                  f"{out['step_time_ratio']:.2f}; push median {out['push_s_median'] * 1000:.0f} ms; push probe max "
                  f"abs diff per push: {', '.join(f'{x:.2g}' for x in out['probe_max_abs_diff'])}")


@bench_group.command("eval")
@click.option("--model", default=None, help="Default: the embedded smollm2-135m.")
@click.option("--engine", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True)
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="Where aime24.jsonl is (its problems are used; the benchmarks' golds there join the grading "
                   "corpus); default: generated synthetic problems.")
@click.option("--problems", type=click.IntRange(1), default=4, show_default=True)
@click.option("--n", type=click.IntRange(1), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(8), default=256, show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--answers", type=click.IntRange(100), default=10_000, show_default=True,
              help="(gold, response) pairs in the grading corpus (and rollouts, up to 2,000).")
@click.option("--varied", type=click.IntRange(100), default=16_384, show_default=True,
              help="Integer-gold answers in the forms models write (the `varied integer forms` grading row).")
@click.option("--grading-only", is_flag=True, help="Only the grading figures (no engine).")
def eval_cmd(model, engine, data_dir, problems, n, max_tokens, concurrency, rounds, answers, varied,
             grading_only) -> None:
    """The harness's wall time against the bare engine on the same samples; graded answers per second through the
    integer fast path against math-verify in the process pool, and their agreement on a corpus."""
    import asyncio

    from rich.console import Console

    from rstar2_agent.chat_format import ChatFormat
    from rstar2_agent.engines import make_engine
    from rstar2_agent.eval.benchmarks import get_benchmark
    from rstar2_agent.models import resolve_model

    from .eval_overhead import bench_harness
    from .grading import bench_grading

    console = Console()
    resolved = None if grading_only else resolve_model(model)

    async def go():
        row = None
        if not grading_only:
            bench = get_benchmark("aime24" if data_dir else "synth")
            probs = bench.load(data_dir, problems)
            with console.status(f"starting {engine} ..."):
                eng = make_engine(engine, resolved.path, context_length=min(resolved.spec.context_length, 4096))
            try:
                row = await bench_harness(eng, ChatFormat(eng.tokenizer, "hermes"), bench, probs, n, max_tokens,
                                          concurrency, rounds)
            finally:
                await eng.close()
        with console.status("grading ..."):
            return row, await bench_grading(answers, min(answers, 2_000), data_dir=data_dir, varied=varied)

    row, grading = asyncio.run(go())
    if row is not None:
        console.print(f"harness vs bare {engine} engine ({resolved.spec.name}): {row.samples} samples x {max_tokens} "
                      f"tokens, concurrency {concurrency}, {rounds} rounds")
        console.print(f"  bare engine {row.bare_s:.2f} s ({row.tokens / row.bare_s:.1f} tok/s), harness "
                      f"{row.harness_s:.2f} s ({row.tokens / row.harness_s:.1f} tok/s): "
                      f"harness / bare = {row.ratio:.3f}")
    for g in grading:
        console.print(f"grading {g.name} ({g.answers} answers, {g.decided} decided by the fast path): with the fast "
                      f"path {g.fast_per_s:.0f} answers/s, math-verify in the pool only {g.pool_per_s:.0f} answers/s "
                      f"({g.ratio:.1f}x); same verdicts on {g.agree}/{g.answers} ({len(g.differ)} disagreements)",
                      soft_wrap=True)
        for pair, fast, pool in g.differ[:20]:
            console.print(f"  differs: gold {pair.gold!r}, answer {fast.predicted!r} ({pair.kind}): with the fast "
                          f"path {fast.correct}, math-verify {pool.correct} ({pool.error or 'no error'})",
                          soft_wrap=True)


@bench_group.command("grading")
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="Benchmark mirrors whose golds join the grading corpus; default: generated answers only.")
@click.option("--answers", type=click.IntRange(100), default=10_000, show_default=True,
              help="(gold, response) pairs in the grading corpus (and rollouts, up to 2,000).")
@click.option("--varied", type=click.IntRange(100), default=16_384, show_default=True,
              help="Integer-gold answers in the forms models write (the `varied integer forms` row).")
@click.pass_context
def grading_cmd(ctx, data_dir, answers, varied) -> None:
    """Graded answers per second through the integer fast path against math-verify in the process pool, and their
    agreement: on rollouts, on a corpus and on integer golds in the forms models write (`rstar2 bench eval
    --grading-only`)."""
    ctx.invoke(eval_cmd, data_dir=data_dir, answers=answers, varied=varied, grading_only=True)


@bench_group.command("rollout", context_settings={"ignore_unknown_options": True})
@click.option("--recipe", default="rl-smollm2-cpu", show_default=True,
              help="A YAML file, or a recipe name in train/recipes/ (its first stage's settings are used).")
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
@click.argument("overrides", nargs=-1)
def rollout_cmd(recipe, rounds, overrides) -> None:
    """RL rollout tokens/s against the bare engine on the same tokens, and one step's time split."""
    import asyncio

    from rstar2_agent.train.config import RLConfig

    from .rollout import bench_rollout

    cfg = _recipe(RLConfig, recipe, overrides)
    row = asyncio.run(bench_rollout(cfg, rounds))
    click.echo(f"{row.rollouts} rollouts; bare engine tok/s per round: {', '.join(f'{x:.1f}' for x in row.bare_tok_s)}"
               f"; RL rollout tok/s: {', '.join(f'{x:.1f}' for x in row.rl_tok_s)}")
    click.echo(f"RL rollout / bare engine throughput (best rounds): {row.ratio:.3f}")
    click.echo("one step: " + ", ".join(f"{k.removeprefix('time_')} {v:.1f} s" for k, v in row.split.items()))


@bench_group.command("push")
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--engine", type=click.Choice(["ray", "vllm"]), default="ray", show_default=True,
              help="ray: the learner group's pushes to Ray rollout workers (collective against object store); vllm: "
                   "pushes into an in-process vLLM engine (one message against whole layers under --max-message-mb).")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True, help="Ray rollout workers.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--bucket-mb", type=float, default=256.0, show_default=True, help="The collective's bucket size.")
@click.option("--max-message-mb", type=float, default=64.0, show_default=True,
              help="vllm: the message cap of the chunked pushes (64 cuts a 135M model as 2048 cuts a 14B one).")
@click.option("--all", "every", is_flag=True, help="Every backend a CPU can run (CUDA IPC substituted, named), each "
              "injected failure and its recovery time; exits 1 unless every backend is ok and every failure recovered.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None, help="Also write the figures here.")
def push_cmd(model, engine, workers, rounds, bucket_mb, max_message_mb, every, json_file) -> None:
    """Seconds (and, --engine vllm, peak memory) per weight push: to the Ray rollout workers (local cluster, CPU),
    collective against object store; or into vLLM in this process, one message against chunked; or --all."""
    import asyncio
    from dataclasses import asdict
    from pathlib import Path

    from .push import bench_push, bench_vllm_push

    if every:
        from .push_all import bench_push_all

        report = asyncio.run(bench_push_all(model))
        click.echo(f"{model}: every weight push a CPU runs (substituted: {report['substituted']})")
        for name, b in report["backends"].items():
            click.echo(f"{name:>12}: ok {b['ok']}, {b.get('seconds', '-')} s, {b.get('bytes', '-')} bytes, peak added "
                       f"{b.get('peak_added_mib', '-')} MiB{'; ' + b['note'] if b.get('note') else ''}")
        for f in report["failures"]:
            click.echo(f"{f['backend']:>12} failure at {f['phase']}: {f['error']}; left paused {f['left_paused']}; "
                       f"recovered {f['recovered']} in {f['recovery_s']} s")
        if json_file:
            Path(json_file).write_text(json.dumps(report, indent=1))
        if not report["ok"]:
            raise SystemExit(1)
        return

    if engine == "vllm":
        vrow = asyncio.run(bench_vllm_push(model, rounds, max_message_mb))
        click.echo(f"{model}, {vrow.megabytes:.0f} MiB (fp32) into vLLM in this process, {rounds} rounds")
        for mode in vrow.seconds:
            click.echo(f"{mode:>12}: {vrow.messages[mode]} messages; "
                       f"{', '.join(f'{x:.2f}' for x in vrow.seconds[mode])} s (median {vrow.median(mode):.2f}); "
                       f"peak memory added {', '.join(f'{x:.0f}' for x in vrow.added_mib[mode])} MiB")
        click.echo("chunked / one message (medians): " + ", ".join(f"{k} {v:.2f}" for k, v in vrow.ratios.items()))
        if json_file:
            Path(json_file).write_text(json.dumps({**asdict(vrow), "ratios": vrow.ratios}, indent=1))
        return
    row = asyncio.run(bench_push(model, workers, rounds, bucket_mb=bucket_mb))
    click.echo(f"{model}, {row.megabytes:.0f} MiB to {workers} rollout workers, {rounds} rounds")
    for mode, secs in row.seconds.items():
        click.echo(f"{mode:>12}: {', '.join(f'{x:.2f}' for x in secs)} s (median {row.median(mode):.2f} s)")
    click.echo(f"object store / collective seconds per push (medians): {row.ratio:.2f}")
    if json_file:
        Path(json_file).write_text(json.dumps({**asdict(row), "ratio": row.ratio}, indent=1))


@bench_group.command("learner")
@click.option("--model", default=None, help="Default: a random Qwen3-shaped model (Qwen3's vocabulary, --layers narrow "
              "layers of --hidden); or a registry name, folder or hub id (e.g. smollm2-135m).")
@click.option("--trajectories", type=click.IntRange(1), default=8, show_default=True)
@click.option("--prompt", type=click.IntRange(4), default=128, show_default=True, help="Prompt tokens (about).")
@click.option("--max-response", type=click.IntRange(8), default=512, show_default=True,
              help="The longest response; the others spread below it.")
@click.option("--micro-batch", type=click.IntRange(1), default=4, show_default=True, help="Padded: trajectories each.")
@click.option("--budget", type=click.IntRange(0), default=0, show_default=True,
              help="Packed: tokens each (0: 4/3 of the longest trajectory, as the 14B recipe's 16K over 12K).")
@click.option("--chunk", type=click.IntRange(1), default=128, show_default=True, help="The LM head's token chunk.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True)
@click.option("--layers", type=click.IntRange(1), default=4, show_default=True)
@click.option("--hidden", type=click.IntRange(16), default=256, show_default=True)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None, help="Also write the figures here.")
def learner_cmd(model, trajectories, prompt, max_response, micro_batch, budget, chunk, dtype, layers, hidden,
                json_file) -> None:
    """Peak memory of one RL policy update: full logits against the LM head in token chunks, padded micro-batches
    against packed ones, with and without activation checkpointing (ratios to the padded full-logits update)."""
    from dataclasses import asdict
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from .learner import bench_learner

    row = bench_learner(model, trajectories, prompt, max_response, micro_batch, budget, chunk, dtype, layers, hidden)
    table = Table(title=f"one policy update of {row.model} on {row.device}: {row.trajectories} trajectories, "
                        f"{row.tokens} tokens")
    for col in ("setting", "peak MiB", "/ first row", "positions computed", "loss"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    for r in row.rows:
        table.add_row(r["setting"], f"{r['peak_mib']:.0f}", f"{r['ratio']:.2f}", str(r["positions"]),
                      f"{r['loss']:+.6f}")
    Console().print(table)
    if json_file:
        Path(json_file).write_text(json.dumps(asdict(row), indent=1))


@bench_group.command("gpu", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                              "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def gpu_cmd(args) -> None:
    """The GPU check (learner step, generation, logprob parity) on this machine's accelerator; its options are
    bench/gpu_check.py's (`rstar2 bench gpu --help`), e.g. --out gpu.json, --tiny --device cpu."""
    from .gpu_check import main

    raise SystemExit(main(list(args)))


def _recipe(cls, recipe: str, overrides: tuple[str, ...]):
    """The recipe (a YAML file or a name in train/recipes/) with key=value overrides, as a `cls` dataclass."""
    from rstar2_agent.train.recipe import RecipeError, load

    try:
        return load(cls, recipe, overrides)
    except RecipeError as e:
        raise click.UsageError(str(e)) from e
