"""The RL learner's memory (issue 33, item 2): log-probabilities and entropy from the LM head in token chunks
(learner/chunked_head.py), micro-batches by a token budget packed without padding (learner/update.py), and activation
checkpointing carried from the recipe to the learner. Each checked against the path it replaces on the real
SmolLM2-135M (fp32, so the comparisons are float-tight), scaled down: chunks of a few tokens and budgets of a few
dozen exercise the cutting a 14B learner does at 1K and 16K; and the same on two FSDP2 ranks over gloo."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from gloo_ranks import run_ranks

from rstar2_agent.train.config import OptimConfig, RLConfig, Stage
from rstar2_agent.train.learner.model import TorchLearner
from rstar2_agent.train.learner.update import (
    UpdateConfig,
    UpdateItem,
    forward_logprobs,
    length,
    micro_batches,
    mini_shards,
    old_logprobs,
    policy_update,
    ppo_update,
    shards,
    token_chunks,
)
from rstar2_agent.train.rl import RLRun

FULL = UpdateConfig(micro_batch=2, temperature=0.7, pad_id=2, micro_batch_tokens=0, logprob_chunk_tokens=0)


@pytest.fixture(scope="module")
def learner(smol):
    return TorchLearner(smol.path, OptimConfig(lr=1e-3, warmup_steps=0), 4, dtype="fp32")


@pytest.fixture(scope="module")
def tiny_learner(tiny_smollm2):
    return TorchLearner(tiny_smollm2, OptimConfig(lr=1e-3, warmup_steps=0), 4, dtype="fp32")


# (learner fixture, weights in float64, gradient tolerance relative to each tensor's largest entry): SmolLM2 in fp32,
# where 30 layers of fp32 backward turn 1e-7 rounding into differences up to about 1e-3 (a wrong gradient, a chunk
# or a trajectory missing, is off by its whole size), and its 2-layer cut in float64, where the two paths' matmuls
# agree to about 1e-15 and what is compared is their math
GRADIENTS = [("learner", False, 1e-2), ("tiny_learner", True, 1e-9)]


def trajectories(n: int = 6, seed: int = 0) -> list[UpdateItem]:
    """Kept rollouts of different lengths (so padded micro-batches pad), advantages of both signs, some tool-response
    tokens (mask 0) inside the responses."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 49152, (3 + 2 * i,), generator=g).tolist()
        response = torch.randint(3, 49152, (4 + (5 * i) % 11,), generator=g).tolist()
        mask = [0 if k % 5 == 3 else 1 for k in range(len(response))]
        out.append(UpdateItem(prompt, response, mask, [-1.0] * len(response), [1.0, -0.5][i % 2] * (1 + i / 10)))
    return out


def assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], tol: float) -> None:
    """Every parameter's gradient within `tol` of its largest entry (a gradient summed over many tokens cancels,
    so an entry-wise relative tolerance would measure the cancellation, not the two paths)."""
    assert set(got) == set(want)
    for k, w in want.items():
        assert float((got[k] - w).abs().max()) <= tol * float(w.abs().max()), k


@contextlib.contextmanager
def float64(learner: TorchLearner, on: bool = True):
    """The learner's weights in float64 while open (when `on`)."""
    if on:
        learner.model.double()
    try:
        yield
    finally:
        learner.model.float()


def response_logprobs(items: list[UpdateItem], order: list[list[UpdateItem]], per_batch: list[torch.Tensor],
                      packed: bool) -> dict[int, torch.Tensor]:
    """Each trajectory's generated-token logprobs (by its index in `items`; its response mask's tokens, what the loss
    reads and the chunked head computes) out of the micro-batches' [batch, width - 1] tensors: packed rows hold the
    trajectories back to back, padded batches one per row."""
    out = {}
    for part, logp in zip(order, per_batch, strict=True):
        offset = 0
        for b, t in enumerate(part):
            p, r = len(t.prompt_ids), len(t.response_ids)
            row, start = (0, offset) if packed else (b, 0)
            generated = torch.tensor(t.response_mask, dtype=torch.bool)
            out[items.index(t)] = logp[row, start + p - 1:start + p + r - 1][generated]
            offset += p + r
    return out


# ------------------------------------------------------------------------------------------------ chunked logprobs
def test_chunked_logprobs_and_entropy_equal_the_full_logits(learner):
    """On a padded micro-batch of SmolLM2, the head 7 tokens at a time (uneven chunks across rows and padding) gives
    the full path's logprobs and entropy."""
    batch = micro_batches(trajectories(3), 3, pad_id=2)[0]
    got = {chunk: forward_logprobs(learner, batch, 0.7, chunk) for chunk in (0, 7)}
    response = batch["mask"][:, 1:] > 0  # the chunked head runs there only (the test below)
    # fp32 logprobs of -1 to -20: the chunked head sums its matmuls in another order, some ulps apart (2.3e-5 seen
    # once), so a relative bound (about 32 ulps) beside the absolute one
    torch.testing.assert_close(got[7][0][response], got[0][0][response], rtol=4e-6, atol=2e-5)
    torch.testing.assert_close(got[7][1][response], got[0][1][response], rtol=2e-5, atol=1e-5)


def test_the_update_runs_the_head_on_the_response_alone_with_the_same_logprobs(learner):
    """The update's chunked head runs only where the next token is a generated one (what the loss and its metrics
    read): there the logprobs and entropy are exactly those of the head over every position, and the prompt, the
    tool output and the padding hold 0. Padded and packed micro-batches."""
    items = trajectories(3)
    for batch in (micro_batches(items, 3, pad_id=2)[0], micro_batches(items, 3, pad_id=2, tokens=200)[0]):
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
        response = batch["mask"][:, 1:] > 0
        assert 0 < int(response.sum()) < response.numel()
        with torch.no_grad():
            every = learner.chunked_logprobs(inputs, 0.7, 7)
            got = forward_logprobs(learner, batch, 0.7, 7)
        for g, e in zip(got, every, strict=True):
            assert torch.equal(g[response], e[response]) and not g[~response].any()


@pytest.mark.parametrize("which,wide,tol", GRADIENTS)
def test_chunked_logprob_gradients_equal_the_full_logits(request, which, wide, tol):
    """The gradient of a logprob-weighted sum, the head 7 tokens at a time, reaches every parameter (the tied
    embedding included) as the full path's does."""
    learner = request.getfixturevalue(which)
    batch = micro_batches(trajectories(3), 3, pad_id=2)[0]
    weights = torch.randn(batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1,
                          generator=torch.Generator().manual_seed(1))
    grads = {}
    with float64(learner, wide):
        for chunk in (0, 7):
            learner.model.zero_grad(set_to_none=True)
            logp, _ = forward_logprobs(learner, batch, 0.7, chunk)
            (logp * weights * batch["mask"][:, 1:]).sum().backward()  # the positions the chunked head runs on
            grads[chunk] = {k: p.grad.clone() for k, p in learner.model.named_parameters()}
    assert "model.embed_tokens.weight" in grads[7]  # the tied head's gradient reaches the embedding
    assert_same_gradients(grads[7], grads[0], tol)
    learner.model.zero_grad(set_to_none=True)


def test_the_backward_keeps_no_full_vocabulary_tensor(tiny_learner):
    """What autograd saves for the backward: the full path keeps [tokens, vocabulary] fp32 tensors (the logits and
    their log-softmax); the chunked path keeps none of vocabulary width, only hidden states (each chunk's logits
    are recomputed in the backward). SmolLM2's 2-layer cut: the same head and vocabulary."""
    learner = tiny_learner
    vocab = learner.model.config.vocab_size
    batch = micro_batches(trajectories(4), 4, pad_id=2)[0]

    def saved(chunk: int) -> list[torch.Size]:
        shapes = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            shapes.append(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, _ = forward_logprobs(learner, batch, 1.0, chunk)
        logp.sum().backward()
        learner.model.zero_grad(set_to_none=True)
        return [s for s in shapes if len(s) >= 2 and s[-1] == vocab]

    assert saved(0), "the full path should save vocabulary-wide tensors"
    assert saved(8) == []


def test_chunked_logprobs_refuse_a_head_that_is_not_a_linear():
    from rstar2_agent.train.learner.chunked_head import install

    class Odd(torch.nn.Module):
        def get_output_embeddings(self):
            return torch.nn.Embedding(4, 2)

    with pytest.raises(TypeError, match="logprob_chunk_tokens: 0"):
        install(Odd())


# ------------------------------------------------------------------------------------------------ packing
def test_token_chunks_fill_the_budget_longest_first_and_a_long_trajectory_goes_alone():
    items = [UpdateItem([1] * p, [2] * r, [1] * r, [0.0] * r, 0.0) for p, r in ((5, 5), (2, 3), (30, 40), (4, 20),
                                                                                  (1, 9), (3, 3))]
    parts = token_chunks(items, 32)
    assert sorted(map(id, sum(parts, []))) == sorted(map(id, items))  # each exactly once
    assert len(parts[0]) == 1 and length(parts[0][0]) == 70  # over the budget: alone
    assert all(sum(map(length, p)) <= 32 for p in parts[1:])
    assert len(parts) == 3  # 24 + 6 | 10 + 10 + 5 (first fit, longest first): 1 + 2 micro-batches for 6 trajectories


def test_shards_by_tokens_balance_the_ranks_and_give_them_the_same_number_of_micro_batches():
    g = torch.Generator().manual_seed(3)
    items = [UpdateItem([1] * 10, [2] * n, [1] * n, [0.0] * n, 0.0) for n in torch.randint(1, 300, (37,), generator=g)
             .tolist()]
    parts, batches = shards(items, 4, 8, tokens=400)
    loads = [sum(map(length, p)) for p in parts]
    assert sum(len(p) for p in parts) == 37 and max(loads) - min(loads) <= max(map(length, items))
    assert batches == max(len(token_chunks(p, 400)) for p in parts)
    for p in parts:  # every rank runs `batches` micro-batches (empty ones at the end), each packed into one row
        mbs = micro_batches(p, 8, 2, batches, tokens=400)
        assert len(mbs) == batches and all(m["input_ids"].shape[0] == 1 for m in mbs)
    by_count, _ = shards(items, 4, 8)
    assert [len(p) for p in by_count] == [10, 9, 9, 9]  # without a budget: items r, r + 4, ... as before


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_equal_the_padded_ones_and_attention_stays_within_each_trajectory(learner, attention):
    """Trajectories packed back to back (position ids restarting) give every response token the logprob it has in a
    right-padded micro-batch, for sdpa and eager attention. The same rows with position ids that do not restart
    (one long sequence to transformers: attention across the trajectories) give other logprobs, so the comparison
    sees a leak."""
    learner.model.set_attn_implementation(attention)
    try:
        items = trajectories(6)
        padded = micro_batches(items, 2, pad_id=2)
        packed = micro_batches(items, 2, pad_id=2, tokens=48)
        assert 1 < len(packed) < len(items) and max(len(p) for p in token_chunks(items, 48)) >= 2
        want = response_logprobs(items, [items[i:i + 2] for i in range(0, 6, 2)],
                                 old_logprobs(learner, padded, 0.7, chunk=0), packed=False)
        got = response_logprobs(items, token_chunks(items, 48), old_logprobs(learner, packed, 0.7, chunk=5),
                                packed=True)
        for i in range(len(items)):
            torch.testing.assert_close(got[i], want[i], rtol=0, atol=5e-5, msg=f"trajectory {i}")

        leaky = [{**b, "position_ids": torch.arange(b["input_ids"].shape[1])[None]} for b in packed]
        leaked = response_logprobs(items, token_chunks(items, 48), old_logprobs(learner, leaky, 0.7, chunk=5),
                                   packed=True)
        later = [i for part in token_chunks(items, 48) for i in map(items.index, part[1:])]  # not first in a row
        assert later and all((leaked[i] - want[i]).abs().max() > 1e-2 for i in later)
    finally:
        learner.model.set_attn_implementation("sdpa")


@pytest.mark.slow  # two whole updates of SmolLM2
@pytest.mark.parametrize("which,wide,tol", GRADIENTS)
def test_a_policy_update_by_token_budget_and_chunks_gives_the_same_gradient(request, which, wide, tol):
    """The whole update (old-logprob pass, loss, backward) packed under a 40-token budget with the head 6 tokens at a
    time gives the padded full-logits update's loss, entropy, metrics and gradient."""
    learner = request.getfixturevalue(which)
    items = trajectories(6, seed=4)
    total = sum(sum(t.response_mask) for t in items)
    results = []
    with float64(learner, wide):
        for cfg in (FULL, dataclasses.replace(FULL, micro_batch_tokens=40, logprob_chunk_tokens=6)):
            learner.model.zero_grad(set_to_none=True)
            metrics = policy_update(learner, items, cfg, total)
            results.append((metrics, {k: p.grad.clone() for k, p in learner.model.named_parameters()}))
    (want, want_grads), (got, grads) = results
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    assert_same_gradients(grads, want_grads, max(tol, 1e-6))  # float64 weights, fp32 logprobs in both: rounding there
    learner.model.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------------------------ the recipe
def test_the_recipe_carries_the_memory_settings_to_the_update_and_the_learner(tmp_path, tiny_smollm2, monkeypatch):
    from rstar2_agent.train.config import check_micro_batch_tokens
    from rstar2_agent.train.learner.ray_group import LearnerActor
    from rstar2_agent.train.placement import choose_placement
    from rstar2_agent.train.recipe import load
    from rstar2_agent.train.rl import update_config

    paper = load(RLConfig, "rl-qwen3-14b-base-mi300x")
    assert paper.gradient_checkpointing and paper.micro_batch_tokens == 16384 and paper.logprob_chunk_tokens == 1024
    check_micro_batch_tokens(paper)  # 16K holds stage 2's 12K responses
    upd = update_config(paper, 0)
    assert (upd.micro_batch_tokens, upd.logprob_chunk_tokens) == (16384, 1024)

    def checkpointing(model) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())

    cfg = RLConfig(model=tiny_smollm2, dtype="fp32", gradient_checkpointing=True)
    assert checkpointing(choose_placement(cfg).learner(tiny_smollm2, 2).model)
    plain = dataclasses.replace(cfg, gradient_checkpointing=False)
    assert not checkpointing(choose_placement(plain).learner(tiny_smollm2, 2).model)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(key, "0")  # restored after the test: setup() sets them as Ray's ranks need
    threads = torch.get_num_threads()
    rank = LearnerActor(0, 1)  # a Ray learner rank's own setup, in this process (one rank: no process group)
    try:
        rank.setup(("127.0.0.1", 0), tiny_smollm2, dataclasses.asdict(OptimConfig()), 2, "fp32", {}, 60.0,
                   gradient_checkpointing=True)
    finally:
        torch.set_num_threads(threads)
    assert checkpointing(rank.learner.model)


def test_a_token_budget_below_the_longest_response_or_a_bad_chunk_is_refused_before_anything_loads(tmp_path):
    absent = str(tmp_path / "absent")
    with pytest.raises(ValueError, match=r"micro_batch_tokens \(4096\) is below the longest stage's "
                                         r"max_response_tokens \(8192\)"):
        RLRun(RLConfig(model=absent, micro_batch_tokens=4096, stages=[Stage(steps=1, max_response_tokens=8192)]))
    with pytest.raises(ValueError, match="logprob_chunk_tokens must be a whole number of tokens"):
        RLRun(RLConfig(model=absent, logprob_chunk_tokens=-1))


# ------------------------------------------------------------------------------------------------ FSDP2 ranks
def rl_rank(model: str, items: list[UpdateItem], cfg: UpdateConfig, total: int) -> dict[str, float]:
    """One FSDP2 rank of the Ray learner group's update (ray_group.py LearnerActor.update), under torchrun's
    environment: its token-balanced share of each PPO mini-batch, as many micro-batches as every rank, the loss scaled
    by the world size."""
    learner = TorchLearner(model, OptimConfig(lr=1e-3, warmup_steps=0), 2, dtype="fp32", gradient_checkpointing=True)
    parts, totals, batches = mini_shards(items, learner.world, cfg)
    assert sum(totals) == total
    return ppo_update(learner, parts[learner.rank], cfg, totals, batches=batches, scale=learner.world)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_fsdp_ranks_packed_chunked_and_checkpointed_match_one_process(tiny_smollm2):
    """Two FSDP2 ranks on gloo (the lm_head's tied embedding sharded over them), each packing its token-balanced
    share of each of two PPO mini-batches under a 40-token budget with the head 6 tokens at a time and every layer
    checkpointed: the gradient norm, loss, entropy and clip fraction of one process's padded full-logits update in
    the same two mini-batches (the second taken after the first's optimizer step, so the ratio has moved)."""
    items = trajectories(7, seed=5)
    total = sum(sum(t.response_mask) for t in items)
    local = TorchLearner(tiny_smollm2, OptimConfig(lr=1e-3, warmup_steps=0), 2, dtype="fp32")
    two = dataclasses.replace(FULL, ppo_mini_batches=2)
    (minis,), totals, _ = mini_shards(items, 1, two)
    want = ppo_update(local, minis, two, totals)
    assert want["logprob_gap"] > 0 and local.step == 1
    cfg = dataclasses.replace(two, micro_batch_tokens=40, logprob_chunk_tokens=6)
    ranks = run_ranks(rl_rank, 2, tiny_smollm2, items, cfg, total)
    assert ranks[0]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    for k in ("loss", "entropy", "logp_mismatch_abs", "logprob_gap"):
        assert sum(r[k] for r in ranks) == pytest.approx(want[k], rel=1e-4, abs=1e-6), k


# ------------------------------------------------------------------------------------------------ the bench
def test_the_learner_bench_measures_every_setting_on_the_same_update(tmp_path):
    """`rstar2 bench learner` at toy size: eight settings side by side, the same loss in each, packing computes
    fewer positions than padding, and the chunked head allocates less at its peak than the full logits (the
    allocations, not a timing, so the same on every run)."""
    from click.testing import CliRunner

    from rstar2_agent.cli import main

    res = CliRunner().invoke(main, ["bench", "learner", "--layers", "1", "--hidden", "32", "--trajectories", "3",
                                    "--prompt", "8", "--max-response", "48", "--chunk", "8",
                                    "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    import json

    rows = {r["setting"]: r for r in json.loads((tmp_path / "b.json").read_text())["rows"]}
    assert len(rows) == 8 and len({round(r["loss"], 5) for r in rows.values()}) == 1
    padded, chunked = rows["padded x4, full logits"], rows["padded x4, chunks of 8"]
    packed = next(r for k, r in rows.items() if k.startswith("packed") and k.endswith("full logits"))
    assert packed["positions"] < padded["positions"] and chunked["peak_mib"] < padded["peak_mib"]
