"""`rstar2 bench conformance` without the official venvs: the corpus is a function of the seed, has every case kind
the brief asks for, and a disagreement is classified (the run itself, against the official packages, is the
command's; its verdicts for BFCL are kept in tests/data/bfcl_official_verdicts.json)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("bfcl_eval")

from rstar2_agent.bench import conformance as conf  # noqa: E402


def test_the_corpus_is_a_function_of_the_seed():
    items = conf.bfcl_items()
    a = conf.bfcl_decode_cases(random.Random(3), 50, items) + conf.gpqa_cases(random.Random(3), 50)
    b = conf.bfcl_decode_cases(random.Random(3), 50, items) + conf.gpqa_cases(random.Random(3), 50)
    assert a == b
    ast = conf.bfcl_ast_cases(random.Random(3), 200, items)
    assert {c["category"] for c in ast} >= {"simple", "java", "live_parallel_multiple"}
    assert all(c["model_output"] == [{x["name"]: x["arguments"]} for x in c["calls"]] for c in ast)


def test_ifeval_cases_come_from_the_ifeval_prompts():
    cases = conf.ifeval_cases(random.Random(0), 20)
    rows, _ = conf.ifeval_rows()
    prompts = {r["prompt"] for r in rows}
    assert all(c["prompt"] in prompts and len(c["kwargs"]) == len(c["instruction_id_list"]) for c in cases)


def test_disagreements_are_classified():
    case = {"kind": "gpqa", "response": "Answer: B\n\\boxed{C}"}
    assert conf.compare(case, conf.ours(case), {"letter": "B"}) == "ours_reads_boxed"
    case = {"kind": "gpqa", "response": "Answer: $A$"}
    assert conf.compare(case, conf.ours(case), {"letter": "A"}) is None
    case = {"kind": "bfcl_decode", "text": '<tool_call>{"name": "f", "arguments": {}}</tool_call>'}
    assert conf.compare(case, conf.ours(case), {"decoded": []}) is None
    assert conf.compare(case, conf.ours(case), {"decoded": [["f", {}]]}) == "different_calls"
    assert conf.compare({"kind": "bfcl_ast"}, {"valid": True}, {"raises": "KeyError"}) == "official_raises_ours_passes"


def test_a_multi_turn_step_is_compared_as_the_call_strings_bfcl_executes():
    """Row bfcl_execute: the same raw text read as a multi-turn step (decode_execute); a raise and an empty list are
    both no call (the turn ends)."""
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": [1, \\"a\\"]}"}\n</tool_call>'  # arguments: a string
    case = {"kind": "bfcl_decode", "text": text}
    mine = conf.ours(case, "execute")
    assert mine == {"executed": ["f(x=[1, 'a'])"]}
    assert conf.compare(case, mine, {"executed": ["f(x=[1, 'a'])"], "execute_empty": False}) is None
    assert conf.compare(case, mine, {"executed": None, "execute_error": "KeyError"}) == "official_no_call"
    assert conf.compare(case, mine, {"executed": ["f(x=[1])"], "execute_empty": False}) == "different_calls"
    none = {"kind": "bfcl_decode", "text": "<tool_call>[1]</tool_call>"}
    assert conf.compare(none, conf.ours(none, "execute"), {"executed": None}) is None
    assert conf.compare(none, conf.ours(none, "execute"), {"executed": [], "execute_empty": True}) is None
    assert ("bfcl_execute", "bfcl_decode", "execute") in conf.CHECKERS
