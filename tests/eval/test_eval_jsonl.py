"""`rstar2 eval jsonl:PATH`: the user's own problems file. The reader's errors each name the line and what to fix;
the keys other problem readers take are read; the stored name follows the problems, not the file's spelling; and
the real CLI against a scripted chat endpoint grades, stores, resumes without asking twice, and starts a new run
for an edited file."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI

from rstar2_agent.eval.benchmarks import DataError, get_benchmark
from rstar2_agent.eval.benchmarks.jsonl_file import JSONLFile
from rstar2_agent.eval.report import load
from rstar2_agent.store import Store

from conftest import uvicorn_app

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


def write(path: Path, *lines: str | dict) -> Path:
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(("lines", "message"), [
    (['{"question": "1+1?", "answer": 2}', '{"question": "2+2?", "answer": 4'], r"bad\.jsonl:2: not valid JSON"),
    (['["1+1?", 2]'], r"bad\.jsonl:1: a JSON list, not an object"),
    (['{"question": "1+1?", "answer": 2}', '', '{"text": "2+2?", "answer": 4}'],
     r"bad\.jsonl:3: no question; .*'question', 'problem', 'prompt' \(keys here: 'text', 'answer'\)"),
    (['{"question": "   ", "answer": 2}'], r"bad\.jsonl:1: no question"),
    (['{"question": "1+1?", "answer": ""}'], r"bad\.jsonl:1: no answer; .*'answer', 'gold'.*'solution'"),
    (['{"question": "1+1?", "answer": null, "reasoning": "two"}'], r"bad\.jsonl:1: no answer"),
    (['{"question": "1+1?", "answer": true}'], r"bad\.jsonl:1: no answer"),
    (['{"id": "a", "question": "1+1?", "answer": 2}', '{"id": "a", "question": "2+2?", "answer": 4}'],
     r"bad\.jsonl:2: the id 'a' is also line 1's; ids must be unique"),
    (['{"id": 2, "question": "1+1?", "answer": 2}', '{"question": "2+2?", "answer": 4}'],
     r"bad\.jsonl:2: the id '2' is also line 1's \(this line has no id: its line number is its id\)"),
    (['{"id": ["x"], "question": "1+1?", "answer": 2}'], r"bad\.jsonl:1: the id \['x'\] is not"),
    ([], r"bad\.jsonl: no problems in the file"),
    (['', '   '], r"bad\.jsonl: no problems in the file"),
])
def test_each_bad_file_says_what_to_fix(tmp_path, lines, message):
    write(tmp_path / "bad.jsonl", *lines)
    with pytest.raises(DataError, match=message):
        get_benchmark(f"jsonl:{tmp_path / 'bad.jsonl'}")


def test_a_missing_path_a_folder_and_no_path(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl does not exist; give the path of a JSONL file"):
        get_benchmark(f"jsonl:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(DataError, match="is a folder, not a file"):
        get_benchmark(f"jsonl:{tmp_path}")
    with pytest.raises(DataError, match="names no file"):
        get_benchmark("jsonl:")
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\xe9?", "answer": 1}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        get_benchmark(f"jsonl:{tmp_path / 'latin1.jsonl'}")


def test_the_keys_other_readers_take_and_the_answers_forms(tmp_path):
    path = write(tmp_path / "mine.jsonl",
                 {"id": "a", "question": "Q1", "answer": 42},
                 {"problem": "Q2", "gold": "\\frac{1}{2}", "solution": "ignored when an answer is given"},
                 "",
                 {"id": 9, "prompt": "Q4", "solution": "So \\boxed{3} then \\boxed{x^{2}}."},
                 {"problem": "Q5", "expected_answer": 3.0},
                 {"question": "  Q6 ", "numerical_answer": "-5", "prompt": "not this"},
                 {"question": "Q7", "solution": "  12 "})
    bench = get_benchmark(f"jsonl:{path}")
    name = bench.name
    assert [(p.id, p.text, p.answer, p.source) for p in bench.load()] == [
        ("a", "Q1", "42", name), ("2", "Q2", "\\frac{1}{2}", name), ("9", "Q4", "x^{2}", name),
        ("5", "Q5", "3", name), ("6", "Q6", "-5", name), ("7", "Q7", "12", name)]


def test_ids_default_to_line_numbers_and_limit_takes_the_first(tmp_path):
    path = write(tmp_path / "mine.jsonl", {"id": "a", "question": "Q1", "answer": 1}, "",
                 {"question": "Q3", "answer": 3}, {"question": "Q4", "answer": 4})
    bench = get_benchmark(f"jsonl:{path}")
    assert [p.id for p in bench.load()] == ["a", "3", "4"]
    assert [p.id for p in bench.load(limit=2)] == ["a", "3"]


def test_the_stored_name_follows_the_problems_not_the_spelling_or_the_place(tmp_path, monkeypatch):
    rows = [{"id": "a", "question": "What is 6 * 7?", "answer": 42}, {"id": "b", "question": "1+1?", "answer": "2"}]
    first = get_benchmark(f"jsonl:{write(tmp_path / 'mine.jsonl', *rows)}")
    assert first.name.startswith("jsonl:mine@") and len(first.name.split("@")[1]) == 8
    (tmp_path / "elsewhere").mkdir()
    spaced = "\n".join(json.dumps(r, indent=None, separators=(" , ", " : ")) for r in rows) + "\n\n"
    (tmp_path / "elsewhere" / "mine.jsonl").write_text(spaced, encoding="utf-8")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert JSONLFile("jsonl:mine.jsonl").name == first.name  # relative to the cwd; the JSON's spacing is no change
    monkeypatch.setenv("HOME", str(tmp_path))
    assert JSONLFile("jsonl:~/mine.jsonl").name == first.name
    edited = write(tmp_path / "mine.jsonl", rows[0], {**rows[1], "answer": "3"})
    assert get_benchmark(f"jsonl:{edited}").name != first.name
    assert get_benchmark(f"jsonl:{write(tmp_path / 'other.jsonl', *rows)}").name.startswith("jsonl:other@")


# ------------------------------------------------------------------------------------------ the real CLI
# what the scripted model answers to each question (a substring of it): right on "2 + 3" and "2/4", wrong on "7 * 6"
REPLIES = {"2 + 3": "5", "7 * 6": "41", "2/4": "\\frac{1}{2}"}


def scripted() -> FastAPI:
    """An OpenAI chat endpoint that answers each question from REPLIES in the rStar2 answer format, counting the
    calls per question."""
    app = FastAPI()
    app.state.calls = {}

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> dict:
        question = body["messages"][-1]["content"]
        key = next(k for k in REPLIES if k in question)
        app.state.calls[key] = app.state.calls.get(key, 0) + 1
        msg = {"role": "assistant", "content": f"Easy.<answer>\\boxed{{{REPLIES[key]}}}</answer>"}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    return app


async def rstar2(*args: str, cwd: Path) -> str:
    proc = await asyncio.create_subprocess_exec(RSTAR2, *args, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (out + err).decode()[-3000:]
    return (out + err).decode()


def scores(db: Path, run: str) -> dict[str, dict[str, list[bool]]]:
    """Per stored benchmark of the run: each problem's graded samples."""
    out: dict[str, dict[str, list[bool]]] = {}
    for r in load(Store(db), run):
        for s in sorted(r.samples, key=lambda s: (s.problem_id, s.sample_index)):
            out.setdefault(r.run.benchmark, {}).setdefault(s.problem_id, []).append(s.correct)
    return out


async def test_the_cli_grades_stores_resumes_and_starts_a_new_run_for_an_edited_file(tmp_path):
    rows = [{"id": "add", "question": "What is 2 + 3?", "answer": 5},
            {"problem": "What is 7 * 6?", "gold": "42"},
            {"id": 7, "prompt": "Simplify 2/4.", "solution": "Halve both: \\boxed{\\frac{1}{2}}"}]
    write(tmp_path / "problems.jsonl", *rows)
    first = get_benchmark(f"jsonl:{tmp_path / 'problems.jsonl'}").name
    db = str(tmp_path / "eval.db")
    app = scripted()
    async with uvicorn_app(app) as url:
        args = ["eval", "run", "jsonl:problems.jsonl", "--url", url, "--api", "chat", "--served-model", "scripted",
                "--no-tools", "--n", "2", "--db", db]
        out = await rstar2(*args, cwd=tmp_path)
        assert first in out and "n 2, temperature 0.6, top_p 1, max_tokens 30720, max_turns 30" in out
        run = "scripted-t0.6-notools-chat"  # the default name: the same command resumes
        assert scores(tmp_path / "eval.db", run) == {first: {"2": [False, False], "7": [True, True],
                                                             "add": [True, True]}}
        assert app.state.calls == {k: 2 for k in REPLIES}

        out = await rstar2(*args, cwd=tmp_path)
        assert app.state.calls == {k: 2 for k in REPLIES}, "a resumed run asked again"
        assert "6 stored" in out

        write(tmp_path / "problems.jsonl", rows[0], {**rows[1], "gold": "41"}, rows[2])
        await rstar2(*args, cwd=tmp_path)
        assert app.state.calls == {k: 4 for k in REPLIES}
    got = scores(tmp_path / "eval.db", run)
    (second,) = set(got) - {first}
    assert second.startswith("jsonl:problems@")
    assert got[first]["2"] == [False, False] and got[second]["2"] == [True, True]  # the old run is kept as it was
    assert got[second]["add"] == got[second]["7"] == [True, True]
