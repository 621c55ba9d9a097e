"""`rstar2 train problems-verify` against a real OpenAI-compatible server: the project's `rstar2 serve` app on
loopback (uvicorn, the real agent loop and sandbox), with a scripted engine standing in for the 32B model, so
that how many of each problem's samples reach the label is known. The command runs as a real process: it is
killed while a request is in flight and run again, and nothing it recorded is asked again."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.engines.base import Engine, Generation
from rstar2_agent.train.data.problems import from_text, read_problems, write_problems
from rstar2_agent.train.data.problems_verify import VerifyConfig, progress_path, verify

from conftest import ROOT, free_port, serving, until

RSTAR2 = str(Path(sys.executable).with_name("rstar2"))
SAMPLES = 4
# problem -> (label, how many of SAMPLES answers reach it)
SCRIPT = {"How many edges does a cube have?": ("12", 4),
          "How many days are in a week?": ("7", 1),
          "How many days are in April?": ("30", 2),
          "How many vowels are in the English alphabet?": ("5", 0)}


class ScriptedMathModel(Engine):
    """Stands in for the strong model: the k-th sample of a problem reaches its label when (k mod SAMPLES) is below
    the scripted count; `hold` is a problem whose requests wait for `release` (set once the asking process is
    killed: the server does not notice that a non-streaming client is gone)."""

    name, context_length = "scripted-math", 8192

    def __init__(self, tokenizer, hold: str | None = None):
        self.tokenizer, self.hold, self.release = tokenizer, hold, asyncio.Event()
        self.calls: collections.Counter[str] = collections.Counter()

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        prompt = self.tokenizer.decode(prompt_ids)
        problem = next(p for p in SCRIPT if p in prompt)
        self.calls[problem] += 1
        if problem == self.hold:
            await self.release.wait()  # the client is killed meanwhile
        label, right = SCRIPT[problem]
        answer = label if (self.calls[problem] - 1) % SAMPLES < right else str(int(label) + 1)
        ids = self.tokenizer.encode(f"The answer is <answer>\\boxed{{{answer}}}</answer>", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [0.0] * len(ids), "stop")


async def _verify(url: str, inp: Path, out: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        RSTAR2, "train", "problems-verify", str(inp), "--out", str(out), "--url", url, "--samples", str(SAMPLES),
        "--concurrency", "1", "--timeout", "60", *extra, cwd=ROOT, start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def _finish(proc: asyncio.subprocess.Process) -> str:
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return out.decode()


def _recorded(out: Path) -> list[dict]:
    return [r for r in map(json.loads, progress_path(out).read_text().splitlines()) if "id" in r]


@pytest.mark.slow
async def test_a_killed_verify_resumes_without_asking_again_scripted_model(tmp_path, smol_tokenizer, sandbox):
    inp, out = tmp_path / "omr.jsonl", tmp_path / "omr-verified.jsonl"
    problems = [from_text(p, label, "openmathreasoning") for p, (label, _) in SCRIPT.items()]
    write_problems(inp, problems)
    held = "How many days are in April?"
    engine = ScriptedMathModel(smol_tokenizer, hold=held)
    async with serving(engine, sandbox) as url:  # its one model is the verifier's default (--served-model unset)
        proc = await _verify(url, inp, out)
        try:
            await until(lambda: engine.calls[held] == SAMPLES or proc.returncode is not None,
                        "the third problem's request", timeout=60)
            assert proc.returncode is None, await _finish(proc)
            assert [r["correct"] for r in _recorded(out)] == [4, 1]  # the first two, recorded before the third
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and its grader processes, mid-request
            await proc.wait()
            engine.release.set()
        assert not out.exists()  # written only when every problem is done
        with open(progress_path(out), "a") as f:
            f.write('{"id": "0123')  # a line cut by the kill
        engine.hold = None
        log = await _finish(await _verify(url, inp, out))
        assert "2 of 4 problems kept" in log and "2 asked now, 2 recorded before" in log, log
        # each problem asked once with n=SAMPLES; the held one again after the kill, none recorded twice
        assert engine.calls == {p: SAMPLES for p in SCRIPT} | {held: 2 * SAMPLES}
        assert [(p.text, p.answer) for p in read_problems(out)] == [
            ("How many edges does a cube have?", "12"), (held, "30")]
        assert [r["correct"] for r in _recorded(out)] == [4, 1, 2, 0]

        # --min-agree is applied to what is recorded: nothing is asked
        log = await _finish(await _verify(url, inp, out, "--min-agree", "1"))
        assert "3 of 4 problems kept" in log and "0 asked now" in log, log
        assert sum(engine.calls.values()) == 5 * SAMPLES
        # other sampling settings would mix two experiments in one record
        log = await _finish(await _verify(url, inp, out, "--temperature", "1.0"))
        assert "recorded with other settings" in log and "temperature: 0.6 -> 1.0" in log, log


async def test_no_server_says_so(tmp_path):
    inp = tmp_path / "p.jsonl"
    write_problems(inp, [from_text("What is 1+1?", "2", "test")])
    cfg = VerifyConfig(f"http://127.0.0.1:{free_port()}", served_model="m", timeout=5)
    with pytest.raises(DataError, match="no OpenAI-compatible server answers"):
        await verify(inp, tmp_path / "out.jsonl", cfg)


def test_the_journal_cuts_a_torn_line_and_refuses_a_corrupt_one(tmp_path):
    from rstar2_agent.train.data.journal import Journal

    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append({"id": "a", "correct": 2})
        j.append({"id": "b", "correct": 0})
    with open(path, "a") as f:
        f.write('{"id": "c", "corr')  # a kill in the middle of a write
    with Journal(path) as j:
        assert j.rows == [{"id": "a", "correct": 2}, {"id": "b", "correct": 0}]
        j.append({"id": "c", "correct": 1})
    with Journal(path) as j:
        assert [r["id"] for r in j.rows] == ["a", "b", "c"]
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"j.jsonl:2 is not a JSON line"):
        Journal(path)
