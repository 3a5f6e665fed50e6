"""Batch augmentation on the batch's device, whole-batch tensor ops. `BatchAugment` (the identity in
eval mode) applies per sample: a shift of up to `translate` pixels, zero-filled; a horizontal flip
with probability `hflip`; with probability `erase`, a square of `erase_area` of the image set to 0
(random erasing, Zhong et al. 2017, fixed area and aspect ratio 1)."""
from __future__ import annotations

import torch
from torch import nn


def random_translate(images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """images [B, C, H, W] -> [B, C, H, W], each shifted by its own (dy, dx) in [-max_shift, max_shift]."""
    if max_shift <= 0:
        return images
    B, C, H, W = images.shape
    padded = nn.functional.pad(images, (max_shift,) * 4)  # [B, C, H + 2s, W + 2s]
    offsets = torch.randint(0, 2 * max_shift + 1, (2, B), device=images.device, generator=generator)
    rows = (offsets[0, :, None] + torch.arange(H, device=images.device))  # [B, H]
    cols = (offsets[1, :, None] + torch.arange(W, device=images.device))  # [B, W]
    batch = torch.arange(B, device=images.device)[:, None, None]
    # Advanced indexing picks out[b, :, i, j] = padded[b, :, rows[b, i], cols[b, j]] for all b at once.
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def random_hflip(images: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    if p <= 0:
        return images
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < p
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def random_erase(images: torch.Tensor, p: float, area: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero one square of `area` (a fraction of the image) at a random place, with probability p."""
    if p <= 0 or area <= 0:
        return images
    B, _, H, W = images.shape
    side_h, side_w = max(1, round(H * area ** 0.5)), max(1, round(W * area ** 0.5))
    device = images.device
    top = (torch.rand(B, device=device, generator=generator) * (H - side_h + 1)).long()
    left = (torch.rand(B, device=device, generator=generator) * (W - side_w + 1)).long()
    apply = torch.rand(B, device=device, generator=generator) < p
    ys, xs = torch.arange(H, device=device), torch.arange(W, device=device)
    in_rows = (ys >= top[:, None]) & (ys < top[:, None] + side_h)  # [B, H]
    in_cols = (xs >= left[:, None]) & (xs < left[:, None] + side_w)  # [B, W]
    mask = in_rows[:, :, None] & in_cols[:, None, :] & apply[:, None, None]  # [B, H, W]
    return images.masked_fill(mask[:, None], 0.0)


class BatchAugment(nn.Module):
    def __init__(self, translate: int = 0, hflip: float = 0.0, erase: float = 0.0, erase_area: float = 0.1):
        super().__init__()
        self.translate, self.hflip, self.erase, self.erase_area = translate, hflip, erase, erase_area

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # images [B, C, H, W] -> [B, C, H, W]; each op is the identity where its probability or size is 0
        if not self.training:
            return images
        images = random_translate(images, self.translate)
        images = random_hflip(images, self.hflip)
        return random_erase(images, self.erase, self.erase_area)


def mixup(images: torch.Tensor, labels: torch.Tensor, alpha: float):
    """Mixup (Zhang et al. 2018), the batch reversed as partner -> (mixed images, labels, partner
    labels, lam); the loss is lam * CE(labels) + (1 - lam) * CE(partner). lam ~ Beta(alpha, alpha), a
    0-d tensor on the images' device (1 for alpha <= 0)."""
    if alpha > 0:
        concentration = torch.full((), float(alpha), device=images.device)
        # validate_args=False: checking the parameters would read them back on the host
        lam = torch.distributions.Beta(concentration, concentration, validate_args=False).sample()
    else:
        lam = torch.ones((), device=images.device)
    return lam * images + (1 - lam) * images.flip(0), labels, labels.flip(0), lam
