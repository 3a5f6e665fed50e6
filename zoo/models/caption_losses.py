"""The captioner's training losses as functions of tensors (zoo.models.captioner wires them up):
the caption NLL, the doubly stochastic attention regulariser (Xu et al. 2015, eq. 14), supervised
attention (Liu et al. 2017). B captions, T1 = T - 1 predicted words (the steps), L cells."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def caption_nll(logits: torch.Tensor, targets: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """-log p(y_t) per step [B, T1] from logits [B, T1, V] and targets [B, T1]; pads (step_mask 0) are 0."""
    B, T1 = targets.shape
    nll = F.cross_entropy(logits.reshape(B * T1, -1), targets.reshape(-1), reduction="none").view(B, T1)
    return nll * step_mask


def doubly_stochastic(alpha: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """eq. (14): sum_i (1 - sum_t alpha_ti)^2, averaged over the batch: every cell should receive
    about one step's worth of attention over the caption. alpha [B, T1, L], step_mask [B, T1]."""
    attention_sum = (alpha * step_mask.unsqueeze(-1)).sum(1)  # [B, L] = sum_t alpha_ti
    return ((1.0 - attention_sum) ** 2).sum(1).mean()


def supervised_attention(log_alpha: torch.Tensor, cell_masks: torch.Tensor, word_items: torch.Tensor,
                         step_mask: torch.Tensor, target: str = "box") -> torch.Tensor:
    """Liu et al. 2017: on every word that names an item, a loss between alpha_t and the cells of
    that item's box. log_alpha [B, T1, L]; cell_masks [B, K, L] (item k's box covers cell l);
    word_items [B, T] (the item each caption token names, -1 none) -> the per-caption sum,
    averaged over the batch. target "box": the cross-entropy to the box mask normalised to sum 1
    (their strong supervision); "mass": -log(the attention mass inside the box)."""
    slot = word_items[:, 1:]  # the target word's item, aligned with the steps
    L = log_alpha.shape[-1]
    on_item = cell_masks.gather(1, slot.clamp(min=0).unsqueeze(-1).expand(-1, -1, L))  # [B, T1, L]
    valid = (slot >= 0) & (step_mask > 0) & on_item.any(-1)  # (a box too small to hold a cell centre: no target)
    if target == "box":
        q = on_item.to(log_alpha.dtype)
        q = q / q.sum(-1, keepdim=True).clamp(min=1)
        per_step = -(q * log_alpha).sum(-1)
    else:
        per_step = -torch.logsumexp(log_alpha.masked_fill(~on_item, float("-inf")), dim=-1)
        per_step = torch.where(valid, per_step, torch.zeros_like(per_step))
    return (per_step * valid).sum() / log_alpha.shape[0]
