"""`rstar2 train sft|data|problems|problems-verify|rl|plan|ablation|report` (the RL benchmarks: `rstar2 bench`).

Under torchrun (several GPUs): `python -m rstar2_agent.train.train_commands`."""

from __future__ import annotations

import json
import logging

import click

from .data.problems import BENCHMARKS
from .recipe import RecipeError

log = logging.getLogger(__name__)


@click.group("train")
def train_group() -> None:
    """Train: the non-reasoning SFT stage (`rstar2 train sft`), then GRPO-RoC RL in stages (`rstar2 train rl`)."""


def _run_options(default_recipe: str):
    """--recipe, --resume and the key=value overrides of `rstar2 train sft` and `rstar2 train rl`."""
    def wrap(fn):
        fn = click.argument("overrides", nargs=-1)(fn)
        fn = click.option("--resume", is_flag=True,
                          help="Continue from the last checkpoint in the recipe's `out` folder.")(fn)
        return click.option("--recipe", default=default_recipe, show_default=True,
                            help="A YAML file, or a recipe name in train/recipes/.")(fn)
    return wrap


def _train(kind: str, cfg, run, step_text, errors: tuple[type[Exception], ...], summary) -> None:
    """Run `run(on_step)` under a progress bar; a known error becomes a clean message; then where the model is
    and what changed."""
    bar, on_step = _progress(kind, step_text)
    try:
        with bar:
            final, history = run(on_step)
    except errors as e:
        raise click.ClickException(str(e)) from e
    click.echo(_reach(cfg.out, final))
    if history:
        click.echo(summary(history))


@train_group.command("sft", context_settings={"ignore_unknown_options": True})
@_run_options("sft-smollm2-cpu")
def sft_cmd(recipe, resume, overrides) -> None:
    """Supervised fine-tuning; OVERRIDES are key=value (e.g. optim.lr=2e-5 max_steps=10 out=runs/x)."""
    from rstar2_agent.benchmark_data import DataError
    from rstar2_agent.models import ModelError

    from .config import SFTConfig
    from .sft import run_sft

    cfg = _recipe(SFTConfig, recipe, overrides)
    _memory_check(cfg, "sft", recipe)
    _train("sft", cfg, lambda on_step: run_sft(cfg, resume=resume, on_step=on_step),
           lambda m: f"loss {m['loss']:.4f} lr {m['lr']:.2e} gnorm {m['grad_norm']:.2f} {m['tokens_per_s']:.0f} tok/s",
           (DataError, ModelError, ValueError),
           lambda h: f"loss {h[0]['loss']:.4f} -> {h[-1]['loss']:.4f} over {len(h)} steps")


@train_group.command("rl", context_settings={"ignore_unknown_options": True})
@_run_options("rl-smollm2-cpu")
def rl_cmd(recipe, resume, overrides) -> None:
    """GRPO-RoC RL in stages; OVERRIDES are key=value (e.g. roc=false out=runs/grpo prompts_per_step=8)."""
    import asyncio

    from rstar2_agent.benchmark_data import DataError
    from rstar2_agent.models import ModelError

    from .config import RLConfig
    from .rl import run_rl

    cfg = _recipe(RLConfig, recipe, overrides)
    _memory_check(cfg, "rl", recipe)
    _train("rl", cfg, lambda on_step: asyncio.run(run_rl(cfg, resume=resume, on_step=on_step)),
           lambda m: f"acc {m['accuracy']:.2f} len {m['response_tokens']:.0f} loss {m['loss']:+.4f} "
                     f"stage {m['stage']:.0f}",
           (ModelError, ValueError, DataError),
           lambda h: f"rollout accuracy {h[0]['accuracy']:.3f} (first step) -> {h[-1]['accuracy']:.3f} (last) "
                     f"over {len(h)} steps")


def _memory_check(cfg, kind: str, recipe: str) -> None:
    """The memory plan before a GPU run (train/plan `check_before_run`): a recipe that cannot fit stops here."""
    from .plan import check_before_run
    from .plan.formulas import PlanError

    try:
        check_before_run(cfg, kind, recipe)
    except PlanError as e:
        raise click.ClickException(str(e)) from e


@train_group.command("plan", context_settings={"ignore_unknown_options": True})
@click.option("--recipe", required=True, help="An SFT or RL recipe: a YAML file or a name in train/recipes/.")
@click.option("--gpus", type=click.IntRange(1), default=None,
              help="RL: the GPUs the cluster has (checked against the placement); SFT: the FSDP ranks "
                   "(default $WORLD_SIZE, else 1).")
@click.option("--gpu-memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Memory of each GPU (default: the recipe's gpu_memory_gib, else this machine's GPU; with neither "
                   "the plan is against this machine's memory).")
@click.option("--prompt-tokens", type=click.IntRange(1), default=None,
              help="RL: the longest prompt, added to the largest stage's max_response_tokens [default: 1024].")
@click.option("--logits-chunk", type=click.IntRange(0), default=None,
              help="RL: log-probabilities in chunks of this many tokens (0: the full fp32 [tokens x vocab] logits; "
                   "default: the recipe's logprob_chunk_tokens when it has one).")
@click.option("--receive", type=click.Choice(["model", "bucket", "host"]), default="bucket", show_default=True,
              help="RL on Ray: what the weight push receives on a rollout GPU (bucket: one bucket at a time, as the "
                   "push does; model: the whole bf16 model, as it did before; host: nothing on the GPU).")
@click.option("--shape", default=None, help="Size this model instead of the recipe's (a folder or a known name).")
@click.option("--json", "as_json", is_flag=True, help='Print the plan as JSON ("fits": true|false, GiB per component).')
@click.argument("overrides", nargs=-1)
def plan_cmd(recipe, gpus, gpu_memory_gib, prompt_tokens, logits_chunk, receive, shape, as_json, overrides) -> None:
    """Per GPU, what a recipe's learner (weights, gradients, AdamW state, activations) and rollout engine (weights,
    KV cache, receive buffers) hold at their peak, and whether it fits; the formulas are in docs/memory.md. The
    exit status is 1 when it does not fit."""
    import sys

    import yaml

    from . import recipe as recipes
    from .config import RLConfig, SFTConfig
    from .model_shape import ShapeError, model_shape
    from .plan import plan_rl, plan_sft
    from .plan.formulas import PROMPT_TOKENS, PlanError
    from .plan.planner import gpu_memory_here
    from .plan.records import render, to_json

    try:
        raw = yaml.safe_load(recipes.find_recipe(recipe).read_text()) or {}
    except RecipeError as e:
        raise click.UsageError(str(e)) from e
    kind = "rl" if isinstance(raw, dict) and "stages" in raw else "sft"
    cfg = _recipe(RLConfig if kind == "rl" else SFTConfig, recipe, overrides)
    on_gpu = (kind == "rl" and cfg.distributed == "ray" and cfg.ray.gpus_per_learner > 0)
    memory = gpu_memory_gib or cfg.gpu_memory_gib or None
    if memory is None and (on_gpu or gpus):
        memory = gpu_memory_here()
        if memory is None:
            raise click.UsageError("no GPU here to size the plan by: give --gpu-memory-gib")
    try:
        s = model_shape(shape) if shape else None
        if kind == "rl":
            plan = plan_rl(cfg, recipe=recipe, gpu_memory_gib=memory, gpus=gpus, shape=s, receive=receive,
                           prompt_tokens=prompt_tokens or PROMPT_TOKENS, logits_chunk=logits_chunk)
        else:
            plan = plan_sft(cfg, recipe=recipe, gpu_memory_gib=memory, gpus=gpus or cfg.gpus or None, shape=s)
    except (PlanError, ShapeError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(to_json(plan) if as_json else render(plan))
    if not plan.fits:
        sys.exit(1)


def _reach(out, final) -> str:
    """How to use the checkpoint: by the run's name when `--model NAME` finds it from here (runs/NAME/last)."""
    from pathlib import Path

    from rstar2_agent.models import REGISTRY

    name = Path(out).name
    by_name = name.lower() not in REGISTRY and not Path(name).is_dir() and \
        (Path("runs") / name / "last").resolve() == (Path(out) / "last").resolve()
    model = name if by_name else str(final)
    return f"checkpoint: {final}\nuse it with --model {model}, e.g. rstar2 chat --model {model}"


@train_group.command("ablation", context_settings={"ignore_unknown_options": True})
@click.option("--recipe", default="rl-smollm2-tooltasks-cpu", show_default=True,
              help="The RL recipe both arms share (a YAML file or a name in train/recipes/); its group_size is G.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Comma-separated seeds; each arm runs every seed.")
@click.option("--steps", type=click.IntRange(1), default=16, show_default=True,
              help="Training steps of every run (the recipe's one stage is set to this many).")
@click.option("--out", default="runs/ablation", show_default=True, help="One folder per (arm, seed) under this.")
@click.option("--with-2g", "with_2g", is_flag=True, help="Also plain GRPO on all 2G rollouts (RoC's sampling).")
@click.option("--final-steps", type=click.IntRange(1), default=2, show_default=True,
              help="The final value of a run is the mean of its last K steps.")
@click.option("--probe-prompts", type=click.IntRange(0), default=64, show_default=True,
              help="Held-out probe problems (0: no probe); every policy samples each --probe-samples times.")
@click.option("--probe-samples", type=click.IntRange(1), default=4, show_default=True)
@click.option("--probe-seed", type=int, default=1009, show_default=True,
              help="The data seed of the probe's problems (disjoint from training: checked).")
@click.option("--report-only", is_flag=True, help="Train and probe nothing: report what is stored so far.")
@click.option("--summary", "summary_path", default=None,
              help="Where the JSON summary goes (default OUT/ablation-summary.json).")
@click.option("--png", default=None, help="Where the curves go (default OUT/curves.png).")
@click.argument("overrides", nargs=-1)
def ablation_cmd(recipe, seeds, steps, out, with_2g, final_steps, probe_prompts, probe_samples, probe_seed,
                 report_only, summary_path, png, overrides) -> None:
    """GRPO-RoC (2G sampled, G kept) against GRPO (G sampled, G used) over seeds: curves, a paired test over
    seeds on the training rollouts, and a held-out probe with a paired bootstrap; it resumes where it stopped."""
    import asyncio
    import dataclasses

    from rich.console import Console
    from rich.table import Table

    from rstar2_agent.models import ModelError

    from .ablation.experiment import CURVES, run_ablation, write_outputs
    from .ablation.probe import ProbeSettings, value
    from .config import RLConfig

    cfg = _recipe(RLConfig, recipe, overrides)
    if len(cfg.stages) != 1:
        raise click.UsageError("--steps sets the recipe's one stage; this recipe has several")
    cfg = dataclasses.replace(cfg, stages=[dataclasses.replace(cfg.stages[0], steps=steps)])
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError as e:
        raise click.UsageError(f"--seeds takes comma-separated integers, e.g. 0,1,2 ({e})") from e
    probe = ProbeSettings(probe_prompts, probe_samples, probe_seed) if probe_prompts else None
    console = Console()

    def on_run(arm: str, seed: int, step: int, total: int, m: dict[str, float]) -> None:
        console.print(f"{arm} seed {seed}: step {step}/{total} acc {m['accuracy']:.2f} "
                      f"pos tool errors {m['tool_error_ratio_positive']:.3f} len {m['response_tokens']:.0f}")

    def on_probe(name: str, record: dict, ran: bool) -> None:
        console.print(f"probe {name}: {'ran' if ran else 're-used'}; acc {value(record, 'accuracy'):.3f} pos tool "
                      f"errors {value(record, 'tool_error_ratio_among_positives'):.3f}"
                      + (f" ({record['seconds'] / record['rollouts']:.2f} s a rollout)" if ran else ""))

    try:
        ab = asyncio.run(run_ablation(cfg, seed_list, out, with_2g, on_run, probe, on_probe, report_only))
    except (ModelError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    outcome = write_outputs(cfg, recipe, seed_list, ab, probe, out, final_steps, summary_path, png)
    if outcome.rows is not None:
        grid = Table(title=f"training rollouts: final values (mean of the last {final_steps} steps, seeds {seeds})")
        for col in ("metric", *outcome.arms, "roc / grpo", "roc - grpo", "t", "p (t)", "p (sign flips)"):
            grid.add_column(col, justify="right")
        labels = dict(CURVES)
        for r in outcome.rows:
            grid.add_row(labels[r.metric], *[f"{r.means[a]:.3f}" for a in outcome.arms],
                         f"{r.ratio:.2f}" if r.ratio is not None else "-", f"{r.diff:+.3f}",
                         f"{r.t:.2f}" if r.t is not None else "-", f"{r.p_t:.3f}" if r.p_t is not None else "-",
                         f"{r.p_perm:.3f}")
        console.print(grid)
    if "probe" in outcome.doc:
        _print_probe(console, outcome.doc["probe"])
    if "power" in outcome.doc:
        console.print(f"the tool-error ratio's interval straddles 1: power estimate {json.dumps(outcome.doc['power'])}")
    console.print(f"wrote {outcome.png} and {outcome.summary_file}")


def _print_probe(console, rows: dict) -> None:
    from rich.table import Table

    def f(x) -> str:
        return "-" if x is None else f"{x:.3f}"

    grid = Table(title="held-out probe at the end: RoC / GRPO with a paired bootstrap 95% interval (prompts, seeds)")
    for col in ("metric", "SFT start", "roc", "grpo", "roc / grpo", "95% interval"):
        grid.add_column(col, justify="right")
    for metric, r in rows.items():
        ci = r.get("ci95")
        grid.add_row(metric, f(r["start"]), f(r["roc"]), f(r["grpo"]), f(r["ratio"]),
                     f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-")
    console.print(grid)


@train_group.command("report")
@click.argument("run_name")
@click.option("--db", default=None, help="Store: a SQLite file or a SQLAlchemy URL.")
@click.option("--png", type=click.Path(dir_okay=False), default=None, help="Draw the curves into this PNG.")
@click.option("--json", "as_json", is_flag=True,
              help='Print only a JSON list, one object a step: {"step": N, "metric": value, ...}.')
@click.option("--all", "every", is_flag=True, help="Every metric a column (default: the few a step is read by).")
def report_cmd(run_name, db, png, as_json, every) -> None:
    """A training run's metrics per step (SFT or RL), and its curves."""
    from rstar2_agent.store import Store, StoreError

    from .report import curves, metrics_by_step, print_table

    try:
        runs = [r for r in Store(db).runs(run_name) if r.kind in ("sft", "rl")]
        if not runs:
            raise StoreError(f"no training run named {run_name!r}")
        steps = metrics_by_step(Store(db), runs[-1].id)
    except StoreError as e:
        raise click.ClickException(str(e)) from e
    if png:
        curves(steps, png, f"{run_name} ({runs[-1].kind})")
    if as_json:
        click.echo(json.dumps([{"step": step, **m} for step, m in steps.items()], indent=1))
        return
    print_table(steps, f"{run_name} ({runs[-1].kind}, {runs[-1].status})", runs[-1].kind, every)
    if png:
        click.echo(f"wrote {png}")


@train_group.command("data")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Write chat JSONL here.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the SOURCE@N sampling.")
@click.option("--hub-dir", envvar="RSTAR2_HUB_DIR", default=None,
              help="Read hub:ORG/NAME from DIR/ORG/NAME, a local copy of the hub repository [env RSTAR2_HUB_DIR].")
@click.option("--model", default="smollm2-135m", show_default=True, help="Count tokens with this model's tokenizer.")
@click.option("--format", "format_", default="hermes", show_default=True,
              help="The format the tokens are counted in, as SFT renders them.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and tokens of each source as JSON.")
@click.option("--rewrite-url", default=None,
              help="Rewrite the Tulu 3 and Llama-Nemotron rows with a model at this OpenAI-compatible URL (e.g. "
                   "http://localhost:8000/v1); off by default.")
@click.option("--rewrite-model", default=None, help="The model name to ask at --rewrite-url.")
@click.option("--rewrite-what", type=click.Choice(["prompt", "response", "both"]), default="both", show_default=True)
@click.option("--rewrite-cache", default=None, help="Answers so far, for resuming [default: OUT.rewrite-cache.jsonl].")
@click.option("--rewrite-concurrency", type=click.IntRange(1), default=8, show_default=True)
@click.option("--rewrite-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds per request.")
def data_cmd(sources, out, seed, hub_dir, model, format_, as_json, rewrite_url, rewrite_model, rewrite_what,
             rewrite_cache, rewrite_concurrency, rewrite_timeout) -> None:
    """Write SOURCES as one chat JSONL and report the rows and tokens of each. A source is synthetic:N[:SEED],
    FORMAT:path (sharegpt, glaive_v2, toolace, magicoder, nemotron, openai), hub:ORG/NAME[:split] (ToolACE,
    APIGen-MT, Glaive v2, Magicoder, Tulu 3, Llama-Nemotron), any of them with @N to sample N rows, or mix:paper
    (the paper's SFT mix at its sizes)."""
    from rstar2_agent.benchmark_data import DataError
    from rstar2_agent.models import ModelError

    from .data.rewrite import RewriteConfig, RewriteError
    from .data.sft_mix import write_mix

    if rewrite_url and not rewrite_model:
        raise click.UsageError("--rewrite-url needs --rewrite-model, the model to ask")
    rewrite_cfg = RewriteConfig(rewrite_url, rewrite_model, rewrite_what, rewrite_cache or f"{out}.rewrite-cache.jsonl",
                                rewrite_concurrency, rewrite_timeout) if rewrite_url else None
    try:
        result = write_mix(sources, out, seed=seed, hub_dir=hub_dir, model=model, format_=format_,
                           rewrite_cfg=rewrite_cfg)
    except (DataError, ModelError, RewriteError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    rewritten = result.get("rewrite", {})
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    for r in result["sources"]:
        asked = f" of {r['available']}" + (f" (asked {r['requested']})" if r["requested"] is not None else "")
        skipped = f"; {r['bad_rows']} bad rows skipped" if r["bad_rows"] else ""
        click.echo(f"{r['source']}: {r['rows']} rows{asked}, {r['tokens']} tokens ({r['target_tokens']} trained)"
                   f"{skipped}" + (f"; rewrite {rewritten[r['source']]}" if r["source"] in rewritten else ""))
    t = result["total"]
    click.echo(f"{t['rows']} conversations, {t['tokens']} tokens ({t['target_tokens']} trained) in {format_} "
               f"with {model}'s tokenizer -> {out}")


@train_group.command("problems")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Write problems JSONL here.")
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="The benchmark mirrors to decontaminate against, as for `rstar2 eval` (else the hub).")
@click.option("--benchmarks", default=",".join(BENCHMARKS), show_default=True,
              help="The evaluation sets no training problem may share an 8-gram with (comma list).")
@click.option("--boilerplate", type=click.IntRange(0), default=None,
              help="An 8-gram that this many benchmark problems share is their phrasing and strikes nothing "
              "(default 3; 0: the paper's rule as written, any shared 8-gram strikes).")
@click.option("--json", "as_json", is_flag=True, help="Print only the counts, as JSON.")
def problems_cmd(sources, out, data_dir, benchmarks, boilerplate, as_json) -> None:
    """RL problems as the paper curated them: integer answers, no duplicates, no overlap with evaluation sets.

    SOURCES, read in order: hub:ID[:CONFIG[:SPLIT]] (open-r1/DAPO-Math-17k-Processed:all, nvidia/OpenMathReasoning,
    alexandonian/project-euler), or a local copy in the source's own schema, JSONL or Parquet files or a folder of
    them: dapo:PATH (prompt, reward_model.ground_truth), omr:PATH (problem, expected_answer, problem_type,
    problem_source), euler:PATH (problem, numerical_answer), problems:PATH (this command's output). Then run
    `rstar2 train problems-verify` on the OpenMathReasoning part, as the paper did."""
    from rstar2_agent.benchmark_data import DataError

    from .data.problems import BOILERPLATE_PROBLEMS, build

    try:
        counts = build(sources, out, data_dir, [b.strip() for b in benchmarks.split(",") if b.strip()],
                       BOILERPLATE_PROBLEMS if boilerplate is None else boilerplate)
    except DataError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(counts.as_json()))
    else:
        click.echo(f"{counts.kept} of {counts.read} problems -> {out} (dropped: {counts.non_integer} non-integer "
                   f"answers, {counts.duplicate} duplicates, {counts.contaminated} sharing an 8-gram with "
                   f"{benchmarks or 'no benchmark'})")
        click.echo(hits_line(counts.decontamination))


def hits_line(report: dict) -> str:
    """The decontamination's hits, by benchmark and by the n-grams that struck most."""
    by = ", ".join(f"{k} {v}" for k, v in report.get("by_benchmark", {}).items()) or "none"
    grams = "; ".join(f'"{g}" {n}' for g, n in list(report.get("top_ngrams", {}).items())[:5])
    return (f"decontamination hits by benchmark: {by}" + (f"; most striking 8-grams: {grams}" if grams else "")
            + f" ({report.get('boilerplate_ngrams', 0)} boilerplate 8-grams set aside)")


def _verify_options(f):
    """The verifier's options, shared by problems-verify and problems-paper."""
    for option in reversed([
        click.option("--url", required=True, help="An OpenAI-compatible server (vLLM, SGLang, rstar2 serve)."),
        click.option("--served-model", default=None, help="The model name on that server (default: its first)."),
        click.option("--api-key", envvar="RSTAR2_API_KEY", default=None),
        click.option("--samples", type=click.IntRange(1), default=16, show_default=True, help="Answers per problem."),
        click.option("--min-agree", type=click.IntRange(1), default=2, show_default=True,
                     help="Keep a problem when at least this many answers reach its label."),
        click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True,
                     help="Problems in flight."),
        click.option("--temperature", type=click.FloatRange(0), default=0.6, show_default=True),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True),
        click.option("--max-tokens", type=click.IntRange(1), default=None, help="Per answer (default: the server's)."),
        click.option("--timeout", type=click.FloatRange(1), default=1800.0, show_default=True,
                     help="Seconds one request (all its samples) may take."),
    ]):
        f = option(f)
    return f


def _verify_config(o: dict):
    from .data.problems_verify import VerifyConfig

    return VerifyConfig(o["url"], o["served_model"], o["samples"], o["min_agree"], o["concurrency"],
                        o["temperature"], o["top_p"], o["max_tokens"], o["timeout"], o["api_key"])


@train_group.command("problems-verify")
@click.argument("problems", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Write the kept problems here; progress goes to OUT.progress.jsonl (a rerun resumes from it).")
@_verify_options
def problems_verify_cmd(problems, out, **o) -> None:
    """Keep the PROBLEMS (a `rstar2 train problems` file) whose answer a strong model reproduces at least
    --min-agree times in --samples tries: the paper's filter on OpenMathReasoning (Qwen3-32B, 2 of 16)."""
    import asyncio

    from rstar2_agent.benchmark_data import DataError

    from .data.problems_verify import verify

    bar, on_step = _progress("verify", lambda m: "")
    try:
        with bar:
            counts = asyncio.run(verify(problems, out, _verify_config(o), lambda i, n: on_step(i, n, {})))
    except DataError as e:
        raise click.ClickException(str(e)) from e
    if counts.failed:
        raise click.ClickException(f"{counts.failed} problems got no answer (see the warnings); run the same command "
                                   f"again to ask only those: the {counts.asked + counts.done_before} done are kept "
                                   f"in {out}.progress.jsonl")
    click.echo(f"{counts.kept} of {counts.read} problems kept -> {out} ({counts.asked} asked now, "
               f"{counts.done_before} recorded before)")


@train_group.command("problems-paper")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="A folder for every step's file; rl-problems.jsonl there is the result (a rerun resumes).")
@click.option("--data-dir", envvar="RSTAR2_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="The benchmark mirrors to decontaminate against, as for `rstar2 eval` (else the hub).")
@click.option("--dapo", default=None, help="The DAPO source (default: open-r1's `all` config, the paper's 17K; "
              "`hub:open-r1/DAPO-Math-17k-Processed:en` keeps only those without Chinese text).")
@click.option("--aops", default=None, help="The OpenMathReasoning source (default: the hub's; omr:PATH a copy).")
@click.option("--euler", default=None, help="The Project Euler source (default: the hub's; euler:PATH a copy).")
@click.option("--boilerplate", type=click.IntRange(0), default=None,
              help="As `rstar2 train problems --boilerplate` (default 3; 0: the paper's rule as written).")
@click.option("--json", "as_json", is_flag=True, help="Print only the steps and their counts, as JSON.")
@_verify_options
def problems_paper_cmd(out_dir, data_dir, dapo, aops, euler, boilerplate, as_json, **o) -> None:
    """The paper's 42K RL problems in one command, step by step (train/data/paper_problems.py): the AoPS problems
    of OpenMathReasoning, those a strong model at --url reproduces (the paper: Qwen3-32B, 2 of 16), then DAPO,
    those and Project Euler merged, deduplicated and decontaminated. Each finished step is recorded in --out, so
    a rerun (after a kill, a server that went away) goes on from the step it stopped in."""
    import asyncio

    from rstar2_agent.benchmark_data import DataError

    from .data.paper_problems import PaperSources, beside_paper, build_paper_problems
    from .data.problems import BOILERPLATE_PROBLEMS

    defaults = PaperSources()
    sources = PaperSources(dapo or defaults.dapo, aops or defaults.aops, euler or defaults.euler)
    bar, on_problem = _progress("verify", lambda m: "")
    try:
        with bar:
            result = asyncio.run(build_paper_problems(
                out_dir, _verify_config(o), data_dir, sources,
                boilerplate=BOILERPLATE_PROBLEMS if boilerplate is None else boilerplate,
                on_step=lambda s: log.info("problems-paper: %s", s),
                on_problem=lambda i, n: on_problem(i, n, {})))
    except DataError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(result.as_json()))
        return
    for step in result.steps:
        when = "recorded before" if step.done_before else "now"
        click.echo(f"{step.step} ({when}): {step.counts.get('kept')} of {step.counts.get('read')} -> {step.out}")
    merge = result.steps[-1].counts
    click.echo("kept, beside the paper's: " + ", ".join(
        f"{name} {ours}" + (f" (paper {paper:,})" if paper else "") for name, ours, paper in beside_paper(merge)))
    click.echo(hits_line(merge.get("decontamination") or {}))
    click.echo(f"RL problems: {result.out} (an RL stage's data: {result.out})")


@train_group.command("rehearse")
@click.option("--fixtures", default="tests/data", show_default=True, type=click.Path(file_okay=False, exists=True),
              help="The hub's data as fixtures in each source's schema (layout: train/rehearsal.py Fixtures).")
@click.option("--out", default="runs/rehearsal", show_default=True, type=click.Path(file_okay=False),
              help="Where the three stages write (checkpoints, the store); emptied first.")
@click.option("--model", default="tiny", show_default=True, help="tiny: the embedded SmolLM2's 2-layer random "
              "variant (the machinery, in minutes); or a model name or folder (smollm2-135m) to learn something.")
@click.option("--eval-limit", type=click.IntRange(1), default=1, show_default=True,
              help="Problems per benchmark in the final `rstar2 eval paper`.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON at the end.")
def rehearse_cmd(fixtures, out, model, eval_limit, as_json) -> None:
    """The paper's pipeline end to end: the 14B recipes themselves (sft-qwen3-14b-base, rl-qwen3-14b-base-mi300x on
    its checkpoint, `rstar2 eval paper` on RL's) under the CPU scale-down overlay, printed first as a diff against
    the recipes, each hand-off between the stages checked on what the stages wrote."""
    import json
    import shutil
    from pathlib import Path

    from rstar2_agent.benchmark_data import DataError
    from rstar2_agent.models import ModelError

    from .rehearsal import HandOffError, Rehearsal

    shutil.rmtree(out, ignore_errors=True)
    try:
        figures = Rehearsal(Path(out), Path(fixtures), model, eval_limit, echo=click.echo).run()
    except HandOffError as e:
        raise click.ClickException(f"hand-off check failed: {e}") from e
    except (DataError, ModelError, ValueError) as e:  # a stage's own error (SFT's data errors are ValueErrors)
        raise click.ClickException(f"the rehearsal stopped: {e}") from e
    click.echo("rehearsal passed: every hand-off checked")
    if as_json:
        click.echo(json.dumps(figures))


def _recipe(cls, recipe: str, overrides: tuple[str, ...]):
    """The recipe (a YAML file or a name in train/recipes/) with key=value overrides, as a `cls` dataclass."""
    from . import recipe as recipes

    try:
        return recipes.load(cls, recipe, overrides)
    except RecipeError as e:
        raise click.UsageError(str(e)) from e


def _progress(label: str, info):
    """A rich progress bar over training steps (plain lines where the output is not a terminal) and its per-step
    callback."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from rstar2_agent.progress import PlainProgress

    bar = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
    task = bar.add_task(label, total=None, info="preparing data and model")
    plain = PlainProgress(bar.console, label)  # where the output is not a terminal: a line every 30 s

    def on_step(step: int, total: int, m: dict[str, float]) -> None:
        bar.update(task, total=total, completed=step, info=info(m))
        plain(step, total, info(m))

    return bar, on_step


if __name__ == "__main__":
    train_group()
