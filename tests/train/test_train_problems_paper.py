"""`rstar2 train problems-paper`: the paper's RL problem set as one resumable chain (the AoPS part curated, then
verified by a model behind a real OpenAI-compatible server, then merged with DAPO and Project Euler). The server is
the project's `rstar2 serve` app on loopback with a scripted engine standing in for Qwen3-32B; the sources are the
fixtures in each source's own schema (tests/data/problems/)."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.engines.base import Engine, Generation
from rstar2_agent.train.data.paper_problems import PAPER_DAPO, STEPS, PaperSources, build_paper_problems
from rstar2_agent.train.data.problems import build, read_problems
from rstar2_agent.train.data.problems_verify import VerifyConfig
from rstar2_agent.train.train_commands import train_group

from conftest import serving

DATA = Path(__file__).resolve().parents[1] / "data" / "problems"
BENCH = DATA / "benchmarks"
SOURCES = PaperSources(dapo=f"dapo:{DATA / 'dapo.jsonl'}", aops=f"omr:{DATA / 'omr.jsonl'}",
                       euler=f"euler:{DATA / 'euler.jsonl'}")


class Verifier(Engine):
    """Answers a problem's label (read from the chain's curated AoPS file) when the label is even, else label + 1."""

    name, context_length = "scripted-verifier", 8192

    def __init__(self, tokenizer, aops: Path):
        self.tokenizer, self.aops = tokenizer, aops
        self.calls: collections.Counter[str] = collections.Counter()

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        prompt = self.tokenizer.decode(prompt_ids)
        problem = next(p for p in read_problems(self.aops) if p.text in prompt)
        self.calls[problem.text] += 1
        label = int(problem.answer)
        ids = self.tokenizer.encode(f"<answer>\\boxed{{{label if label % 2 == 0 else label + 1}}}</answer>",
                                    add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


def test_the_14b_recipe_trains_on_what_the_chain_builds_and_stops_early_without_it(tmp_path, monkeypatch):
    """The 14B recipe's stages read the chain's output (the paper's 42K); where it is not built the run stops at the
    recipe check, before a learner, an engine or Ray starts, naming the command that builds it and the named
    alternative, which reads the chain's own DAPO (open-r1's `all`, the 17K the paper counts) and Project Euler."""
    from rstar2_agent.train.config import RLConfig
    from rstar2_agent.train.data.paper_problems import RESULT, WITHOUT_VERIFIER
    from rstar2_agent.train.recipe import load
    from rstar2_agent.train.rl import check_recipe

    monkeypatch.chdir(tmp_path)
    paper = load(RLConfig, "rl-qwen3-14b-base-mi300x")
    assert all(stage.data == f"runs/rl-problems/{RESULT}" for stage in paper.stages)
    defaults = PaperSources()
    assert PAPER_DAPO.endswith(":all") and WITHOUT_VERIFIER == [defaults.dapo, defaults.euler]
    with pytest.raises(DataError, match=r"stage 1's data runs/rl-problems/rl-problems.jsonl does not exist.*"
                                        r"rstar2 train problems-paper --out runs/rl-problems .*open-r1/DAPO"):
        check_recipe(paper)
    (tmp_path / "runs" / "rl-problems").mkdir(parents=True)
    (tmp_path / "runs" / "rl-problems" / RESULT).write_text('{"problem": "1+1?", "answer": "2", "source": "s"}\n')
    check_recipe(paper)  # built: the check passes


@pytest.mark.slow
async def test_the_chain_builds_each_step_once_and_a_rerun_asks_nothing(tmp_path, smol_tokenizer, sandbox):
    out = tmp_path / "paper"
    engine = Verifier(smol_tokenizer, out / "aops.jsonl")
    async with serving(engine, sandbox) as url:
        cfg = VerifyConfig(url, samples=2, min_agree=1, concurrency=2, timeout=60)
        first = await build_paper_problems(out, cfg, str(BENCH), SOURCES)
        assert [s.step for s in first.steps] == list(STEPS) and not any(s.done_before for s in first.steps)
        aops = read_problems(out / "aops.jsonl")
        assert aops and all(p.source == "openmathreasoning" for p in aops)
        assert engine.calls == {p.text: 2 for p in aops}  # every curated AoPS problem asked once, 2 samples
        verified = read_problems(out / "aops-verified.jsonl")
        assert [p.text for p in verified] == [p.text for p in aops if int(p.answer) % 2 == 0]
        assert first.steps[1].counts["kept"] == len(verified) and first.steps[1].counts["asked"] == len(aops)
        # the merge is `rstar2 train problems` over DAPO, the verified AoPS problems and Project Euler
        by_hand = build([SOURCES.dapo, f"problems:{out / 'aops-verified.jsonl'}", SOURCES.euler],
                        tmp_path / "by-hand.jsonl", str(BENCH))
        assert (out / "rl-problems.jsonl").read_text() == (tmp_path / "by-hand.jsonl").read_text()
        assert first.steps[2].counts == by_hand.as_json() and first.out == str(out / "rl-problems.jsonl")

        again = await build_paper_problems(out, cfg, str(BENCH), SOURCES)  # a rerun: every step recorded
        assert all(s.done_before for s in again.steps) and sum(engine.calls.values()) == 2 * len(aops)
        assert [s.counts for s in again.steps] == [s.counts for s in first.steps]
        # the command prints what each source kept beside the paper's counts, and the decontamination's hits
        args = ["problems-paper", "--out", str(out), "--data-dir", str(BENCH), "--dapo", SOURCES.dapo, "--aops",
                SOURCES.aops, "--euler", SOURCES.euler, "--url", url, "--samples", "2", "--min-agree", "1"]
        r = await asyncio.to_thread(CliRunner().invoke, train_group, args)
        kept = first.steps[2].counts["kept_by_source"]
        assert r.exit_code == 0 and sum(engine.calls.values()) == 2 * len(aops), r.output
        assert (f"kept, beside the paper's: dapo {kept['dapo']} (paper 17,000), openmathreasoning "
                f"{kept['openmathreasoning']} (paper 24,063), project-euler {kept['project-euler']} (paper 937), "
                f"total {first.steps[2].counts['kept']} (paper 42,000)") in r.output
        assert ('decontamination hits by benchmark: aime24 1; most striking 8-grams: "let n be the number of ways to" 1'
                in r.output)

        (out / "merge.done.json").unlink()  # as if killed in the merge: only the merge runs again
        resumed = await build_paper_problems(out, cfg, str(BENCH), SOURCES)
        assert [s.done_before for s in resumed.steps] == [True, True, False]
        assert sum(engine.calls.values()) == 2 * len(aops)

        with pytest.raises(DataError, match=r"step aops-verified was built with other settings \(.*samples"):
            await build_paper_problems(out, VerifyConfig(url, samples=4, min_agree=1), str(BENCH), SOURCES)


def test_the_command_needs_a_server_and_says_so(tmp_path):
    r = CliRunner().invoke(train_group, ["problems-paper", "--out", str(tmp_path / "p"), "--aops",
                                         SOURCES.aops, "--data-dir", str(BENCH), "--url", "http://127.0.0.1:9",
                                         "--served-model", "m", "--timeout", "5", "--json"])
    assert r.exit_code != 0 and "no OpenAI-compatible server answers" in r.output, r.output
    done = json.loads((tmp_path / "p" / "aops.done.json").read_text())  # the first step stays done
    assert done["counts"]["kept"] == len(read_problems(tmp_path / "p" / "aops.jsonl"))
