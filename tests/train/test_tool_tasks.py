"""Tool tasks (train/data/tool_tasks.py) against the real sandbox and the real math grader: seeded and distinct
problems, reference programs that print the answer from the question's data on stdin, bugs that really fail (in
the user's file only), error-then-fix records whose first call fails and second succeeds, deterministic records,
the `tooltasks:` SFT source and the RL stage's `data: tooltasks`."""

from __future__ import annotations

import json
from collections import Counter

from rstar2_agent.chat_format import extract_answer
from rstar2_agent.grading.math import grade_answer
from rstar2_agent.sandbox import ExecRequest
from rstar2_agent.synthetic import SynthProblem
from rstar2_agent.train.data import tool_tasks
from rstar2_agent.train.data.tool_tasks import ToolProblem, conversations_async, problems


def _family(p: ToolProblem) -> str:
    return p.text.split("\n", 1)[0]


def _calls(record: dict) -> list[dict]:
    return [json.loads(c["function"]["arguments"]) for m in record["messages"] if m["role"] == "assistant"
            for c in m.get("tool_calls") or []]


def test_problems_are_deterministic_per_seed_and_distinct():
    first = problems(3, 60)
    assert first == problems(3, 60)
    assert all(isinstance(p, SynthProblem) and p.bugs for p in first)  # Problems: RL's pool holds them as they are
    assert len({p.id for p in first}) == 60 and len({p.text for p in first}) == 60
    assert len({p.text for p in problems(4, 60)} - {p.text for p in first}) >= 55  # another seed, others
    assert len(Counter(p.text.split()[1] for p in first)) == len(tool_tasks.FAMILIES)  # every family drawn


def test_the_question_holds_the_data_the_program_reads():
    for p in problems(5, 40):
        assert p.stdin.endswith("\n") and p.stdin.strip() in p.text
        assert "input()" in p.code or "sys.stdin" in p.code
        assert p.answer.lstrip("-").isdigit()


async def test_reference_programs_print_the_answer_in_the_sandbox(sandbox):
    sample = problems(11, 25)
    results = await sandbox.run_batch([ExecRequest(p.code, p.stdin) for p in sample])
    for p, r in zip(sample, results, strict=True):
        assert r.ok and r.stdout == p.answer + "\n", (p.text, r.stderr)


async def test_every_bug_raises_in_the_users_file_only(sandbox):
    sample = problems(12, 20)
    pairs = [(p, b) for p in sample for b in p.bugs]
    results = await sandbox.run_batch([ExecRequest(b.code, p.stdin) for p, b in pairs])
    for (_, b), r in zip(pairs, results, strict=True):
        assert not r.ok and "Traceback" in r.stderr, b.code
        assert r.stderr.count('File "') == r.stderr.count('File "main.py"'), r.stderr  # no library's path


def test_the_math_grader_accepts_the_boxed_answer_and_rejects_another():
    for p in problems(13, 20):
        boxed = extract_answer(f"<answer>The answer is \\boxed{{{p.answer}}}.</answer>")
        assert grade_answer(boxed, p.answer)
        assert not grade_answer(str(int(p.answer) + 1), p.answer)


async def test_error_then_fix_records_fail_first_and_succeed_second(sandbox):
    sample = problems(14, 16)
    records = await conversations_async(14, 16, error_share=1.0, sandbox=sandbox)
    for p, record in zip(sample, records, strict=True):
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]  # each format adds its system
        first, second = _calls(record)
        assert first["input"] == second["input"] == p.stdin and second["code"] == p.code
        bad, good = await sandbox.run(first["code"], first["input"]), await sandbox.run(second["code"], second["input"])
        assert not bad.ok and good.ok and good.stdout == p.answer + "\n"
        shown_bad, shown_good = (json.loads(m["content"]) for m in record["messages"] if m["role"] == "tool")
        assert shown_bad["status"] == "failure: error" and shown_bad["stderr"] == bad.stderr  # the real error text
        assert shown_good["status"] == "success" and shown_good["stdout"] == good.stdout
        assert f"\\boxed{{{p.answer}}}" in record["messages"][-1]["content"]


async def test_clean_records_call_once_and_the_share_mixes_the_kinds(sandbox):
    clean = await conversations_async(15, 10, error_share=0.0, sandbox=sandbox)
    assert all(len(_calls(r)) == 1 and len(r["messages"]) == 4 for r in clean)
    mixed = await conversations_async(15, 60, sandbox=sandbox)
    fixes = sum(len(_calls(r)) == 2 for r in mixed)
    assert 18 <= fixes <= 42  # about half at the default share
    assert mixed == await conversations_async(15, 60, sandbox=sandbox)  # timings do not leak into the records
    assert all('"execution_time": "0.010s"' in m["content"] for r in mixed for m in r["messages"]
               if m["role"] == "tool")


def test_the_tooltasks_source_loads_through_load_records():
    from rstar2_agent.train.data.converters import load_records

    records = load_records("tooltasks:6:21:1.0")  # N:SEED:ERROR_SHARE
    assert len(records) == 6 and all(len(_calls(r)) == 2 for r in records)
    assert [_calls(r)[1]["code"] for r in records] == [p.code for p in problems(21, 6)]


def test_the_rl_stage_picks_the_tool_tasks_generator():
    from rstar2_agent.train.config import RLConfig, Stage
    from rstar2_agent.train.data.pool import draw, stage_pool
    from rstar2_agent.train.recipe import load

    cfg = load(RLConfig, "rl-smollm2-tooltasks-cpu")
    assert cfg.stages[0].data == "tooltasks" and cfg.model == "runs/sft-smollm2-tooltasks-cpu/last"
    assert Stage(steps=1).data == "synthetic"
    pool = stage_pool(Stage(steps=1, data="tooltasks", data_seed=5, data_size=4), cfg)
    assert pool == {p.id: p for p in problems(5, 4)}
    # a step's problems are a function of (seed, step): pinned, so a change of the draw shows here
    eight = stage_pool(Stage(steps=1, data="tooltasks", data_seed=5, data_size=8), cfg)
    assert [p.id for p in draw(eight, 3, seed=7, step=2)] == ["tool-5-6", "tool-5-2", "tool-5-0"]
