"""Spatial Transformer Networks: the sampler against the paper's equations written out (eqs. 1,
5-7), the identity start (sec. 4.2), where it looked (the grid's outline, the exact sampling
weights), a grid off the canvas, gradients to the transform, the attention form and the recurrent
variant. The registry-wide tests (steps, export, records, releases) cover it as every family."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.attention import affine
from zoo.errors import UserError
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


def test_the_outline_and_the_sampling_weights_are_where_the_grid_reads():
    """A zoom into the top-left quarter, rotated a little: the outline is theta applied to the
    patch's corners, and each pixel's weight is its bilinear weight summed over the patch (the
    same numbers the sampler multiplies: weights . image == sum of the patch)."""
    theta = torch.tensor([[[0.5, 0.1, -0.5], [-0.1, 0.5, -0.5]]])
    corners = affine.outline(theta, (20, 20))[0]
    for (xt, yt), (x, y) in zip([(-1, -1), (1, -1), (1, 1), (-1, 1)], corners.tolist()):
        xs, ys = (theta[0] @ torch.tensor([xt, yt, 1.0])).tolist()
        assert (x, y) == pytest.approx(((xs + 1) * 10, (ys + 1) * 10))
    box = affine.bounding_box(corners)
    assert box.tolist() == pytest.approx([min(x for x, _ in corners.tolist()), min(y for _, y in corners.tolist()),
                                          max(x for x, _ in corners.tolist()), max(y for _, y in corners.tolist())])
    sampler = affine.AffineSampler(6)
    weights = affine.sampling_weights(sampler, theta, (20, 20))[0]
    image = torch.rand(1, 1, 20, 20)
    assert (weights * image[0, 0]).sum().item() == pytest.approx(sampler(image, theta).sum().item(), rel=1e-5)
    inside = torch.zeros(20, 20, dtype=torch.bool)
    inside[: int(box[3]) + 1, : int(box[2]) + 1] = True
    assert weights[~inside].abs().max() == 0 and weights.sum() > 0


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
