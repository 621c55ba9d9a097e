"""The default agent's data (train/data/asks.py): every family's program prints its answer in the real sandbox,
the asks are seeded, varied and distinct, the records are the synthetic conversations' shape (one call, the
program's output, a boxed answer the math grader accepts), the `asks:` source loads, and the held-out prompts the
agent is measured on share no question with the data."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rstar2_agent.chat_format import extract_answer
from rstar2_agent.grading.math import grade_answer
from rstar2_agent.sandbox import ExecRequest
from rstar2_agent.train.data import asks
from rstar2_agent.train.data.converters import DataError, load_records

HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "agent_held_out.jsonl"


def test_asks_are_seeded_distinct_and_cover_every_family():
    first = asks.problems(0, 280)
    assert first == asks.problems(0, 280)
    assert len({p.text for p in first}) == 280
    assert {p.id.rsplit("-", 1)[0] for p in first} == {"ask-0"}
    assert len({p.text for p in asks.problems(1, 280)} & {p.text for p in first}) == 0
    assert sum(p.text.endswith("Use Python.") for p in first) > 40  # the phrasings users write, with and without
    assert len({p.text.split()[0] for p in first}) >= 8  # What, Compute, How, Find, Multiply, ...
    families = Counter(p.meta["family"] for p in asks.problems(0, 3 * len(asks.FAMILIES)))
    assert families == Counter({name: 3 for name in asks.FAMILIES})  # each family drawn as often


async def test_every_program_prints_its_answer_in_the_sandbox(sandbox):
    sample = asks.problems(5, 3 * len(asks.FAMILIES))
    results = await sandbox.run_batch([ExecRequest(p.code) for p in sample])
    for p, r in zip(sample, results, strict=True):
        assert r.ok and r.stdout == p.answer + "\n", (p.text, p.code, r.stderr)


def test_the_program_carries_the_question_s_numbers():
    """The point of the data: the code is the question's own operation on the question's own numbers."""
    import re

    derived = {"sum_range"}  # "a + (a+1) + ... + b" lists a term the code computes
    for p in asks.problems(7, 200):
        numbers = [] if p.meta["family"] in derived else re.findall(r"\d{3,}", p.text)
        assert not numbers or max(numbers, key=len) in p.code, (p.text, p.code)


def test_the_asks_source_gives_one_call_then_a_boxed_answer_the_grader_accepts():
    records = load_records("asks:12:3")
    assert records == load_records("asks:12:3") and len(records) == 12
    for rec, p in zip(records, asks.problems(3, 12), strict=True):
        roles = [m["role"] for m in rec["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        call = rec["messages"][1]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"]) == {"code": p.code}
        assert rec["messages"][2]["result"]["stdout"] == p.answer + "\n"
        answer = extract_answer(rec["messages"][3]["content"])
        assert grade_answer(answer, p.answer) and not grade_answer(answer, str(int(p.answer) + 1))
    with pytest.raises(DataError, match="asks:N"):
        load_records("asks:many")


@pytest.mark.parametrize("name,count", [("agent_held_out.jsonl", 20), ("agent_similar.jsonl", 10)])
def test_the_held_out_prompts_are_not_in_the_data(name, count):
    """Neither held-out set (the 20 prompts, and the 10 of the README's kind) shares a question with the recipe's
    asks (asks:444:0)."""
    held = [json.loads(line) for line in (HELD_OUT.parent / name).read_text().splitlines()]
    assert len(held) == count and all(r["answer"].lstrip("-").isdigit() for r in held)
    trained = {p.text.lower() for p in asks.problems(0, 444)}
    for r in held:
        assert not any(r["question"].lower() in t or t in r["question"].lower() for t in trained)


def test_error_share_records_read_a_real_error_and_train_only_on_the_fix(smol, smol_tokenizer):
    """`asks:N:SEED:1`: every ask whose program imports math first calls it without the import (or with a bare
    `gcd(`), gets the real sandbox's NameError, then calls the program; the rest are as at share 0. Rendered for
    SFT, the failing call is prompt (no target token) and the fix and the answer are targets."""
    from rstar2_agent.chat_format import ChatFormat
    from rstar2_agent.train.data.chat_data import render

    plain, mixed = load_records("asks:40:5"), load_records("asks:40:5:1")
    fixed = [k for k, rec in enumerate(mixed) if len(rec["messages"]) == 6]
    assert len(fixed) == sum("import math\n" in p.code for p in asks.problems(5, 40)) > 5
    assert all(mixed[k] == plain[k] for k in range(40) if k not in fixed)
    fmt = ChatFormat(smol_tokenizer, "hermes", smol.spec.chat_template)
    for k in fixed:
        first, error, fix, ok = mixed[k]["messages"][1:5]
        assert first["weight"] == 0 and "weight" not in fix
        assert "import math" not in json.loads(first["tool_calls"][0]["function"]["arguments"])["code"]
        assert error["result"]["status"] == "error" and "NameError: name '" in error["result"]["stderr"]
        assert json.loads(fix["tool_calls"][0]["function"]["arguments"]) == {"code": asks.problems(5, 40)[k].code}
        assert ok["result"]["stdout"] == plain[k]["messages"][2]["result"]["stdout"]
        ex = render(fmt, mixed[k])
        target = smol_tokenizer.decode([t for t, m in zip(ex.ids, ex.mask, strict=True) if m])
        assert "NameError" not in target and target.count("<tool_call>") == 1 and "\\boxed{" in target
        unweighted = render(fmt, {**mixed[k], "messages": [{k2: v for k2, v in m.items() if k2 != "weight"}
                                                            for m in mixed[k]["messages"]]})
        assert unweighted.ids == ex.ids and sum(unweighted.mask) > sum(ex.mask)
    with pytest.raises(DataError, match="error_share must be between 0 and 1"):
        load_records("asks:4:0:2")
