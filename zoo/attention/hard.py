"""Stochastic "hard" attention, Xu et al. 2015 sec. 4.1, with the learning rule of the authors' code.

At step t the model picks ONE location `s_t ~ Multinoulli_L(alpha_t)` (eq. 8-9) and uses its
annotation vector as the context, `z_t = a_{s_t}`. The choice is not differentiable, so the
attention network learns by REINFORCE on the variational bound (eq. 10-12). The authors' Theano code
(arctic-captions, `known_grads` on alpha) applies, per sample n and step t,

    dL/dalpha_t = (b - cost_n) / 10 * (-onehot(s_t) / alpha_t) + lambda_e * (log alpha_t + 1)

where cost_n is the sample's caption NLL, b a moving average of the cost, `b <- 0.9 b + 0.1 mean(cost)`,
1/10 the reward scaling and lambda_e = 0.002 the entropy bonus. `reinforce_surrogate` below is a
scalar whose autograd gradient with respect to alpha is exactly that (per sample; we average over the
batch, as the NLL is averaged). It is an unbiased estimator of the gradient of E[cost] for any
baseline that does not depend on the sample (tests/test_hard_attention.py checks this exactly on a
problem small enough to enumerate).

Also from the paper: with probability 0.5 per minibatch the expected context (soft attention's
`sum_i alpha_i a_i`) replaces the sample. The paper calls that case "equivalent to the deterministic
attention", so we let the NLL gradient flow through alpha then, as in soft attention, and apply no
REINFORCE term. At test time the hard model decodes with the expected context (the authors' choice,
the default) or with the argmax location.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from zoo.attention.scores import AttentionScore
from zoo.attention.soft import expected_context, masked_log_softmax

MODES = ("sample", "expected", "argmax")


class HardAttentionOutput(NamedTuple):
    context: torch.Tensor  # [B, D]
    alpha: torch.Tensor  # [B, L]
    log_alpha: torch.Tensor  # [B, L], exact (log_softmax of the scores, no clamping)
    location: torch.Tensor  # [B] int64: the sampled / argmax location (the peak in "expected" mode)


def sample_locations(log_alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """s ~ Cat(alpha) for every row, by Gumbel-max: argmax_i(log alpha_i - log E_i), E_i ~ Exp(1).

    log_alpha [B, L] -> [B] int64. No host sync; masked locations (log alpha = -huge) are never drawn."""
    noise = torch.empty_like(log_alpha).exponential_(generator=generator)
    return (log_alpha - noise.log()).argmax(dim=-1)


def gather_context(values: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
    """values [B, L, D], location [B] -> a_{s} [B, D] (eq. 9's z_t for the sampled s)."""
    index = location.view(-1, 1, 1).expand(-1, 1, values.shape[-1])
    return values.gather(1, index).squeeze(1)


class HardAttention(nn.Module):
    """(projected keys [B, L, P], values [B, L, D], query [B, Dq], mask [B, L], mode) -> HardAttentionOutput.

    mode "sample" (training): a sampled location, no gradient into alpha through the context;
    "expected": the soft context; "argmax": the most likely location."""

    def __init__(self, score: AttentionScore):
        super().__init__()
        self.score = score

    def forward(self, projected: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                mask: torch.Tensor | None = None, mode: str = "sample",
                generator: torch.Generator | None = None) -> HardAttentionOutput:
        log_alpha = masked_log_softmax(self.score(projected, query), mask)  # eq. (4)-(5)
        alpha = log_alpha.exp()
        if mode == "sample":
            location = sample_locations(log_alpha.detach(), generator)  # eq. (8)
            context = gather_context(values, location)  # eq. (9)
        elif mode == "expected":
            location = alpha.detach().argmax(dim=-1)
            context = expected_context(alpha, values)  # eq. (13)
        elif mode == "argmax":
            location = alpha.detach().argmax(dim=-1)
            context = gather_context(values, location)
        else:
            raise ValueError(f"unknown hard attention mode {mode!r}; choose one of {', '.join(MODES)}")
        return HardAttentionOutput(context, alpha, log_alpha, location)


class MovingAverageBaseline(nn.Module):
    """The authors' baseline: b <- decay * b + (1 - decay) * mean(cost), starting at 0.

    Kept as a buffer so that it travels with checkpoints; updated in place without a host sync."""

    def __init__(self, decay: float = 0.9):
        super().__init__()
        self.decay = float(decay)
        self.register_buffer("value", torch.zeros(()))

    @torch.no_grad()
    def update(self, cost: torch.Tensor) -> None:
        self.value.mul_(self.decay).add_(cost.detach().mean().to(self.value.dtype), alpha=1.0 - self.decay)


def reinforce_surrogate(log_alpha: torch.Tensor, locations: torch.Tensor, cost: torch.Tensor,
                        baseline: torch.Tensor | float, step_mask: torch.Tensor | None = None,
                        reward_scale: float | torch.Tensor = 0.1, entropy_coef: float = 0.002) -> torch.Tensor:
    """A scalar to ADD to the loss so that autograd produces the authors' hard-attention gradient.

    log_alpha [B, T, L] (exact log alpha, with grad), locations [B, T] int64 (the samples s_t),
    cost [B] (one cost per sample, e.g. its caption NLL: every step's choice is charged with it)
    or [B, T] (a cost per step, e.g. the NLL of the words a step's choice affects); detached here.
    baseline: a scalar, [B] or [B, T] (anything that does not depend on the samples; detached).
    reward_scale: a float or a scalar tensor (0 turns the REINFORCE term off without a branch).
    step_mask [B, T] (True/1 on real steps) -> scalar.

    Per sample n, d/d alpha_t of the returned value is
        reward_scale * (cost_n - b) * onehot(s_t) / alpha_t + entropy_coef * (log alpha_t + 1),
    i.e. the authors' `(b - cost)/10 * (-sample/alpha) + lambda_e (log alpha + 1)`, averaged over B.
    The first term is the REINFORCE (score-function) estimator of d E[cost] (eq. 11-12); the second
    is the gradient of -entropy, so minimising it raises the entropy of alpha (the entropy bonus)."""
    batch = log_alpha.shape[0]
    if step_mask is None:
        step_mask = torch.ones(locations.shape, dtype=log_alpha.dtype, device=log_alpha.device)
    step_mask = step_mask.to(log_alpha.dtype)
    if isinstance(baseline, torch.Tensor):
        baseline = baseline.detach()
        if baseline.dim() == 1:
            baseline = baseline.unsqueeze(1)
    cost = cost.detach()
    if cost.dim() == 1:
        cost = cost.unsqueeze(1)
    advantage = (cost - baseline) * reward_scale  # [B, 1] or [B, T]
    log_p_sample = log_alpha.gather(-1, locations.unsqueeze(-1)).squeeze(-1)  # [B, T] = log alpha_{t, s_t}
    score_term = (advantage * log_p_sample * step_mask).sum()
    alpha = log_alpha.exp()
    neg_entropy = (alpha * log_alpha).sum(-1)  # [B, T]; masked locations give 0 * (-huge) = 0
    entropy_term = entropy_coef * (neg_entropy * step_mask).sum()
    return (score_term + entropy_term) / batch
