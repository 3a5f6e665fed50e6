"""The spatial transformer's sampler (Jaderberg et al. 2015, sec. 3.2-3.3) and where it looks.

A transform theta [B, 2, 3] maps the output patch's normalised coordinates (x_t, y_t) in [-1, 1]
to the input's (eq. 1, the backward warp, target to source):

    (x_s, y_s) = theta (x_t, y_t, 1)

and the patch is the input bilinearly sampled there (eqs. 5-7), zero outside. `F.affine_grid` and
`F.grid_sample` both get `align_corners=False`: -1 and 1 are the outer edges of the first and last
pixel, so the identity reads the whole image (at half the resolution, exactly a 2 x 2 average pool).

Where it looks, in input pixels: `outline` (the sampled region's corners, a parallelogram), its
`bounding_box`, and `footprint`, the exact share of each pixel inside the region. An affine map
sends the patch's equal cells to equal parallelograms, so what the classifier sees is uniform over
the region; the bilinear weights instead form a lattice of dots (when the grid's spacing is over a
pixel) whose peak jumps with the sub-pixel phase, while the footprint peaks at the region's centre.
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
    """theta [B, 2, 3] -> [B, H, W]: the area of each input pixel inside the sampled region, exact up
    to float64 rounding: A(x, y) = |region  [-inf, x] x [-inf, y]| at the pixel corners (the region
    clipped by `_clip`, its area by the shoelace formula), each pixel's area by inclusion-exclusion
    of its corners' A. `chunk`: images at a time (a 100 x 100 canvas takes 3 MB each)."""
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
