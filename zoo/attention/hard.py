"""Stochastic "hard" attention, Xu et al. 2015 sec. 4.1, with the learning rule of the authors' code.

At step t the model picks ONE location `s_t ~ Multinoulli_L(alpha_t)` (eq. 8-9) and uses its
annotation vector as the context, `z_t = a_{s_t}`. The choice is not differentiable, so the
attention network learns by REINFORCE on the variational bound (eq. 10-12). The authors' Theano code
(arctic-captions, `known_grads` on alpha) applies, per sample n and step t,

    dL/dalpha_t = (b - cost_n) / 10 * (-onehot(s_t) / alpha_t) + lambda_e * (log alpha_t + 1)

with cost_n the sample's caption NLL, b <- 0.9 b + 0.1 mean(cost) a moving average, 1/10 the reward
scaling and lambda_e = 0.002 the entropy bonus; `reinforce_surrogate` is a scalar whose gradient is
exactly that (unbiased for any baseline independent of the sample: tests/test_hard_attention.py
checks it exactly on a problem small enough to enumerate). With probability 0.5 per minibatch the
expected context replaces the sample ("equivalent to the deterministic attention": the NLL gradient
then flows through alpha, with no REINFORCE term). At test time the model decodes with the expected
context (the authors' choice) or the argmax location.

A decoder chooses its estimator by name (`HardSpec.estimator`) from `ESTIMATORS`: each is a
`HardEstimator` holding its checks, the weights of a sampled step's context and its loss term
(REINFORCE, VIMCO, the exact marginal of Deng et al. 2018, Gumbel-softmax with or without
straight-through), so a new estimator is one class here.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import torch
from torch import nn

from zoo.attention.scores import AttentionScore
from zoo.attention.soft import expected_context, masked_log_softmax
from zoo.hparams import Block

MODES = ("sample", "expected", "argmax")


class HardAttentionOutput(NamedTuple):
    context: torch.Tensor  # [B, D]
    alpha: torch.Tensor  # [B, L]
    log_alpha: torch.Tensor  # [B, L], exact (log_softmax of the scores, no clamping)
    location: torch.Tensor  # [B] int64: the sampled / argmax location (the peak in "expected" mode)


def sample_locations(log_alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """s ~ Cat(alpha) for every row, by Gumbel-max: argmax_i(log alpha_i - log E_i), E_i ~ Exp(1):
    log_alpha [B, L] -> [B] int64, no host sync; masked locations are never drawn."""
    noise = torch.empty_like(log_alpha).exponential_(generator=generator)
    return (log_alpha - noise.log()).argmax(dim=-1)


def gather_context(values: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
    """values [B, L, D], location [B] -> a_{s} [B, D] (eq. 9's z_t for the sampled s)."""
    index = location.view(-1, 1, 1).expand(-1, 1, values.shape[-1])
    return values.gather(1, index).squeeze(1)


class HardAttention(nn.Module):
    """(projected keys [B, L, P], values [B, L, D], query [B, Dq], mask [B, L], mode) -> HardAttentionOutput;
    mode "sample" (a drawn location), "expected" (the soft context) or "argmax"."""

    def __init__(self, score: AttentionScore):
        super().__init__()
        self.score = score

    def forward(self, projected: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                mask: torch.Tensor | None = None, mode: str = "sample",
                generator: torch.Generator | None = None) -> HardAttentionOutput:
        if mode not in MODES:
            raise ValueError(f"unknown hard attention mode {mode!r}; choose one of {', '.join(MODES)}")
        log_alpha = masked_log_softmax(self.score(projected, query), mask)  # eq. (4)-(5)
        alpha = log_alpha.exp()
        if mode == "sample":
            location = sample_locations(log_alpha.detach(), generator)  # eq. (8)
        else:
            location = alpha.detach().argmax(dim=-1)
        # eq. (13)'s expected context, or eq. (9)'s annotation vector at the location
        context = expected_context(alpha, values) if mode == "expected" else gather_context(values, location)
        return HardAttentionOutput(context, alpha, log_alpha, location)


class MovingAverageBaseline(nn.Module):
    """The authors' baseline b <- decay * b + (1 - decay) * mean(cost), from 0; a buffer, no host sync."""

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

    log_alpha [B, T, L] (with grad), locations [B, T] (the samples s_t), cost [B] (every step charged
    with it) or [B, T] (a cost per step) and baseline (a scalar, [B] or [B, T], independent of the
    samples), both detached here; reward_scale a float or scalar tensor (0: REINFORCE off without a
    branch); step_mask [B, T]. Per sample n, d/d alpha_t of the value, averaged over B, is
        reward_scale * (cost_n - b) * onehot(s_t) / alpha_t + entropy_coef * (log alpha_t + 1):
    the score-function estimator of d E[cost] (eq. 11-12) plus the gradient of -entropy."""
    def per_step(x):  # [B] -> [B, 1]; [B, T] and scalars as they are; detached
        return x.detach().view(-1, 1) if x.dim() == 1 else x.detach()

    log_p_sample = log_alpha.gather(-1, locations.unsqueeze(-1)).squeeze(-1)  # [B, T] = log alpha_{t, s_t}
    step_mask = torch.ones_like(log_p_sample) if step_mask is None else step_mask.to(log_alpha.dtype)
    baseline = per_step(baseline) if isinstance(baseline, torch.Tensor) else baseline
    advantage = (per_step(cost) - baseline) * reward_scale  # [B, 1] or [B, T]
    score_term = (advantage * log_p_sample * step_mask).sum()
    entropy_term = entropy_coef * negative_entropy(log_alpha, step_mask)
    return (score_term + entropy_term) / log_alpha.shape[0]


def discounted_cost(nll: torch.Tensor, discount: float) -> torch.Tensor:
    """What step t's sample pays: its word's NLL and, discounted by gamma^(t' - t), the later words
    its sample can change. nll [B, T1] -> [B, T1]; discount 0: each word's own NLL."""
    if discount <= 0:
        return nll
    T1 = nll.shape[1]
    powers = torch.arange(T1, device=nll.device, dtype=nll.dtype)
    later = powers.view(1, -1) - powers.view(-1, 1)  # [t, t'] = t' - t
    weight = torch.where(later >= 0, discount ** later.clamp(min=0), 0.0)
    return nll @ weight.T  # [B, T1]: sum_{t' >= t} gamma^(t' - t) nll_t'


def negative_entropy(log_alpha: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """sum over real steps of sum_i alpha_i log alpha_i: log_alpha [B, T, L], step_mask [B, T] -> scalar
    (minimising it raises the entropy of alpha: the entropy bonus)."""
    alpha = log_alpha.exp()
    neg_entropy = (alpha * log_alpha).sum(-1)  # [B, T]; masked locations give 0 * (-huge) = 0
    return (neg_entropy * step_mask).sum()


def leave_one_out_baseline(cost: torch.Tensor) -> torch.Tensor:
    """Each path's baseline: the mean cost of the OTHER K - 1 paths of the same input (independent of
    its own samples: unbiased). cost [B, K, ...] with K >= 2 -> [B, K, ...], detached."""
    cost = cost.detach()
    K = cost.shape[1]
    return (cost.sum(1, keepdim=True) - cost) / (K - 1)


def vimco_signal(log_f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """VIMCO (Mnih & Rezende 2016, eq. 8-10) for K >= 2 paths per input: log_f [B, K] = log p(y | z_k)
    -> (bound [B] = log (1/K) sum_k f_k, with log_f's gradient; signal [B, K], detached), where
    signal_j = bound - log (1/K) (sum_{k != j} f_k + fhat_j), fhat_j = exp(mean_{k != j} log f_k):
    path j's learning signal for its score d log q(z_j)."""
    K = log_f.shape[1]
    log_k = math.log(K)
    bound = torch.logsumexp(log_f, dim=1) - log_k  # [B], with log_f's gradient
    log_f = log_f.detach()
    log_fhat = leave_one_out_baseline(log_f)  # [B, K]: mean_{k != j} log f_k
    # for each j, the K terms with f_j replaced by fhat_j: [B, K (j), K (k)]
    replaced = torch.where(torch.eye(K, dtype=torch.bool, device=log_f.device), log_fhat.unsqueeze(-1),
                           log_f.unsqueeze(1))
    return bound, bound.detach().unsqueeze(1) - (torch.logsumexp(replaced, dim=-1) - log_k)


def marginal_log_prob(log_alpha: torch.Tensor, cell_log_probs: torch.Tensor) -> torch.Tensor:
    """The exact marginal over the cell z_t (Deng et al. 2018): log p(y) = logsumexp_i [log alpha_i
    + log p(y | z = i)]. log_alpha [..., L], cell_log_probs [..., L, V] -> [..., V]."""
    return torch.logsumexp(log_alpha.unsqueeze(-1) + cell_log_probs, dim=-2)


def straight_through_weights(log_alpha: torch.Tensor, gumbel: torch.Tensor, temperature: float) -> torch.Tensor:
    """Gumbel-softmax straight-through (Jang et al. 2017; Maddison et al. 2017): log_alpha, gumbel
    [..., L] -> the one-hot sample argmax_i(log alpha_i + g_i) forward (REINFORCE's sample from the
    same noise), the gradient of softmax((log alpha + g) / temperature) backward. In float32 (bf16
    noise and logits make NaNs: pytorch #41663)."""
    scores = log_alpha.float() + gumbel.float()
    soft = torch.softmax(scores / temperature, dim=-1)
    hard = torch.zeros_like(soft).scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    return (hard - soft.detach() + soft).to(log_alpha.dtype)


# ----------------------------------------------------------------------------- estimators
@dataclass
class HardSpec(Block):
    """How a decoder's hard attention learns and decodes (the captioner's `hard:` block): samples =
    K paths per caption; semi_sampling_p = the chance of an expected-context minibatch (sec. 4.1);
    entropy_coef = lambda_e; REINFORCE's reward_scale, baseline (the authors' moving average, a
    learned b(h_{t-1}, E y_t), or the other paths' mean cost) and cost (per caption or per word)."""

    estimator: str = "reinforce"
    samples: int = 1
    test_mode: Literal["expected", "argmax", "marginal"] = "expected"
    semi_sampling_p: float = 0.5
    entropy_coef: float = 0.002
    reward_scale: float = 0.1
    baseline: Literal["moving_average", "learned", "leave_one_out"] = "moving_average"
    baseline_decay: float = 0.9
    reinforce_cost: Literal["caption", "word"] = "caption"
    reinforce_discount: float = 0.0
    gumbel_temperature: float = 1.0


class HardBatch(NamedTuple):
    """What an estimator's loss reads of a teacher-forced minibatch: B rows (K sample paths per
    caption side by side), T1 steps, L cells."""

    log_alpha: torch.Tensor  # [B, T1, L], with its gradient
    location: torch.Tensor | None  # [B, T1] the cells drawn (None where nothing was drawn)
    nll: torch.Tensor  # [B, T1] each word's -log p, pads 0
    caption_nll: torch.Tensor  # [B] -log p(caption)
    n_words: torch.Tensor  # [B] real words per caption (>= 1)
    step_mask: torch.Tensor  # [B, T1] 1 on real words
    use_expected: torch.Tensor | None  # bool scalar: the minibatch used the expected context
    paths: int  # K
    sampled: bool  # the pass drew cells (False: the exact marginal, or the expected context)
    moving_average: torch.Tensor | None  # the authors' baseline b, a scalar
    learned_baseline: Callable[[], torch.Tensor] | None  # -> the learned b per step [B, T1]


class EstimatorTerms(NamedTuple):
    objective: torch.Tensor | None  # replaces the mean caption NLL (VIMCO's bound), or None
    added: dict[str, torch.Tensor]  # added to the loss, in this order
    logged: dict[str, torch.Tensor]  # reported beside it (a REINFORCE cost, VIMCO's bound)


#: estimator name -> its class (a subclass with a `name` registers itself): `estimator`'s allow-list
ESTIMATORS: dict[str, type["HardEstimator"]] = {}


class HardEstimator:
    """How the one-cell attention learns: `check`, `step_weights` and `terms`. `train_mode`: the pass
    it trains with, "sample" (a cell drawn per step) or "marginal" (the cell summed out)."""

    name: ClassVar[str] = ""
    train_mode: ClassVar[str] = "sample"
    min_samples: ClassVar[int] = 1  # sample paths per caption it needs

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name:
            ESTIMATORS[cls.name] = cls

    def __init__(self, spec: HardSpec):
        self.spec = spec

    def check(self, decoder) -> None:
        """ValueError (one line) for a setting it cannot run or mean; `decoder`: the decoder's block."""
        if self.spec.samples < self.min_samples:
            raise ValueError(f"{self.name} needs hard.samples >= {self.min_samples} (paths per caption), "
                             f"got {self.spec.samples}")

    def step_weights(self, log_alpha: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
        """Weights [N, L] whose expected context is a sampled step's z_t, for log_alpha and the
        step's Gumbel noise [N, L]; None: the sample's annotation vector itself (eq. 9, a gather)."""
        return None

    def terms(self, batch: HardBatch) -> EstimatorTerms:
        """Its loss term; the default (and any pass that drew nothing): the entropy bonus alone."""
        added = {}
        if self.spec.entropy_coef:
            added["entropy_bonus"] = (self.spec.entropy_coef * negative_entropy(batch.log_alpha, batch.step_mask)
                                      / batch.log_alpha.shape[0])
        return EstimatorTerms(None, added, {})


class Reinforce(HardEstimator):
    """The score-function estimator (eq. 10-12) with the authors' rule (`reinforce_surrogate`), off on
    expected minibatches by a multiplier; a learned baseline is regressed on the cost by its own MSE."""

    name = "reinforce"

    def check(self, decoder) -> None:
        super().check(decoder)
        if self.spec.baseline == "leave_one_out" and self.spec.samples < 2:
            raise ValueError(f"baseline: leave_one_out needs hard.samples >= 2 (paths per caption), "
                             f"got {self.spec.samples}")

    def terms(self, batch: HardBatch) -> EstimatorTerms:
        if not batch.sampled:
            return super().terms(batch)
        spec, step_mask = self.spec, batch.step_mask
        added, logged = {}, {}
        if spec.reinforce_cost == "caption":  # the authors: every step pays the caption's per-word NLL
            cost = (batch.caption_nll / batch.n_words).detach()  # [B]
        else:  # step t pays for word t and, discounted, the later words its sample can change
            cost = discounted_cost(batch.nll.detach(), spec.reinforce_discount)  # [B, T1]
        if batch.learned_baseline is not None:
            predicted = batch.learned_baseline()  # [B, T1]
            if cost.dim() == 1:
                predicted = (predicted * step_mask).sum(1) / step_mask.sum(1).clamp(min=1)  # one per caption
                baseline_loss = ((predicted - cost) ** 2).mean()
            else:
                baseline_loss = (((predicted - cost) ** 2) * step_mask).sum() / step_mask.sum().clamp(min=1)
            baseline = predicted.detach()
        elif spec.baseline == "leave_one_out":  # the mean cost of the caption's other paths
            baseline = leave_one_out_baseline(cost.view(-1, batch.paths, *cost.shape[1:])).view(cost.shape)
        else:
            baseline = batch.moving_average
        logged["cost"] = cost
        scale = spec.reward_scale * (~batch.use_expected).to(cost.dtype)  # no REINFORCE on expected minibatches
        added["reinforce"] = reinforce_surrogate(batch.log_alpha, batch.location, cost, baseline, step_mask,
                                                 reward_scale=scale, entropy_coef=spec.entropy_coef)
        if batch.learned_baseline is not None:
            added["baseline_loss"] = baseline_loss
        return EstimatorTerms(None, added, logged)


class Vimco(HardEstimator):
    """VIMCO: minus the bound log (1/K) sum_k p(caption | z_k), each path's log q(z_k) = sum_t log
    alpha_t(s_kt) scored with its signal (`vimco_signal`) times `reward_scale`; the entropy bonus."""

    name = "vimco"
    min_samples = 2

    def terms(self, batch: HardBatch) -> EstimatorTerms:
        if not batch.sampled:
            return super().terms(batch)
        bound, signal = vimco_signal(-batch.caption_nll.view(-1, batch.paths))
        log_q = (batch.log_alpha.gather(-1, batch.location.unsqueeze(-1)).squeeze(-1) * batch.step_mask).sum(1)  # [B*K]
        scale = self.spec.reward_scale * (~batch.use_expected).to(log_q.dtype)
        score = -(signal.reshape(-1) * log_q).sum() / signal.shape[0]
        reinforce = scale * score + (self.spec.entropy_coef * negative_entropy(batch.log_alpha, batch.step_mask)
                                     / log_q.shape[0])
        return EstimatorTerms(-bound.mean(), {"reinforce": reinforce}, {"vimco_bound": bound.mean()})


class Marginal(HardEstimator):
    """The exact marginal over the cell (Deng et al. 2018, `marginal_log_prob`): no samples, no
    variance; its loss term: the entropy bonus."""

    name = "marginal"
    train_mode = "marginal"

    def check(self, decoder) -> None:
        super().check(decoder)
        if self.spec.samples != 1:
            raise ValueError("the exact marginal draws no samples; hard.samples must be 1")
        if not decoder.deep_output:
            raise ValueError("the exact marginal sums the cell out at the deep output; it needs "
                             "decoder.deep_output: true")


class StraightThrough(HardEstimator):
    """Gumbel-softmax straight-through (`straight_through_weights`); its loss term: the entropy bonus."""

    name = "straight_through"

    def step_weights(self, log_alpha: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return straight_through_weights(log_alpha, noise, self.spec.gumbel_temperature)


class GumbelSoftmax(HardEstimator):
    """The relaxed Gumbel-softmax (Jang et al. 2017, eq. 1; Maddison et al. 2017's Concrete): the
    context mixes the cells under softmax((log alpha + g) / tau) both ways (a gap to one-cell
    decoding that shrinks with tau); the noise's argmax marks the cell. Loss: the entropy bonus."""

    name = "gumbel_softmax"

    def step_weights(self, log_alpha: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # in float32, as straight_through_weights (bf16 noise and logits make NaNs: pytorch #41663)
        relaxed = (log_alpha.float() + noise.float()) / self.spec.gumbel_temperature
        return torch.softmax(relaxed, dim=-1).to(log_alpha.dtype)


def build_estimator(spec: HardSpec) -> HardEstimator:
    """The estimator `spec.estimator` names (ValueError, one line, for a name off the list)."""
    if spec.estimator not in ESTIMATORS:
        raise ValueError(f"hard.estimator must be one of {', '.join(ESTIMATORS)}, got {spec.estimator!r}")
    return ESTIMATORS[spec.estimator](spec)
