"""BFCL v3 checking against bfcl_eval's own answer files: calls built from the possible answers pass, broken ones
fail, multi-turn ground truth replays to 1; and the benchmark end to end with a scripted agent
(the real model: test_eval_run.py)."""

from __future__ import annotations

import copy
import inspect
import json
from functools import cache

import pytest

pytest.importorskip("bfcl_eval")

from rstar2_agent.eval.benchmarks.base import Context  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3 import BFCLv3, continuation, tool_schema, tools_for  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3 import data as bfcl  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3.ast_checker import standardize  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3.multi_turn import Call, World, parse_call  # noqa: E402
from rstar2_agent.eval.runner import ReadCalls  # noqa: E402
from rstar2_agent.trajectory import ToolCallRecord, Trajectory, Turn  # noqa: E402

from conftest import ScriptedEngine  # noqa: E402

AST = [c for c in bfcl.NON_LIVE + bfcl.LIVE if not bfcl.is_relevance(c)]
# Items whose own first possible answer breaks BFCL's rules (bfcl_eval's checker rejects it too): a required
# parameter without an answer, a name that differs from the doc, a parameter the doc lacks; and Java ArrayLists
# of mixed types the literal builder below cannot write.
BROKEN_ANSWERS = {"simple_200", "simple_363", "parallel_multiple_26", "live_simple_106-63-0", "live_simple_112-68-0",
                  "live_multiple_144-56-0", "live_multiple_507-149-4", "live_multiple_834-178-9",
                  "live_multiple_862-181-3", "live_multiple_964-207-0", "java_36", "java_65", "javascript_41"}
WRONG = "zz-not-an-answer-zz"


@cache
def items(category: str) -> list[dict]:
    return bfcl.load_items(category)


def sample(category: str, n: int = 40) -> list[dict]:
    rows = [r for r in items(category) if r["id"] not in BROKEN_ANSWERS]
    return rows[:: max(1, len(rows) // n)]


# ------------------------------------------------------------------------------------------ known-correct calls
def java(v, doc: dict) -> str:
    """A Python value (dicts: one value per key) in Java syntax, as BFCL's converter reads it."""
    kind, inner = doc["type"], (doc.get("items") or {}).get("type")
    if isinstance(v, bool):
        return "true" if v else "false"
    if kind == "long" and isinstance(v, int):
        return f"{v}L"
    if kind in ("Array", "ArrayList") and isinstance(v, list):
        if kind == "Array":
            return f"new {inner}[]{{{', '.join(java(x, {'type': inner}) for x in v)}}}"
        return f"new ArrayList<>(Arrays.asList({', '.join(json.dumps(x) if inner == 'String' else java(x, {'type': inner}) for x in v)}))"  # noqa: E501
    if kind == "HashMap" and isinstance(v, dict):
        puts = "".join(f"put({json.dumps(k)}, {json.dumps(x)}); " for k, x in v.items())
        return f"new HashMap<String, String>() {{{{ {puts}}}}}"
    return str(v)


def javascript(v, doc: dict) -> str:
    kind, inner = doc["type"], (doc.get("items") or {}).get("type")
    if isinstance(v, bool):
        return "true" if v else "false"
    if kind == "array" and isinstance(v, list):
        return "[" + ", ".join(f"'{x}'" if isinstance(x, str) else javascript(x, {"type": inner}) for x in v) + "]"
    if kind == "dict" and isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {javascript(x, {'type': 'any'})}" for k, x in v.items()) + "}"
    return str(v)


def correct_calls(item: dict, category: str) -> list[dict]:
    docs = {f["name"]: f["parameters"]["properties"] for f in item["function"]}
    literal = {"java": java, "javascript": javascript}.get(category)
    calls = []
    for answer in item["ground_truth"]:
        for name, params in answer.items():
            args = {p: bfcl.first_answer(v) for p, v in params.items() if v and v[0] != ""}
            if literal:
                args = {p: literal(v, docs[name][p]) for p, v in args.items()}
            calls.append({"name": name, "arguments": args})
    return calls


def grade(category: str, item: dict, calls: list[dict]):
    return bfcl.grade_single_turn(category, item["function"], calls, item.get("ground_truth"))


@pytest.mark.parametrize("category", AST)
def test_first_possible_answers_are_valid(category):
    for item in sample(category):
        result = grade(category, item, correct_calls(item, category))
        assert result.valid, (item["id"], result.error)
        assert result.expected == item["ground_truth"]


@pytest.mark.parametrize("category", AST)
def test_broken_calls_are_invalid(category):
    for item in sample(category, 25):
        good = correct_calls(item, category)
        wrong_value = copy.deepcopy(good)
        args = wrong_value[0]["arguments"]
        if args:
            args[next(iter(args))] = WRONG
            assert not grade(category, item, wrong_value).valid, item["id"]
        doc = next(f for f in item["function"] if f["name"] == good[0]["name"])
        required = [p for p in doc["parameters"].get("required", []) if p in good[0]["arguments"]]
        if required:
            missing = copy.deepcopy(good)
            del missing[0]["arguments"][required[0]]
            result = grade(category, item, missing)
            assert not result.valid and "Missing required parameter" in result.error, (item["id"], result.error)
        renamed = copy.deepcopy(good)
        renamed[0]["name"] += "_other"
        assert not grade(category, item, renamed).valid, item["id"]
        extra = good + [copy.deepcopy(good[0])]
        result = grade(category, item, extra)
        assert not result.valid and "Wrong number of functions" in result.error, item["id"]
        assert not grade(category, item, []).valid, item["id"]


def test_parallel_calls_match_in_any_order():
    item = next(i for i in items("parallel") if len(i["ground_truth"]) >= 3)
    calls = correct_calls(item, "parallel")
    assert grade("parallel", item, calls[::-1]).valid


def test_string_normalization_and_int_for_float():
    assert standardize("April 1, 2024") == standardize("april 1 2024") == "april12024"
    item = {"function": [{"name": "f", "parameters": {"type": "dict", "required": ["x", "city"], "properties": {
        "x": {"type": "float"}, "city": {"type": "string"}}}}],
            "ground_truth": [{"f": {"x": [3.0], "city": ["New York, NY"]}}]}
    assert grade("simple", item, [{"name": "f", "arguments": {"x": 3, "city": "new york NY"}}]).valid
    assert not grade("simple", item, [{"name": "f", "arguments": {"x": "3", "city": "new york NY"}}]).valid


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance", "live_relevance"])
def test_relevance(category):
    call = [{"name": "anything", "arguments": {}}]
    for item in items(category)[:20]:
        if category == "live_relevance":
            assert grade(category, item, call).valid and not grade(category, item, []).valid
        else:
            assert grade(category, item, []).valid and not grade(category, item, call).valid


# ------------------------------------------------------------------------------------------ multi-turn
def ground_truth_calls(item: dict) -> list[list[Call]]:
    return [[parse_call(c) for c in turn] for turn in item["ground_truth"]]


@pytest.mark.parametrize("category", bfcl.MULTI_TURN)
def test_multi_turn_ground_truth_replays_to_one(category):
    for item in items(category)[:12]:
        turns = ground_truth_calls(item)
        assert bfcl.grade_multi_turn(category, item, turns).valid, item["id"]

        last = max(i for i, t in enumerate(turns) if t)
        removed = copy.deepcopy(turns)
        removed[last] = removed[last][:-1]
        assert not bfcl.grade_multi_turn(category, item, removed).valid, item["id"]

        altered = copy.deepcopy(turns)
        t, i, key = next((t, i, k) for t, calls in enumerate(altered) for i, c in enumerate(calls)
                         for k, v in (c.kwargs or {}).items() if isinstance(v, str))
        altered[t][i].kwargs[key] += "_altered"
        result = bfcl.grade_multi_turn(category, item, altered)
        assert not result.valid and result.error, item["id"]

        result = bfcl.grade_multi_turn(category, item, turns[:-1])
        assert result.error_type == "multi_turn:force_terminated"


def test_multi_turn_turn_without_calls_fails():
    item = items("multi_turn_base")[0]
    turns = ground_truth_calls(item)
    turns[0] = []
    result = bfcl.grade_multi_turn("multi_turn_base", item, turns)
    assert result.error_type == "multi_turn:empty_turn_model_response"


def test_world_results_and_errors():
    item = items("multi_turn_base")[0]
    world = World(item["involved_classes"], item["initial_config"])
    assert world.call(Call("pwd")) == json.dumps({"current_working_directory": "/workspace"})
    assert world.call(Call("no_such_api")).startswith("Error during execution: name 'no_such_api'")
    assert world.call(Call("cd", (), {"nope": 1})).startswith("Error during execution:")
    assert parse_call("sort('final_report.pdf')") == Call("sort", ("final_report.pdf",), {})


def test_miss_func_items_hold_functions_back():
    item = items("multi_turn_miss_func")[0]
    held = {d["name"] for docs in item["missed_function"].values() for d in docs}
    assert held and not held & {d["name"] for d in item["function"]}


# ------------------------------------------------------------------------------------------ overall
def test_overall_weighting():
    weights = bfcl.category_weights()
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["simple"] == pytest.approx(1 / 45) and weights["multiple"] == pytest.approx(1 / 15)
    assert weights["multi_turn_base"] == pytest.approx(1 / 12)
    full = {c: (1.0, bfcl.category_size(c)) for c in bfcl.CATEGORIES}
    assert bfcl.overall(full)["overall"] == pytest.approx(1.0) and bfcl.overall(full)["complete"]
    only_multi_turn = bfcl.overall({c: (1.0, 10) for c in bfcl.MULTI_TURN})
    assert only_multi_turn["overall"] == pytest.approx(1 / 3) and not only_multi_turn["complete"]
    live = bfcl.overall({"live_simple": (1.0, 30), "live_multiple": (0.0, 10), **{
        c: (0.0, 1) for c in bfcl.LIVE if c not in ("live_simple", "live_multiple")}})
    assert live["live"] == pytest.approx(30 / 44)


# ------------------------------------------------------------------------------------------ tool schemas
def test_tool_schemas_follow_bfcl():
    item = next(i for i in items("simple") if "." in i["function"][0]["name"])
    tools, names = tools_for(item["function"], "simple")
    fn = tools[0]["function"]
    assert "." not in fn["name"] and names[fn["name"]] == item["function"][0]["name"]
    assert fn["parameters"]["type"] == "object" and fn["description"].endswith("Python 3 syntax.")
    doc = {"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float", "description": "x"}, "t": {"type": "tuple", "items": {"type": "integer"}},
        "d": {"type": "dict", "properties": {"a": {"type": "any"}}}}}}
    props = tool_schema(doc, "simple")["function"]["parameters"]["properties"]
    assert props["x"]["type"] == "number" and props["x"]["format"] == "float"
    assert props["t"] == {"type": "array", "items": {"type": "integer"}}
    assert props["d"]["type"] == "object" and props["d"]["properties"]["a"]["type"] == "string"
    java_props = tool_schema(items("java")[0]["function"][0], "java")["function"]["parameters"]["properties"]
    assert all(p["type"] == "string" and "string representation" in p["description"] for p in java_props.values())


# ------------------------------------------------------------------------------------------ the benchmark
class FakeAgent:
    """Stands in for ctx.agent: writes the calls a script gives for each agent call (read back by the benchmark's
    `read_calls` when it gives one, as the agent loop reads them), running them through `execute` the way the
    agent loop does, and records what it was asked."""

    def __init__(self, script):
        self.script, self.requests = script, []

    async def __call__(self, messages, tools=None, seed=None, max_turns=None, execute=None, max_calls=None,
                       problem_prefix=True, read_calls=None):
        self.requests.append({"messages": copy.deepcopy(messages), "tools": tools, "max_turns": max_turns,
                              "max_calls": max_calls, "problem_prefix": problem_prefix, "read_calls": read_calls})
        calls = self.script(len(self.requests) - 1, tools)
        text = "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>\n"  # Qwen's form
                       for n, a in calls)
        if read_calls is not None:
            calls = [(c.name, c.arguments) for c in read_calls(text)]
        records = []
        for k, (name, args) in enumerate(calls):
            raw = json.dumps({"name": name, "arguments": args})
            rec = ToolCallRecord(turn=0, id=f"c{k}", name=name, arguments=args,
                                 raw=f"<tool_call>\n{raw}\n</tool_call>\n")
            rec.response = await execute(name, args) if execute else ""
            records.append(rec)
        turns = [Turn("".join(r.raw for r in records) + "<|im_end|>", 5, "stop", records)]
        if records and max_turns != 1:
            turns.append(Turn("Done.", 2, "stop"))
        return Trajectory(prompt_ids=[1], turns=turns, stop_reason="max_turns" if max_turns == 1 else "no_tool_call")


def context(agent) -> Context:
    return Context(agent=agent, math_grader=None, seed=0)


async def test_benchmark_single_turn_maps_names_back_with_a_scripted_agent():
    bench = BFCLv3(["simple"])
    problem = next(p for p in bench.load() if "." in p.meta["functions"][0]["name"])
    item = next(i for i in items("simple") if i["id"] == problem.id)
    shown = {v: k for k, v in tools_for(item["function"], "simple")[1].items()}
    calls = [(shown[c["name"]], c["arguments"]) for c in correct_calls(item, "simple")]
    agent = FakeAgent(lambda i, tools: calls)
    out = await bench.run(problem, 0, context(agent))
    assert out.correct and out.details["produced"][0]["name"] == item["function"][0]["name"]
    assert agent.requests[0]["max_turns"] == 1 and agent.requests[0]["messages"][0]["role"] == "system"
    assert agent.requests[0]["problem_prefix"] is False  # BFCL's own prompt, without the math instruction
    wrong = await bench.run(problem, 0, context(FakeAgent(lambda i, tools: [])))
    assert not wrong.correct and "Wrong number" in wrong.details["error"] and wrong.details["expected"]


def test_load_limits_per_category_and_ids():
    problems = BFCLv3("simple,multi_turn_miss_func").load(limit=3)
    assert [p.id for p in problems] == ["simple_0", "simple_1", "simple_2", "multi_turn_miss_func_0",
                                        "multi_turn_miss_func_1", "multi_turn_miss_func_2"]
    assert problems[3].meta["missed_function"] and problems[3].meta["involved_classes"]
    assert len(BFCLv3("live").categories) == 6 and len(BFCLv3().categories) == 17


def _as_kwargs(world: World, call: Call) -> dict:
    return dict(inspect.signature(world.methods[call.name]).bind(*call.args, **(call.kwargs or {})).arguments)


@pytest.mark.parametrize("skip_turn", [None, 0])
async def test_benchmark_multi_turn_with_a_scripted_agent(skip_turn):
    bench = BFCLv3(["multi_turn_miss_func"])
    problem = bench.load(limit=1)[0]
    item = items("multi_turn_miss_func")[0]
    world = World(item["involved_classes"], item["initial_config"])
    truth = ground_truth_calls(item)

    def script(turn, tools):
        if turn == skip_turn:
            return []
        return [(c.name, _as_kwargs(world, c)) for c in truth[turn]]

    agent = FakeAgent(script)
    out = await bench.run(problem, 0, context(agent))
    assert out.correct is (skip_turn is None), out.details["error"]
    assert len(agent.requests) == len(item["question"]) == len(out.details["turns"])
    added = int(next(iter(item["missed_function"])))
    request = agent.requests[added]
    assert request["messages"][-1] == {"role": "user", "content": bfcl.ADDED_FUNCTIONS_PROMPT}
    held = {d["name"] for d in item["missed_function"][str(added)]}
    assert held <= {t["function"]["name"] for t in request["tools"]}
    assert not held & {t["function"]["name"] for t in agent.requests[0]["tools"]}
    later = agent.requests[1]["messages"]  # the first turn's calls and results carried over
    assert later[2]["role"] == "assistant" and "<|im_end|>" not in later[2]["content"]
    if skip_turn is None:
        assert [c["function"]["name"] for c in later[2]["tool_calls"]] == [c.name for c in truth[0]]
        assert later[3]["role"] == "tool"


def test_continuation_keeps_unreadable_calls_as_text():
    bad = ToolCallRecord(turn=0, id="x", name="", arguments={}, raw="<tool_call>{oops</tool_call>", error="bad",
                         response="error")
    traj = Trajectory(prompt_ids=[], turns=[Turn("hi <tool_call>{oops</tool_call>", 3, "stop", [bad])])
    msgs = continuation(traj)
    assert msgs[0] == {"role": "assistant", "content": "hi <tool_call>{oops</tool_call>"}
    assert msgs[1] == {"role": "tool", "tool_call_id": "x", "content": "error"}


# ------------------------------------------------------------------------------------------ with the real loop
def real_loop_context(tokenizer, texts: list[str], format: str = "hermes") -> tuple[Context, ScriptedEngine]:
    from rstar2_agent.agent import AgentConfig, run_agent
    from rstar2_agent.chat_format import ChatFormat

    engine, fmt = ScriptedEngine(tokenizer, texts), ChatFormat(tokenizer, format)

    async def agent(prompt, tools=None, seed=None, max_turns=None, execute=None, max_calls=None, problem_prefix=True,
                    read_calls=None):
        cfg = AgentConfig(max_turns=max_turns or 30, max_calls_per_turn=max_calls)
        ids = fmt.render_prompt(prompt, tools, problem_prefix=problem_prefix)
        loop_fmt = fmt if read_calls is None else ReadCalls(fmt, read_calls)  # as eval/runner.py's make_agent
        return await run_agent(prompt, engine, None, loop_fmt, cfg, tools=tools, execute=execute, prompt_ids=ids)

    return Context(agent=agent, math_grader=None, seed=0, extra={"fmt": fmt}), engine


def hermes(calls: list[tuple[str, dict]]) -> str:
    return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>\n' for n, a in calls)


@pytest.mark.slow
@pytest.mark.parametrize("format", ["hermes", "rstar2-release"])
async def test_real_loop_single_and_multi_turn_with_a_scripted_engine(smol_tokenizer, format):
    """Every call of a parallel turn reaches the checker with its arguments, in the Hermes format and in the
    release's (whose own cap of one call a turn and Python-only arguments are for its Python tool)."""
    bench = BFCLv3(["parallel_multiple", "multi_turn_miss_func"])
    problems = {p.id: p for p in bench.load(limit=1)}
    item = items("parallel_multiple")[0]
    shown = {v: k for k, v in tools_for(item["function"], "parallel_multiple")[1].items()}
    calls = [(shown[c["name"]], c["arguments"]) for c in correct_calls(item, "parallel_multiple")][::-1]
    assert len(calls) > 1
    ctx, _ = real_loop_context(smol_tokenizer, [hermes(calls)], format)
    out = await bench.run(problems[item["id"]], 0, ctx)
    assert out.correct, out.details["error"]

    item = items("multi_turn_miss_func")[0]
    world = World(item["involved_classes"], item["initial_config"])
    texts = []
    for turn in ground_truth_calls(item):
        if turn:
            texts.append(hermes([(c.name, _as_kwargs(world, c)) for c in turn]))
        texts.append("That is all I can do.")
    ctx, engine = real_loop_context(smol_tokenizer, texts, format)
    out = await bench.run(problems[item["id"]], 0, ctx)
    assert out.correct, out.details["error"]
    assert not engine.texts and all(t["stop_reason"] == "no_tool_call" for t in out.details["turns"])
    assert json.loads(out.details["turns"][0]["results"][0]) == {"current_working_directory": "document"}


def qwen(calls: list[tuple[str, dict]], **extra) -> str:
    """The calls as Qwen's handler reads them, each JSON object with `extra` fields beside name and arguments."""
    return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a, **extra})}\n</tool_call>\n' for n, a in calls)


@pytest.mark.slow
async def test_real_loop_multi_turn_steps_run_what_decode_execute_reads(smol_tokenizer):
    """A multi-turn step's calls are the ones bfcl_eval's decode_execute reads from its raw text, whatever the
    format's own parser would make of it: a call with a field besides name and arguments (which our parser refuses)
    runs; arguments given as a JSON string run; after the reasoning only; a step it cannot read ends the turn."""
    bench = BFCLv3(["multi_turn_base"])
    problem = bench.load(limit=1)[0]
    item = items("multi_turn_base")[0]
    world = World(item["involved_classes"], item["initial_config"])
    truth = [[(c.name, _as_kwargs(world, c)) for c in turn] for turn in ground_truth_calls(item)]
    assert all(truth)

    def step(k: int, calls: list[tuple[str, dict]]) -> str:
        if k % 2:  # arguments as a JSON string: decode_execute json.loads them (decode_ast would fail)
            return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": json.dumps(a)})}\n</tool_call>\n'
                           for n, a in calls)
        return '<think>\n<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "x"}}\n</tool_call>\n</think>\n\n' + \
            qwen(calls, id=k)

    texts = [t for k, turn in enumerate(truth) for t in (step(k, turn), "Done.")]
    ctx, engine = real_loop_context(smol_tokenizer, texts)
    out = await bench.run(problem, 0, ctx)
    assert out.correct, out.details["error"]
    assert not engine.texts and [[c["name"] for c in t["calls"]] for t in out.details["turns"]] == \
        [[n for n, _ in turn] for turn in truth]

    # the first turn's calls without the newlines Qwen's handler needs, then a JSON list: no call, the turn ends
    for unread in ("".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in truth[0]),
                   qwen(truth[0]) + '<tool_call>\n[{"name": "ls"}]\n</tool_call>'):
        texts = [unread] + [t for turn in truth[1:] for t in (qwen(turn), "Done.")]
        ctx, engine = real_loop_context(smol_tokenizer, texts)
        out = await bench.run(problem, 0, ctx)
        assert not engine.texts and out.details["turns"][0]["calls"] == []
        assert out.details["turns"][0]["stop_reason"] == "no_tool_call"
        assert not out.correct and out.reason == "multi_turn:empty_turn_model_response"
