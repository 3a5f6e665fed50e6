"""DRAW's Gaussian filterbank attention (Gregor et al. 2015, sec. 3.2, eqs. 19-29), batched.

An N x N grid of 2-D Gaussian filters is placed on an A x B image (A = width, B = height) by five
numbers per example, emitted by a linear map of the decoder state (eq. 21):

    (g~X, g~Y, log sigma^2, log delta~, log gamma) = W(h_dec)

    gX = (A + 1)/2 (g~X + 1),   gY = (B + 1)/2 (g~Y + 1)                       eqs. 22-23
    delta = (max(A, B) - 1)/(N - 1) delta~                                    eq. 24
    mu_X^i = gX + (i - N/2 - 0.5) delta,  mu_Y^j = gY + (j - N/2 - 0.5) delta  eqs. 19-20
    F_X[i, a] = exp(-(a - mu_X^i)^2 / (2 sigma^2)) / Z_X                      eq. 25
    F_Y[j, b] = exp(-(b - mu_Y^j)^2 / (2 sigma^2)) / Z_Y                      eq. 26
    read(x, x^) = gamma [F_Y x F_X^T, F_Y x^ F_X^T]                           eq. 27
    write(w)    = 1/gamma^ F^_Y^T w F^_X                                       eq. 29

Coordinates are the paper's 1-based pixel indices a = 1..A, b = 1..B: then g~ = 0 is the image
centre and the grid with N = A, delta~ = 1 lands exactly on the pixels (0-based pixels shift every
filter by half a pixel, a common port defect; `i - N/2` alone breaks the symmetry about g). Each
filter row is normalised exactly (a softmax, not exp(.)/(sum + eps)): a window far outside the
image keeps rows summing to 1, with no NaN or Inf. All of it runs in fp32, also under autocast
(half-precision squared distances over 100 pixels lose the filters).

Shapes: images [B, C, H, W] (all channels read with the same filters); Fx [B, N, W], Fy [B, N, H];
glimpses [B, C, N, N].
"""
from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
from torch import nn


class FilterParams(NamedTuple):
    """Per-example attention parameters in image coordinates, each [B] (fp32)."""

    gx: torch.Tensor  # grid centre, 1-based pixel units along the width
    gy: torch.Tensor  # grid centre along the height
    sigma2: torch.Tensor  # isotropic filter variance (pixels^2)
    delta: torch.Tensor  # stride between filter centres (pixels)
    gamma: torch.Tensor  # intensity: read multiplies by it, write divides by it


def _autocast_off(device_type: str):
    # a device without autocast (`meta`, where zoo.guards.budget measures a model) has nothing to switch off
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def _f32(t: torch.Tensor) -> torch.Tensor:
    """At least fp32: half types go up, fp64 (used by the tests' references) stays."""
    return t if t.dtype == torch.float64 else t.float()


def params_from_raw(raw: torch.Tensor, height: int, width: int, n: int) -> FilterParams:
    """raw [B, 5] = (g~X, g~Y, log sigma^2, log delta~, log gamma)  ->  FilterParams in pixels."""
    with _autocast_off(raw.device.type):
        raw = raw.float()
        gx_t, gy_t, log_sigma2, log_delta_t, log_gamma = raw.unbind(-1)
        gx = (width + 1) / 2 * (gx_t + 1)  # eq. 22
        gy = (height + 1) / 2 * (gy_t + 1)  # eq. 23
        # eq. 24; with N = 1 the single centre is g and delta does not matter.
        delta = (max(width, height) - 1) / max(n - 1, 1) * torch.exp(log_delta_t)
        return FilterParams(gx, gy, torch.exp(log_sigma2), delta, torch.exp(log_gamma))


def filter_centres(g: torch.Tensor, delta: torch.Tensor, n: int) -> torch.Tensor:
    """g, delta [B] -> mu [B, N]: centres symmetric about g (eqs. 19-20)."""
    i = torch.arange(1, n + 1, device=g.device, dtype=torch.float32)
    offsets = i - n / 2 - 0.5  # -(N-1)/2 .. (N-1)/2
    return g.float()[:, None] + offsets[None, :] * delta.float()[:, None]


def _axis_filters(mu: torch.Tensor, sigma2: torch.Tensor, size: int) -> torch.Tensor:
    """mu [B, N], sigma2 [B] -> F [B, N, size], rows summing to 1 (eqs. 25-26)."""
    a = torch.arange(1, size + 1, device=mu.device, dtype=torch.float32)
    logits = -(a[None, None, :] - mu[:, :, None]) ** 2 / (2 * sigma2[:, None, None])
    # Exact normalisation by Z: softmax subtracts the row maximum, so it cannot underflow to 0/0.
    return torch.softmax(logits, dim=-1)


def filterbank(params: FilterParams, n: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FilterParams (each [B]) -> (Fx [B, N, W], Fy [B, N, H]) in fp32."""
    with _autocast_off(params.gx.device.type):
        sigma2 = params.sigma2.float()
        return (_axis_filters(filter_centres(params.gx, params.delta, n), sigma2, width),
                _axis_filters(filter_centres(params.gy, params.delta, n), sigma2, height))


def filter_read(x: torch.Tensor, fx: torch.Tensor, fy: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """gamma F_Y x F_X^T for every channel: x [B, C, H, W] -> [B, C, N, N] (one half of eq. 27)."""
    with _autocast_off(x.device.type):
        glimpse = _f32(fy)[:, None] @ _f32(x) @ _f32(fx).transpose(1, 2)[:, None]
        return _f32(gamma)[:, None, None, None] * glimpse


def read(x: torch.Tensor, x_hat: torch.Tensor, fx: torch.Tensor, fy: torch.Tensor,
         gamma: torch.Tensor) -> torch.Tensor:
    """eq. 27: x, x_hat [B, C, H, W] -> gamma [F_Y x F_X^T, F_Y x^ F_X^T] as [B, 2C, N, N]
    (the image's C glimpses first, then the error image's)."""
    return filter_read(torch.cat([x, x_hat], dim=1), fx, fy, gamma)


def write(w: torch.Tensor, fx: torch.Tensor, fy: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """eq. 29: w [B, C, N, N] -> 1/gamma F_Y^T w F_X as [B, C, H, W]."""
    with _autocast_off(w.device.type):
        canvas = _f32(fy).transpose(1, 2)[:, None] @ _f32(w) @ _f32(fx)[:, None]
        return canvas / _f32(gamma)[:, None, None, None]


class FilterbankAttention(nn.Module):
    """The five attention parameters from a state vector (eq. 21), and the filterbank they define;
    one instance per use (DRAW's read and write have their own)."""

    def __init__(self, state_size: int, height: int, width: int, n: int):
        super().__init__()
        if int(n) < 1:
            raise ValueError(f"filterbank size N must be >= 1, got {n}")
        self.height, self.width, self.n = int(height), int(width), int(n)
        self.linear = nn.Linear(state_size, 5)  # eq. 21

    @torch.no_grad()
    def init_whole_image(self) -> None:
        """Start (at h = 0) from the whole image with anti-aliased filters: g at the centre, delta~ = 1
        (eq. 24), sigma = delta / 2 so the filters tile it, gamma = 1 (nn.Linear's default bias gives
        sigma ~ 1 px: at N << image size a sparse, aliased sample)."""
        delta = (max(self.height, self.width) - 1) / max(self.n - 1, 1)
        self.linear.bias.copy_(torch.tensor([0.0, 0.0, math.log((delta / 2) ** 2), 0.0, 0.0]))

    def forward(self, h: torch.Tensor) -> tuple[FilterParams, torch.Tensor, torch.Tensor]:
        """h [B, state_size] -> (FilterParams, Fx [B, N, W], Fy [B, N, H])."""
        params = params_from_raw(self.linear(h), self.height, self.width, self.n)
        fx, fy = filterbank(params, self.n, self.height, self.width)
        return params, fx, fy
