"""The GRPO-RoC objective: group-normalized advantages and a token-level PPO clip loss with asymmetric
clipping (eps_low 0.2, eps_high 0.28), the ratio taken against the rollout engine's own logprobs, averaged
over all response tokens of the batch; no KL term, no entropy bonus."""

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


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  eps_low: float = 0.2, eps_high: float = 0.28, denominator: float | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate: -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), summed
    over masked tokens / denominator (default: the masked token count). `advantages` is per token (each
    token carries its trajectory's advantage)."""
    mask = mask.float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    denom = denominator if denominator is not None else mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        clip_frac = ((clipped * advantages < ratio * advantages).float() * mask).sum() / n  # the clip is active
        gap = ((logp - old_logp).abs() * mask).sum() / n
    return loss, {"clip_frac": float(clip_frac), "logprob_gap": float(gap)}
