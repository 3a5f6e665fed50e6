"""Spatial Transformer Networks: the sampler against the paper's equations written out (eqs. 1,
5-7), the identity start (sec. 4.2), where it looked (the grid's outline, the region's exact
footprint), a grid off the canvas, gradients to the transform, the attention form and the recurrent
variant. The registry-wide tests (steps, export, records, releases) cover it as every family."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.attention import affine
from zoo.guards.errors import UserError
from zoo.models.stn import STN


def tiny(**overrides) -> STN:
    torch.manual_seed(0)
    return STN(**{**STN.card.tiny[""], **overrides}).eval()


def slow_sample(image: torch.Tensor, theta: torch.Tensor, P: int) -> torch.Tensor:
    """eqs. 1 and 5-7 for one image [C, H, W]: each output pixel's centre (x_t, y_t) in [-1, 1]
    (pixel edges at +-1), mapped by theta, read as sum_nm U_nm max(0, 1 - |x - m|) max(0, 1 - |y - n|)
    in pixel units (pixel m's centre at m + 0.5), zero outside."""
    C, H, W = image.shape
    out = torch.zeros(C, P, P)
    for i in range(P):
        for j in range(P):
            xt, yt = (2 * j + 1) / P - 1, (2 * i + 1) / P - 1
            xs, ys = (theta @ torch.tensor([xt, yt, 1.0])).tolist()
            x, y = (xs + 1) * W / 2 - 0.5, (ys + 1) * H / 2 - 0.5  # in pixel-centre units
            for n in range(H):
                for m in range(W):
                    out[:, i, j] += image[:, n, m] * max(0.0, 1 - abs(x - m)) * max(0.0, 1 - abs(y - n))
    return out


def test_the_sampler_is_the_papers_bilinear_kernel():
    torch.manual_seed(0)
    image = torch.rand(2, 7, 9)
    theta = torch.tensor([[0.6, 0.2, 0.1], [-0.1, 0.5, -0.3]])
    fast = affine.AffineSampler(5)(image[None], theta[None])[0]
    torch.testing.assert_close(fast, slow_sample(image, theta, 5), atol=1e-5, rtol=1e-5)


def test_the_identity_start_reads_the_whole_image_pooled_2x2():
    """Zero weights and bias [1, 0, 0, 0, 1, 0] (sec. 4.2): at half the side the patch is a 2 x 2
    average pooling of the whole canvas, whatever the input, and the grid's outline is the canvas."""
    model = tiny()
    assert not model.where.weight.any() and model.where.bias.tolist() == list(affine.IDENTITY)
    images = torch.rand(3, 1, 20, 20)
    theta = model.transforms(images)
    assert torch.equal(theta, torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).expand(3, 1, 2, 3))
    torch.testing.assert_close(model.sampler(images, theta[:, 0]), F.avg_pool2d(images, 2), atol=1e-6, rtol=0)
    record = model.attention_record(images)
    torch.testing.assert_close(record.boxes[:, 0, 0], torch.tensor([[0.0, 0.0, 20.0, 20.0]] * 3))
    torch.testing.assert_close(record.maps, torch.full((3, 1, 20, 20), 1 / 400))  # every pixel read alike


def test_the_outline_is_where_the_grid_reads_and_the_footprint_fills_it_exactly():
    """A zoom towards the top left, rotated a little: the outline is theta applied to the patch's
    corners; the footprint is each pixel's area inside that parallelogram (against 64 x 64
    points per pixel tested inside it), summing to its area |det A| H W."""
    theta = torch.tensor([[[0.5, 0.1, -0.3], [-0.1, 0.5, -0.3]]])
    corners = affine.outline(theta, (20, 20))[0]
    for (xt, yt), (x, y) in zip([(-1, -1), (1, -1), (1, 1), (-1, 1)], corners.tolist()):
        xs, ys = (theta[0] @ torch.tensor([xt, yt, 1.0])).tolist()
        assert (x, y) == pytest.approx(((xs + 1) * 10, (ys + 1) * 10))
    box = affine.bounding_box(corners)
    assert box.tolist() == pytest.approx([min(x for x, _ in corners.tolist()), min(y for _, y in corners.tolist()),
                                          max(x for x, _ in corners.tolist()), max(y for _, y in corners.tolist())])
    assert box.min() > 0 and box.max() < 20  # wholly on the canvas
    cover = affine.footprint(theta, (20, 20))[0]
    n = 64
    points = (torch.arange(20 * n, dtype=torch.float64) + 0.5) / n / 10 - 1  # sub-pixel centres, normalised
    grid = torch.stack(torch.meshgrid(points, points, indexing="xy"), -1)  # [20n, 20n, 2] (x, y)
    source = torch.linalg.solve(theta[0, :, :2].double(), (grid - theta[0, :, 2].double()).reshape(-1, 2).T).T
    inside = (source.abs() <= 1).all(-1).double().reshape(20, n, 20, n).mean((1, 3))
    torch.testing.assert_close(cover.double(), inside, atol=2 / n, rtol=0)  # a pixel cut by an edge: error < 2/n
    assert cover.sum().item() == pytest.approx(torch.det(theta[0, :, :2]).abs().item() * 400, rel=1e-5)
    outside = torch.ones(20, 20, dtype=torch.bool)
    x0, y0, x1, y1 = box.tolist()
    outside[int(y0):int(y1) + 1, int(x0):int(x1) + 1] = False
    assert cover.max() == 1 and cover[outside].max() == 0


def test_an_axis_aligned_window_covers_its_box_and_the_map_peaks_where_the_window_is():
    """The attention form's footprint is its box's pixel coverage (zoo.attention.record, as a RAM
    glimpse's), partly off the canvas too; the record's map is that, normalised, and its peak (a
    plateau: every pixel wholly inside) is the window's centre, wherever the grid's sub-pixel phase
    puts the sampler's bilinear weights."""
    from zoo.attention.record import box_coverage, peak_pixels

    theta = affine.attention_theta(torch.tensor([[0.3, 0.2, -0.1], [0.5, 0.9, 0.0]]))  # the second: partly off
    cover = affine.footprint(theta, (20, 20))
    boxes = affine.bounding_box(affine.outline(theta, (20, 20)))
    torch.testing.assert_close(cover, box_coverage(boxes, (20, 20)), atol=1e-6, rtol=0)
    assert cover[1].sum().item() == pytest.approx(10 * 6)  # 10 px tall, 6 of its 10 px columns on the canvas
    model = tiny(transform="attention")
    with torch.no_grad():
        model.where.bias.copy_(torch.tensor([0.33, 0.21, -0.13]))  # a 6.6 px window at (12.1, 8.7)
    record = model.attention_record(torch.rand(1, 1, 20, 20))
    peak = peak_pixels(record.maps[0, 0]).item()
    assert (peak % 20 + 0.5, peak // 20 + 0.5) == pytest.approx((12.1, 8.7), abs=1.0)
    assert record.maps.sum().item() == pytest.approx(1.0)


def test_a_grid_wholly_off_the_canvas_is_a_degenerate_map_not_a_crash(tmp_path):
    """A valid prediction: the patch is all zero padding, the map all zero (degenerate, drawn grey)."""
    from zoo.viz.record import html_report, strip

    model = tiny()
    with torch.no_grad():
        model.where.bias.copy_(torch.tensor([0.2, 0.0, 3.0, 0.0, 0.2, 3.0]))  # far right, far down
    images = torch.rand(2, 1, 20, 20)
    record = model.attention_record(images)
    assert record.degenerate().all() and torch.isfinite(record.prediction["probs"]).all()
    assert (record.boxes[:, 0, 0, :2] > 20).all()  # the grid's box lies past the canvas
    strip(record, 0, images[0])
    assert "degenerate" in record.to_json(maps=False)
    html_report(record, images, ["a.png", "b.png"], "off the canvas")


def test_the_transform_learns_by_backprop_through_the_sampler():
    """Gradients reach the localisation net (the sampler is differentiable in theta, eqs. 6-7),
    and an optimizer step moves the transform away from the identity."""
    model = tiny().train()
    images, labels = model.example_batch(8)
    optimizer = model.configure_optimizers()["optimizer"]
    model.train_loss(images, labels)[0].backward()
    # the transform's layer learns at once; with its weights zero at first (sec. 4.2) the
    # localisation convolutions get their gradient from the second step on
    assert model.where.weight.grad.abs().sum() > 0 and model.where.bias.grad.abs().sum() > 0
    assert model.loc[1][0].weight.grad.abs().sum() == 0
    optimizer.step()
    assert not torch.equal(model.transforms(images)[:, 0], torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).expand(8, 2, 3))
    optimizer.zero_grad()
    model.train_loss(images, labels)[0].backward()
    assert model.loc[1][0].weight.grad.abs().sum() > 0
    assert optimizer.param_groups[1]["lr"] == model.hparams.lr * model.hparams.loc_lr_scale  # the loc net's own lr


def test_the_attention_form_keeps_a_square_box_and_the_recurrent_variant_a_glimpse_per_step():
    model = tiny(transform="attention", num_glimpses=3, rnn_hidden=8)
    with torch.no_grad():
        model.where.bias.copy_(torch.tensor([0.5, 0.2, -0.4]))  # s, tx, ty
    images = torch.rand(2, 1, 20, 20)
    theta = model.transforms(images)
    assert theta.shape == (2, 3, 2, 3) and torch.equal(theta[..., 0, 1], torch.zeros(2, 3))
    record = model.attention_record(images)
    assert record.labels[0] == ["glimpse 1", "glimpse 2", "glimpse 3"]
    torch.testing.assert_close(record.boxes[0, 0, 0], torch.tensor([7.0, 1.0, 17.0, 11.0]))  # 10 px square
    logits, exported = model.export_forward(images)
    assert logits.shape == (2, 4) and torch.equal(exported, theta)


@pytest.mark.parametrize("bad, message", [({"transform": "projective"}, "transform must be one of affine, attention"),
                                          ({"patch_size": 3}, "too small for its convolutions"),
                                          ({"num_glimpses": 0}, "num_glimpses and loc_downsample are >= 1")])
def test_impossible_settings_are_one_line(bad, message):
    with pytest.raises(UserError, match=message):
        tiny(**bad)
