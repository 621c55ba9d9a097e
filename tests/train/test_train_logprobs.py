"""The learner's own logprobs (issue 21, part 3): the old-logprob pass, the PPO ratio against it, the engine/learner
mismatch metrics, the optional truncated importance weights (`rollout_correction: tis`), and
`rstar2 train report RUN --json`. A tiny random Llama built from SmolLM2's own config (2 layers) stands in for the
policy, so the forward passes are those of the real architecture and tokenizer, in seconds."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from rstar2_agent.train.config import OptimConfig, RLConfig
from rstar2_agent.train.learner.model import TorchLearner
from rstar2_agent.train.learner.update import UpdateItem, micro_batches, old_logprobs, policy_update
from rstar2_agent.train.loss import ppo_clip_loss, rollout_mismatch, tis_weights
from rstar2_agent.train.rl import RLRun, update_config


@pytest.fixture
def learner(tiny_smollm2):
    return TorchLearner(tiny_smollm2, OptimConfig(lr=1e-3, warmup_steps=0), 4, dtype="fp32")


def rollouts(n: int = 5, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of different lengths, so micro-batches pad."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(3, 49152, (4 + i,), generator=g).tolist(),
             torch.randint(3, 49152, (6 + 2 * i,), generator=g).tolist()) for i in range(n)]


def direct_logprobs(learner: TorchLearner, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """The response tokens' logprobs from a forward pass of this one sequence, no padding, no batching."""
    with torch.no_grad():
        logits = learner.model(torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)[len(prompt) - 1:-1]
    return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


# ------------------------------------------------------------------------------------------------ formulas
def test_the_mismatch_metrics_on_known_tensors():
    learner = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is a tool response's
    same = rollout_mismatch(learner, learner.clone(), mask)
    assert same == {"logp_mismatch_kl": 0.0, "logp_mismatch_out_of_range": 0.0, "logp_mismatch_abs": 0.0}

    d = torch.tensor([[1.0, 0.5, -1.0, 0.0, 9.0]])  # learner - engine; the masked 9 must not count
    m = rollout_mismatch(learner, learner - d, mask)
    kept = [1.0, 0.5, -1.0, 0.0]
    assert m["logp_mismatch_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in kept) / 4, rel=1e-6)
    assert m["logp_mismatch_out_of_range"] == 0.5  # ratios e and 1/e leave [0.5, 2]; e^0.5 and 1 do not
    assert m["logp_mismatch_abs"] == pytest.approx(2.5 / 4)
    near = learner.double()  # exact offsets: the gap of an fp32 engine against an fp32 learner is this small
    tiny = rollout_mismatch(near, near + torch.tensor([[1e-5, -2e-5, 3e-6, 1e-6, 0.0]], dtype=torch.float64), mask)
    assert tiny["logp_mismatch_kl"] == pytest.approx((1e-10 + 4e-10 + 9e-12 + 1e-12) / 2 / 4, rel=1e-4)  # d^2 / 2
    edge = rollout_mismatch(torch.log(torch.tensor([[1.99, 0.51, 2.01, 0.49]])), torch.zeros(1, 4), torch.ones(1, 4))
    assert edge["logp_mismatch_out_of_range"] == 0.5  # 1.99 and 0.51 are inside, 2.01 and 0.49 are not


def test_tis_weights_are_capped_detached_and_scale_the_per_token_loss():
    learner = torch.zeros(1, 4, requires_grad=True)
    d = torch.tensor([[1.0, 0.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, stats = tis_weights(learner, learner.detach() - d, mask, cap=2.0)
    assert not w.requires_grad
    assert w[0].tolist() == pytest.approx([2.0, math.exp(0.5), math.exp(-1.0), 1.0])
    assert stats["tis_capped"] == pytest.approx(1 / 3)  # only e was above the cap (the masked token is not counted)
    assert stats["tis_weight_mean"] == pytest.approx((2.0 + math.exp(0.5) + math.exp(-1.0)) / 3)

    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0]]))  # ratios against old logprobs of 0
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    plain, _ = ppo_clip_loss(logp, torch.zeros(1, 4), adv, mask)
    weighted, _ = ppo_clip_loss(logp, torch.zeros(1, 4), adv, mask, weights=w)
    # per token -min(r A, clip(r) A): -1.28, -0.5, +1.0 (A < 0 takes the larger ratio), masked
    assert float(plain) == pytest.approx((-1.28 - 0.5 + 1.0) / 3)
    assert float(weighted) == pytest.approx((-1.28 * 2.0 - 0.5 * math.exp(0.5) + 1.0 * math.exp(-1.0)) / 3)


def test_rollout_correction_is_validated_before_anything_loads(tmp_path):
    with pytest.raises(ValueError, match=r"rollout_correction must be one of auto, none, tis, not 'is'"):
        RLRun(RLConfig(rollout_correction="is", model=str(tmp_path / "absent")))
    with pytest.raises(ValueError, match=r"tis_cap must be a positive number"):
        RLRun(RLConfig(rollout_correction="tis", tis_cap=0.0, model=str(tmp_path / "absent")))


# ------------------------------------------------------------------------------------------------ on the model
def test_the_old_logprob_pass_equals_a_direct_forward(learner):
    data = rollouts(5)
    items = [UpdateItem(p, r, [1] * len(r), [0.0] * len(r), 1.0) for p, r in data]
    parts = micro_batches(items, 2, pad_id=2, batches=4)  # 3 real micro-batches, then an empty one (FSDP padding)
    old = old_logprobs(learner, parts, temperature=0.7)
    assert len(old) == 4 and not any(t.requires_grad for t in old)
    for i, (prompt, response) in enumerate(data):
        got = old[i // 2][i % 2, len(prompt) - 1:len(prompt) + len(response) - 1]
        want = direct_logprobs(learner, prompt, response, temperature=0.7)
        assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5)
    hot = old_logprobs(learner, parts[:1], temperature=1.0)[0]
    assert not torch.allclose(hot, old[0])  # the temperature is applied, as the engine's processed logprobs


def offsets(n: int) -> list[float]:
    return [[1.0, 0.5, -1.0, 0.0][k % 4] for k in range(n)]  # learner - engine per token: ratios e, e^.5, 1/e, 1


def update_on(learner, data, advs, cfg, offset=offsets) -> tuple[dict[str, float], list[torch.Tensor]]:
    """One policy_update on `data` whose engine logprobs sit `offset` below (above) the learner's; the grads."""
    items = []
    for (p, r), a in zip(data, advs, strict=True):
        own = direct_logprobs(learner, p, r, cfg.temperature).tolist()
        items.append(UpdateItem(p, r, [1] * len(r), [x - o for x, o in zip(own, offset(len(r)), strict=True)], a))
    learner.optimizer.zero_grad(set_to_none=True)
    total = sum(len(r) for _, r in data)
    metrics = policy_update(learner, items, update_config(cfg, pad_id=2), total)
    return metrics, [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]


def test_the_ratio_is_taken_against_the_learner_and_the_engine_only_measures_the_gap(learner):
    """The engine's logprobs are off by up to e on every token: a ratio against them would clip a third of the
    positive tokens at once. Against the learner's old logprobs the ratio is 1 (one optimizer step per RL step),
    nothing clips, the loss is the plain policy-gradient -sum(A) / N, and the gap shows in the metrics alone."""
    data = rollouts(4, seed=1)
    advs = [1.0, -1.0, 0.5, -0.5]
    cfg = RLConfig(micro_batch=2, temperature=1.0)
    m, grads = update_on(learner, data, advs, cfg)
    n = sum(len(r) for _, r in data)
    assert m["clip_frac"] == 0.0 and m["logprob_gap"] < 1e-5
    assert m["loss"] == pytest.approx(-sum(a * len(r) for (_, r), a in zip(data, advs, strict=True)) / n, abs=1e-5)
    per_token = [d for _, r in data for d in offsets(len(r))]
    assert m["logp_mismatch_kl"] == pytest.approx(sum(math.exp(d) - d - 1 for d in per_token) / n, abs=1e-4)
    assert m["logp_mismatch_out_of_range"] == pytest.approx(sum(abs(d) == 1.0 for d in per_token) / n)
    assert m["logp_mismatch_abs"] == pytest.approx(sum(abs(d) for d in per_token) / n, abs=1e-4)
    assert "tis_weight_mean" not in m  # off by default, as in the release

    tis = RLConfig(micro_batch=2, temperature=1.0, rollout_correction="tis", tis_cap=2.0)
    mt, _ = update_on(learner, data, advs, tis)
    weights = [[min(math.exp(d), 2.0) for d in offsets(len(r))] for _, r in data]
    assert mt["loss"] == pytest.approx(-sum(a * sum(w) for w, a in zip(weights, advs, strict=True)) / n, abs=1e-5)
    assert mt["tis_capped"] == pytest.approx(sum(d == 1.0 for d in per_token) / n)
    assert mt["tis_weight_mean"] == pytest.approx(sum(sum(w) for w in weights) / n, abs=1e-5)
    assert mt["logp_mismatch_kl"] == pytest.approx(m["logp_mismatch_kl"])

    # every token's ratio above the cap: the TIS gradient is the plain one times the cap
    _, capped = update_on(learner, data, advs, tis, offset=lambda k: [1.0] * k)
    for g, c in zip(grads, capped, strict=True):
        assert torch.allclose(c, 2.0 * g, rtol=1e-4, atol=1e-9)


# ------------------------------------------------------------------------------------------------ report --json
def test_report_json_prints_one_object_a_step_and_nothing_else(tmp_path):
    from rstar2_agent.cli import main
    from rstar2_agent.store import Store

    db = str(tmp_path / "store.db")
    store = Store(db)
    run = store.open_run("rl-x", "rl", "m", {}, {}, kind="rl")
    store.add_metrics(run.id, 1, {"accuracy": 0.25, "logp_mismatch_kl": 0.003, "logp_mismatch_out_of_range": 0.01})
    store.add_metrics(run.id, 2, {"accuracy": 0.5, "logp_mismatch_kl": 0.002, "logp_mismatch_out_of_range": 0.0})
    other = store.open_run("other", "rl", "m", {}, {}, kind="rl")
    store.add_metrics(other.id, 1, {"accuracy": 1.0})
    result = CliRunner().invoke(main, ["train", "report", "rl-x", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"step": 1, "accuracy": 0.25, "logp_mismatch_kl": 0.003, "logp_mismatch_out_of_range": 0.01},
        {"step": 2, "accuracy": 0.5, "logp_mismatch_kl": 0.002, "logp_mismatch_out_of_range": 0.0}]
    missing = CliRunner().invoke(main, ["train", "report", "nope", "--db", db, "--json"])
    assert missing.exit_code != 0 and "no training run named 'nope'" in missing.output
