"""The GRPO-RoC objective: group-normalized advantages and a token-level PPO clip loss with asymmetric
clipping (eps_low 0.2, eps_high 0.28), the ratio taken against the learner's own logprobs of the rollouts
before the update (as verl and the release recompute `old_log_prob`), averaged over all response tokens of
the batch; no KL term, no entropy bonus. The rollout engine's logprobs only measure the engine/learner gap
(`rollout_mismatch`) and, with `rollout_correction: tis`, give truncated importance weights (`tis_weights`)."""

from __future__ import annotations

import torch


def grpo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) over the kept group (std with Bessel's correction, as torch.std)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    std = r.std() if len(rewards) > 1 else torch.tensor(0.0, dtype=torch.float64)
    return ((r - r.mean()) / (std + eps)).tolist()


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probability of each target under softmax(logits / T): the distribution the engine sampled from."""
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float, chunk: int = 128) -> torch.Tensor:
    """The entropy of softmax(logits / T) at each position ([batch, width]), `chunk` positions at a time: a
    full-vocabulary softmax of the whole micro-batch at once would be several GB of temporaries on long rollouts."""
    out = []
    for s in range(0, logits.size(1), chunk):
        logp = torch.log_softmax(logits[:, s:s + chunk].float() / max(temperature, 1e-6), -1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out, 1) if out else logits.new_zeros(logits.shape[:2])


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  eps_low: float = 0.2, eps_high: float = 0.28, denominator: float | None = None,
                  weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate: -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), times the
    per-token `weights` when given (the truncated importance weights of `tis_weights`, as verl multiplies its
    `rollout_is_weights` into the PG loss), summed over masked tokens / denominator (default: the masked token
    count). `advantages` is per token (each token carries its trajectory's advantage)."""
    mask = mask.float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if weights is not None:
        per_token = per_token * weights
    denom = denominator if denominator is not None else mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        clip_frac = masked_mean(clipped * advantages < ratio * advantages, mask)  # the clip is active
        gap = masked_mean((logp - old_logp).abs(), mask)
    return loss, {"clip_frac": clip_frac, "logprob_gap": gap}


LOG_RATIO_BOUND = 20.0  # log-ratios are clamped to +-20 before exp, as verl's rollout correction does


def rollout_mismatch(learner_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                     low: float = 0.5, high: float = 2.0) -> dict[str, float]:
    """The engine/learner gap on the same sampled tokens, means over the masked (generated) tokens. With
    d = learner - engine (log pi_learner / pi_engine, verl's `log_ratio`): `logp_mismatch_kl` is verl's `k3_kl`,
    exp(d) - d - 1, an estimate of KL(engine || learner) since the tokens were sampled by the engine (0 when they
    agree); `logp_mismatch_out_of_range` the share of tokens whose ratio exp(d) leaves [low, high] (the interval is
    symmetric under 1/x for the default 0.5, 2, so engine/learner and learner/engine give the same share);
    `logp_mismatch_abs` the mean |d|."""
    with torch.no_grad():  # in float64, with expm1: at d ~ 1e-5 (an fp32 engine), exp(d) - d - 1 in fp32 is noise
        d = (learner_logp.double() - engine_logp.double()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        ratio = torch.exp(d)
        return {"logp_mismatch_kl": masked_mean(torch.expm1(d) - d, mask),
                "logp_mismatch_out_of_range": masked_mean((ratio < low) | (ratio > high), mask),
                "logp_mismatch_abs": masked_mean(d.abs(), mask)}


def tis_weights(learner_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level truncated importance weights against the engine's policy, min(pi_learner / pi_engine, cap),
    detached (they reweight the sampled tokens, they are not optimized), as verl's `rollout_is: token` with
    `rollout_is_threshold`; `learner_logp` is the old policy's (before the update). Metrics: the mean weight and
    the share of tokens whose ratio the cap truncated, over the masked tokens."""
    with torch.no_grad():
        ratio = torch.exp((learner_logp - engine_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        weights = ratio.clamp(max=cap)
        return weights, {"tis_weight_mean": masked_mean(weights, mask), "tis_capped": masked_mean(ratio > cap, mask)}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of `x` (a bool tensor counts as 0/1) over the positions where mask is 1, in float64; 0 when there
    are none."""
    mask = mask.double()
    return float((x.double() * mask).sum() / mask.sum().clamp(min=1))
