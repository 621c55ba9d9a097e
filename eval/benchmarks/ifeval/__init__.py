"""IFEval: 541 prompts with 25 kinds of verifiable instructions ("answer in at most 3 sentences", "no commas", ...).

As the paper ran it (section 5.1: the benchmark's own prompt, T 0): the prompt is the one user turn, no tool, one
greedy sample. The model's format renders it as for any conversation (its system prompt; the rStar2 formats also
their user prefix and `<reason>` opening, as the model's own template does), and what is checked is the text the
model gives the user (instructions.final_text: reasoning removed, an `<answer>` block's content).
A sample is correct when it follows every instruction strictly (prompt-level strict, the paper's number); the
report also gives prompt-level loose and instruction-level strict and loose, overall and per instruction type.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rstar2_agent.trajectory import Trajectory

from ..base import REASONING_BUDGET, Benchmark, BenchmarkSource, Context, Outcome, Problem, RunDefaults, sample_seed
from .instructions import check, final_text, kwargs_of

SOURCE = BenchmarkSource("ifeval", "google/IFEval", "train", "ifeval.jsonl",
                         ("key", "prompt", "instruction_id_list", "kwargs"), question="prompt")


class IFEval(Benchmark):
    name = "ifeval"
    checker = {"checker": "Google's instruction checks (if-verifiable 0.1.2)", "official": "lm-eval 0.4.13",
               "conformance": "4,990-4,995/5,000 prompts; the rest a letter Google's code draws at random "
                              "(rstar2 bench conformance, seed 0)"}
    source = SOURCE
    # One greedy sample, no tool (the paper: T 0). Neither the paper nor IFEval gives a response budget: ours, as for
    # BFCL v3 and Arena-Hard (base.py REASONING_BUDGET; lm-eval's IFEval task allows 1280, for a model that does not
    # reason first).
    defaults = RunDefaults(n=1, temperature=0.0, top_p=1.0, max_tokens=REASONING_BUDGET, max_turns=1)

    def problem(self, row: dict[str, Any], index: int) -> Problem:
        ids = list(row["instruction_id_list"])
        return Problem(str(row["key"]), str(row["prompt"]), json.dumps(ids),
                       meta={"instruction_id_list": ids, "kwargs": kwargs_of(row)})

    async def run(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        traj = await ctx.agent([{"role": "user", "content": problem.text}], tools=[], max_turns=1,
                               seed=sample_seed(ctx.seed, problem.id, sample_index), problem_prefix=False)
        outcome = self.grade_text(traj, problem)
        outcome.details["question"] = problem.text
        return outcome

    def grade_text(self, traj: Trajectory, problem: Problem) -> Outcome:
        response = final_text(traj.text)
        results = check(response, problem.meta["instruction_id_list"], problem.meta["kwargs"], problem.text)
        strict, loose = all(r.strict for r in results), all(r.loose for r in results)
        details = {"instructions": [{"id": r.instruction_id, "strict": r.strict, "loose": r.loose} for r in results],
                   "prompt_loose": loose, "checked": response}
        reason = "engine_error" if traj.stop_reason == "engine_error" else (
            None if strict else "empty_response" if not response else "instructions_not_followed")
        passed = sum(r.strict for r in results)
        return Outcome(traj, strict, f"{passed}/{len(results)} strict, {sum(r.loose for r in results)}/"
                       f"{len(results)} loose", problem.answer, reason, details)


def ifeval_scores(details: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """IFEval's four accuracies over samples' details (prompt-level: every instruction followed; instruction-level:
    over all instructions), and per instruction type."""
    prompts = strict_prompts = loose_prompts = 0
    per_type: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # n, strict, loose
    for d in details:
        items = d.get("instructions") or []
        prompts += 1
        strict_prompts += all(i["strict"] for i in items)
        loose_prompts += all(i["loose"] for i in items)
        for i in items:
            counts = per_type[i["id"]]
            counts[0] += 1
            counts[1] += i["strict"]
            counts[2] += i["loose"]
    total = sum(c[0] for c in per_type.values())
    if not prompts:
        return {}
    return {"prompts": prompts, "instructions": total,
            "prompt_strict": strict_prompts / prompts, "prompt_loose": loose_prompts / prompts,
            "instruction_strict": sum(c[1] for c in per_type.values()) / total if total else 0.0,
            "instruction_loose": sum(c[2] for c in per_type.values()) / total if total else 0.0,
            "per_type": {k: {"n": n, "strict": s / n, "loose": lo / n} for k, (n, s, lo) in sorted(per_type.items())}}
