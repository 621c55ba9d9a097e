"""`rstar2 eval` end to end with the real SmolLM2, the real sandbox and a real SQLite store: the fixture and two
AIME24 problems, reports, resume after SIGKILL, an endpoint that fails and then recovers, the chat-API loop,
and a grader that hangs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from html import escape
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from rstar2_agent.eval.benchmarks import Context, get_benchmark
from rstar2_agent.eval.harness import ModelSource, evaluate
from rstar2_agent.eval.report import load
from rstar2_agent.eval.runner import EvalConfig, run_benchmark
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.server import ServeConfig, Server
from rstar2_agent.store import Store
from rstar2_agent.trajectory import Trajectory, Turn

from conftest import run_until_paused, uvicorn_app

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


def cfg(**kw) -> EvalConfig:
    base = dict(n=2, temperature=0.0, max_tokens=128, max_turns=2, concurrency=4, retries=0)
    return EvalConfig(**{**base, **kw})


async def test_fixture_run_is_stored_reported_and_resumed(tmp_path, engine):
    """The first run builds its engine from the source, as `rstar2 eval` does; the resume and the growth reuse the
    session's engine (the same model)."""
    store = Store(tmp_path / "eval.db")
    out = tmp_path / "out"
    # 64 tokens a turn: SmolLM2's first turn is a whole tool call on these three problems
    await evaluate(["aime24"], ModelSource(), cfg(n=1, max_tokens=64), store, "fix", data_dir=str(FIXTURE),
                   out=str(out))
    (result,) = load(store, "fix")
    samples = store.samples(result.run.id)
    assert len(samples) == 3 and all(s.status == "ok" for s in samples) and result.run.status == "finished"
    assert {s.gold for s in samples} == {"5", "042", "1024"} and all(s.tokens > 0 for s in samples)
    assert result.run.config["temperature"] == 0.0 and result.run.info["n"] == 1 and result.run.version
    trajs = store.trajectories(result.run.id)
    assert set(trajs) == {s.id for s in samples} and all(t["turns"] for t in trajs.values())

    metrics = json.loads((out / "results.json").read_text())[0]["metrics"]
    assert metrics["problems"] == 3 and metrics["samples"] == 3 and set(metrics["pass_at_k"]) == {"1"}
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(x["trajectory"]["turns"][0]["text"] for x in lines)
    html = (out / "report.html").read_text()
    assert "Use Python to compute 7 * 6." in html and html.count("<summary>#") == 3
    first_turn = lines[0]["trajectory"]["turns"][0]["text"].strip().splitlines()[0]
    assert escape(first_turn[:40]) in html
    calls = [c for x in lines for t in x["trajectory"]["turns"] for c in t["tool_calls"]]
    assert calls and all(escape(c["response"]) in html for c in calls)  # every tool output can be read

    ids = [s.id for s in samples]
    await evaluate(["aime24"], ModelSource(), cfg(n=1, max_tokens=64), store, "fix", data_dir=str(FIXTURE),
                   engine=engine)  # resumed: none
    assert [s.id for s in store.samples(result.run.id)] == ids
    # more samples: only those
    await evaluate(["aime24"], ModelSource(), cfg(n=2, max_tokens=64), store, "fix", data_dir=str(FIXTURE),
                   engine=engine)
    grown = store.samples(result.run.id)
    assert len(grown) == 6 and set(ids) < {s.id for s in grown}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data (benchmark mirrors) is absent")
async def test_two_aime24_problems(tmp_path, tiny_engine):
    """The mirror's first two problems run and are stored (the tiny SmolLM2 generates: the data's path is tested)."""
    store = Store(tmp_path / "eval.db")
    await evaluate(["aime24"], ModelSource(), cfg(n=1, limit=2, max_tokens=96), store, "aime", data_dir=str(SHARED),
                   engine=tiny_engine)
    (result,) = load(store, "aime")
    assert result.summary["problems"] == 2 and result.summary["samples"] == 2
    assert {s.problem_id for s in result.samples} == {"60", "61"}


def flaky_proxy(upstream: str) -> FastAPI:
    """Forwards to a real server; while `app.state.fail` is set it answers 503 instead."""
    app = FastAPI()
    app.state.fail, app.state.failed, app.state.forwarded = True, 0, 0
    client = httpx.AsyncClient(base_url=upstream, timeout=120)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        if app.state.fail and path != "models":
            app.state.failed += 1
            return Response('{"error": {"message": "overloaded"}}', status_code=503)
        app.state.forwarded += path == "completions"
        r = await client.request(request.method, f"/v1/{path}", content=await request.body(),
                                 headers={"content-type": "application/json"})
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    return app


async def test_endpoint_errors_are_retried_stored_as_errors_and_resumed(tmp_path, tiny_engine, sandbox, tiny_smollm2):
    """On the tiny SmolLM2: the client's machinery, whatever the model writes."""
    server = Server(tiny_engine, sandbox, ServeConfig(model_name="smol", format="markdown"))
    proxy = flaky_proxy("")
    store = Store(tmp_path / "eval.db")
    async with uvicorn_app(create_app(server, manage=False)) as upstream:
        proxy = flaky_proxy(upstream)
        async with uvicorn_app(proxy) as url:
            source = ModelSource(model=tiny_smollm2, urls=[url])
            config = cfg(n=1, limit=2, retries=2, backoff=0.05, format="markdown")
            await evaluate(["aime24"], source, config, store, "flaky", data_dir=str(FIXTURE))
            (result,) = load(store, "flaky")
            errors = store.samples(result.run.id, status="error")
            assert len(errors) == 2 and result.errors == 2 and proxy.state.failed == 2 * 3  # 1 try + 2 retries each
            assert all(s.attempts == 3 and "503" in s.error and s.stop_reason == "engine_error" for s in errors)

            proxy.state.fail = False
            await evaluate(["aime24"], source, config, store, "flaky", data_dir=str(FIXTURE))
            (result,) = load(store, "flaky")
            assert result.errors == 0 and len(result.samples) == 2
            assert all(s.status == "ok" and s.attempts == 4 and s.tokens > 0 for s in result.samples)


async def test_several_urls_form_a_replica_pool(tmp_path, tiny_engine, sandbox, tiny_smollm2):
    """On the tiny SmolLM2: the client's machinery, whatever the model writes."""
    server = Server(tiny_engine, sandbox, ServeConfig(model_name="smol", format="markdown"))
    store = Store(tmp_path / "eval.db")
    async with uvicorn_app(create_app(server, manage=False)) as upstream:
        a, b = flaky_proxy(upstream), flaky_proxy(upstream)
        a.state.fail = b.state.fail = False
        async with uvicorn_app(a) as url_a, uvicorn_app(b) as url_b:
            source = ModelSource(model=tiny_smollm2, urls=[url_a, url_b], replica_policy="least_outstanding")
            await evaluate(["aime24"], source, cfg(n=2, format="markdown", max_tokens=48), store, "pool",
                           data_dir=str(FIXTURE))
    (result,) = load(store, "pool")
    assert len(result.samples) == 6 and result.errors == 0 and result.run.info["urls"] == [url_a, url_b]
    assert a.state.forwarded > 0 and b.state.forwarded > 0  # both replicas served


async def test_chat_api_against_rstar2_serve(tmp_path, tiny_engine, sandbox):
    """On the tiny SmolLM2: the chat API's path, whatever the model writes."""
    server = Server(tiny_engine, sandbox, ServeConfig(model_name="smol", format="markdown"))
    store = Store(tmp_path / "eval.db")
    async with uvicorn_app(create_app(server, manage=False)) as url:
        await evaluate(["aime24"], ModelSource(urls=[url]), cfg(n=1, limit=3, api="chat", max_tokens=96), store, "chat",
                       data_dir=str(FIXTURE))
    (result,) = load(store, "chat")
    assert len(result.samples) == 3 and result.errors == 0 and result.run.model == url
    assert all(s.tokens > 0 and s.stop_reason in ("answer", "no_tool_call", "max_tokens") for s in result.samples)


async def test_a_benchmarks_own_prompt_reaches_an_rstar2_server_without_the_math_instruction(engine, sandbox):
    """IFEval and Arena-Hard send the benchmark's prompt alone (problem_prefix=False). Over --api chat to rstar2
    serve in an rStar2 format, whose template adds the math-problem instruction to every user turn, the client asks
    the server's template not to (vLLM's chat_template_kwargs), so the server renders what the token path renders;
    a math prompt still gets the instruction."""
    from rstar2_agent.agent import AgentConfig
    from rstar2_agent.eval.chat_api import ChatAPIAgent
    from rstar2_agent.release_format import PROBLEM_PREFIX

    server = Server(engine, sandbox, ServeConfig(model_name="smol", format="rstar2-paper"))
    rendered: list[str] = []
    render = server.render

    async def spy(fmt, messages, tools, problem_prefix=True):  # what the real render gave, decoded
        ids = await render(fmt, messages, tools, problem_prefix)
        rendered.append(fmt.decode(ids))
        return ids

    server.render = spy
    cfg = AgentConfig(max_turns=1)
    cfg.sampling.max_tokens = 4
    async with uvicorn_app(create_app(server, manage=False)) as url:
        agent = ChatAPIAgent(url, None, None, None)
        try:
            await agent([{"role": "user", "content": "Write a haiku about rain."}], cfg, tools=[], problem_prefix=False)
            await agent([{"role": "user", "content": "What is 2 + 3?"}], cfg, tools=[])
        finally:
            await agent.close()
    assert agent.owner == "rstar2" and len(rendered) == 2
    assert "Write a haiku about rain." in rendered[0] and PROBLEM_PREFIX not in rendered[0]
    assert PROBLEM_PREFIX + "What is 2 + 3?" in rendered[1]


def scripted_chat_server() -> FastAPI:
    """An OpenAI chat endpoint whose model is scripted (SmolLM2 does not write Hermes tool calls, which this path
    needs): it asks for Python first, then answers with what the tool printed."""
    app = FastAPI()
    app.state.tool_messages = []

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> dict:
        last = body["messages"][-1]
        if last["role"] == "tool":
            app.state.tool_messages.append(last)
            stdout = json.loads(last["content"])["stdout"].strip()
            msg = {"role": "assistant", "content": f"<answer>\\boxed{{{stdout}}}</answer>"}
        else:
            expr = last["content"].split("compute ")[1].split(".")[0]
            call = {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"code": f"print({expr})"})}
            msg = {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_1", "type": "function", "function": call}]}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if msg["content"] is None
                             else "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}}

    return app


async def test_chat_api_runs_tool_calls_client_side_with_a_scripted_chat_server(tmp_path):
    app = scripted_chat_server()
    store = Store(tmp_path / "eval.db")
    async with uvicorn_app(app) as url:
        await evaluate(["aime24"], ModelSource(urls=[url], served_model="scripted"), cfg(n=1, api="chat"), store,
                       "chat", data_dir=str(FIXTURE))
    (result,) = load(store, "chat")
    assert [s.correct for s in result.samples] == [True, True, True]  # 5, 42 (gold "042"), 1024
    assert all(s.tool_calls == 1 and s.tool_errors == 0 and s.turns == 2 for s in result.samples)
    assert sorted(json.loads(m["content"])["stdout"] for m in app.state.tool_messages) == ["1024\n", "42\n", "5\n"]
    assert all(m["tool_call_id"] == "call_1" for m in app.state.tool_messages)


async def test_a_hanging_grader_marks_the_sample_and_the_run_goes_on_with_a_scripted_model(tmp_path):
    """The model is scripted (no model writes this answer on cue); the grader and the store are real."""
    answers = {"1": "9^{9^{9^{9}}}", "2": "42", "3": "1024"}  # math-verify never finishes the first

    async def scripted_agent(prompt, tools=None, seed=None, **kw):
        pid = next(k for k, q in {"1": "2 + 3", "2": "7 * 6", "3": "2**10"}.items() if q in prompt)
        text = f"<answer>\\boxed{{{answers[pid]}}}</answer>"
        return Trajectory(prompt_ids=[], turns=[Turn(text, 5, "stop")], stop_reason="answer")

    bench = get_benchmark("aime24")
    grader = MathGrader(workers=1, timeout=2)
    store = Store(tmp_path / "eval.db")
    run = store.open_run("hang", "aime24", "scripted", {})
    try:
        ctx = Context(agent=scripted_agent, math_grader=grader, seed=0)
        await run_benchmark(bench, bench.load(FIXTURE), ctx, cfg(n=1), store, run.id)
    finally:
        grader.close()
    by_id = {s.problem_id: s for s in store.samples(run.id)}
    assert not by_id["1"].correct and by_id["1"].reason == "grader_timeout"
    assert by_id["2"].correct and by_id["3"].correct  # after the stuck one, grading goes on


def _stored(db: Path, run: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute(
            "SELECT s.problem_id, s.sample_index, s.status, s.correct, s.answer, s.tokens, s.stop_reason, t.data "
            "FROM samples s JOIN runs r ON r.id = s.run_id LEFT JOIN trajectories t ON t.sample_id = s.id "
            "WHERE r.name = ? ORDER BY s.problem_id, s.sample_index", (run,)).fetchall()


@pytest.mark.timeout(600)  # three CLI runs, each starting the engine and the grader's voting process
def test_a_run_killed_with_sigkill_resumes_to_the_same_results(tmp_path, tiny_smollm2):
    """Killed (SIGKILL, the whole process group) once two of its six samples are stored, the run resumes to what an
    uninterrupted run stores. Resuming is the store's and the runner's machinery: SmolLM2's 2-layer cut runs it."""
    db = tmp_path / "eval.db"
    args = [RSTAR2, "eval", "aime24", "--model", tiny_smollm2, "--data-dir", str(FIXTURE), "--n", "2", "--temperature",
            "0", "--max-tokens", "64", "--max-turns", "2", "--concurrency", "1", "--db", str(db)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run_until_paused([*args, "--run", "killed"], "sample:2", env, sig=signal.SIGKILL)
    partial = _stored(db, "killed")
    assert len(partial) == 2, "the run should have been killed after its second sample"
    assert all(row[7] is not None for row in partial)  # no sample without its trajectory
    for name in ("killed", "whole"):
        p = subprocess.run([*args, "--run", name], capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
    resumed, whole = _stored(db, "killed"), _stored(db, "whole")
    assert len(resumed) == len(whole) == 6
    strip = [(r[:7], json.loads(r[7])["response_ids"]) for r in resumed]
    assert strip == [(r[:7], json.loads(r[7])["response_ids"]) for r in whole]

    p = subprocess.run([RSTAR2, "eval", "compare", "killed", "whole", "--db", str(db)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "+0.0" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([RSTAR2, "eval", "report", "killed", "--db", str(db), "--problems"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "aime24" in p.stdout and "3 x 2" in p.stdout, p.stdout + p.stderr


def test_cli_errors_say_what_to_do(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RSTAR2_DATA_DIR": str(tmp_path)}
    p = subprocess.run([RSTAR2, "eval", "aime23", "--db", str(tmp_path / "x.db")], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode != 0 and "unknown benchmark" in p.stderr and "aime24" in p.stderr
    p = subprocess.run([RSTAR2, "eval", "hmmt25", "--db", str(tmp_path / "x.db")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode != 0 and "hmmt_feb_2025.jsonl" in p.stderr and "--data-dir" in p.stderr
    p = subprocess.run([RSTAR2, "eval", "report", "nope", "--db", str(tmp_path / "x.db")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "no run named 'nope'" in p.stderr


async def test_bfcl_v3_items_score_each_category(tmp_path, tiny_engine):
    """Four BFCL categories, one item each, run, scored and reported. The tiny SmolLM2 generates: the driver (one agent
    call per user turn), the scoring and the report are tested whatever the model writes; the checkers' verdicts
    against the official ones: test_bfcl_official_verdicts.py."""
    from rstar2_agent.eval.benchmarks.bfcl_v3 import BFCLv3
    from rstar2_agent.eval.report import write_outputs

    store = Store(tmp_path / "eval.db")
    bench = BFCLv3("simple,irrelevance,live_relevance,multi_turn_base")
    await evaluate(["bfcl_v3"], ModelSource(), cfg(n=1, limit=1, max_tokens=96), store, "bfcl", benchmarks={
        "bfcl_v3": bench}, engine=tiny_engine)
    (result,) = load(store, "bfcl")
    by_id = {s.problem_id: s for s in result.samples}
    assert set(by_id) == {"simple_0", "irrelevance_0", "live_relevance_0-0-0", "multi_turn_base_0"}
    assert set(result.summary["bfcl"]["categories"]) == {"simple", "irrelevance", "live_relevance",
                                                         "multi_turn_base"}
    assert 0.0 <= result.summary["bfcl"]["overall"] <= 1.0 and not result.summary["bfcl"]["complete"]
    assert by_id["simple_0"].correct or by_id["simple_0"].details["expected"]  # a failure says what was expected
    user_turns = bench.load(limit=1)[-1].meta["turns"]
    log = by_id["multi_turn_base_0"].details["turns"]  # one agent call per user turn, unless BFCL's step cap ended it
    assert len(log) == len(user_turns) or log[-1]["stop_reason"] == "max_turns"
    html = (write_outputs(store, "bfcl", tmp_path / "out")[2]).read_text()
    assert "expected" in html


async def test_an_rl_checkpoint_is_graded_as_its_reward_read_it(tmp_path, tiny_smollm2):
    """An RL checkpoint's meta says how the reward read its answers (answer_extraction); eval, left unset, grades it
    the same way and stores that setting. The release's extraction and the paper's (the rstar2-paper default) read the
    last \\boxed{}, inside an answer block or not; a checkpoint whose reward read only the answer block
    (answer_block) is graded so, and the same text is then wrong."""
    import shutil

    from transformers import AutoTokenizer

    from conftest import ScriptedEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_smollm2)
    verdicts = {}
    for name, meta in (("rl", {"format": "rstar2-paper", "answer_extraction": "release"}),
                       ("strict", {"format": "rstar2-paper", "answer_extraction": "answer_block"}),
                       ("sft", {"format": "rstar2-paper"})):
        folder = tmp_path / name
        shutil.copytree(tiny_smollm2, folder)
        (folder / "rstar2.json").write_text(json.dumps(meta))
        engine = ScriptedEngine(tokenizer, ["2 + 3 is \\boxed{5}</reason>"])
        store = Store(tmp_path / f"{name}.db")
        names = await evaluate(["aime24"], ModelSource(model=str(folder)), cfg(n=1, limit=1, use_tools=False), store,
                               None, str(FIXTURE), engine=engine)
        (result,) = load(store, names["aime24"])
        verdicts[name] = (result.run.config["answer_extraction"], result.samples[0].correct)
    assert verdicts == {"rl": ("release", True), "strict": ("answer_block", False), "sft": ("paper", True)}
