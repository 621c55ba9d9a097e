"""Arena-Hard-Auto v0.1: 500 hard chat prompts; a judge model compares the model's answer with gpt-4-0314's, twice
with the positions swapped (rstar2_agent.eval.benchmarks.arena_hard.verdict has the judging and the score).

The model answers the prompt as the one user turn, no tool, one greedy sample (the paper: the benchmark's own
prompt, T 0; the benchmark's answers were generated at temperature 0 with up to 4096 tokens). The judged answer is
what the model gives the user (reasoning removed, an `<answer>` block's content). The judge is any OpenAI-compatible
chat endpoint (`--judge-url`, `--judge-model`, `--judge-api-key`; the benchmark's is gpt-4-1106-preview at T 0,
4096 tokens); without one, the model under test judges itself: a smoke test of the pipeline, not the benchmark.

Each judgment is stored the moment the judge answers (the store's `judgments` table, keyed by the judged answer's
hash), so a run that is killed, or whose judge fails on the second game, resumes without asking the judge about
the same answer again. A sample is stored when both games are judged; `correct` means the model won the prompt's
battles on balance; the score is the win rate over all battles (`arena_summary`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_agent.benchmark_data import DATA_ENV, DataError, data_dirs, hub_rows, read_jsonl
from rstar2_agent.store import Judgment, Sample

from ..base import REASONING_BUDGET, Benchmark, Context, Outcome, Problem, RunDefaults, sample_seed
from ..ifeval.instructions import final_text
from .verdict import (
    BASELINE,
    CONTINUE,
    JUDGE_ATTEMPTS,
    JUDGE_MAX_TOKENS,
    arena_score,
    game_messages,
    parse_verdict,
    prompt_battles,
)

HUB_ID = "lmarena-ai/arena-hard-auto"
QUESTIONS = ("arena_hard_v0.1_questions.jsonl", "data/arena-hard-v0.1/question.jsonl")
ANSWERS = ("arena_hard_v0.1_gpt-4-0314.jsonl", "data/arena-hard-v0.1/model_answer/gpt-4-0314.jsonl")


class JudgeError(RuntimeError):
    """The judge endpoint failed; the sample is retried (and stored as an error when it keeps failing)."""


@dataclass(frozen=True)
class JudgeSpec:
    """Where the judge is: an OpenAI-compatible chat endpoint, or None (the model under test judges itself)."""
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    max_tokens: int = JUDGE_MAX_TOKENS
    timeout: float = 600.0

    def label(self) -> str:
        return self.model or self.url or "self"


def _rows(names: tuple[str, str], data_dir: str | os.PathLike | None) -> list[dict[str, Any]]:
    local, hub_path = names
    dirs = data_dirs(data_dir)
    for d in dirs:
        if (d / local).is_file():
            return read_jsonl(d / local)
    try:
        return [dict(r) for r in hub_rows(HUB_ID, None, "train", data_files=hub_path)]
    except Exception as e:  # noqa: BLE001 - offline, missing: the same advice
        looked = ", ".join(str(d) for d in dirs) or f"nowhere (neither --data-dir nor ${DATA_ENV} is set)"
        raise DataError(f"no data for arena_hard: no {local} in {looked}, and {hub_path} of the hub dataset {HUB_ID} "
                        f"could not be loaded ({type(e).__name__}: {str(e)[:200]}). Put Arena-Hard-Auto v0.1's "
                        f"question.jsonl as {QUESTIONS[0]} and its gpt-4-0314 answers as {ANSWERS[0]} (the layout "
                        "with `uid`) in a folder and pass --data-dir FOLDER or set $RSTAR2_DATA_DIR.") from e


def baseline_answer(row: dict[str, Any]) -> str:
    """The baseline's answer text: the assistant message's `content.answer` (the current layout), or the first
    choice's first turn (the layout before 2025-04)."""
    if "messages" in row:
        content = row["messages"][-1]["content"]
        return content["answer"] if isinstance(content, dict) else str(content)
    return row["choices"][0]["turns"][0]["content"]


def _uid(row: dict[str, Any]) -> str:
    return str(row.get("uid") or row["question_id"])


class ArenaHard(Benchmark):
    name = "arena_hard"
    defaults = RunDefaults(n=1, temperature=0.0, top_p=1.0, max_tokens=REASONING_BUDGET, max_turns=1)

    def __init__(self, judge: JudgeSpec | None = None):
        self.judge = judge or JudgeSpec()
        self._client = None

    def settings(self) -> dict[str, Any]:
        return super().settings() | {"judge": self.judge.label(), "baseline": BASELINE}

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
        answers = {_uid(r): baseline_answer(r) for r in _rows(ANSWERS, data_dir)}
        problems = []
        for row in _rows(QUESTIONS, data_dir):
            uid = _uid(row)
            question = row["prompt"] if "prompt" in row else row["turns"][0]["content"]
            if uid not in answers:
                raise DataError(f"arena_hard: the {BASELINE} answers have none for question {uid}; use the "
                                "benchmark's own answer file")
            problems.append(Problem(uid, question, BASELINE, self.name,
                                    meta={"baseline": answers[uid], "cluster": row.get("cluster")}))
        return problems[:limit] if limit else problems

    async def run(self, problem: Problem, sample_index: int, ctx: Context) -> Outcome:
        traj = await ctx.agent([{"role": "user", "content": problem.text}], tools=[], max_turns=1,
                               seed=sample_seed(ctx.seed, problem.id, sample_index), problem_prefix=False)
        answer = final_text(traj.text)
        details: dict[str, Any] = {"question": problem.text, "answer": answer, "judge": self.judge.label()}
        if traj.stop_reason == "engine_error":
            return Outcome(traj, False, None, problem.answer, "engine_error", details)
        baseline = problem.meta["baseline"]
        games = []
        try:
            for game, (a, b) in enumerate(((baseline, answer), (answer, baseline)), 1):
                games.append(await self._game(problem, sample_index, game, a, b, answer, ctx))
        except JudgeError as e:
            traj.stop_reason, traj.error = "engine_error", f"judge: {e}"
            return Outcome(traj, False, None, problem.answer, "judge_error", details)
        verdicts = [g.verdict for g in games]
        battles = prompt_battles(*verdicts)
        details |= {"games": [{"game": g.game, "model_is": "B" if g.game == 1 else "A", "verdict": g.verdict,
                               "judgment": g.text} for g in games], "battles": battles}
        won = bool(battles) and sum(battles) / len(battles) > 0.5
        reason = None if won else ("no_verdict" if not battles else "not_better")
        return Outcome(traj, won, " / ".join(str(v) for v in verdicts), problem.answer, reason, details)

    async def _game(self, problem: Problem, sample_index: int, game: int, answer_a: str, answer_b: str,
                    answer: str, ctx: Context) -> Judgment:
        import asyncio

        store, run_id = ctx.extra.get("store"), ctx.extra.get("run_id")
        sha = hashlib.sha256(answer.encode()).hexdigest()
        key = dict(problem_id=problem.id, sample_index=sample_index, game=game, judge=self.judge.label(),
                   answer_sha=sha)
        if store is not None:
            stored = await asyncio.to_thread(store.judgment, run_id, **key)
            if stored is not None:
                return stored
        messages = game_messages(problem.text, answer_a, answer_b)
        text, verdict, reply = "", None, ""
        for attempt in range(JUDGE_ATTEMPTS):
            if attempt:
                messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": CONTINUE}]
            reply = await self._ask(messages, ctx)
            text += ("\n" if text else "") + reply
            verdict = parse_verdict(text)
            if verdict is not None or _labels_disagree(text):
                break
        judgment = Judgment(run_id=run_id, verdict=verdict, text=text, **key)
        if store is not None:
            await asyncio.to_thread(store.add_judgment, judgment)
        return judgment

    async def _ask(self, messages: list[dict[str, str]], ctx: Context) -> str:
        if self.judge.url is None:  # the model under test judges (a smoke test)
            traj = await ctx.agent(messages, tools=[], max_turns=1, seed=0, problem_prefix=False)
            if traj.stop_reason == "engine_error":
                raise JudgeError(traj.error or "the engine failed")
            return final_text(traj.text) or traj.text
        import openai

        if self._client is None:
            base = self.judge.url.rstrip("/")
            self._client = openai.AsyncOpenAI(base_url=base if base.endswith("/v1") else base + "/v1",
                                              api_key=self.judge.api_key or "none", timeout=self.judge.timeout,
                                              max_retries=0)
        try:
            model = self.judge.model or (await self._client.models.list()).data[0].id
            resp = await self._client.chat.completions.create(model=model, messages=messages, temperature=0.0,
                                                              max_tokens=self.judge.max_tokens)
        except openai.OpenAIError as e:
            raise JudgeError(f"{type(e).__name__}: {e}") from e
        return resp.choices[0].message.content or ""

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _labels_disagree(text: str) -> bool:
    """The judgment wrote several different labels: v0.1 leaves it without a verdict and does not ask again."""
    import re

    return len(set(re.findall(r"\[\[([AB<>=]+)\]\]", text.upper()))) > 1


def arena_summary(samples: Sequence[Sample], rounds: int = 100, level: float = 0.95) -> dict[str, Any]:
    """The score, its bootstrap interval and the verdict counts of a run's stored samples."""
    games = [tuple((s.details or {}).get("games", [{}, {}])[i].get("verdict") for i in (0, 1)) for s in samples]
    counts: dict[str, int] = {}
    for g in games:
        for v in g:
            counts[v or "no verdict"] = counts.get(v or "no verdict", 0) + 1
    about = {"judge": next(((s.details or {}).get("judge") for s in samples), None), "baseline": BASELINE,
             "verdicts": counts}
    score = arena_score(games, rounds=rounds, level=level)
    if score is None:
        return {"prompts": 0, "dropped": len(games), **about}
    return {"score": score.score, "ci": [score.lo, score.hi], "level": level, "rounds": rounds,
            "prompts": score.prompts, "dropped": score.dropped, "battles": score.battles, **about}
