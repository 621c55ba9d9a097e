"""The SFT stage: the assistant-only loss mask, data faults, converters, packing, recipes, the schedule; and
with the real SmolLM2 on CPU: the loss falls, the checkpoint answers in `rstar2 chat` (test_engines.py shows it
loading in vLLM's server), a resumed run takes exactly the step it would have taken, and a failed checkpoint write
loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.synthetic import conversations, problems
from rstar2_agent.train.config import CheckpointConfig, OptimConfig, SFTConfig
from rstar2_agent.train.data import converters
from rstar2_agent.train.data.chat_data import (
    DataStats,
    collate,
    collate_shared,
    load_examples,
    pack,
    read_jsonl,
    render,
)
from rstar2_agent.train.learner.model import lr_factor
from rstar2_agent.train.recipe import RecipeError, load
from rstar2_agent.train.run_frame import checkpoints
from rstar2_agent.train.sft import run_sft

from conftest import sft_config as tiny

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))


@pytest.fixture(scope="module")
def fmt(smol_tokenizer):
    return ChatFormat(smol_tokenizer, "hermes")


def test_only_assistant_tokens_are_targets(fmt):
    record = conversations(seed=3, n=1)[0]
    ex = render(fmt, record)
    target = fmt.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if m])
    assistant = [m for m in record["messages"] if m["role"] == "assistant"]
    assert target.startswith(assistant[0]["content"]) and "<tool_call>" in target
    assert assistant[1]["content"] in target and target.count(fmt.eos_text) == 2  # each turn learns to end
    rest = fmt.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if not m])
    assert "<tool_response>" in rest and "<tool_response>" not in target  # tool output is never a target
    user = next(m for m in record["messages"] if m["role"] == "user")
    assert user["content"] in rest and "You are a helpful assistant" in rest
    # the prompt part is the same ids serving renders for this problem
    prompt = fmt.render_prompt(problems(3, 1)[0].text)
    assert ex.ids[:len(prompt)] == prompt and not any(ex.mask[:len(prompt)])


def test_a_malformed_line_is_reported_with_its_number(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    good = json.dumps(conversations(0, 1)[0])
    path.write_text(f"{good}\n{{broken\n{good}\n[1, 2]\n")
    stats = DataStats()
    assert len(list(read_jsonl(path, "skip", stats))) == 2 and stats.bad_lines == [2, 4]
    assert "d.jsonl:2" in caplog.text
    with pytest.raises(DataError, match=r"d.jsonl:2"):
        list(read_jsonl(path, "fail"))


def test_overlong_conversations_are_dropped_or_truncated_and_counted(fmt):
    records = conversations(0, 3)
    stats = DataStats()
    assert load_examples(fmt, records, max_len=100, overlong="drop", stats=stats) == [] and stats.dropped_long == 3
    stats = DataStats()
    cut = load_examples(fmt, records, max_len=400, overlong="truncate", stats=stats)
    assert stats.truncated == 3 and all(len(e.ids) == 400 for e in cut)


def test_packed_rows_give_each_example_its_own_logits(smol, fmt):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smol.path, dtype=torch.float32).eval()
    examples = load_examples(fmt, conversations(5, 3), max_len=2048)
    rows = pack(examples, seq_len=4096, seed=0)
    assert len(rows) == 1 and len(rows[0].docs) == 3
    batch = collate(rows, 0)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits[0]
        at = 0
        for ex in rows[0].docs:
            alone = model(torch.tensor([ex.ids])).logits[0]
            assert torch.allclose(packed[at:at + len(ex.ids)], alone, atol=1e-3)
            at += len(ex.ids)
    labels = batch["labels"][0]
    assert (labels != -100).sum() == sum(sum(ex.mask) for ex in rows[0].docs)


def test_a_shared_prefix_gives_the_same_loss_and_gradients_in_fewer_tokens(tiny_smollm2, fmt):
    """`share_prefix` packs the examples' common leading tokens (the system prompt and tool list) once: the summed
    loss over the targets and every parameter's gradient equal those of the same examples packed apart."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_smollm2, dtype=torch.float32)
    examples = load_examples(fmt, conversations(7, 4), max_len=2048)
    apart, shared = pack(examples, 8192, seed=0), pack(examples, 8192, seed=0, share_prefix=True)
    assert len(shared) == 1 and len(shared[0].docs) == 4 and shared[0].prefix > 100
    system = fmt.decode(examples[0].ids[:shared[0].prefix])
    assert "<tools>" in system and not any(m for ex in examples for m in ex.mask[:shared[0].prefix])
    assert shared[0].length == apart[0].length - 3 * shared[0].prefix

    def loss_and_grads(rows):
        model.zero_grad()
        batch = collate(rows, 0)
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 batch["labels"][:, 1:].reshape(-1), reduction="sum")
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    (loss_a, grads_a), (loss_s, grads_s) = loss_and_grads(apart), loss_and_grads(shared)
    assert loss_s == pytest.approx(loss_a, rel=1e-5)
    for name, g in grads_a.items():
        assert torch.allclose(grads_s[name], g, rtol=1e-4, atol=1e-6), name
    # the first target's prediction stays in the example's own part: a prefix never reaches it
    batch = collate(shared, 0)
    assert (batch["labels"][0, :shared[0].prefix + 1] == -100).all()


def test_the_learners_two_pass_shared_prefix_gives_the_block_masks_loss_and_gradients(tiny_smollm2, fmt):
    """The learner's own sft_loss on a shared-prefix row in two passes (the prefix once, its keys and values kept in
    the graph by the model's real cache, then the examples as a batch: what one-process SFT runs) against the one
    pass with the block mask: the same loss and every parameter's gradient."""
    from rstar2_agent.train.learner.model import TorchLearner

    learner = TorchLearner(tiny_smollm2, OptimConfig(lr=1e-3), 10, dtype="fp32")
    examples = load_examples(fmt, conversations(7, 3) + conversations(8, 2), max_len=2048)
    (row,) = pack(examples, 8192, seed=0, share_prefix=True)
    assert len(row.docs) == 5 and len({len(d.ids) for d in row.docs}) > 1  # examples of several lengths: padded
    targets = sum(sum(d.mask) for d in row.docs)

    def loss_and_grads(batch):
        learner.model.zero_grad()
        loss = learner.sft_loss(batch, targets)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in learner.model.named_parameters()}

    two = collate_shared(row, 0)
    assert two["prefix_ids"].shape == (1, row.prefix) and two["input_ids"].size(0) == 5
    assert (two["labels"] != -100).sum() == targets
    (loss_1, grads_1), (loss_2, grads_2) = loss_and_grads(collate([row], 0)), loss_and_grads(two)
    assert loss_2 == pytest.approx(loss_1, rel=1e-5)
    for name, g in grads_1.items():
        assert torch.allclose(grads_2[name], g, rtol=1e-4, atol=1e-6), name
    with pytest.raises(ValueError, match="share a prefix"):
        collate_shared(pack(examples[:1], 8192, seed=0, share_prefix=True)[0], 0)


def test_one_process_sft_runs_shared_rows_in_two_passes_with_the_step_of_the_examples_apart(tmp_path, tiny_smollm2,
                                                                                           monkeypatch):
    """SFTRun's own step with `share_prefix` on one process: its row goes through collate_shared (counted), and the
    step's loss and gradient norm are those of the same examples packed without a shared prefix."""
    from rstar2_agent.train import sft

    rows_seen = []
    two_pass = sft.collate_shared
    monkeypatch.setattr(sft, "collate_shared", lambda row, pad: rows_seen.append(len(row.docs)) or two_pass(row, pad))
    base = dict(model=tiny_smollm2, data=["synthetic:6:0"], batch_examples=3, seq_len=4096, dtype="fp32")
    shared = sft.SFTRun(tiny(tmp_path / "shared", share_prefix=True, **base))
    got = shared.train_step(shared.prepare())
    apart = sft.SFTRun(tiny(tmp_path / "apart", **base))
    want = apart.train_step(apart.prepare())
    assert rows_seen == [3]  # the step's 3 examples, one row, two passes
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)


def test_converters_on_each_format():
    glaive = converters.glaive_v2({
        "system": 'SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -'
                  '\n{"name": "calc", "description": "d", "parameters": {"type": "object", "properties": {}}}',
        "chat": "USER: compute\n\n\nASSISTANT: <functioncall> {\"name\": \"calc\", \"arguments\": '{\"x\": 2}'} "
                "<|endoftext|>\n\n\nFUNCTION RESPONSE: {\"y\": 4}\n\n\nASSISTANT: It is 4. <|endoftext|>"})
    assert [m["role"] for m in glaive["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(glaive["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"x": 2}
    assert glaive["tools"][0]["function"]["name"] == "calc"
    ace = converters.toolace({
        "system": 'Functions you can invoke:\n[{"name": "f", "parameters": {}}]. Reply with calls.',
        "conversations": [{"from": "user", "value": "q"}, {"from": "assistant", "value": '[f(a=1, b="x")]'},
                          {"from": "tool", "value": "3"}, {"from": "assistant", "value": "It is 3."}]})
    call = ace["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "f" and json.loads(call["arguments"]) == {"a": 1, "b": "x"}
    assert ace["messages"][2] == {"role": "tool", "tool_call_id": ace["messages"][1]["tool_calls"][0]["id"],
                                  "content": "3"}
    with pytest.raises(DataError, match="no converter"):
        converters.load_records("hub:someone/unknown")


@pytest.mark.skipif(not (SHARED / "glaive_toolcall_en_300.jsonl").is_file(), reason="../shared/data is absent")
def test_the_glaive_mirror_converts_and_renders(fmt):
    stats = DataStats()
    records = converters.load_records(f"sharegpt:{SHARED / 'glaive_toolcall_en_300.jsonl'}", stats=stats)
    assert len(records) == 300 and not stats.bad_lines
    calls = sum(len(m.get("tool_calls") or []) for r in records for m in r["messages"])
    assert calls == 211  # the mirror's README counts 211 function-call turns
    examples = load_examples(fmt, records[:20], max_len=4096)
    assert examples and all(any(e.mask) for e in examples)


def test_recipes_and_overrides():
    cfg = load(SFTConfig, "sft-smollm2-cpu", ["optim.lr=2e-5", "max_steps=7", "data=[synthetic:8:1]"])
    assert cfg.optim.lr == 2e-5 and cfg.max_steps == 7 and cfg.data == ["synthetic:8:1"]
    assert load(SFTConfig, "sft-qwen3-14b-base").optim.lr == 5e-6
    with pytest.raises(RecipeError, match="optim.lrr"):
        load(SFTConfig, None, ["optim.lrr=1"])
    with pytest.raises(RecipeError, match="no recipe"):
        load(SFTConfig, "nope")


def test_warmup_then_cosine():
    cfg = OptimConfig(warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(s, 20, cfg) for s in range(20)]
    assert factors[:4] == [0.2, 0.4, 0.6, 0.8] and factors[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[4:], factors[5:], strict=False)) and factors[-1] > 0.1


@pytest.mark.slow
def test_loss_falls_and_the_checkpoint_answers_in_chat(sft_checkpoint):
    final, history = sft_checkpoint  # the session's SFT run: 4 synthetic conversations, 2 epochs
    losses = [h["loss"] for h in history]
    assert len(losses) == 8 and sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
    assert (final / "model.safetensors").is_file() and (final / "trainer_state.pt").is_file()
    assert json.loads((final / "rstar2.json").read_text())["format"] == "hermes"
    p = subprocess.run([RSTAR2, "chat", "--model", str(final), "--engine", "hf", "--temperature", "0", "--max-tokens",
                        "64", "--max-turns", "1", "-p", "What is the greatest common divisor of 1234 and 5678?",
                        "--json"], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    traj = json.loads(p.stdout)
    assert traj["turns"] and traj["turns"][0]["text"]


@pytest.mark.slow
def test_resume_takes_exactly_the_next_step(tmp_path, tiny_smollm2):
    """A checkpoint every step, `checkpoint.keep: 2`: the run ends with the newest two, `last` at the newest."""
    cfg = tiny(tmp_path, model=tiny_smollm2, max_steps=3, save_every=1, checkpoint=CheckpointConfig(keep=2))
    _, straight = run_sft(cfg)
    assert [int(p.name.split("-")[1]) for p in checkpoints(cfg.out)] == [2, 3]
    assert (Path(cfg.out) / "last").resolve().name == "checkpoint-3"
    import shutil

    shutil.rmtree(Path(cfg.out) / "checkpoint-3")  # as if killed after step 2's checkpoint
    _, resumed = run_sft(cfg, resume=True)
    assert len(resumed) == 1 and resumed[0]["loss"] == pytest.approx(straight[2]["loss"], rel=1e-5)
    assert resumed[0]["lr"] == pytest.approx(straight[2]["lr"])
    import sqlite3

    with sqlite3.connect(cfg.db) as c:  # step 3, recorded by the first run and trained again, is in the store once
        rows = c.execute("SELECT step, name FROM metrics").fetchall()
    assert len(rows) == len(set(rows)) and {step for step, _ in rows} == {1, 2, 3}


@pytest.mark.slow
def test_frozen_layers_keep_their_weights_the_rest_learns_and_a_resume_takes_the_same_step(tmp_path, tiny_smollm2):
    """`frozen_layers: 1` on the 2-layer model: after two steps the embeddings (and the head tied to them) and layer
    0 are the base's bit for bit, layer 1 and the final norm moved; the checkpoint resumes to step 2's loss; a count
    the model does not have is refused."""
    from safetensors.torch import load_file

    cfg = tiny(tmp_path, model=tiny_smollm2, max_steps=2, save_every=1, frozen_layers=1)
    _, straight = run_sft(cfg)
    base, after = load_file(f"{tiny_smollm2}/model.safetensors"), load_file(f"{cfg.out}/checkpoint-2/model.safetensors")
    frozen = [k for k in base if k.startswith(("model.embed_tokens.", "model.layers.0."))]
    assert len(frozen) > 5 and all(torch.equal(base[k], after[k]) for k in frozen)
    assert not torch.equal(base["model.layers.1.mlp.up_proj.weight"], after["model.layers.1.mlp.up_proj.weight"])
    assert not torch.equal(base["model.norm.weight"], after["model.norm.weight"])
    import shutil

    shutil.rmtree(Path(cfg.out) / "checkpoint-2")
    _, resumed = run_sft(cfg, resume=True)
    assert resumed[0]["loss"] == pytest.approx(straight[1]["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="frozen_layers must be between 0 and 1"):
        run_sft(tiny(tmp_path / "too-many", model=tiny_smollm2, max_steps=1, frozen_layers=2))


def test_embedding_noise_is_neftunes_size_seeded_and_gone_after_the_block():
    """NEFTune's noise: uniform, at most alpha / sqrt(L * d) an entry (about half that on average), the same from the
    same seed, and only inside the block."""
    from rstar2_agent.train.learner.model import embedding_noise

    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(50, 64)
    model.get_input_embeddings = lambda: model.embed
    model.requires_grad_(False)
    ids = torch.randint(0, 50, (3, 25))
    plain = model.embed(ids)
    with embedding_noise(model, 5.0, torch.Generator().manual_seed(1)):
        noisy = model.embed(ids) - plain
    with embedding_noise(model, 5.0, torch.Generator().manual_seed(1)):
        again = model.embed(ids) - plain
    bound = 5.0 / (25 * 64) ** 0.5
    assert noisy.abs().max() <= bound and float(noisy.abs().mean()) == pytest.approx(bound / 2, rel=0.05)
    assert torch.equal(noisy, again) and torch.equal(model.embed(ids), plain)  # seeded; the hook is removed
    with embedding_noise(model, 0.0, torch.Generator()):
        assert torch.equal(model.embed(ids), plain)


def test_neftune_changes_the_loss_deterministically_and_a_resume_takes_the_same_step(tmp_path, tiny_smollm2):
    """`neftune_alpha: 5`: another loss than without noise at the same step, and a resume from step 1 takes step 2's
    noise: the stream is keyed on the seed, the step and the rank (a stream started when the learner is built would
    give the resumed step 1's noise instead)."""
    import shutil

    plain = run_sft(tiny(tmp_path / "plain", model=tiny_smollm2, max_steps=2))[1]
    cfg = tiny(tmp_path / "noisy", model=tiny_smollm2, max_steps=2, save_every=1, neftune_alpha=5.0)
    _, noisy = run_sft(cfg)
    assert noisy[0]["loss"] != pytest.approx(plain[0]["loss"], rel=1e-6)
    shutil.rmtree(Path(cfg.out) / "checkpoint-2")
    _, resumed = run_sft(cfg, resume=True)
    assert resumed[0]["loss"] == noisy[1]["loss"]
    with pytest.raises(ValueError, match="neftune_alpha is a noise scale"):
        run_sft(tiny(tmp_path / "negative", model=tiny_smollm2, max_steps=1, neftune_alpha=-1.0))


def test_train_sft_into_a_log_says_each_step_where_no_bar_can_draw(tmp_path, tiny_smollm2):
    """`rstar2 train sft` with its output not a terminal (click's runner, as a log file or CI): plain progress lines,
    the first and the last step among them, then where the model is."""
    from click.testing import CliRunner

    from rstar2_agent.train.train_commands import train_group

    r = CliRunner().invoke(train_group, ["sft", f"model={tiny_smollm2}", "max_steps=2", "data=[synthetic:4:0]",
                                         f"out={tmp_path / 'sft'}", f"db={tmp_path / 's.db'}", "micro_batch=1"])
    assert r.exit_code == 0, r.output
    assert "sft: 1/2 (loss " in r.output and "sft: 2/2 (loss " in r.output, r.output
    assert r.output.index("sft: 2/2") < r.output.index("checkpoint-2")


@pytest.mark.slow
def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch, tiny_smollm2):
    """... even with `checkpoint.keep: 1`: the old one goes only once the new one is whole."""
    cfg = tiny(tmp_path, model=tiny_smollm2, max_steps=2, save_every=1, checkpoint=CheckpointConfig(keep=1))
    from rstar2_agent.train.learner import checkpoint

    real = checkpoint.save_file
    calls = []

    def full_disk(*a, **kw):  # the second checkpoint's HF export meets a full disk
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_sft(cfg)
    (only,) = checkpoints(cfg.out)
    assert only.name == "checkpoint-1" and (only / "model.safetensors").is_file()
    assert not list(Path(cfg.out).glob("*.tmp"))


def test_batch_examples_counts_examples_per_step_and_an_epoch_takes_each_once(tmp_path, tiny_smollm2):
    """`batch_examples: 4` on 12 conversations: 3 steps an epoch, each with 4 examples (packed into rows of seq_len),
    every example once in the epoch, and the step's loss over all 4 examples' targets."""
    from rstar2_agent.train.sft import SFTRun

    run = SFTRun(tiny(tmp_path, model=tiny_smollm2, data=["synthetic:12:0"], batch_examples=4, epochs=1, dtype="fp32"))
    learner = run.prepare()
    assert len(run.examples) == 12 and run.total == 3 and run.rows == []
    seen = []
    for step in range(3):
        rows = run.step_rows(step)
        docs = [ex for r in rows for ex in r.docs]
        assert len(docs) == 4 and all(r.length <= 1024 for r in rows)
        seen += [id(ex) for ex in docs]
    assert sorted(seen) == sorted(map(id, run.examples))
    metrics = run.train_step(learner)
    assert metrics["target_tokens"] == sum(sum(ex.mask) for r in run.step_rows(0) for ex in r.docs)
    with pytest.raises(ValueError, match="batch_examples is a number of examples per step"):
        SFTRun(tiny(tmp_path, model=tiny_smollm2, batch_examples=-1))


def sft_rank(cfgs: list[SFTConfig]) -> list[tuple[float, float, int]]:
    """One optimizer step of SFT on this rank for each of `cfgs` in turn (under torchrun's environment: FSDP2 over
    the ranks, one process group for all); each step's logged gradient norm and loss, and its number of packed
    rows."""
    from rstar2_agent.train.sft import SFTRun

    out = []
    for cfg in cfgs:
        run = SFTRun(cfg)
        metrics = run.train_step(run.prepare())
        out.append((metrics["grad_norm"], metrics["loss"], len(run.rows)))
    return out


# `rows`: 2 packed rows a step (2 ranks x 1, or 1 process x 2 accumulated); `examples`: 3 examples a step (the
# paper's way of counting), packed into fewer rows than ranks, so one rank runs a padding pass with no target to
# keep FSDP's collectives in step; `frozen`: rows, with the embeddings and layer 0 frozen (FSDP's root unit then
# holds a frozen and a trained parameter)
FSDP_CASES = {"rows": {}, "examples": {"batch_examples": 3, "seq_len": 4096}, "frozen": {"frozen_layers": 1}}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_fsdp_ranks_give_the_gradient_of_one_process(tmp_path, tiny_smollm2):
    """The same step on two FSDP2 ranks over gloo and in one process: the same gradient norm and loss, in each of
    FSDP_CASES (one pair of rank processes runs the three, each case a learner of its own). FSDP averages the ranks'
    gradients, so unscaled the two ranks' norm is half (with 8 GPUs an eighth, and grad_clip 1.0 acting as 8.0)."""
    from gloo_ranks import run_ranks

    from rstar2_agent.train.sft import SFTRun

    base = dict(model=tiny_smollm2, data=["synthetic:16:0"], micro_batch=1, dtype="fp32")
    wants = []
    for case, extra in FSDP_CASES.items():
        one = SFTRun(tiny(tmp_path / case / "one", grad_accum=2, **base, **extra))
        wants.append((case, one.train_step(one.prepare()), len(one.rows)))
        if case == "examples":  # the 3 fit one row
            assert len(one.step_rows(0)) == 1 and sum(len(r.docs) for r in one.step_rows(0)) == 3
        else:
            assert len(one.rows) >= 2
    ranks = run_ranks(sft_rank, 2, [tiny(tmp_path / case / "two", grad_accum=1, **base, **extra)
                                    for case, extra in FSDP_CASES.items()])
    for k, (case, want, rows) in enumerate(wants):
        assert ranks[0][k][2] == rows, case
        for grad_norm, loss, _ in (rank[k] for rank in ranks):
            assert grad_norm == pytest.approx(want["grad_norm"], rel=1e-4), case
            assert loss == pytest.approx(want["loss"], rel=1e-5), case
