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
  quadrilateral for a general affine transform, and `bounding_box` around it;
- `sampling_weights`: how much each input pixel contributes to the patch, the exact bilinear
  weights summed over the patch (the sampler's adjoint applied to a patch of ones); zero where the
  grid lies outside the image, all zero when it lies wholly outside.
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


def sampling_weights(sampler: AffineSampler, theta: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """[B, H, W]: each input pixel's total bilinear weight in the patch theta [B, 2, 3] samples,
    exactly as grid_sample weighs it (the gradient of the patch's sum with respect to the input:
    the sampler is linear in the image). Pixels no sample reaches weigh 0."""
    image = theta.new_zeros(theta.shape[0], 1, *image_size, requires_grad=True)
    with torch.enable_grad():
        (weights,) = torch.autograd.grad(sampler(image, theta.detach()).sum(), image)
    return weights[:, 0]
