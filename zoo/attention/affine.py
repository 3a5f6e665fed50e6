"""The spatial transformer's sampler (Jaderberg et al. 2015, sec. 3.2-3.3) and where it looks.

A transform theta [B, 2, 3] maps the output patch's normalised coordinates (x_t, y_t) in [-1, 1]
to the input's (eq. 1, the backward warp, target to source):

    (x_s, y_s) = theta (x_t, y_t, 1)

and the patch is the input bilinearly sampled there (eqs. 5-7: V = sum_nm U_nm max(0, 1 - |x_s - m|)
max(0, 1 - |y_s - n|)), zero outside the input. `F.affine_grid` and `F.grid_sample` are given the
same `align_corners=False` (their defaults since PyTorch 1.3, pytorch PR #24929): -1 and 1 are the
outer edges of the first and last pixel, so the identity transform reads the whole image, and at
half the resolution it is exactly a 2 x 2 average pooling.

Where it looks, in the input's pixels (x0, y0, x1, y1 pixel edges as zoo.attention.record):
- `outline`: the corners of the sampled region (the patch's edges, x_t, y_t = +-1), a
  quadrilateral (a parallelogram) for a general affine transform, and `bounding_box` around it;
- `footprint`: the share of each input pixel that the sampled region covers, exactly (the area of
  the pixel inside the parallelogram). Each output pixel stands for the source cell theta maps its
  own square to; an affine map sends equal squares to equal parallelograms, so the patch's cells
  tile the region evenly and the density of what the classifier sees is uniform over it. This,
  not the bilinear weights the sampler happens to multiply, is the map: when the grid's spacing is
  over a pixel (a patch smaller than the region it reads) those weights are a lattice of dots whose
  places depend on the grid's sub-pixel phase, so their peak lands anywhere in the region and
  moves under an arbitrarily small shift of the window; the footprint fills the outline, has no
  lattice, and peaks (as a plateau) at the region's centre, where the window is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ALIGN_CORNERS = False  # affine_grid and grid_sample alike
IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # theta's six numbers, row by row
ATTENTION_IDENTITY = (1.0, 0.0, 0.0)  # (s, tx, ty)


def attention_theta(params: torch.Tensor) -> torch.Tensor:
    """The paper's attention form A = [[s, 0, tx], [0, s, ty]] (sec. 3.1): params [B, 3] (s, tx, ty)
    -> theta [B, 2, 3]."""
    s, tx, ty = params.unbind(-1)
    zero = torch.zeros_like(s)
    return torch.stack([torch.stack([s, zero, tx], -1), torch.stack([zero, s, ty], -1)], -2)


class AffineSampler(nn.Module):
    """images [B, C, H, W], theta [B, 2, 3] -> patches [B, C, P, P] (P = patch_size)."""

    def __init__(self, patch_size: int):
        super().__init__()
        self.patch_size = patch_size

    def grid(self, theta: torch.Tensor, channels: int) -> torch.Tensor:
        """theta [B, 2, 3] -> the source coordinates of every output pixel [B, P, P, 2] (x, y) in [-1, 1]."""
        size = (theta.shape[0], channels, self.patch_size, self.patch_size)
        return F.affine_grid(theta, size, align_corners=ALIGN_CORNERS)  # eq. 1

    def forward(self, images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        grid = self.grid(theta, images.shape[1])
        return F.grid_sample(images, grid.to(images.dtype), mode="bilinear", padding_mode="zeros",
                             align_corners=ALIGN_CORNERS)  # eqs. 5-7


def outline(theta: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """The sampled region's corners in input pixels: theta [B, 2, 3] -> [B, 4, 2] (x, y), in the
    order top-left, top-right, bottom-right, bottom-left of the patch."""
    H, W = image_size
    corners = theta.new_tensor([[-1.0, -1.0, 1.0], [1.0, -1.0, 1.0], [1.0, 1.0, 1.0], [-1.0, 1.0, 1.0]])
    source = corners @ theta.transpose(1, 2)  # [B, 4, 2] normalised (eq. 1 at the patch's edges)
    return (source + 1) / 2 * source.new_tensor([W, H])  # align_corners=False: -1 and 1 are the outer edges


def bounding_box(corners: torch.Tensor) -> torch.Tensor:
    """[..., 4, 2] corners -> [..., 4] (x0, y0, x1, y1), the box around them."""
    return torch.cat([corners.amin(-2), corners.amax(-2)], -1)


def footprint(theta: torch.Tensor, image_size: tuple[int, int], chunk: int = 16) -> torch.Tensor:
    """theta [B, 2, 3] -> [B, H, W]: the area of each input pixel inside the sampled region (1 for a
    pixel wholly inside, 0 outside the region or the canvas), exact up to float64 rounding.

    The area left of x and above y, A(x, y) = |region  [-inf, x] x [-inf, y]|, at the pixel
    corners, and each pixel's area by inclusion-exclusion of its four corners' A. The region is
    clipped to each half-plane by projecting what lies beyond onto its edge (`_clip`); the
    shoelace formula gives the area. `chunk`: images at a time (a 100 x 100 canvas takes 3 MB each)."""
    H, W = image_size
    xs = torch.arange(W + 1, device=theta.device, dtype=torch.float64)
    ys = torch.arange(H + 1, device=theta.device, dtype=torch.float64)
    parts = []
    for part in theta.detach().double().split(chunk):
        left = _clip(outline(part, image_size)[:, None], xs[None, :], 0)  # [b, W + 1, 8, 2]
        region = _clip(left[:, None], ys[None, :, None], 1)  # [b, H + 1, W + 1, 16, 2]
        x, y = region.unbind(-1)
        area = 0.5 * (x * y.roll(-1, -1) - x.roll(-1, -1) * y).sum(-1).abs()  # shoelace
        parts.append(area[:, 1:, 1:] - area[:, :-1, 1:] - area[:, 1:, :-1] + area[:, :-1, :-1])
    return torch.cat(parts).clamp_min(0).to(theta.dtype)


def _clip(polygon: torch.Tensor, bound: torch.Tensor, axis: int) -> torch.Tensor:
    """polygon [..., n, 2] -> [..., 2n, 2] of the same area as its part with coordinate `axis` <= `bound`
    [...]: each vertex beyond the bound is projected onto it, and where an edge crosses it the crossing
    is inserted. The projected vertices and crossings lie on the line coordinate = bound, where a path
    adds to the shoelace sum what the straight chord between its ends does: the area is the clipped one."""
    a, b = polygon, polygon.roll(-1, -2)
    bound = bound[..., None]
    ca, cb = a[..., axis], b[..., axis]
    crosses = (ca - bound) * (cb - bound) < 0
    t = (bound - ca) / torch.where(crosses, cb - ca, torch.ones_like(cb - ca))
    crossing = a + t[..., None] * (b - a)
    clamped, other = torch.broadcast_tensors(torch.minimum(ca, bound), a[..., 1 - axis])
    kept = torch.stack([clamped, other] if axis == 0 else [other, clamped], -1)
    return torch.stack([kept, torch.where(crosses[..., None], crossing, kept)], -2).flatten(-3, -2)
