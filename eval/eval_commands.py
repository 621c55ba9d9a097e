"""`rstar2 eval BENCH[,BENCH...]` and `rstar2 eval report|compare` (the harness benchmark: `rstar2 bench eval`)."""

from __future__ import annotations

import click

from rstar2_agent.chat_format import EXTRACTIONS, FORMATS
from rstar2_agent.cli_options import engine_option, replica_options
from rstar2_agent.store import StoreError

from .benchmarks import BENCHMARKS, DEFAULT_GPQA_EXTRACTION, GPQA_EXTRACTIONS, JSONL_PREFIX, DataError, get_benchmarks


class _EvalGroup(click.Group):
    """`rstar2 eval aime24 ...` runs a benchmark; `rstar2 eval report RUN` etc. are subcommands."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("eval", cls=_EvalGroup)
def eval_group() -> None:
    """Evaluate a model with the tool: `rstar2 eval aime24` (benchmarks: aime24, aime25, hmmt25, math500,
    gpqa_diamond, bfcl_v3, ifeval, arena_hard, synth, or jsonl:PATH for your own problems; a comma list runs
    several), each run as its authors run it unless flags say otherwise. Results are stored; the same command
    resumes. `rstar2 eval paper`: the paper's table."""


BY_BENCHMARK = "Default: the benchmark's own"


def run_options(f):
    """The options `rstar2 eval BENCH` and `rstar2 eval paper` share (the engine, sampling, the store)."""
    for option in reversed(_RUN_OPTIONS):
        f = option(f)
    return f


_RUN_OPTIONS = [
    click.option("--model", default=None, help="Registry name (default smollm2-135m), local folder or Hugging Face "
                 "id; with --url: where the tokenizer comes from."),
    engine_option,
    click.option("--url", "urls", multiple=True, help="An OpenAI-compatible server to evaluate instead of a local "
                 "engine; several: a replica pool over them."),
    replica_options,
    click.option("--served-model", default=None, help="The model name on that server (default: its first)."),
    click.option("--api-key", envvar="RSTAR2_API_KEY", default=None),
    click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
                 help="completions: token level (vLLM, SGLang, rstar2 serve); chat: the tool loop runs here over "
                 "/v1/chat/completions with `tools` (hosted APIs)."),
    click.option("--n", type=click.IntRange(1), default=None, help=f"Samples per problem. {BY_BENCHMARK} (16; "
                 "BFCL v3 1)."),
    click.option("--temperature", type=click.FloatRange(0), default=None, help=f"{BY_BENCHMARK} (0.6; BFCL v3 0)."),
    click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
                 help=f"{BY_BENCHMARK} (1: the paper gives none)."),
    click.option("--max-tokens", type=click.IntRange(1), default=None, help="Response budget per sample (generated "
                 f"and tool tokens). {BY_BENCHMARK} (30720; BFCL v3, IFEval, Arena-Hard 16384)."),
    click.option("--max-turns", type=click.IntRange(1), default=None, help=f"{BY_BENCHMARK} (30)."),
    click.option("--no-tools", is_flag=True, help="One turn, no Python tool."),
    click.option("--format", "format_name", type=click.Choice(FORMATS), default=None,
                 help="Default: the model's (registry)."),
    click.option("--answer-extraction", type=click.Choice(EXTRACTIONS), default=None,
                 help="paper: the boxed answer inside the last <answer> block; release: the last box anywhere, else "
                 "math-verify over the whole response. Default: the format's (template: release; others: paper)."),
    click.option("--limit", type=click.IntRange(1), default=None, help="Only the first K problems (BFCL: per "
                 "category)."),
    click.option("--categories", default="all", show_default=True, help="bfcl_v3: categories or groups (non_live, "
                 "live, multi_turn, single_turn), comma-separated; synth: problem families (primes, fib, ...)."),
    click.option("--judge-url", default=None, help="arena_hard: the judge, an OpenAI-compatible chat server (the "
                 "benchmark's: gpt-4-1106-preview). Default: the model under test judges itself, a smoke test only."),
    click.option("--judge-model", default=None, help="arena_hard: the judge's model name on that server (default: "
                 "its first)."),
    click.option("--judge-api-key", envvar="RSTAR2_JUDGE_API_KEY", default=None, help="arena_hard: the judge's API "
                 "key (or $RSTAR2_JUDGE_API_KEY)."),
    click.option("--gpqa-extraction", type=click.Choice(list(GPQA_EXTRACTIONS)), default=DEFAULT_GPQA_EXTRACTION,
                 show_default=True, help="gpqa_diamond: how the letter is asked for and read. ours: our prompt "
                 "(\\boxed{X}, after the math-problem instruction), a boxed or stated letter, the last; simple-evals: "
                 "simple-evals' prompt alone ('Answer: $LETTER' as the last line) and its regex, the first 'Answer: X' "
                 "(none: wrong). Another extraction is another run."),
    click.option("--concurrency", type=click.IntRange(1), default=64, show_default=True, help="Samples in flight."),
    click.option("--retries", type=click.IntRange(0), default=3, show_default=True,
                 help="Retries of a sample whose engine or endpoint failed (with back-off)."),
    click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL (default "
                 "$RSTAR2_HOME/rstar2.db)."),
    click.option("--run", "run_name", default=None, help="Run name; the same name resumes (default: the model and "
                 "the settings that differ from the benchmark's, so the same command resumes)."),
    click.option("--out", default=None, type=click.Path(file_okay=False), help="Write results.json, samples.jsonl, "
                 "report.html here."),
    click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
                 help="Folder with JSONL mirrors of the hub datasets (default: $RSTAR2_DATA_DIR, else the hub)."),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--grader-timeout", type=click.FloatRange(0.1), default=10.0, show_default=True),
    click.option("--sandbox-url", "sandbox_urls", multiple=True, help="Use `rstar2 sandbox serve` servers."),
    click.option("--unsafe-no-isolation", "unsafe", is_flag=True, help="Run tool code without bubblewrap."),
]


def source_and_config(o: dict):
    """The ModelSource and EvalConfig from the shared options (`o`: click's keyword arguments)."""
    from .harness import ModelSource
    from .runner import EvalConfig

    cfg = EvalConfig(n=o["n"], temperature=o["temperature"], top_p=o["top_p"], max_tokens=o["max_tokens"],
                     max_turns=o["max_turns"], use_tools=not o["no_tools"], seed=o["seed"], api=o["api"],
                     format=o["format_name"] or "", answer_extraction=o["answer_extraction"] or "",
                     limit=o["limit"], concurrency=o["concurrency"],
                     retries=o["retries"])
    source = ModelSource(model=o["model"], engine=o["engine"], urls=list(o["urls"]), replicas=o["replicas"],
                    replica_policy=o["replica_policy"], served_model=o["served_model"], api_key=o["api_key"],
                    sandbox_urls=list(o["sandbox_urls"]), isolation=not o["unsafe"],
                    grader_timeout=o["grader_timeout"])
    return source, cfg


def judge_spec(o: dict):
    """Arena-Hard's judge from the shared options."""
    from .benchmarks import JudgeSpec

    return JudgeSpec(url=o["judge_url"], model=o["judge_model"], api_key=o["judge_api_key"])


def run_async(coro):
    """Run a command's coroutine; the errors users can fix become click errors."""
    import asyncio

    from rstar2_agent.engines import EngineError
    from rstar2_agent.models import ModelError
    from rstar2_agent.sandbox import SandboxError

    try:
        return asyncio.run(coro)
    except (DataError, StoreError, ModelError, EngineError, SandboxError) as e:
        raise click.ClickException(str(e)) from e
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; finished samples are stored, run the same command to resume") from None


@eval_group.command("run")
@click.argument("benchmarks")
@run_options
def run_cmd(benchmarks, **o) -> None:
    """Run (or resume) BENCHMARKS, e.g. aime24 or aime24,aime25,hmmt25, each with its own defaults (n, sampling,
    budgets: its authors' settings) where no flag is given.

    Benchmarks: aime24, aime25, hmmt25, math500, gpqa_diamond, bfcl_v3, ifeval, arena_hard, synth, and
    jsonl:PATH: your own math problems, one JSON object a line with the text under "question" (or "problem",
    "prompt"), the answer under "answer" (or "gold", "solution": its last \\boxed{}) and an optional unique "id";
    graded like the math benchmarks with the paper's defaults. PATH is relative to the current directory; the run
    is stored as jsonl:STEM@HASH (a hash of the problems), so a changed file starts a new run."""
    from rstar2_agent.store import Store

    from .harness import evaluate

    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    unknown = [b for b in names if b not in BENCHMARKS and not b.startswith(JSONL_PREFIX)]
    if unknown:
        import difflib

        close = [m for b in unknown for m in difflib.get_close_matches(b.lower(), list(BENCHMARKS), n=2, cutoff=0.6)]
        close = [f"{JSONL_PREFIX}{b}" for b in unknown if b.endswith(".jsonl")] + close
        hint = f"did you mean {' or '.join(close)} (`rstar2 eval {close[0]}`)? " if close else ""
        raise click.UsageError(f"unknown benchmark(s) {', '.join(unknown)}; {hint}"
                               f"choose from {', '.join(BENCHMARKS)} or {JSONL_PREFIX}PATH (your own problems)")
    source, cfg = source_and_config(o)

    async def go():
        store = Store(o["db"])
        await evaluate(names, source, cfg, store, o["run_name"], o["data_dir"], o["out"],
                       benchmarks=get_benchmarks(names, o["categories"], judge_spec(o), o["gpqa_extraction"]))

    run_async(go())


@eval_group.command("paper")
@run_options
def paper_cmd(**o) -> None:
    """The paper's table for rStar2-Agent-14B (AIME24 80.6, AIME25 69.8, HMMT25 52.7, MATH-500 97.8, GPQA-Diamond
    60.9, BFCL v3 60.8, IFEval 83.4, Arena-Hard 86.6): runs (or resumes) each benchmark with its own defaults, as
    `rstar2 eval BENCH` would (the same runs in the store), then prints ours beside the paper's: pass@1 averaged over
    each problem's samples in percent (BFCL v3: its weighted overall; IFEval: strict prompt-level accuracy;
    Arena-Hard: the win rate against gpt-4-0314 as --judge-url judges), a 95% interval over problems (the unit
    sampled, so 16 samples of 30 problems are 30 observations: Wilson's interval when every problem scored 0 or 1, as
    with one sample each, else Student's t over the per-problem accuracies; BFCL v3: a bootstrap of items within
    categories; Arena-Hard: the benchmark's bootstrap over battles) and whether the paper's number is inside it.
    Defaults: AIME24/AIME25/HMMT25/MATH-500/GPQA-Diamond the paper's avg@16 at temperature 0.6, 30 turns, 30720
    tokens (the release's eval script), top_p 1 (the paper gives none); BFCL v3 as its leaderboard runs it, one greedy
    sample; IFEval and Arena-Hard one greedy sample of the benchmark's prompt, no tool; those three 16384 tokens, room
    for a reasoning model (--max-tokens 4096: the leaderboards' own cap). It
    says which format it used for the model, and why. A benchmark without data is skipped with the reason.
    --limit K: a smoke run on the first K problems of each (BFCL: of each category)."""
    from rstar2_agent.store import Store

    from .paper import paper_table, run_paper
    from .report import console as wide_console

    source, cfg = source_and_config(o)
    refuse_unknown_format(source, cfg, o["format_name"])

    async def go():
        return await run_paper(source, cfg, Store(o["db"]), o["run_name"], o["data_dir"], o["categories"], o["out"],
                               judge=judge_spec(o), gpqa_extraction=o["gpqa_extraction"])

    rows = run_async(go())
    console = wide_console()
    console.print(paper_table(rows, f"rStar2-Agent paper vs {source.label()}"))
    console.print(f"format {paper_format_line(source, cfg, o['format_name'])}", soft_wrap=True)
    for r in rows:
        if r.skipped:
            console.print(f"{r.benchmark} skipped: {r.skipped}", soft_wrap=True)
    if all(r.skipped for r in rows):
        raise click.ClickException("no benchmark could run: give their data with --data-dir (see above)")


def refuse_unknown_format(source, cfg, given: str | None) -> None:
    """The paper's table in a defaulted format would be numbers of a prompt the model never saw: a model whose
    format is not known (not the registry's, not one of our checkpoints, no release chat template) needs --format."""
    from rstar2_agent.models import recognized

    if given or cfg.api == "chat" or recognized(source.model):
        return
    raise click.ClickException(
        f"the format of {source.model} is not known (no registry entry, no rstar2.json, not the release's chat "
        "template): the table would score a prompt the model never saw. The public rStar2-Agent-14B: --format "
        "rstar2-paper; one of our checkpoints keeps its format in rstar2.json; another tool-calling model: --format "
        "template (its own chat template) or hermes")


def paper_format_line(source, cfg, given: str | None) -> str:
    """Which format the paper's table ran in for this model, and why."""
    from rstar2_agent.models import format_reason

    if cfg.api == "chat":
        return "(--api chat): the chat server renders the conversation with its own template and tool parser"
    return format_reason(source.model, given, cfg.format or "?")


@eval_group.command("report")
@click.argument("run_name")
@click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL.")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="Also write the report files here.")
@click.option("--problems", is_flag=True, help="Print the per-problem accuracy too.")
def report_cmd(run_name, db, out, problems) -> None:
    """The results of a stored run (all its benchmarks)."""
    from rich.table import Table

    from rstar2_agent.store import Store

    from .report import benchmark_tables, load, results_table, write_outputs
    from .report import console as wide_console

    console = wide_console()
    try:
        store = Store(db)
        results = load(store, run_name)
        console.print(results_table(results, f"{run_name} ({results[0].run.model})"))
        for table in (t for r in results for t in benchmark_tables(r)):
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
    for col in ("benchmark", "problems", f"{run_a} %", f"{run_b} %", "diff (pts)", "± s.e.", "paired 95% CI",
                "better", "worse"):
        table.add_column(col)
    for b in benches:
        low, high = b["ci"]
        table.add_row(b["benchmark"], str(b["problems"]), f"{100 * b['a']:.1f}", f"{100 * b['b']:.1f}",
                      f"{100 * b['diff']:+.1f}", f"{100 * b['stderr']:.1f}", f"{100 * low:+.1f} to {100 * high:+.1f}",
                      str(b["better"]), str(b["worse"]))
    console.print(table)
    if problems and top:
        table = Table(title=f"problems that changed (largest first, {min(top, len(problems))} of {len(problems)})")
        for col in ("benchmark", "problem", f"{run_a} %", f"{run_b} %", "diff (pts)"):
            table.add_column(col)
        for p in problems[:top]:
            table.add_row(p["benchmark"], p["problem_id"], f"{100 * p['a']:.0f}", f"{100 * p['b']:.0f}",
                          f"{100 * p['diff']:+.0f}")
        console.print(table)


