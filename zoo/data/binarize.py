"""The fixed binarization that defines the binarized test sets (DRAW, Gregor et al. 2015, and
the usual binarized-MNIST protocol): a stochastic binarization, drawn once, that is a function
of the image and a seed only. Every model, batch size, order and device then scores the same
binary test images. (Training uses a fresh binarization every step; that is the model's.)"""
from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _hash32(v: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing hash on int64 tensors (values stay < 2^63: no overflow)."""
    v = v & _MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _MASK32
    return (v >> 16) ^ v


def fixed_binarize(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A fixed stochastic binarization: pixel on iff u < intensity, with u ~ U[0, 1) a hash of
    (seed, the image's 8-bit content, the pixel index). Deterministic per image, independent of
    batch size, order and device. x [B, ...] in [0, 1] -> same shape in {0, 1}."""
    flat = x.detach().reshape(x.shape[0], -1)
    q = (flat * 255).round().to(torch.int64)  # the uint8 image the loader divided by 255
    P = q.shape[1]
    weights = torch.randint(1, 1 << 20, (P,), generator=torch.Generator().manual_seed(int(seed)))
    key = _hash32((q * weights.to(x.device)).sum(1) + int(seed))  # [B] image identity
    pixel = torch.arange(P, device=x.device, dtype=torch.int64)
    u = _hash32(_hash32(key[:, None] ^ (pixel[None, :] * 0x9E3779B1 & _MASK32)) + int(seed))
    u = u.to(torch.float64) / float(1 << 32)
    return (u < flat.double()).to(x.dtype).reshape(x.shape)
