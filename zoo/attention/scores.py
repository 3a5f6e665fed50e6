"""Attention scores: how well each annotation vector (key) answers the decoder's query.

Show, Attend and Tell (Xu et al. 2015) scores locations with an MLP, eq. (4), `e_ti = f_att(a_i,
h_{t-1})`; the others are the usual alternatives:

- "dot":        e_i = k_i . q       (the query projected to the key width where they differ)
- "scaled_dot": e_i = k_i . q / sqrt(d)
- "general":    e_i = k_i^T W q                  (bilinear)
- "additive":   e_i = w^T tanh(W_k k_i + W_q q + b)   (the paper's f_att; tanh, not ReLU)

The keys do not change over the decoding steps, so a score splits into `project_keys(keys)` (once
per image) and `forward(projected, query)` (once per step), and that into
`combine(projected, query_linear(query))`, so a caller can fuse the query's linear map with others
of the same query (the captioner's gate and LSTM).
"""
from __future__ import annotations

import abc
import math

import torch
from torch import nn


class AttentionScore(nn.Module, abc.ABC):
    """Base class. keys [B, L, Dk] -> projected [B, L, P] once; (projected, query [B, Dq]) -> [B, L]."""

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return keys

    @property
    def query_linear(self) -> nn.Linear | None:
        """The linear map applied to the query first (None: the query as it is)."""
        return getattr(self, "query_proj", None)

    @abc.abstractmethod
    def combine(self, projected: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """(projected keys [B, L, P], query after `query_linear` [B, Q]) -> scores [B, L]."""

    def forward(self, projected: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Scores [B, L] of every key for the query."""
        linear = self.query_linear
        return self.combine(projected, linear(query) if linear is not None else query)

    def score(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Both halves at once: keys [B, L, Dk], query [B, Dq] -> scores [B, L]."""
        return self(self.project_keys(keys), query)


class DotScore(AttentionScore):
    def __init__(self, key_dim: int, query_dim: int, scaled: bool = False):
        super().__init__()
        self.query_proj = None if key_dim == query_dim else nn.Linear(query_dim, key_dim, bias=False)
        self.scale = 1.0 / math.sqrt(key_dim) if scaled else 1.0

    def combine(self, projected: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        # query [B, Dk]
        return torch.bmm(projected, query.unsqueeze(-1)).squeeze(-1) * self.scale


class GeneralScore(AttentionScore):
    """Bilinear k^T W q; W is applied to the keys once so a step is one batched dot product."""

    def __init__(self, key_dim: int, query_dim: int):
        super().__init__()
        self.weight = nn.Linear(key_dim, query_dim, bias=False)  # k^T W as a map Dk -> Dq

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return self.weight(keys)  # [B, L, Dq]

    def combine(self, projected: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        return torch.bmm(projected, query.unsqueeze(-1)).squeeze(-1)


def tanh_via_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) = 2 sigmoid(2x) - 1 (within 2e-7 in fp32): on CPU torch's tanh is several times slower
    than its sigmoid, and the additive score's tanh is most of a beam-search step. Without autograd
    `x` is overwritten in place: pass a temporary."""
    if not x.is_cpu:
        return torch.tanh(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.sigmoid(2 * x) * 2 - 1
    return torch.sigmoid_(x.mul_(2)).mul_(2).sub_(1)


class _AdditiveScoresCPU(torch.autograd.Function):
    """scores = w . tanh(P + q) + b over [rows, L, A], trained on CPU: written as 2 w . s - sum(w) + b
    with s = sigmoid(2 (P + q)) saved, and a hand-written backward (d/dP = 4 g w s (1 - s)): seven
    passes over [rows, L, A] against about twelve for autograd's tanh + linear (most of a step)."""

    @staticmethod
    def forward(ctx, projected, query, weight, bias):
        # projected [R, L, A], query [R, A], weight [A], bias [1] -> scores [R, L]
        s = torch.add(projected, query.unsqueeze(1)).mul_(2).sigmoid_()
        ctx.save_for_backward(s, weight)
        return torch.matmul(s, weight * 2) + (bias - weight.sum())

    @staticmethod
    def backward(ctx, grad):
        s, weight = ctx.saved_tensors
        d_pre = torch.addcmul(s, s, s, value=-1).mul_(grad.unsqueeze(-1) * (4 * weight))  # [R, L, A]
        d_weight = 2 * torch.einsum("rl,rla->a", grad, s) - grad.sum()
        return d_pre, d_pre.sum(1), d_weight, grad.sum().reshape(1)


class AdditiveScore(AttentionScore):
    """The paper's f_att (eq. 4): a one-hidden-layer MLP with tanh over [a_i, h_{t-1}]."""

    def __init__(self, key_dim: int, query_dim: int, attention_dim: int):
        super().__init__()
        self.key_proj = nn.Linear(key_dim, attention_dim)  # carries the MLP's bias
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        self.out = nn.Linear(attention_dim, 1)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return self.key_proj(keys)  # [B, L, A]

    def combine(self, projected: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        # projected [B, L, A], query [B, A] (after query_proj) -> [B, L]
        if projected.is_cpu and torch.is_grad_enabled():
            return _AdditiveScoresCPU.apply(projected, query, self.out.weight.view(-1), self.out.bias)
        hidden = tanh_via_sigmoid(projected + query.unsqueeze(1))  # [B, L, A]
        return self.out(hidden).squeeze(-1)


SCORES = ("dot", "scaled_dot", "general", "additive")


def build_score(name: str, key_dim: int, query_dim: int, attention_dim: int | None = None) -> AttentionScore:
    """The score `name` (one of SCORES) for keys of width key_dim and queries of width query_dim."""
    if name not in SCORES:
        raise ValueError(f"unknown attention score {name!r}; choose one of {', '.join(SCORES)}")
    if name == "general":
        return GeneralScore(key_dim, query_dim)
    if name != "additive":
        return DotScore(key_dim, query_dim, scaled=name == "scaled_dot")
    if not attention_dim:
        raise ValueError("the additive score needs attention_dim")
    return AdditiveScore(key_dim, query_dim, attention_dim)
