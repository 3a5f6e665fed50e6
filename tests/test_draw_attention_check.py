"""Does DRAW's filterbank attention do its job? Checks whose answer is known without any data set:
a trained write window lands on the one thing there is to draw, and on sparse canvases attention
beats a no-attention DRAW of the same size. Each trains tiny models for a few hundred steps on
one CPU thread.

A defect that training can work around (the filter grid shifted by one stride, x and y swapped)
leaves the likelihood as good as ever; only where the window claims to be gives it away, and that
is what the figures draw."""
import math

import pytest
import torch

from zoo.models.draw import DRAW

S = 16  # canvas side


def blob_on_noise(n: int, rows: slice, cols: slice, generator: torch.Generator) -> torch.Tensor:
    """[n, 1, S, S]: a solid block of ones at (rows, cols), every other pixel a fair coin.
    The empty canvas (logit 0) already predicts the coins perfectly, so the block is the only
    thing a write can improve: the best single write covers the block and nothing else."""
    x = torch.bernoulli(torch.full((n, 1, S, S), 0.5), generator=generator)
    x[:, :, rows, cols] = 1
    return x


def test_trained_write_window_lands_on_the_blob():
    # rows 3..8, columns 10..15 (1-based), off the centre where the window starts and off the
    # diagonal, so a window that stays put, or swaps x and y, or mirrors one, misses it
    rows, cols = slice(2, 8), slice(9, 15)
    torch.manual_seed(0)
    write_n = 3
    model = DRAW(image_size=S, T=1, enc_size=16, dec_size=16, z_size=2, read_n=2, write_n=write_n)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        optimizer.zero_grad()
        model.negative_elbo(blob_on_noise(32, rows, cols, generator))["nelbo"].mean().backward()
        optimizer.step()
    x = blob_on_noise(256, rows, cols, generator)
    with torch.no_grad():
        out = model(x, record=True)
        nelbo = model.negative_elbo(x)["nelbo"].mean()
    coins = S * S - (rows.stop - rows.start) * (cols.stop - cols.start)
    # it learned the block: the bound is the coins' entropy plus little (the empty canvas pays
    # log 2 on each of the block's 36 pixels too, 25 nats more)
    assert nelbo < coins * math.log(2) + 2.0, nelbo
    write = out["write"][0]
    # the paper's 1-based pixel coordinates: pixel a spans [a - 1/2, a + 1/2] around a
    centre_x = (cols.start + 1 + cols.stop) / 2
    centre_y = (rows.start + 1 + rows.stop) / 2
    torch.testing.assert_close(write.gx, torch.full_like(write.gx, centre_x), atol=1.0, rtol=0)
    torch.testing.assert_close(write.gy, torch.full_like(write.gy, centre_y), atol=1.0, rtol=0)
    extent = write_n * write.delta  # the N x N grid's side, what the figures draw as the box
    side = cols.stop - cols.start
    assert ((extent > side - 2) & (extent < side + 2)).all(), extent


GRID = (2, 6, 10)  # top/left corners of the 4x4 blob: 3 x 3 places on the 16 x 16 canvas
BLOB = 4


def grid_blobs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse set: one 4x4 block of ones at one of 9 places on an empty 16x16 canvas.
    Returns (x [n, 1, S, S], corners [n, 2] as (row, col), 0-based)."""
    corners = torch.tensor(GRID)[torch.randint(0, len(GRID), (n, 2), generator=generator)]
    r = torch.arange(S)
    rows = (r >= corners[:, :1]) & (r < corners[:, :1] + BLOB)  # [n, S]
    cols = (r >= corners[:, 1:]) & (r < corners[:, 1:] + BLOB)
    return (rows[:, :, None] & cols[:, None, :]).float()[:, None], corners


def train(model: DRAW, steps: int = 500) -> DRAW:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)  # both models see the same canvases
    for _ in range(steps):
        optimizer.zero_grad()
        model.negative_elbo(grid_blobs(32, generator)[0])["nelbo"].mean().backward()
        optimizer.step()
    return model


@pytest.mark.slow
def test_attention_beats_no_attention_of_equal_size_on_a_sparse_set():
    """Nine places, one blob: without attention the canvas is a full linear write of a 4-unit
    state (eq. 18), 16 images at most, and cannot draw a sharp blob at each of 9 places; with
    attention two numbers move a 4x4 write window there (eqs. 22-23). Equal parameter counts
    (the no-attention encoder reads 2 x 256 pixels), equal budget: 2 steps, 500 updates."""
    T, z = 2, 4
    torch.manual_seed(0)
    attention = DRAW(image_size=S, T=T, enc_size=24, dec_size=24, z_size=z, read_n=3, write_n=BLOB)
    # The first read then sees the whole canvas, blurred, instead of 9 pixels 7.5 px apart
    # (sigma 1 px at nn.Linear's default bias), so it can tell where the blob is.
    attention.read_attn.init_whole_image()
    attention.write_attn.init_whole_image()
    torch.manual_seed(0)
    plain = DRAW(image_size=S, T=T, enc_size=4, dec_size=4, z_size=z, attention="none")
    sizes = [sum(p.numel() for p in m.parameters()) for m in (attention, plain)]
    assert abs(sizes[0] / sizes[1] - 1) < 0.10, sizes
    x, corners = grid_blobs(256, torch.Generator().manual_seed(2))
    noise = torch.randn(T, 256, z, generator=torch.Generator().manual_seed(3))
    bounds = {}
    for name, model in (("attention", attention), ("none", plain)):
        train(model)
        with torch.no_grad():
            bounds[name] = model.negative_elbo(x, noise)["nelbo"].mean().item()
    assert bounds["attention"] < bounds["none"] - 5.0, bounds
