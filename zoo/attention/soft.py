"""Soft (deterministic) attention over a set of annotation vectors, Xu et al. 2015 sec. 4.2.

    alpha_t = softmax_i(e_ti)                    eq. (5)
    z_t     = sum_i alpha_ti a_i                 eq. (13), the expected context

`mask [B, L]` (True = a real location) gives a padded location alpha exactly 0; a row with no valid
location gets alpha 0 everywhere and a zero context instead of NaNs.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.attention.scores import AttentionScore


def masked_log_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """scores [B, L], mask [B, L] bool or None -> log alpha [B, L]; masked entries are a huge
    negative number (not -inf, so that 0 * log alpha stays 0 and gradients stay finite)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.log_softmax(scores, dim=-1)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """scores [B, L] -> alpha [B, L]; exactly 0 where mask is False (and in all-masked rows)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    alpha = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return alpha * mask  # an all-masked row came out uniform; this zeroes it


def expected_context(alpha: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """alpha [B, L], values [B, L, D] -> z [B, D] = sum_i alpha_i a_i (eq. 13)."""
    return torch.bmm(alpha.unsqueeze(1), values).squeeze(1)


class SoftAttention(nn.Module):
    """(projected keys [B, L, P] (`score.project_keys`, once per image), values [B, L, D], query
    [B, Dq], mask [B, L]) -> (context [B, D], alpha [B, L])."""

    def __init__(self, score: AttentionScore):
        super().__init__()
        self.score = score

    def forward(self, projected: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = masked_softmax(self.score(projected, query), mask)  # eq. (4)-(5)
        return expected_context(alpha, values), alpha
