"""The fixed binarization of the binarized test sets (DRAW, Gregor et al. 2015): a stochastic
binarization that is a function of the image and a seed only, the same for every model, batch,
order and device. (Training draws a fresh one every step: the model's.)"""
from __future__ import annotations

from functools import lru_cache

import torch

_MASK32 = 0xFFFFFFFF


def _hash32(v: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing hash on int64 tensors (values stay < 2^63: no overflow)."""
    v = v & _MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _MASK32
    return (v >> 16) ^ v


@lru_cache(maxsize=16)
def _pixel_weights(pixels: int, seed: int, device: torch.device) -> torch.Tensor:
    """The content hash's per-pixel weights, once per size, seed and device (no host copy in a step)."""
    return torch.randint(1, 1 << 20, (pixels,), generator=torch.Generator().manual_seed(seed)).to(device)


def fixed_binarize(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Pixel on iff u < intensity, u ~ U[0, 1) a hash of (seed, the image's 8-bit content, the pixel
    index). x [B, ...] in [0, 1] -> same shape in {0, 1}."""
    flat = x.detach().reshape(x.shape[0], -1)
    q = (flat * 255).round().to(torch.int64)  # the uint8 image the loader divided by 255
    P = q.shape[1]
    key = _hash32((q * _pixel_weights(P, int(seed), x.device)).sum(1) + int(seed))  # [B] image identity
    pixel = torch.arange(P, device=x.device, dtype=torch.int64)
    u = _hash32(_hash32(key[:, None] ^ (pixel[None, :] * 0x9E3779B1 & _MASK32)) + int(seed))
    u = u.to(torch.float64) / float(1 << 32)
    return (u < flat.double()).to(x.dtype).reshape(x.shape)
