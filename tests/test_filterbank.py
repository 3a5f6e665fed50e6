"""DRAW Gaussian filterbank (eqs. 19-29): against a slow per-sample reference written from the
paper, plus the properties the public ports get wrong (grid symmetry, normalisation off-image)."""
import math

import pytest
import torch

from zoo.attention import filterbank as fb


# ----------------------------------------------------------------------------- slow reference
def ref_params(raw, height, width, n):
    """One example: raw = 5 floats -> (gx, gy, sigma2, delta, gamma), straight from eqs. 21-24."""
    gx_t, gy_t, log_s2, log_d, log_g = [float(v) for v in raw]
    gx = (width + 1) / 2 * (gx_t + 1)
    gy = (height + 1) / 2 * (gy_t + 1)
    delta = (max(width, height) - 1) / (n - 1) * math.exp(log_d) if n > 1 else 0.0
    return gx, gy, math.exp(log_s2), delta, math.exp(log_g)


def ref_filters(g, sigma2, delta, n, size):
    """F [n, size] for one axis, pixel coordinates a = 1..size, each row divided by its sum."""
    F = torch.zeros(n, size, dtype=torch.float64)
    for i in range(1, n + 1):
        mu = g + (i - n / 2 - 0.5) * delta
        # shift by the row's largest exponent before exp, only to keep the reference finite
        exps = [-((a - mu) ** 2) / (2 * sigma2) for a in range(1, size + 1)]
        top = max(exps)
        row = [math.exp(e - top) for e in exps]
        z = sum(row)
        for a in range(size):
            F[i - 1, a] = row[a] / z
    return F


def ref_read_write(raw, x, w, n):
    """Loop over the batch: (read [B, C, N, N] of x only, write [B, C, H, W] of w, Fx, Fy)."""
    B, C, H, W = x.shape
    reads, writes, fxs, fys = [], [], [], []
    for b in range(B):
        gx, gy, s2, d, gamma = ref_params(raw[b], H, W, n)
        Fx, Fy = ref_filters(gx, s2, d, n, W), ref_filters(gy, s2, d, n, H)
        reads.append(torch.stack([gamma * Fy @ x[b, c].double() @ Fx.T for c in range(C)]))
        writes.append(torch.stack([Fy.T @ w[b, c].double() @ Fx / gamma for c in range(C)]))
        fxs.append(Fx)
        fys.append(Fy)
    return torch.stack(reads), torch.stack(writes), torch.stack(fxs), torch.stack(fys)


def raw_params(B, spread=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, 5, generator=g) * spread
    raw[:, 2] = raw[:, 2].clamp(-3, 3)  # log sigma^2
    raw[:, 3] = raw[:, 3].clamp(-2, 1)  # log delta~
    raw[:, 4] = raw[:, 4].clamp(-1, 1)  # log gamma
    return raw


def build(raw, n, H, W):
    p = fb.params_from_raw(raw, H, W, n)
    fx, fy = fb.filterbank(p, n, H, W)
    return p, fx, fy


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("n,H,W,C", [(3, 9, 11, 1), (4, 12, 7, 3), (1, 5, 5, 2), (5, 28, 28, 1)])
def test_batched_equals_per_sample_reference(n, H, W, C):
    B = 6
    raw = raw_params(B, seed=n)
    x = torch.rand(B, C, H, W)
    w = torch.randn(B, C, n, n)
    p, fx, fy = build(raw, n, H, W)
    r_read, r_write, r_fx, r_fy = ref_read_write(raw, x, w, n)
    assert fx.shape == (B, n, W) and fy.shape == (B, n, H)
    torch.testing.assert_close(fx.double(), r_fx, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fy.double(), r_fy, atol=1e-5, rtol=1e-4)
    got = fb.read(x, x - 0.5, fx, fy, p.gamma)
    assert got.shape == (B, 2 * C, n, n)
    torch.testing.assert_close(got[:, :C].double(), r_read, atol=1e-4, rtol=1e-4)
    # second half of eq. 27 is the same read of the error image
    r_read_hat, _, _, _ = ref_read_write(raw, x - 0.5, w, n)
    torch.testing.assert_close(got[:, C:].double(), r_read_hat, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fb.write(w, fx, fy, p.gamma).double(), r_write, atol=1e-4, rtol=1e-4)


def test_rows_sum_to_one_everywhere():
    raw = raw_params(64, spread=3.0)
    _, fx, fy = build(raw, 5, 20, 30)
    torch.testing.assert_close(fx.sum(-1), torch.ones(64, 5))
    torch.testing.assert_close(fy.sum(-1), torch.ones(64, 5))
    assert (fx >= 0).all() and (fy >= 0).all()


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_grid_is_symmetric_about_g(n):
    g = torch.tensor([3.0, 10.5, -4.0])
    delta = torch.tensor([1.0, 2.5, 0.3])
    mu = fb.filter_centres(g, delta, n)
    # mirror pairs average to g, and consecutive centres are delta apart
    torch.testing.assert_close((mu + mu.flip(-1)) / 2, g[:, None].expand(-1, n))
    torch.testing.assert_close(mu.diff(dim=-1), delta[:, None].expand(-1, n - 1))
    # and therefore the filters themselves are mirror images about the centre of a symmetric image
    raw = torch.tensor([[0.0, 0.0, 0.0, -0.3, 0.0]])
    _, fx, fy = build(raw, n, 15, 15)
    torch.testing.assert_close(fx, fx.flip(1).flip(2))


def test_identity_read_at_full_image_settings():
    # g~ = 0 (centre), delta~ = 1 (delta = 1 pixel), N = A = B, tiny sigma: every filter is one pixel
    H = W = N = 9
    raw = torch.tensor([[0.0, 0.0, math.log(0.01), 0.0, 0.0]])
    p, fx, fy = build(raw, N, H, W)
    torch.testing.assert_close(fb.filter_centres(p.gx, p.delta, N)[0], torch.arange(1.0, N + 1))
    torch.testing.assert_close(fx[0], torch.eye(N), atol=1e-6, rtol=0)
    x = torch.rand(2, 3, H, W)
    got = fb.filter_read(x, fx.expand(2, -1, -1), fy.expand(2, -1, -1), p.gamma.expand(2))
    torch.testing.assert_close(got, x, atol=1e-5, rtol=0)
    # and the write of the same glimpse puts it back
    torch.testing.assert_close(fb.write(got, fx.expand(2, -1, -1), fy.expand(2, -1, -1), p.gamma.expand(2)),
                               x, atol=1e-5, rtol=0)


def test_read_write_adjoint_with_gamma():
    B, C, H, W, n = 5, 2, 13, 10, 4
    raw = raw_params(B, seed=3)
    p, fx, fy = build(raw, n, H, W)
    x = torch.randn(B, C, H, W, dtype=torch.float64)
    w = torch.randn(B, C, n, n, dtype=torch.float64)
    fx, fy, gamma = fx.double(), fy.double(), p.gamma.double()
    lhs = (fb.filter_read(x, fx, fy, gamma).double() * w).sum((1, 2, 3))  # <gamma Fy x Fx^T, w>
    rhs = (x * fb.write(w, fx, fy, gamma).double()).sum((1, 2, 3))  # <x, 1/gamma Fy^T w Fx>
    # read scales by gamma and write by 1/gamma, so the two differ by exactly gamma^2
    torch.testing.assert_close(lhs, gamma ** 2 * rhs, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(gamma, torch.ones_like(gamma))  # the test would not see a missing gamma


def test_no_nan_far_outside_the_image():
    raw = torch.tensor([[60.0, -80.0, math.log(0.05), 0.5, 0.0],
                        [-1e3, 1e3, math.log(1e-4), -3.0, 2.0],
                        [0.0, 0.0, 8.0, 3.0, -2.0]], requires_grad=True)
    p, fx, fy = build(raw, 5, 28, 28)
    x = torch.rand(3, 1, 28, 28)
    out = fb.read(x, x - 0.5, fx, fy, p.gamma).sum() + fb.write(torch.rand(3, 1, 5, 5), fx, fy, p.gamma).sum()
    out.backward()
    assert torch.isfinite(fx).all() and torch.isfinite(fy).all() and torch.isfinite(out)
    assert torch.isfinite(raw.grad).all()
    torch.testing.assert_close(fx.sum(-1), torch.ones(3, 5))
    # window to the right of the image: all its mass ends on the last column
    torch.testing.assert_close(fx[0, :, -1], torch.ones(5))


def test_gradients_reach_all_five_parameters():
    raw = raw_params(4, seed=1).requires_grad_(True)
    p, fx, fy = build(raw, 3, 10, 12)
    x = torch.rand(4, 1, 10, 12)
    (fb.read(x, x, fx, fy, p.gamma).pow(2).sum() + fb.write(torch.rand(4, 1, 3, 3), fx, fy, p.gamma).pow(2).sum()).backward()
    assert (raw.grad.abs().sum(0) > 0).all()


def test_fp32_under_autocast():
    raw = raw_params(3, seed=2)
    x = torch.rand(3, 2, 16, 16)
    p, fx, fy = build(raw, 4, 16, 16)
    expected = fb.read(x, x - 0.5, fx, fy, p.gamma)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p2, fx2, fy2 = build(raw.bfloat16(), 4, 16, 16)
        got = fb.read(x.bfloat16(), (x - 0.5).bfloat16(), fx2, fy2, p2.gamma)
        wrote = fb.write(got, fx2, fy2, p2.gamma)
    assert fx2.dtype == torch.float32 and got.dtype == torch.float32 and wrote.dtype == torch.float32
    # only the inputs' bf16 rounding differs, not the filterbank maths
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)


def test_module_and_invalid_n():
    attn = fb.FilterbankAttention(state_size=8, height=10, width=14, n=3)
    p, fx, fy = attn(torch.randn(5, 8))
    assert fx.shape == (5, 3, 14) and fy.shape == (5, 3, 10) and p.gamma.shape == (5,)
    with pytest.raises(ValueError):
        fb.FilterbankAttention(state_size=8, height=10, width=14, n=0)


def test_whole_image_init_tiles_the_image_instead_of_aliasing():
    attn = fb.FilterbankAttention(state_size=16, height=100, width=100, n=12)
    with torch.no_grad():
        attn.linear.bias.zero_()  # what nn.Linear's default bias is near: sigma = 1 px
    _, fx_default, _ = attn(torch.zeros(1, 16))
    attn.init_whole_image()
    p, fx, fy = attn(torch.zeros(2, 16))
    mu = fb.filter_centres(p.gx, p.delta, 12)
    torch.testing.assert_close(mu[:, [0, -1]], torch.tensor([[1.0, 100.0]] * 2))  # spans the image
    torch.testing.assert_close(p.sigma2.sqrt(), p.delta / 2)
    torch.testing.assert_close(p.gamma, torch.ones(2))
    # every pixel column feeds some filter: the filters tile the image ...
    coverage = fx[0].sum(0)  # [W]
    assert coverage.min() > 0.3 * coverage.mean()
    # ... where sigma = 1 px at a 9-px stride leaves columns between the centres all but unread
    default_coverage = fx_default[0].sum(0)
    assert default_coverage.min() < 0.01 * default_coverage.mean()
