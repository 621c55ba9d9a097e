"""The SFT data of the paper's mix: each set's loader on a fixture written in that set's own hub schema
(tests/data/sft/ORG/NAME, laid out as local copies of the hub repositories), the seeded `@N` sampling, `mix:paper`,
`rstar2 train data --json`, and the optional rewrite over a real OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.train.config import SFTConfig
from rstar2_agent.train.data import converters
from rstar2_agent.train.data.chat_data import PYTHON_TOOL, DataStats, load_examples, render
from rstar2_agent.train.data.rewrite import RewriteConfig, RewriteError, rewrite
from rstar2_agent.train.data.sft_mix import PAPER_MIX, expand, load_mix, split_size
from rstar2_agent.train.recipe import load

from conftest import uvicorn_app

HUB_DIR = Path(__file__).parents[1] / "data" / "sft"
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


@pytest.fixture(scope="module")
def fmt(smol, smol_tokenizer):
    return ChatFormat(smol_tokenizer, "hermes", smol.spec.chat_template)


def hub(hub_id: str, stats: DataStats | None = None) -> list[dict]:
    return converters.load_records(f"hub:{hub_id}", "skip", stats, str(HUB_DIR))


def roles(record: dict) -> list[str]:
    return [m["role"] for m in record["messages"]]


def calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def test_toolace_calls_become_tool_calls_and_a_malformed_row_is_skipped(fmt):
    stats = DataStats()
    records = hub("Team-ACE/ToolACE", stats)
    assert len(records) == 3 and stats.bad_lines == [4]
    first, parallel, refusal = records
    assert roles(first) == ["user", "assistant", "tool", "assistant"]
    assert calls(first["messages"][1]) == [("TideTable", {"harbour": "Port Sorell", "date": "2024-03-02"})]
    assert [t["function"]["name"] for t in first["tools"]] == ["TideTable"]
    assert calls(parallel["messages"][1]) == [("BusDepartures", {"stop_id": 4471, "limit": 3}),
                                               ("TideTable", {"harbour": "Stanley"})]
    assert "tool_calls" not in refusal["messages"][1] and "taxi" in refusal["messages"][1]["content"]
    assert all(any(ex.mask) for ex in load_examples(fmt, records, 4096))


def test_apigen_mt_multi_turn_calls_and_observations(fmt):
    (order, _) = records = hub("Salesforce/APIGen-MT-5k")
    assert roles(order) == ["system", *["user", "assistant", "tool", "assistant"] * 2]
    assert calls(order["messages"][6]) == [("cancel_order", {"order_id": "#W1234", "reason": "ordered by mistake"})]
    assert order["messages"][7]["tool_call_id"] == order["messages"][6]["tool_calls"][0]["id"]
    assert [t["function"]["name"] for t in order["tools"]] == ["get_order", "cancel_order"]
    assert all(any(ex.mask) for ex in load_examples(fmt, records, 4096))


def test_glaive_v2_with_and_without_functions(fmt):
    call, refusal, plain = records = hub("glaiveai/glaive-function-calling-v2")
    assert calls(call["messages"][2]) == [("convert_length", {"value": 12, "from_unit": "m", "to_unit": "ft"})]
    assert roles(call)[-2:] == ["tool", "assistant"]
    assert call["messages"][-1]["content"] == "12 metres is about 39.37 feet."
    assert refusal["tools"] and roles(refusal) == ["system", "user", "assistant"]
    assert plain["tools"] == [] and plain["messages"][0]["content"].startswith("You are a helpful assistant, with no")
    assert all(any(ex.mask) for ex in load_examples(fmt, records, 4096))


def test_magicoder_python_blocks_become_one_call_of_the_formats_python_tool(fmt, smol_tokenizer):
    stats = DataStats()
    records = hub("ise-uiuc/Magicoder-Evol-Instruct-110K", stats)
    assert len(records) == 3 and stats.filtered == 1 and not stats.bad_lines  # the JavaScript row is left out
    triangular, reverse, vowels = records
    assert roles(triangular) == ["user", "assistant"] and "tools" not in triangular
    assert triangular["messages"][1]["content"] == "The n-th triangular number is n(n+1)/2:"
    ((name, args),) = calls(triangular["messages"][1])
    assert name == PYTHON_TOOL and args == {"code": "def triangular(n):\n    return n * (n + 1) // 2\n\n"
                                                    "print(triangular(10))", "input": ""}
    assert calls(reverse["messages"][1])[0][1]["code"].endswith("\n\nprint(reverse_words('to be or not'))")
    assert calls(vowels["messages"][1])[0][1]["code"] == "print(sum(c in 'aeiou' for c in 'sandbox'))"  # ```Python
    # rendered, the call names the tool of the format in use: hermes' own, or any other the format is given
    text = fmt.decode(render(fmt, triangular).ids)
    assert '{"name": "execute_python_code_with_standard_io", "arguments": {"code": "def triangular' in text
    run_python = {"type": "function", "function": {"name": "run_python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}, "input": {"type": "string"}}}}}
    other = ChatFormat(smol_tokenizer, "hermes", tools=[run_python])
    ex = render(other, triangular)
    target = other.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if m])
    assert target.startswith('The n-th triangular number is n(n+1)/2:\n<tool_call>\n{"name": "run_python"')
    assert PYTHON_TOOL not in other.decode(ex.ids)


def test_magicoder_oss_instruct_schema_keeps_python_rows_only():
    rows = [{"lang": "python", "problem": "Sum a list.", "solution": "```python\nprint(sum([1, 2]))\n```"},
            {"lang": "rust", "problem": "Sum a vec.", "solution": "```rust\nfn main() {}\n```"}]
    out = [converters.magicoder(r) for r in rows]
    assert out[1] is None and calls(out[0]["messages"][1])[0][1]["code"] == "print(sum([1, 2]))"


def test_tulu3_instruction_following_rows(fmt):
    records = hub("allenai/tulu-3-sft-personas-instruction-following")
    assert len(records) == 3 and all(roles(r) == ["user", "assistant"] and r["tools"] == [] for r in records)
    assert records[1]["messages"][1]["content"] == "BRING YOUR WHEELS AND YOUR WRENCHES\nWE FIX IT TOGETHER OVER COFFEE"
    assert all(any(ex.mask) for ex in load_examples(fmt, records, 4096))


def test_nemotron_keeps_the_chat_splits_non_reasoning_rows(fmt):
    stats = DataStats()
    records = hub("nvidia/Llama-Nemotron-Post-Training-Dataset", stats)
    assert len(records) == 3 and stats.filtered == 1  # the reasoning row; the safety split is not read
    cat, hobby, welsh = records
    assert cat["messages"] == [{"role": "user", "content": "What is a good name for a grey cat?"},
                               {"role": "assistant", "content": "A few ideas: Ash, Smokey, Pebble or Earl Grey."}]
    assert roles(hobby) == ["user", "assistant", "user", "assistant"]
    assert welsh["messages"] == [{"role": "user", "content": "Say hello in Welsh."},  # v1's template text
                                 {"role": "assistant", "content": "Helo! (or 'Shwmae' in the south)."}]
    safety = converters.load_records("hub:nvidia/Llama-Nemotron-Post-Training-Dataset:safety", "skip", None,
                                     str(HUB_DIR))
    assert [m["content"] for m in safety[0]["messages"]][-1] == "I can't help with that."
    assert all(any(ex.mask) for ex in load_examples(fmt, records, 4096))


def test_local_copies_in_parquet_json_and_folders(tmp_path):
    import pyarrow
    import pyarrow.parquet

    tulu = HUB_DIR / "allenai/tulu-3-sft-personas-instruction-following/data/train-00000-of-00001.jsonl"
    rows = [json.loads(line) for line in tulu.read_text().splitlines()]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "train.parquet")
    from_parquet = converters.load_records(f"openai:{tmp_path / 'train.parquet'}")
    assert [r["messages"] for r in from_parquet] == [r["messages"] for r in rows]
    folder = converters.load_records(f"nemotron:{HUB_DIR / 'nvidia/Llama-Nemotron-Post-Training-Dataset/SFT'}")
    assert len(folder) == 4  # chat and safety files, the reasoning row left out
    ace = converters.load_records(f"toolace:{HUB_DIR / 'Team-ACE/ToolACE/data.json'}")
    assert len(ace) == 3
    copy = tmp_path / "Team-ACE" / "ToolACE"  # a hub copy with metadata beside its data
    copy.mkdir(parents=True)
    (copy / "data.json").write_text((HUB_DIR / "Team-ACE/ToolACE/data.json").read_text())
    (copy / "dataset_info.json").write_text('{"features": {}}')
    assert converters.load_records("hub:Team-ACE/ToolACE", hub_dir=str(tmp_path)) == ace
    with pytest.raises(DataError, match="huggingface-cli download --repo-type dataset Salesforce/APIGen-MT-5k"):
        converters.load_records("hub:Salesforce/APIGen-MT-5k", hub_dir=str(tmp_path))


def test_sampling_is_seeded_sized_and_ordered(caplog):
    full = load_mix(["synthetic:40:3"])[0].records
    a, b = (load_mix(["synthetic:40:3@10"], seed=7)[0] for _ in range(2))
    assert a.records == b.records and len(a.records) == 10 and a.available == 40 and a.requested == 10
    assert [full.index(r) for r in a.records] == sorted(full.index(r) for r in a.records)  # the source's order
    assert load_mix(["synthetic:40:3@10"], seed=8)[0].records != a.records
    # a source's rows do not depend on the sources before it
    assert load_mix(["synthetic:5:1", "synthetic:40:3@10"], seed=7)[1].records == a.records
    with caplog.at_level(logging.WARNING):
        few = load_mix(["synthetic:5:1@9"])[0]
    assert few.records == load_mix(["synthetic:5:1"])[0].records and "asked for 9 rows, it has 5" in caplog.text


def test_mix_paper_is_the_papers_sizes_and_the_14b_recipe_uses_it():
    sizes = dict(split_size(s) for s in PAPER_MIX)
    assert sum(sizes[f"hub:{h}"] for h in ("Team-ACE/ToolACE", "Salesforce/APIGen-MT-5k",
                                           "glaiveai/glaive-function-calling-v2")) == 117_000
    assert sizes["hub:ise-uiuc/Magicoder-Evol-Instruct-110K"] == 48_000
    assert sizes["hub:allenai/tulu-3-sft-personas-instruction-following"] == 30_000
    assert sizes["hub:nvidia/Llama-Nemotron-Post-Training-Dataset:chat"] == 27_000
    assert expand(["mix:paper", "synthetic:2"]) == [*PAPER_MIX, "synthetic:2"]
    with pytest.raises(DataError, match="the one mix is mix:paper"):
        expand(["mix:tulu"])
    cfg = load(SFTConfig, "sft-qwen3-14b-base")
    assert "mix:paper" in cfg.data and not any("tulu-3-sft-mixture" in s for s in cfg.data)


def test_train_data_json_reports_rows_and_tokens_per_source(tmp_path, fmt):
    out = tmp_path / "mix.jsonl"
    p = subprocess.run([RSTAR2, "train", "data", "mix:paper", "synthetic:2:0", "--hub-dir", str(HUB_DIR),
                        "--out", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    got = {r["source"]: (r["rows"], r["requested"], r["bad_rows"], r["filtered"]) for r in report["sources"]}
    assert got == {PAPER_MIX[0]: (3, 11000, 1, 0), PAPER_MIX[1]: (2, 5000, 0, 0), PAPER_MIX[2]: (3, 101000, 0, 0),
                   PAPER_MIX[3]: (3, 48000, 0, 1), PAPER_MIX[4]: (3, 30000, 0, 0), PAPER_MIX[5]: (3, 27000, 0, 1),
                   "synthetic:2:0": (2, None, 0, 0)}
    assert "asked for 11000 rows, it has 3" in p.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == report["total"]["rows"] == 19
    # the tokens are those of the written records rendered as SFT renders them (hermes, SmolLM2's tokenizer)
    at = 0
    for r in report["sources"]:
        examples = load_examples(fmt, records[at:at + r["rows"]], 1 << 30)
        at += r["rows"]
        assert r["tokens"] == sum(len(e.ids) for e in examples) > r["target_tokens"] == sum(sum(e.mask)
                                                                                            for e in examples) > 0
    assert report["total"]["tokens"] == sum(r["tokens"] for r in report["sources"])


def test_train_data_single_source_still_writes_and_says_so(tmp_path):
    out = tmp_path / "synth.jsonl"
    p = subprocess.run([RSTAR2, "train", "data", "synthetic:4:0", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 4 and "4 conversations" in p.stdout and str(out) in p.stdout


class RewritingEngine:
    """A scripted stand-in for the stronger model behind `rstar2 serve`: it answers a rewrite request with "NEW " and
    the text of the request's last tagged block upper-cased, and fails once it has answered `fail_after` times (an
    endpoint that goes down)."""

    name, context_length = "scripted-rewriter", 8192

    def __init__(self, tokenizer, fail_after: int | None = None):
        self.tokenizer, self.fail_after, self.calls = tokenizer, fail_after, 0

    def stats(self) -> dict:
        return {}

    async def generate(self, prompt_ids, sampling, on_tokens=None):
        from rstar2_agent.engines.base import EngineError, Generation

        if self.fail_after is not None and self.calls >= self.fail_after:
            raise EngineError("the endpoint is down")
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids)
        tag = "response" if "<response>" in text else "request"
        inner = text[text.rindex(f"<{tag}>") + len(tag) + 2:text.rindex(f"</{tag}>")].strip()
        ids = self.tokenizer.encode("NEW " + inner.upper(), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


async def test_rewrite_resumes_without_asking_twice_against_serve_with_a_scripted_engine(tmp_path, smol_tokenizer,
                                                                                          sandbox):
    from rstar2_agent.serve.app import create_app
    from rstar2_agent.serve.server import ServeConfig, Server

    records = hub("allenai/tulu-3-sft-personas-instruction-following")
    engine = RewritingEngine(smol_tokenizer, fail_after=4)
    server = Server(engine, sandbox, ServeConfig(model_name="rewriter", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        cfg = RewriteConfig(f"{url}/v1", "rewriter", "both", str(tmp_path / "cache.jsonl"), concurrency=1,
                            timeout=30)
        with pytest.raises(RewriteError, match="run the same command again"):
            await rewrite(records, cfg)
        assert engine.calls == 4 and len((tmp_path / "cache.jsonl").read_text().splitlines()) == 4
        with open(tmp_path / "cache.jsonl", "a") as f:
            f.write('{"key": "cut short by a ki')  # the line a killed run was writing
        engine.fail_after = None
        out, stats = await rewrite(records, cfg)
        assert engine.calls == 6 and (stats.asked, stats.cached) == (2, 4)  # 3 rows x (prompt, response)
        for old, new in zip(records, out, strict=True):
            prompt, answer = (m["content"] for m in old["messages"])
            assert new["messages"][0]["content"] == "NEW " + prompt.upper()
            assert new["messages"][1]["content"] == "NEW " + answer.upper()
        again, stats = await rewrite(records, cfg)
        assert again == out and engine.calls == 6 and (stats.asked, stats.cached) == (0, 6)
        # the command rewrites the sets the paper rewrote (not ToolACE), from the same cache
        tulu = "hub:allenai/tulu-3-sft-personas-instruction-following"
        p = await asyncio.create_subprocess_exec(
            RSTAR2, "train", "data", "hub:Team-ACE/ToolACE", tulu, "--hub-dir", str(HUB_DIR), "--out",
            str(tmp_path / "mix.jsonl"), "--json", "--rewrite-url", f"{url}/v1", "--rewrite-model", "rewriter",
            "--rewrite-cache", cfg.cache, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(p.communicate(), 300)
        assert p.returncode == 0, stderr.decode()
        assert json.loads(stdout)["rewrite"] == {tulu: {"asked": 0, "cached": 6, "empty": 0}}
        written = [json.loads(line) for line in (tmp_path / "mix.jsonl").read_text().splitlines()]
        assert written[:3] == hub("Team-ACE/ToolACE") and written[3:] == out and engine.calls == 6
        # the rewritten file, given to an rstar2-paper SFT, trains every row in the shape RL's reward reads
        shaped = load_examples(ChatFormat(smol_tokenizer, "rstar2-paper"), written, 1 << 30)
        assert len(shaped) == 6 and all(ex.shaped for ex in shaped)
        assert not any(ex.shaped_as_written for ex in shaped[3:])  # the endpoint's text alone is not in shape


# ------------------------------------------------------------------------------------------ the targets' shape
@pytest.fixture(scope="module")
def paper_fmt(smol_tokenizer):
    return ChatFormat(smol_tokenizer, "rstar2-paper")


def test_every_paper_mix_source_trains_in_the_shape_the_rl_reward_reads(paper_fmt):
    """Each mix:paper source's fixture in the rstar2-paper profile: as written almost no conversation has the paper's
    shape (a Tulu answer is plain text, a ToolACE turn a bare call); as trained, with target_shape "format", every
    one does, per source, and the decoded targets close </reason> before each call and end in an answer block."""
    from rstar2_agent.train.data.sft_mix import render_parts, report

    parts = load_mix(list(PAPER_MIX), 0, "skip", str(HUB_DIR))
    examples = render_parts(paper_fmt, parts, 1 << 30)
    rows = {r["source"]: r for r in report(parts)["sources"]}
    for source in PAPER_MIX:
        assert rows[source]["in_shape"] == 1.0, (source, rows[source])
        assert rows[source]["in_shape_as_written"] < 1.0, source  # what the conversion is for
    eos = paper_fmt.eos_text
    for ex in examples:
        targets = [t for t in _spans(paper_fmt, ex) if t.strip()]
        assert targets and all(t.endswith(eos) for t in targets)
        for t in targets:
            body = t[:-len(eos)]
            assert "</reason>" in body and ("<tool_call>" in body.split("</reason>", 1)[1]
                                            or body.rstrip().endswith("</answer>")), body[-200:]
    as_written = render_parts(paper_fmt, load_mix(list(PAPER_MIX[4:5]), 0, "skip", str(HUB_DIR)), 1 << 30,
                              shape="as_written")
    assert not any(ex.shaped for ex in as_written)  # Tulu 3 as written: its answers are not in a block
    with pytest.raises(ValueError, match="target_shape must be one of format, as_written"):
        load_examples(paper_fmt, [], 100, shape="paper")


def test_hermes_reports_no_shape_share(fmt):
    from rstar2_agent.train.data.sft_mix import render_parts, report

    parts = load_mix(list(PAPER_MIX[4:5]), 0, "skip", str(HUB_DIR))
    render_parts(fmt, parts, 1 << 30)
    (row,) = report(parts)["sources"]
    assert row["in_shape"] is None and row["in_shape_as_written"] is None


def _spans(fmt: ChatFormat, ex) -> list[str]:
    """The example's target runs (mask 1), decoded."""
    out, run = [], []
    for i, m in zip(ex.ids, ex.mask, strict=True):
        if m:
            run.append(i)
        elif run:
            out.append(fmt.tokenizer.decode(run))
            run = []
    if run:
        out.append(fmt.tokenizer.decode(run))
    return out
