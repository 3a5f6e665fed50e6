"""The retina against a slow, obvious per-sample slicing reference."""
import math

import pytest
import torch

from zoo.attention.glimpse import METHODS, Retina


def slicing_reference(images, locations, g, k, sf=2):
    """One sample, one scale at a time: zero-pad, slice the window, average each block. Edges
    are rounded to the nearest pixel edge (exact where the locations are aligned)."""
    B, C, H, W = images.shape
    out = torch.zeros(B, k, C, g, g, dtype=images.dtype)
    for b in range(B):
        cx = (float(locations[b, 0]) + 1) / 2 * W
        cy = (float(locations[b, 1]) + 1) / 2 * H
        for i in range(k):
            w = g * sf ** i
            x0, y0 = math.floor(cx - w / 2 + 0.5), math.floor(cy - w / 2 + 0.5)
            pad = w + max(H, W)
            padded = torch.zeros(C, H + 2 * pad, W + 2 * pad, dtype=images.dtype)
            padded[:, pad:pad + H, pad:pad + W] = images[b]
            window = padded[:, y0 + pad:y0 + pad + w, x0 + pad:x0 + pad + w]
            s = w // g
            out[b, i] = window.reshape(C, g, s, g, s).mean(dim=(2, 4))
    return out


def aligned_locations(B, H, W, g, k, sf=2, generator=None, margin=None):
    """Locations whose patch edges fall on pixel edges, including ones partly or wholly outside."""
    big = g * sf ** (k - 1)
    margin = big if margin is None else margin
    # patch edges c -+ w/2 are integers when c is an integer (even g) or a half-integer (odd g, k=1)
    shift = 0.5 if g % 2 else 0.0
    cx = torch.randint(-margin, W + margin + 1, (B,), generator=generator).double() + shift
    cy = torch.randint(-margin, H + margin + 1, (B,), generator=generator).double() + shift
    return torch.stack([cx / W * 2 - 1, cy / H * 2 - 1], dim=1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,g,k", [
    ((6, 1, 60, 60), 12, 3),   # the paper's 60x60 setting
    ((5, 3, 20, 34), 4, 3),    # colour, non-square
    ((4, 2, 28, 28), 8, 1),    # the paper's 28x28 setting
    ((4, 1, 9, 13), 5, 1),     # odd patch: half-integer centres
])
def test_equals_slicing_reference_at_aligned_locations(method, shape, g, k):
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(shape, generator=gen, dtype=torch.float64)
    B, C, H, W = shape
    locations = aligned_locations(B, H, W, g, k, generator=gen)
    expected = slicing_reference(images, locations, g, k)
    got = Retina(g, k, method=method)(images, locations)
    assert got.shape == (B, k, C, g, g)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_float32_matches_reference(method):
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(8, 1, 60, 60, generator=gen)
    locations = aligned_locations(8, 60, 60, 12, 3, generator=gen, margin=10)
    expected = slicing_reference(images.double(), locations, 12, 3).float()
    got = Retina(12, 3, method=method)(images, locations.float())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_known_pixels_and_orientation(method):
    """(-1, -1) is the top-left corner: a glimpse there sees the top-left pixel in the bottom-right
    quadrant of the patch and zeros elsewhere; x is columns, y is rows."""
    images = torch.zeros(1, 1, 10, 16)
    images[0, 0, 0, 0] = 1.0
    images[0, 0, 0, 15] = 2.0  # top-right
    g = 4
    retina = Retina(g, 1, method=method)
    top_left = retina(images, torch.tensor([[-1.0, -1.0]]))[0, 0, 0]
    expected = torch.zeros(g, g)
    expected[2, 2] = 1.0
    torch.testing.assert_close(top_left, expected)
    top_right = retina(images, torch.tensor([[1.0, -1.0]]))[0, 0, 0]
    expected = torch.zeros(g, g)
    expected[2, 1] = 2.0
    torch.testing.assert_close(top_right, expected)


@pytest.mark.parametrize("method", METHODS)
def test_zero_outside_image(method):
    images = torch.rand(3, 2, 12, 12) + 1.0
    far = torch.tensor([[5.0, 0.0], [0.0, -7.0], [40.0, 40.0]])
    assert torch.count_nonzero(Retina(4, 2, method=method)(images, far)) == 0
    # a patch straddling the border: the outside half is zero, the inside half the image
    edge = Retina(4, 1, method=method)(images, torch.tensor([[1.0, 0.0]] * 3))[:, 0]
    assert torch.count_nonzero(edge[..., 2:]) == 0
    assert bool((edge[..., :2] >= 1.0).all())


@pytest.mark.parametrize("method", METHODS)
def test_half_pixel_shift_blends_neighbours(method):
    """Between aligned positions the read is continuous: half a pixel to the right of an aligned
    location (scale 1, cell width 1) reads the mean of the two neighbouring aligned reads."""
    gen = torch.Generator().manual_seed(2)
    images = torch.rand(4, 1, 30, 30, generator=gen, dtype=torch.float64)
    loc = aligned_locations(4, 30, 30, 6, 1, generator=gen, margin=4)
    step = torch.tensor([2.0 / 30, 0.0], dtype=torch.float64)  # one pixel in x
    retina = Retina(6, 1, method=method)
    half = retina(images, loc + step / 2)
    torch.testing.assert_close(half, (retina(images, loc) + retina(images, loc + step)) / 2,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,g,k", [((6, 1, 60, 60), 12, 3), ((5, 3, 20, 34), 4, 3), ((4, 1, 9, 13), 5, 1)])
def test_snapped_retina_equals_slicing_reference_at_any_location(method, shape, g, k):
    """subpixel=False rounds the patch edges to pixel edges, as the slicing reference does."""
    gen = torch.Generator().manual_seed(6)
    images = torch.rand(shape, generator=gen, dtype=torch.float64)
    B, C, H, W = shape
    locations = torch.rand(B, 2, generator=gen, dtype=torch.float64) * 2.6 - 1.3
    expected = slicing_reference(images, locations, g, k)
    got = Retina(g, k, method=method, subpixel=False)(images, locations)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(Retina(g, k, method=method)(images, locations), expected)
    boxes = Retina(g, k, subpixel=False).boxes(locations, H, W)
    torch.testing.assert_close(boxes, boxes.round(), rtol=0, atol=1e-9)  # what was read


@pytest.mark.parametrize("g,k", [(12, 3), (4, 2), (5, 1)])
def test_methods_agree_at_any_location(g, k):
    """All three compute the area average of the piecewise-constant image, also between pixels
    and across the border."""
    gen = torch.Generator().manual_seed(3)
    images = torch.rand(16, 2, 40, 52, generator=gen, dtype=torch.float64)
    loc = torch.rand(16, 2, generator=gen, dtype=torch.float64) * 2.6 - 1.3
    outs = [Retina(g, k, method=m)(images, loc) for m in METHODS]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=1e-12)


def test_methods_agree_and_gradients_reach_the_image():
    gen = torch.Generator().manual_seed(4)
    images = torch.rand(4, 3, 32, 32, generator=gen, requires_grad=True)
    loc = aligned_locations(4, 32, 32, 4, 3, generator=gen).float()
    outs = [Retina(4, 3, method=m)(images, loc) for m in METHODS]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=1e-5)
    weights = torch.rand(outs[0].shape, generator=gen)
    grads = [torch.autograd.grad((o * weights).sum(), images)[0] for o in outs]
    for grad in grads[1:]:
        torch.testing.assert_close(grad, grads[0], rtol=0, atol=1e-5)
    assert grads[0].abs().sum() > 0


def test_boxes_match_the_slices_read():
    gen = torch.Generator().manual_seed(5)
    loc = aligned_locations(6, 60, 60, 12, 3, generator=gen)
    boxes = Retina(12, 3).boxes(loc, 60, 60)  # [B, k, 4]
    assert boxes.shape == (6, 3, 4)
    widths = boxes[..., 2] - boxes[..., 0]
    torch.testing.assert_close(widths, torch.tensor([12.0, 24.0, 48.0], dtype=torch.float64).expand(6, 3))
    centre = (boxes[..., :2] + boxes[..., 2:]) / 2
    torch.testing.assert_close(centre, ((loc + 1) * 30)[:, None].expand(6, 3, 2))
    torch.testing.assert_close(boxes, boxes.round(), rtol=0, atol=1e-9)  # pixel-edge boxes


def test_fractional_scale_factor_filterbank_rows_sum_to_one_inside():
    retina = Retina(6, 3, scale_factor=1.5, method="filterbank")
    fy, fx = retina.filters(torch.zeros(2, 2), 40, 40)
    assert fy.shape == (2, 3, 6, 40) and fx.shape == (2, 3, 6, 40)
    torch.testing.assert_close(fx.sum(-1), torch.ones(2, 3, 6))
    assert int(fx[0, 2].gt(0).sum(-1).max()) in (3, 4)  # 2.25-wide cells touch 3 or 4 pixels


def test_bad_arguments():
    with pytest.raises(ValueError):
        Retina(8, 1, method="nearest")
    with pytest.raises(ValueError):
        Retina(8, 2, scale_factor=1.5, method="crop")
    with pytest.raises(ValueError):
        Retina(5, 2, method="crop")  # the 5-px patch is off the 10-px patch's pixel grid
    with pytest.raises(ValueError):
        Retina(8, 1)(torch.zeros(2, 1, 28, 28), torch.zeros(3, 2))
