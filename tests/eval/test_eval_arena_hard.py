"""Arena-Hard v0.1: verdict parsing (every label, malformed judgments), the two games with the positions swapped, the
score and its bootstrap interval on fixed judgments, and through the real eval path with a scripted contestant and
judge behind real HTTP endpoints: each judgment stored as the judge answers, and a run whose judge failed halfway
(and one killed with SIGKILL) resumed without asking the judge about the same answer twice."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException

from rstar2_agent.eval.benchmarks import JudgeSpec, get_benchmark, get_benchmarks
from rstar2_agent.eval.benchmarks.arena_hard.verdict import (
    CONTINUE,
    JUDGE_SYSTEM,
    LABELS,
    arena_score,
    model_battles,
    parse_verdict,
    prompt_battles,
)
from rstar2_agent.eval.harness import ModelSource, evaluate
from rstar2_agent.eval.paper import paper_row
from rstar2_agent.eval.report import load, write_outputs
from rstar2_agent.eval.runner import EvalConfig
from rstar2_agent.store import Store

from conftest import until, uvicorn_app

FIXTURE = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


# ------------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("label", LABELS)
def test_every_label_is_read(label):
    assert parse_verdict(f"My own answer first. ... My final verdict is: [[{label}]]") == label


@pytest.mark.parametrize(("judgment", "verdict"), [
    ("Assistant B is better: [[b>a]]", "B>A"),  # upper-cased
    ("Tie. [A=B]", "A=B"),  # the single-bracket fallback when there is no [[...]]
    ("[[A>B]] ... so again [[A>B]]", "A>B"),  # the same label twice is one verdict
    ("I cannot decide.", None),  # no label
    ("", None),
    ("First [[A>B]], on reflection [[B>A]]", None),  # two different labels: no verdict (v0.1)
    ("[[A>>>B]]", None),  # not a label
    ("[[AB]]", None),
    ("Assistant A [[A<B]]", "A<B"),  # the mirrored forms of the same verdicts are known too
])
def test_malformed_and_odd_judgments(judgment, verdict):
    assert parse_verdict(judgment) == verdict


def test_game_one_has_the_baseline_as_a_and_game_two_swaps():
    assert prompt_battles("A>>B", "A>>B") == [0, 0, 0, 1, 1, 1]  # A wins both: the baseline, then the model
    assert prompt_battles("B>A", "A>B") == [1, 1]  # the model wins both games
    assert prompt_battles("A=B", "B=A") == [0.5, 0.5]
    assert prompt_battles("B>>A", None) == []  # a game without a verdict drops the prompt
    assert model_battles("B<<A", model_is_a=True) == [1, 1, 1]


def test_the_score_and_its_bootstrap_on_fixed_judgments():
    games = [("B>>A", "A>>B"), ("A=B", "A=B"), ("A>B", "B>A"), (None, "A>B")]
    s = arena_score(games, rounds=100, level=0.95, seed=0)
    # battles: 6 wins, 2 ties, 2 losses -> (6 + 1) / 10
    assert (s.score, s.prompts, s.dropped, s.battles) == (0.7, 3, 1, 10)
    assert 0.0 <= s.lo <= 0.7 <= s.hi <= 1.0 and s.lo < s.hi
    assert arena_score(games, rounds=100, level=0.95, seed=0) == s  # the same seed, the same interval
    narrow = arena_score(games, rounds=100, level=0.5, seed=0)
    assert s.lo <= narrow.lo <= narrow.hi <= s.hi
    assert arena_score([(None, None)]) is None
    many = arena_score([("B>A", "A>B")] * 40 + [("A>B", "B>A")] * 40)
    assert many.score == 0.5 and 0.35 < many.lo < 0.5 < many.hi < 0.65


# ------------------------------------------------------------------------------------------ the eval path
# The scripted contestant's answers, and how the judge rates each prompt (from assistant A's side when the model
# is A): "a1" the model is much better, "b2" a tie, "c3" the baseline slightly better after a judgment without a
# label (the judge is asked to finish).
MODEL = {"sky": "MODEL: Rayleigh scattering.", "turtle": "MODEL: Sheldon.", "HTTP": "MODEL: HyperText Transfer."}
RATING = {"sky": (">>", "model"), "turtle": ("=", None), "HTTP": (">", "baseline")}


def scripted(fail_once: set[tuple[str, int]] | None = None, hang: set[tuple[str, int]] | None = None) -> FastAPI:
    """One OpenAI chat endpoint playing both the contestant and the judge; it counts the judge's calls per
    (prompt, game) and fails (HTTP 500) or hangs the first call of the games named."""
    app = FastAPI()
    app.state.judge_calls = {}
    app.state.release = asyncio.Event()  # ends the hanging calls (a server shutting down waits for them)
    fail_once, hang = set(fail_once or ()), set(hang or ())

    def reply(body: dict, text: str) -> dict:
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> dict:
        messages = body["messages"]
        if messages[0]["content"] != JUDGE_SYSTEM:
            assert [m["role"] for m in messages] == ["user"] and body["temperature"] == 0
            return reply(body, next(a for k, a in MODEL.items() if k in messages[0]["content"]))
        assert body["model"] == "judge-1" and body["temperature"] == 0
        user = messages[1]["content"]
        key = next(k for k in MODEL if k in user.split("<|The Start of Assistant A's Answer|>")[0])
        a_part = user.split("<|The Start of Assistant A's Answer|>")[1]
        game = 2 if a_part.lstrip().startswith("MODEL:") else 1
        if len(messages) == 2:
            app.state.judge_calls[(key, game)] = app.state.judge_calls.get((key, game), 0) + 1
            if (key, game) in fail_once:
                fail_once.discard((key, game))
                raise HTTPException(500, "judge overloaded")
            if (key, game) in hang:
                hang.discard((key, game))
                await app.state.release.wait()
                raise HTTPException(503, "released")
        strength, winner = RATING[key]
        if key == "HTTP" and len(messages) == 2:
            return reply(body, "Let me think about both answers.")  # no label: the judge is asked to go on
        if key == "HTTP":
            assert messages[-1] == {"role": "user", "content": CONTINUE}
        if winner is None:
            label = "A=B"
        else:
            a_wins = (winner == "model") == (game == 2)
            label = f"A{strength}B" if a_wins else f"B{strength}A"
        return reply(body, f"My answer: ... My final verdict is [[{label}]]")

    return app


def judge_rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT problem_id, game, verdict FROM judgments ORDER BY problem_id, game").fetchall()


async def test_judged_through_the_eval_path_and_resumed_without_asking_twice(tmp_path):
    app = scripted(fail_once={("turtle", 2)})
    store = Store(tmp_path / "eval.db")
    cfg = EvalConfig(api="chat", use_tools=False, retries=0)
    async with uvicorn_app(app) as url:
        judge = JudgeSpec(url=url, model="judge-1")
        benches = get_benchmarks(["arena_hard"], judge=judge)
        await evaluate(["arena_hard"], ModelSource(urls=[url], served_model="contestant"), cfg, store, "ah",
                       str(FIXTURE), benchmarks=benches)
        # the judge failed on the tie prompt's second game: that sample is an error, its first game is stored
        (first,) = load(store, "ah")
        assert len(first.samples) == 2 and first.errors == 1
        assert len(judge_rows(tmp_path / "eval.db")) == 5
        await evaluate(["arena_hard"], ModelSource(urls=[url], served_model="contestant"), cfg, store, "ah",
                       str(FIXTURE), benchmarks=get_benchmarks(["arena_hard"], judge=judge))
    assert app.state.judge_calls == {(k, g): 1 + ((k, g) == ("turtle", 2)) for k in MODEL for g in (1, 2)}
    uid = {"sky": "a1" * 16, "turtle": "b2" * 16, "HTTP": "c3" * 16}
    assert judge_rows(tmp_path / "eval.db") == sorted([
        (uid["sky"], 1, "B>>A"), (uid["sky"], 2, "A>>B"), (uid["turtle"], 1, "A=B"), (uid["turtle"], 2, "A=B"),
        (uid["HTTP"], 1, "A>B"), (uid["HTTP"], 2, "B>A")])
    (result,) = load(store, "ah")
    a = result.summary["arena"]
    assert result.errors == 0 and (a["score"], a["prompts"], a["battles"]) == (0.7, 3, 10)
    assert a["judge"] == "judge-1" and result.run.config["judge"] == "judge-1"
    by_id = {s.problem_id: s for s in result.samples}
    assert by_id[uid["sky"]].correct and not by_id[uid["HTTP"]].correct
    assert by_id[uid["HTTP"]].details["games"][0]["judgment"].startswith("Let me think")
    row = paper_row("arena_hard", result)
    assert row.score == 70.0 and row.interval.method == "bootstrap" and row.paper == 86.6
    html = write_outputs(store, "ah", tmp_path / "out")[2].read_text()
    assert "win rate vs gpt-4-0314" in html and "game 2 (the model is assistant A)" in html


async def test_a_run_killed_while_judging_resumes_without_asking_twice(tmp_path):
    """The CLI in a subprocess; the judge hangs on one game; the run is killed with SIGKILL once the other
    judgments are stored; the same command resumes and asks the judge only what it has no answer to."""
    app = scripted(hang={("HTTP", 2)})
    db = tmp_path / "eval.db"
    async with uvicorn_app(app) as url:
        args = [RSTAR2, "eval", "arena_hard", "--url", url, "--api", "chat", "--served-model", "contestant",
                "--no-tools", "--judge-url", url, "--judge-model", "judge-1", "--data-dir", str(FIXTURE), "--db",
                str(db), "--run", "killed"]
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        try:
            # the hung call must have arrived too: killed between storing game 1 and asking game 2, the resumed
            # run would meet the hang itself (already released: a 503) and retry the game
            await until(lambda: db.exists() and len(judge_rows(db)) >= 5 and ("HTTP", 2) in app.state.judge_calls,
                        "five of the six judgments stored and the sixth asked", timeout=120)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        app.state.release.set()
        assert len(judge_rows(db)) == 5, "the run should have been killed with one game left"
        app.state.judge_calls.clear()
        done = await asyncio.create_subprocess_exec(*args[:-1], "killed", stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 300)
        assert done.returncode == 0, err.decode()[-2000:]
    # only the hung game was asked again (it was never answered, so nothing of it was stored)
    assert app.state.judge_calls == {("HTTP", 2): 1}
    assert len(judge_rows(db)) == 6
    assert "Arena-Hard v0.1" in out.decode() + err.decode()


def test_the_judge_and_baseline_are_part_of_the_runs_settings():
    assert get_benchmark("arena_hard", judge=JudgeSpec(model="gpt-4-1106-preview")).settings() == {
        "judge": "gpt-4-1106-preview", "baseline": "gpt-4-0314"}
    assert get_benchmark("arena_hard").settings()["judge"] == "self"


@pytest.mark.skipif(not (SHARED / "arena_hard_v0.1_questions.jsonl").is_file(),
                    reason="no Arena-Hard mirror in ../shared/data")
def test_the_mirror_loads_500_prompts_each_with_its_baseline_answer():
    problems = get_benchmark("arena_hard").load(SHARED)
    assert len(problems) == 500 and len({p.id for p in problems}) == 500
    assert all(p.meta["baseline"].strip() for p in problems)


@pytest.mark.slow
async def test_the_real_model_as_contestant_and_its_own_judge(tmp_path, engine):
    """The smoke setup (no --judge-url): SmolLM2 answers and judges; both games are judged and stored, and the
    same run again asks nothing."""
    store = Store(tmp_path / "eval.db")
    cfg = EvalConfig(max_tokens=24, limit=1, use_tools=False)
    for _ in range(2):
        await evaluate(["arena_hard"], ModelSource(), cfg, store, "smoke", str(FIXTURE), engine=engine)
    (result,) = load(store, "smoke")
    assert len(result.samples) == 1 and result.errors == 0 and result.run.config["judge"] == "self"
    assert [g["game"] for g in result.samples[0].details["games"]] == [1, 2]
    assert len(judge_rows(tmp_path / "eval.db")) == 2
