"""Attention sampling (Katharopoulos & Fleuret, "Processing Megapixel Images with Deep
Attention-Sampling Models", ICML 2019, sec. 3): an attention distribution over the cells of a
low-resolution view, K full-resolution patches drawn from it without replacement, and an unbiased
estimate of the attention-weighted mean of the patches' features, with a gradient that reaches the
attention through the estimator itself (no REINFORCE, no baseline).

Notation: N positions (the view's cells), a = a(x) in the simplex over them, f_i = f(x, i) the
feature of the full-resolution patch at position i, K samples q_1..q_K in draw order. The paper's
equations could not be read where this was written (only its abstract and introduction; the
estimators follow the paper's sec. 3 as the authors' code, idiap/attention-sampling,
`ats/core/expectation.py` and `ats/core/sampling.py`, implements them), so the equations carry
labels of this file, (S1)-(S6), not the paper's numbers:

    (S1)  Phi(x) = sum_i a_i f_i = E_{I ~ a}[f_I]                   attention as an expectation
    (S2)  a = (1 - eps) softmax(logits) + eps / N                   the code's `SampleSoftmax(smooth=eps)`:
                                                                    a_i >= eps/N, so the 1/a_i below stay bounded
    (S3)  q = top-K(log a + G), G_i ~ Gumbel(0, 1) i.i.d.           Gumbel-top-k: K draws without replacement,
                                                                    in draw order (the order top-k returns)
    (S4)  Phi_hat = 1/K sum_k [ sum_{j<k} a_{q_j} f_{q_j} + (1 - s_k) f_{q_k} ],   s_k = sum_{j<k} a_{q_j}
          Given q_1..q_{k-1}, q_k ~ a / (1 - s_k) over the positions not drawn yet, so each bracket is
          unbiased: the mass already drawn is counted exactly, the rest estimated by one draw.
          Collecting terms: Phi_hat = sum_k w_k f_{q_k} with w_k = [(1 - s_k) + (K - k) a_{q_k}] / K.
    (S5)  gradient with respect to the features: w_k (Phi_hat is linear in f: unbiased as (S4)).
    (S6)  gradient with respect to the attention: dPhi/da_i = f_i, estimated without bias by
          G_hat[q_k] = (w_k / a_{q_k}) f_{q_k} (zero at positions not drawn).
          Proof: average over k of G_k, where G_k[q_j] = f_{q_j} for j < k (known exactly) and
          G_k[q_k] = f_{q_k} (1 - s_k) / a_{q_k} (one importance-weighted draw from a / (1 - s_k)); given
          the first k - 1 draws, E[G_k] = f at every position. Summing G_k over k puts
          [(1 - s_m)/a_{q_m} + (K - m)] / K = w_m / a_{q_m} on f_{q_m}. With replacement (or K = 1) this
          is the paper's 1/(K a_q) scaling (the code's `_expected_with_replacement`).

`expected_features` is a surrogate whose value is (S4) and whose autograd gradients are (S5) and
(S6): w_k (a_{q_k} / stop_grad(a_{q_k})) f_{q_k}. Through the softmax the logits get J^T G_hat, an
unbiased estimate of the exact gradient of (S1) (tests/test_ats.py checks both by enumerating
every ordered draw of a small problem, and by Monte Carlo). The authors' custom backward pass
weighs the attention gradient differently (a score-function term F_k (1 - s_k)/a_{q_k} plus
pathwise corrections); (S6) is the plain importance-weighted estimate of the same gradient.

Entropy regulariser (the code's `ats/utils/regularizers.py`): lambda * sum_i a_i log a_i is added
to the loss, which with lambda > 0 keeps the distribution from collapsing onto a few cells early.

Patches: position (r, c) of an h x w view of an H x W image is the full-resolution patch of side P
centred on the cell's centre ((c + 1/2) W / w, (r + 1/2) H / h), its top-left corner rounded to the
nearest pixel; pixels outside the image read as zeros (zero padding). `extract_patches` reads all
B x K patches at once (integer index arithmetic on the device, each patch row one contiguous strip
copied by one `index_select`; no padded copy, no Python loop over images or patches, no host sync).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------- the distribution
def attention_distribution(logits: torch.Tensor, smooth: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, N] -> (a [B, N], log a [B, N]): the softmax over all N positions, mixed with the
    uniform distribution by `smooth` (S2). log a is computed in log space (exact for tiny a)."""
    log_a = logits.log_softmax(-1)
    if smooth > 0:
        n = logits.shape[-1]
        log_a = torch.logaddexp(log_a + math.log1p(-smooth), torch.full_like(log_a, math.log(smooth / n)))
    return log_a.exp(), log_a


def negative_entropy(a: torch.Tensor, log_a: torch.Tensor) -> torch.Tensor:
    """[B, N] -> [B]: sum_i a_i log a_i (the entropy regulariser's term; minimising it raises the
    entropy)."""
    return (a * log_a).sum(-1)


# ----------------------------------------------------------------------------- sampling
def gumbel_noise(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """G ~ Gumbel(0, 1) of `shape` on `like`'s device and dtype: -log E with E ~ Exp(1) (never log 0)."""
    return -torch.empty(shape, device=like.device, dtype=like.dtype).exponential_(generator=generator).log()


def sample_without_replacement(log_a: torch.Tensor, k: int, gumbel: torch.Tensor | None = None) -> torch.Tensor:
    """log a [B, N], gumbel [B, N] -> indices [B, k] of k distinct positions in draw order (S3).
    Without noise (None), the k most attended positions in decreasing order: the deterministic
    read, Gumbel-top-k at zero temperature of the noise."""
    scores = log_a if gumbel is None else log_a + gumbel
    return scores.topk(k, dim=-1, sorted=True).indices


# ----------------------------------------------------------------------------- the estimator
def without_replacement_weights(a_drawn: torch.Tensor) -> torch.Tensor:
    """a_q [B, K] (the drawn positions' attention, in draw order) -> w [B, K] of (S4):
    w_k = [(1 - s_k) + (K - k) a_{q_k}] / K, k = 1..K, s_k the mass drawn before k."""
    K = a_drawn.shape[-1]
    drawn_before = a_drawn.cumsum(-1) - a_drawn  # s_k, exclusive
    remaining = (1 - drawn_before).clamp_min(0)  # rounding must not make the rest negative
    later = torch.arange(K - 1, -1, -1, device=a_drawn.device, dtype=a_drawn.dtype)  # K - k
    return (remaining + later * a_drawn) / K


def expected_features(a: torch.Tensor, index: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The unbiased estimate (S4) of E_{I ~ a}[f_I] from draws without replacement, with the
    gradients (S5) to the features and (S6) to the attention.

    a [B, N] (differentiable), index [B, K] (draw order), features [B, K, D] -> [B, D]."""
    a_drawn = a.gather(-1, index)  # [B, K], differentiable
    fixed = a_drawn.detach()
    weights = without_replacement_weights(fixed)
    # a_q / stop_grad(a_q), written so that its value is exactly 1 (the forward is (S4) to the bit)
    # and its gradient 1 / a_q; a_q is >= eps / N under smoothing, the clamp only guards eps = 0
    ratio = 1 + (a_drawn - fixed) / fixed.clamp_min(torch.finfo(fixed.dtype).tiny)
    return ((weights * ratio).unsqueeze(-1) * features).sum(-2)


# ----------------------------------------------------------------------------- patches
def patch_corners(index: torch.Tensor, grid: tuple[int, int], image_size: tuple[int, int],
                  patch_size: int) -> torch.Tensor:
    """index [B, K] of cells of an h x w grid -> [B, K, 2] (x0, y0) int64: the top-left pixel of the
    patch of side P centred on each cell's centre in an H x W image, rounded to the nearest pixel
    (halves up): x0 = floor((c + 1/2) W / w - P / 2 + 1/2), in integer arithmetic (exact)."""
    h, w = grid
    H, W = image_size
    rows, cols = torch.div(index, w, rounding_mode="floor"), index % w
    y0 = torch.div((2 * rows + 1) * H + h - patch_size * h, 2 * h, rounding_mode="floor")
    x0 = torch.div((2 * cols + 1) * W + w - patch_size * w, 2 * w, rounding_mode="floor")
    return torch.stack([x0, y0], -1)


def patch_boxes(corners: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[..., 2] (x0, y0) -> [..., 4] (x0, y0, x1, y1) in pixel edges (x1, y1 exclusive)."""
    corners = corners.float()
    return torch.cat([corners, corners + patch_size], -1)


def extract_patches(images: torch.Tensor, corners: torch.Tensor, patch_size: int) -> torch.Tensor:
    """images [B, C, H, W], corners [B, K, 2] (x0, y0) integers -> patches [B, K, C, P, P]:
    patch k of image b is images[b, :, y0:y0 + P, x0:x0 + P], zero where it leaves the image
    (`read_windows`, then a 0/1 mask of the pixels inside, built from its row and column factors:
    bool ops over B K P^2 elements cost more)."""
    B, C, H, W = images.shape
    P = patch_size
    offsets = torch.arange(P, device=images.device)
    rows, cols = corners[..., 1:] + offsets, corners[..., :1] + offsets  # [B, K, P]
    row_in = (rows == rows.clamp(0, H - 1)).to(images.dtype)
    col_in = (cols == cols.clamp(0, W - 1)).to(images.dtype)
    return read_windows(images, corners, P).mul_((row_in.unsqueeze(-1) * col_in.unsqueeze(-2)).unsqueeze(2))


def read_windows(images: torch.Tensor, corners: torch.Tensor, size: int) -> torch.Tensor:
    """images [B, C, H, W], corners [B, M, 2] (x0, y0) integers -> windows [B, M, C, S, S] (S = size):
    window m of image b is images[b, :, y0:y0 + S, x0:x0 + S] where that lies inside the image;
    its pixels outside the image hold other (finite) pixels of the batch, for the caller to mask.

    Each window row is S pixels next to each other in memory: the batch, flattened, is viewed as
    overlapping strips (strip s = pixels s .. s + S - 1, `as_strided`, no copy) and one
    `index_select` copies the B M C S strips. That moves rows instead of single pixels (a gather
    pixel by pixel costs several times more on CPU), no padded copy is made, and the work is
    B M C S^2 whatever the image's size. A row above or below the image reads a clamped row, and a
    row reaching past the left or right edge reads on into the neighbouring row. Only the first and
    last image's strips can reach past the ends of the batch's memory: those two images are read
    pixel by pixel (`_gather_windows`), and so is a batch of at most 2 images. The strips are an
    eager-mode optimisation: a traced program (torch.compile, torch.export) reads pixel by pixel,
    which the compiler fuses, whose shapes stay symbolic in the batch, and which ONNX exports."""
    B, C, H, W = images.shape
    M, S = corners.shape[1], size
    # (W < S: a clamped row's strip could leave the batch anywhere)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or B <= 2 or W < S:
        return _gather_windows(images, corners, S)
    rows = (corners[..., 1:] + torch.arange(S, device=images.device)).clamp(0, H - 1)  # [B, M, S]
    x0 = corners[..., :1].clamp(-S, W)  # a window wholly left or right of the image stays so
    plane = H * W
    start = rows * W + (x0 + torch.arange(0, B * C * plane, C * plane, device=images.device).view(B, 1, 1))
    if C > 1:
        start = start.unsqueeze(2) + torch.arange(0, C * plane, plane, device=images.device).view(C, 1)
    flat = images.contiguous().view(-1)
    strips = flat.as_strided((flat.numel() - S + 1, S), (1, 1))  # strips[s] = flat[s:s + S]
    # the clamp changes only rows of the first and last image, which are replaced below
    windows = strips.index_select(0, start.clamp(0, flat.numel() - S).view(-1)).view(B, M, C, S, S)
    windows[::B - 1] = _gather_windows(images[::B - 1], corners[::B - 1], S)  # images 0 and B - 1
    return windows


def _gather_windows(images: torch.Tensor, corners: torch.Tensor, S: int) -> torch.Tensor:
    """`read_windows` pixel by pixel: one gather over the flattened images with indices y W + x,
    rows and columns clamped into the image. [B, M, C, S, S]."""
    B, C, H, W = images.shape
    M = corners.shape[1]
    offsets = torch.arange(S, device=images.device)
    rows = (corners[..., 1:] + offsets).clamp(0, H - 1)  # [B, M, S]
    cols = (corners[..., :1] + offsets).clamp(0, W - 1)
    flat = (rows * W).unsqueeze(-1) + cols.unsqueeze(-2)  # [B, M, S, S]
    windows = images.reshape(B, C, H * W).gather(2, flat.view(B, 1, M * S * S).expand(B, C, M * S * S))
    return windows.view(B, C, M, S, S).transpose(1, 2)


def downsample(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """images [B, C, H, W] -> the low-resolution view [B, C, h, w], each view pixel the mean of the
    image pixels its cell covers (area averaging: antialiased, exact for integer factors)."""
    return F.adaptive_avg_pool2d(images, size)


__all__ = ["attention_distribution", "negative_entropy", "gumbel_noise", "sample_without_replacement",
           "without_replacement_weights", "expected_features", "patch_corners", "patch_boxes", "extract_patches",
           "read_windows", "downsample"]
