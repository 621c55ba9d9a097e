"""The paper's pipeline rehearsed: the 14B recipes themselves, chained as a cluster would chain them
(`sft-qwen3-14b-base`, then `rl-qwen3-14b-base-mi300x` on its checkpoint, then `rstar2 eval paper` on RL's),
under one named scale-down overlay, with every hand-off between the stages checked on what the stages wrote, and
every RL stage training: at least one real update through the 14B recipe's own update path (its PPO mini-batches,
token-budget micro-batches, chunked logprobs, gradient checkpointing, Ray's FSDP ranks over gloo), the new weights
pushed to the rollout worker and the push checked (train/push_check.py).

The overlay (`cpu_overlay`) changes only what a CPU cannot hold: the model (the embedded SmolLM2's 2-layer random
variant by default, or the embedded SmolLM2 itself), counts and budgets (steps, prompts, tokens, examples a step,
ranks and actors), the hub sources (read from fixtures in each source's own schema), bf16 (fp32 on CPU), where
things are written, and, each named beside its line of the printed diff (`DEPARTURES`):
- SFT's data: the paper's mix plus the RL fixture problems as SFT rows in the format's full shape, each answering
  its problem (`fixture_rows`, FIXTURE_COPIES times each). They stand in for what the paper's Qwen3-14B-Base brings
  to its RL problems (it solves some before RL), as `make train`'s 16 rows of RL's families do: without them a
  small model answers none of RL's problems, every group is all wrong, RoC drops it and no stage ever updates. The
  grader is RL's own; the policy still misses some samples, so groups hold right and wrong rollouts;
- SFT's learning rate, for a few-step CPU SFT (the 14B's 5e-6 moves a small model nowhere in that many steps);
- seeded rollouts (the recipe leaves them off for vLLM's batched sampler), so the rehearsal reproduces.
The start check keeps the recipe's threshold (`start_check.min_answer_share`), which the SFT'd policy passes.
Everything else is the recipes' own: the format, the SFT mix and its target shape, RoC, the loss, the update's
settings, the stages with their filter and optimizer reset, the staleness, `distributed: ray` (a local cluster of
CPU actors), the answer extraction. `diff` prints it against the recipes.

The hand-offs, each raising `HandOffError` with what to fix:
- the recipes chain: RL's `model` is SFT's `out`/last, and both train in the same format;
- SFT's data: every source's targets in the format's full shape (each call after a closed `</reason>`, each
  final turn in an answer block: what the RL reward reads), as the SFT run recorded it;
- RL's start: the preflight's answer and signal shares on the first step's rollouts, recorded (the RL run itself
  stops below the recipe's thresholds);
- RL trains: every stage took at least one update (kept rollouts: `update_tokens` > 0), with its gradient norm,
  and every update's push was checked (`push_probe_*`), else the stage is named (`check_rl_updates`);
- eval: `rstar2 eval paper` reads the format and the answer extraction RL rewarded from the checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_agent.models import resolve_model, tiny_variant
from rstar2_agent.processes import end_tree
from rstar2_agent.store import Store

from . import recipe as recipes
from .config import RLConfig, SFTConfig
from .rl import run_rl
from .run_frame import run_name
from .sft import run_sft

SFT_RECIPE = "sft-qwen3-14b-base"
RL_RECIPE = "rl-qwen3-14b-base-mi300x"
OVERLAY = "cpu"  # the one overlay: a CPU machine of 2 cores or more
SFT_EPOCHS = 1.0
SFT_LR = 1e-2  # the random tiny model's; a pretrained one (--model smollm2-135m) takes PRETRAINED_SFT_LR
PRETRAINED_SFT_LR = 3e-4  # measured: 8 one-example steps teach SmolLM2-135M the answer shape on the fixture prompts
SFT_BATCH = 1  # examples a step
FIXTURE_COPIES = 48  # each RL fixture problem's row, this many times in the SFT data
EVAL_TIMEOUT_S = 1800.0


class HandOffError(RuntimeError):
    """What one stage made is not what the next needs."""


@dataclass
class Fixtures:
    """Where the rehearsal reads the hub's data: `root`/sft/ORG/NAME (local copies of the SFT mix's hub sets),
    `root`/problems/{dapo,euler}.jsonl (RL's sources in their hub schemas), `root`/problems/benchmarks and `root`
    (benchmark mirrors, for decontamination and for eval)."""
    root: Path

    @property
    def hub_dir(self) -> Path:
        return self.root / "sft"

    def problems(self, kind: str) -> Path:
        return self.root / "problems" / f"{kind}.jsonl"

    @property
    def benchmarks(self) -> Path:
        return self.root / "problems" / "benchmarks"

    def eval_dir(self, out: Path) -> Path:
        """One folder of every benchmark mirror (links), as `rstar2 eval paper --data-dir` reads them."""
        folder = out / "eval-data"
        folder.mkdir(parents=True, exist_ok=True)
        for src in [*self.root.glob("*.jsonl"), *self.benchmarks.glob("*.jsonl")]:
            link = folder / src.name
            if not link.exists():
                link.symlink_to(src.resolve())
        return folder

    def check(self) -> None:
        needed = [self.hub_dir, self.problems("dapo"), self.problems("euler"), self.benchmarks]
        missing = [str(p) for p in needed if not p.exists()]
        if missing:
            raise HandOffError(f"the rehearsal's fixtures are missing {', '.join(missing)}: give --fixtures the "
                               "folder laid out as train/rehearsal.py's Fixtures says (the checkout's tests/data)")


# why the overlay departs from the recipes where a reason is not plain scale (printed beside the diff's line)
DEPARTURES = {
    "data": "+ the RL fixture problems as SFT rows (fixture_rows): the prior on RL's problems a pretrained base brings",
    "optim.lr": "a few-step CPU SFT of a small model learns nothing at the 14B's 5e-6",
    "seeded_rollouts": "seeded: the rehearsal's rollouts are reproducible (vLLM's batched sampler is not here)",
}
FIXTURE_ROWS = "rl-fixture-rows.jsonl"  # under the rehearsal's out


def cpu_overlay(sft: SFTConfig, rl: RLConfig, model: str, out: Path, fx: Fixtures, sft_lr: float = SFT_LR
                ) -> tuple[dict, dict]:
    """The scale-down overlay as dotted-key changes to each recipe (`recipe.load(..., changes=...)`)."""
    db = str(out / "rehearsal.db")
    # SFT: the paper's mix, plus the RL fixture problems as rows in the format's full shape (`fixture_rows`), one
    # example a step at a small model's learning rate: the start policy answers RL's problems, some of the time; RL
    # keeps the recipe's start check (start_check.min_answer_share), which that policy passes
    sft_changes = {"model": model, "hub_dir": str(fx.hub_dir), "batch_examples": SFT_BATCH, "epochs": SFT_EPOCHS,
                   "optim.lr": sft_lr, "data": [*sft.data, str(out / FIXTURE_ROWS)], "dtype": "fp32",
                   "out": str(out / "sft"), "db": db}
    data = [f"dapo:{fx.problems('dapo')}", f"euler:{fx.problems('euler')}"]
    # one step a stage, each stage's other settings kept (turns, filter, optimizer reset)
    stages = [{**dataclasses.asdict(s), "steps": 1, "max_response_tokens": 48, "data": data} for s in rl.stages]
    rl_changes = {
        "model": str(out / "sft" / "last"), "stages": stages, "prompts_per_step": 2, "group_size": 4,
        "micro_batch_tokens": 1024, "logprob_chunk_tokens": 64, "gpu_memory_gib": 0.0, "dtype": "fp32",
        "seeded_rollouts": True, "out": str(out / "rl"), "db": db, "data_dir": str(fx.benchmarks),
        "ray.address": None, "ray.learners": 2, "ray.gpus_per_learner": 0.0, "ray.cpus_per_learner": 0.5,
        "ray.rollout_workers": 1, "rollout_engine": "hf", "ray.gpus_per_rollout_worker": 0.0,
        "ray.cpus_per_rollout_worker": 0.5, "engine_options": {}, "ray.sandbox_actors": 1,
        "ray.cpus_per_sandbox_actor": 0.25, "sandbox_workers": 2, "ray.sandbox_resources": {},
    }
    return sft_changes, rl_changes


def fixture_rows(rl: RLConfig, path: Path, copies: int = 1) -> int:
    """The RL stages' fixture problems (stage 1's pool, as RL curates it) as SFT chat rows in the format's full
    shape, each answering its problem: `<reason></reason><answer>\\boxed{ANSWER}</answer>` (the generation
    prompt opens the reasoning). They stand in for what the paper's Qwen3-14B-Base brings to its RL problems (it
    solves some before RL), as `make train`'s 16 rows of RL's families do (train/recipes/sft-smollm2-cpu.yaml): a
    small model SFT'd on the mix alone answers none of them, and RL would have no group to learn from. Returns the
    number of rows."""
    from .data.pool import stage_pool

    problems = sorted(stage_pool(rl.stages[0], rl).values(), key=lambda p: p.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in [p for p in problems for _ in range(copies)]:
            f.write(json.dumps({"messages": [
                {"role": "user", "content": p.text},
                {"role": "assistant", "content": f"</reason><answer>\\boxed{{{p.answer}}}</answer>"}]}) + "\n")
    return len(problems) * copies


@dataclass
class Rehearsal:
    out: Path
    fixtures: Path
    model: str = "tiny"  # tiny: the embedded SmolLM2's 2-layer random variant; else a model name or folder
    eval_limit: int = 1
    eval_timeout_s: float = EVAL_TIMEOUT_S
    echo: Callable[[str], None] = print
    figures: dict[str, Any] = field(default_factory=dict)

    def configs(self) -> tuple[tuple[SFTConfig, SFTConfig], tuple[RLConfig, RLConfig]]:
        """(recipe, rehearsed) for SFT and for RL."""
        fx = Fixtures(self.fixtures)
        sft, rl = recipes.load(SFTConfig, SFT_RECIPE), recipes.load(RLConfig, RL_RECIPE)
        model = self.model
        if model == "tiny":
            model = str(tiny_variant(resolve_model("smollm2-135m").path, self.out / "tiny-smollm2"))
        sft_changes, rl_changes = cpu_overlay(sft, rl, model, self.out, fx,
                                              SFT_LR if self.model == "tiny" else PRETRAINED_SFT_LR)
        return ((sft, recipes.load(SFTConfig, SFT_RECIPE, changes=sft_changes)),
                (rl, recipes.load(RLConfig, RL_RECIPE, changes=rl_changes)))

    def run(self) -> dict[str, Any]:
        fx = Fixtures(self.fixtures)
        fx.check()
        self.out.mkdir(parents=True, exist_ok=True)
        (sft_plain, sft), (rl_plain, rl) = self.configs()
        self.echo(overlay_text(sft_plain, sft, rl_plain, rl))
        check_chain(sft_plain, rl_plain)
        check_chain(sft, rl)

        rows = fixture_rows(rl, self.out / FIXTURE_ROWS, FIXTURE_COPIES)
        self.echo(f"SFT data: the paper's mix and {rows} rows of the RL fixture problems ({FIXTURE_ROWS})")
        started = time.monotonic()
        final_sft, history = run_sft(sft)
        self.figures["sft"] = {"steps": len(history), "s": round(time.monotonic() - started, 1),
                               "sources": check_sft_shapes(Store(sft.db), run_name(sft))}
        self.echo(f"SFT: {len(history)} steps, loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}, "
                  f"{self.figures['sft']['s']} s; targets in the {sft.format} shape: "
                  + ", ".join(f"{s['source']} {s['in_shape']:.0%}" for s in self.figures["sft"]["sources"]))

        started = time.monotonic()
        final_rl, history = asyncio.run(run_rl(rl))
        self.figures["rl"] = {"steps": len(history), "s": round(time.monotonic() - started, 1),
                              **check_rl_start(history), "stages": check_rl_updates(history, len(rl.stages))}
        meta = json.loads((final_rl / "rstar2.json").read_text())
        if meta.get("format") != sft.format:
            raise HandOffError(f"the RL checkpoint says format {meta.get('format')!r}, SFT trained {sft.format!r}")
        self.echo(f"RL: {len(history)} steps over {len(rl.stages)} stages, {self.figures['rl']['s']} s; preflight "
                  f"answer share {self.figures['rl']['start_answer_share']:.2f}, signal share "
                  f"{self.figures['rl']['start_signal_share']:.2f}; checkpoint {meta['format']}, answers read by "
                  f"{meta.get('answer_extraction')!r}")
        for st in self.figures["rl"]["stages"]:
            move = (f"the engine made {st['push_probe_move_share']:.0%} of the learner's move"
                    if st["push_probe_move_decided"] else "its move not yet decisive")
            self.echo(f"  RL stage {st['stage']}: {st['updates']} update(s) of {st['steps']} step(s), "
                      f"{st['kept_rollouts']} rollouts kept ({st['update_tokens']} tokens), gradient norm "
                      f"{st['grad_norm']:.4g}; push checked: probe gap {st['push_probe_max_abs_diff']:.3g} "
                      f"(bound {st['push_probe_bound']:.3g}), {move}")

        started = time.monotonic()
        self.run_eval(final_rl, fx, rl.db)
        self.figures["eval"] = {"s": round(time.monotonic() - started, 1),
                                **check_eval_reads_the_checkpoint(Store(rl.db), meta)}
        self.echo(f"eval paper: {self.figures['eval']['runs']} benchmark runs in format {meta['format']} with "
                  f"extraction {meta.get('answer_extraction')!r}, {self.figures['eval']['s']} s")
        return self.figures

    def run_eval(self, model: Path, fx: Fixtures, db: str) -> None:
        """`rstar2 eval paper` on the RL checkpoint, as a user runs it (a child process, ended with this one)."""
        args = [sys.executable, "-m", "rstar2_agent.cli", "eval", "paper", "--model", str(model), "--limit",
                str(self.eval_limit), "--n", "1", "--max-tokens", "48", "--max-turns", "2", "--categories", "simple",
                "--concurrency", "4", "--data-dir", str(fx.eval_dir(self.out)), "--db", db, "--run", "rehearsal"]
        proc = subprocess.Popen(args, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        try:
            code = proc.wait(timeout=self.eval_timeout_s)
        except subprocess.TimeoutExpired:
            raise HandOffError(f"rstar2 eval paper did not end within {self.eval_timeout_s:.0f} s") from None
        finally:
            end_tree(proc.pid, grace=5.0)
        if code != 0:
            raise HandOffError(f"rstar2 eval paper on the RL checkpoint failed (exit {code}): see its output above")


def overlay_text(sft_plain: SFTConfig, sft: SFTConfig, rl_plain: RLConfig, rl: RLConfig) -> str:
    """The overlay as a diff against the recipes: one line per changed key."""
    lines = [f"rehearsal overlay {OVERLAY!r}: what differs from the recipes (everything else is theirs)"]
    for name, before, after in ((SFT_RECIPE, sft_plain, sft), (RL_RECIPE, rl_plain, rl)):
        lines.append(f"--- {name}")
        lines += [f"  {key}: {_short(a)} -> {_short(b)}" + (f"  # {DEPARTURES[key]}" if key in DEPARTURES else "")
                  for key, a, b in recipes.diff(before, after)]
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 70 else text[:33] + "..." + text[-33:]


def check_chain(sft: SFTConfig, rl: RLConfig) -> None:
    """RL starts from what SFT writes, in the format SFT taught."""
    if Path(rl.model) != Path(sft.out) / "last":
        raise HandOffError(f"RL's model {rl.model!r} is not SFT's checkpoint {sft.out}/last: set the RL recipe's "
                           "model to the SFT recipe's out/last")
    if rl.format != sft.format:
        raise HandOffError(f"SFT trains format {sft.format!r} and RL prompts in {rl.format!r}: give both the same "
                           "format")


def check_sft_shapes(store: Store, name: str) -> list[dict[str, Any]]:
    """Every source's share of targets in the format's full shape, as the SFT run recorded it: all of them."""
    (run,) = store.runs(name)
    sources = [{"source": s["source"], "examples": s["examples"], "in_shape_as_written": s["in_shape_as_written"],
                "in_shape": s["in_shape"]} for s in run.info["sources"]]
    short = [s for s in sources if s["in_shape"] is None or s["in_shape"] < 1.0]
    if short or not sources:
        raise HandOffError("SFT trained targets outside the format RL rewards: " + ", ".join(
            f"{s['source']} {s['in_shape']}" for s in short) + " (set target_shape: format in the SFT recipe)")
    return sources


def check_rl_start(history: list[dict[str, float]]) -> dict[str, float]:
    """The preflight's figures on the first step's rollouts."""
    first = history[0] if history else {}
    figures = {k: first[k] for k in ("start_answer_share", "start_signal_share") if k in first}
    if len(figures) != 2:
        raise HandOffError("RL's first step recorded no preflight figures (start_answer_share, start_signal_share)")
    return figures


def check_rl_updates(history: list[dict[str, float]], stages: int) -> list[dict[str, Any]]:
    """Per RL stage: the updates it took (steps whose update had kept rollouts: `update_tokens` > 0), their mean
    gradient norm, and the check of each such update's weight push (its `push_probe_*` figures; the bound from the
    run's calibration). A stage that took no update, or whose push went unchecked, stops the rehearsal: its RL
    would not have trained (every group all right or all wrong, dropped by RoC)."""
    bound = next((h["push_probe_bound"] for h in history if "push_probe_bound" in h), None)
    out = []
    for index in range(stages):
        steps = [h for h in history if int(h.get("stage", -1)) == index]
        updated = [h for h in steps if h.get("update_tokens", 0) > 0]
        if not updated:
            raise HandOffError(f"RL stage {index + 1} took no update in its {len(steps)} step(s): every group was all "
                               "right or all wrong (RoC dropped them), so nothing was trained, pushed or checked; give "
                               "the start policy a signal on the stage's problems (the SFT rows of the RL fixtures)")
        unchecked = [h for h in updated if "push_probe_max_abs_diff" not in h]
        if unchecked or bound is None:
            raise HandOffError(f"RL stage {index + 1} updated without a checked weight push (no push_probe figures): "
                               "turn the recipe's push_check on")
        last = updated[-1]
        out.append({"stage": index + 1, "updates": len(updated), "steps": len(steps),
                    "kept_rollouts": sum(int(h.get("roc_kept_positive", 0) + h.get("roc_kept_negative", 0))
                                         for h in updated),
                    "update_tokens": sum(int(h["update_tokens"]) for h in updated),
                    "grad_norm": sum(h["grad_norm"] for h in updated) / len(updated),
                    "push_probe_max_abs_diff": max(h["push_probe_max_abs_diff"] for h in updated),
                    "push_probe_bound": bound,
                    "push_probe_move_decided": last.get("push_probe_move_decided", 0.0),
                    "push_probe_move_share": last.get("push_probe_move_share", 0.0)})
    return out


def check_eval_reads_the_checkpoint(store: Store, meta: dict[str, Any]) -> dict[str, Any]:
    """Every benchmark run of `rstar2 eval paper` graded in the checkpoint's format with its answer extraction."""
    runs = [r for r in store.runs("rehearsal") if r.kind == "eval"]
    if not runs:
        raise HandOffError("rstar2 eval paper stored no run")
    math_runs = [r for r in runs if r.config.get("use_tools", True) and r.benchmark != "bfcl_v3"]
    wrong = [f"{r.benchmark}: {r.config.get('format')}/{r.config.get('answer_extraction')}" for r in math_runs
             if (r.config.get("format"), r.config.get("answer_extraction"))
             != (meta["format"], meta.get("answer_extraction"))]
    if wrong:
        raise HandOffError(f"eval did not read the checkpoint's format {meta['format']!r} and extraction "
                           f"{meta.get('answer_extraction')!r}: {', '.join(wrong)}")
    return {"runs": len(runs), "checked": sorted(r.benchmark for r in math_runs)}
