"""Our BFCL checker and raw decoders against bfcl-eval 2025.6.8's own verdicts, case by case (no network: the
verdicts were recorded once by running the official code in its venv: bench/conformance.py `bfcl_fixture` and
`bfcl_execute_fixture`)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")

from rstar2_agent.eval.benchmarks.bfcl_v3 import BFCLv3, step_calls  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3 import data as bfcl  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3.ast_checker import CRASH, check_ast  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3.decode import decode, decode_execute, response_text  # noqa: E402
from rstar2_agent.eval.benchmarks.bfcl_v3.multi_turn import Call  # noqa: E402
from rstar2_agent.trajectory import Trajectory, Turn  # noqa: E402

FIXTURE = json.loads((Path(__file__).parents[1] / "data" / "bfcl_official_verdicts.json").read_text())
EXECUTE = json.loads((Path(__file__).parents[1] / "data" / "bfcl_official_execute.json").read_text())["execute"]


@cache
def _items(category: str) -> dict[str, dict]:
    return {i["id"]: i for i in bfcl.load_items(category)}


def item(category: str, item_id: str) -> dict:
    return _items(category)[item_id]


def test_every_ast_verdict_is_the_official_checkers():
    wrong = []
    for case in FIXTURE["ast"]:
        it = item(case["category"], case["id"])
        got = check_ast(case.get("functions", it["function"]), case["calls"], it["ground_truth"], case["category"],
                        bfcl.language(case["category"]))
        official = case["official"]
        want_type = CRASH if official["error_type"] == "raises" else official.get("error_type", "")
        if got.valid != official["valid"] or (not got.valid and got.error_type != want_type):
            wrong.append((case["id"], case["calls"], official, got.error_type))
    assert not wrong, wrong[:5]
    assert any(c["official"].get("error_type") == "type_error:nested" for c in FIXTURE["ast"])


def test_a_float_inside_an_integer_array_fails_the_nested_type_check():
    doc = {"name": "f", "parameters": {"type": "dict", "required": ["xs"], "properties": {
        "xs": {"type": "array", "items": {"type": "integer"}}}}}
    answers = [{"f": {"xs": [[1, 2]]}}]
    got = check_ast([doc], [{"name": "f", "arguments": {"xs": [1.0, 2]}}], answers, "simple")
    assert not got.valid and got.error_type == "type_error:nested"
    assert check_ast([doc], [{"name": "f", "arguments": {"xs": [1, 2]}}], answers, "simple").valid


def test_where_the_official_checker_raises_the_verdict_is_a_failure():
    doc = {"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}}}  # no "required"
    got = check_ast([doc], [{"name": "f", "arguments": {"x": 1}}], [{"f": {"x": [1]}}], "simple")
    assert not got.valid and got.error_type == CRASH


def test_every_raw_decoding_is_the_official_handlers():
    wrong = []
    for case in FIXTURE["decode"]:
        got = decode(case["text"])
        mine = None if got.error else [[c["name"], c["arguments"]] for c in got.calls]
        if mine != case["official"]:
            wrong.append((case["text"], case["official"], mine))
    assert not wrong, wrong[:5]
    assert sum(c["official"] is None for c in FIXTURE["decode"]) > 5  # the handler raises on some variants


def test_every_multi_turn_step_runs_the_calls_of_the_official_decode_execute():
    """What our multi-turn path runs for a step (step_calls, the agent loop's reading there), written as BFCL writes
    calls to execute them: the official decode_execute's strings, in order; none where it raises or finds none."""
    wrong = []
    for case in EXECUTE:
        mine = [Call(c.name, (), c.arguments).text() for c in step_calls(case["text"])]
        if mine != (case["official"] or []):
            wrong.append((case["text"], case["official"], mine))
    assert not wrong, wrong[:5]
    official = [c["official"] for c in EXECUTE]
    assert sum(o is None for o in official) > 20 and sum(o == [] for o in official) > 20
    assert sum(len(o or []) > 1 for o in official) > 20  # several calls a step, in order


def test_the_decode_execute_port_raises_where_the_handler_raises():
    for case in EXECUTE:
        try:
            got = decode_execute(response_text(case["text"]))
        except Exception:  # noqa: BLE001
            got = None
        assert got == case["official"], case["text"]


def test_decode_execute_reads_arguments_given_as_a_json_string_where_decode_ast_fails():
    text = '<tool_call>\n{"name": "cd", "arguments": "{\\"folder\\": \\"doc\\"}"}\n</tool_call>'
    assert decode(text).error and decode_execute(text) == ["cd(folder='doc')"]
    assert [c.name for c in step_calls(text)] == ["cd"]
    assert any(c["official"] and decode(c["text"]).error for c in EXECUTE)  # the fixture has such cases


def _scripted(text: str):
    async def agent(messages, **kwargs):
        return Trajectory(prompt_ids=[1], turns=[Turn(text, 5, "stop")], stop_reason="max_turns")
    return agent


@pytest.mark.parametrize("text, correct", [
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', True),
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', False),  # no newlines: the handler finds none
    ('<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>', False),  # arguments as a string
    ('<tool_call>\n{"name": "f", "parameters": {"x": 1}}\n</tool_call>', False),
    ('<think>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call></think>\n<tool_call>\n'
     '{"name": "f", "arguments": {"x": 1}}\n</tool_call>', True),  # only what follows the reasoning counts
])
async def test_the_benchmark_scores_the_raw_text_as_the_leaderboard_reads_it(text, correct):
    from rstar2_agent.eval.benchmarks.base import Context, Problem

    doc = {"name": "f", "parameters": {"type": "dict", "required": ["x"], "properties": {"x": {"type": "integer"}}}}
    problem = Problem("simple_x", "q", "[]", "bfcl_v3", meta={
        "category": "simple", "functions": [doc], "turns": [[{"role": "user", "content": "q"}]],
        "ground_truth": [{"f": {"x": [1]}}]})
    out = await BFCLv3(["simple"]).run(problem, 0, Context(agent=_scripted(text), math_grader=None, seed=0))
    assert out.correct is correct, out.details
