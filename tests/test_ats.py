"""Attention sampling (zoo.attention.sampling, zoo.models.ats): the without-replacement estimator and
its gradient are unbiased (exactly, over every ordered draw of a small problem, and by Monte Carlo
through the real sampler), the draws never repeat a cell, the batched patch read equals a per-image
loop, gradients reach both networks without REINFORCE, and the attention record is where the model
read. The registry-wide tests (steps, compiled steps, export, record, figures) cover it as every family."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from zoo.attention import sampling
from zoo.guards.errors import UserError
from zoo.models.ats import ATS

DOUBLE = torch.float64


def tiny(**overrides) -> ATS:
    torch.manual_seed(0)
    return ATS(**{**ATS.card.tiny[""], **overrides})


def _problem(N: int, D: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, generator=g, dtype=DOUBLE) * 1.5, torch.randn(N, D, generator=g, dtype=DOUBLE),
            torch.randn(D, generator=g, dtype=DOUBLE))


def _exact(logits, features, c, smooth):
    """c . Phi (S1) and its gradient with respect to the logits."""
    logits = logits.clone().requires_grad_(True)
    a, _ = sampling.attention_distribution(logits[None], smooth)
    value = (a[0] @ features) @ c
    return value.detach(), torch.autograd.grad(value, logits)[0]


def _draw_probability(a: torch.Tensor, order: tuple[int, ...]) -> float:
    """P(q_1..q_K = order) drawing without replacement: prod_k a_{q_k} / (1 - s_k)."""
    p, left = 1.0, 1.0
    for q in order:
        p *= float(a[q]) / left
        left -= float(a[q])
    return p


@pytest.mark.parametrize("K", [1, 3, 5])
@pytest.mark.parametrize("smooth", [0.0, 0.1])
def test_estimator_and_its_gradient_are_exactly_unbiased(K, smooth):
    """Summed over every ordered draw of K of N = 5 cells, weighted by its probability: the estimate
    (S4) is c . Phi and its gradient ((S5)-(S6) through the softmax) is Phi's exact gradient."""
    logits, features, c = _problem(5, 3)
    value, grad = _exact(logits, features, c, smooth)
    mean_value, mean_grad = torch.zeros((), dtype=DOUBLE), torch.zeros(5, dtype=DOUBLE)
    total = 0.0
    for order in itertools.permutations(range(5), K):
        leaf = logits.clone().requires_grad_(True)
        a, _ = sampling.attention_distribution(leaf[None], smooth)
        p = _draw_probability(a[0].detach(), order)
        index = torch.tensor([order])
        estimate = sampling.expected_features(a, index, features[index]) @ c
        mean_value += p * estimate[0].detach()
        mean_grad += p * torch.autograd.grad(estimate[0], leaf)[0]
        total += p
    assert total == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(mean_value, value, rtol=0, atol=1e-12)
    torch.testing.assert_close(mean_grad, grad, rtol=0, atol=1e-12)
    assert grad.abs().max() > 1e-2  # a gradient worth checking


def test_a_single_draw_is_not_the_expectation():
    """The check above can fail: one draw's estimate and gradient differ from the exact ones (and a
    plain renormalised top-K average is biased even in expectation)."""
    logits, features, c = _problem(5, 3)
    value, grad = _exact(logits, features, c, 0.0)
    leaf = logits.clone().requires_grad_(True)
    a, _ = sampling.attention_distribution(leaf[None])
    index = torch.tensor([[4, 0, 2]])
    estimate = sampling.expected_features(a, index, features[index]) @ c
    assert abs(float(estimate[0].detach()) - float(value)) > 1e-3
    assert (torch.autograd.grad(estimate[0], leaf)[0] - grad).abs().max() > 1e-3
    biased = 0.0
    for order in itertools.permutations(range(5), 3):
        w = a[0, list(order)].detach()
        biased += _draw_probability(a[0].detach(), order) * float((w / w.sum()) @ features[list(order)] @ c)
    assert abs(biased - float(value)) > 1e-3


def test_monte_carlo_through_the_sampler_is_unbiased_within_its_standard_error():
    """20,000 Gumbel-top-k draws (one batch, each row its own draw): the first draw's frequencies
    are a, and the mean estimate and mean logit gradient are the exact ones within 4 standard
    errors per component."""
    N, K, M, smooth = 12, 4, 20_000, 1e-3
    logits, features, c = _problem(N, 3, seed=1)
    value, grad = _exact(logits, features, c, smooth)
    leaf = logits.expand(M, N).clone().requires_grad_(True)
    a, log_a = sampling.attention_distribution(leaf, smooth)
    gumbel = sampling.gumbel_noise((M, N), leaf, torch.Generator().manual_seed(2))
    index = sampling.sample_without_replacement(log_a.detach(), K, gumbel)
    estimates = sampling.expected_features(a, index, features[index]) @ c  # [M]
    grads = torch.autograd.grad(estimates.sum(), leaf)[0]  # row m: the gradient of draw m's estimate

    def within(samples: torch.Tensor, exact: torch.Tensor) -> None:
        error = (samples.mean(0) - exact).abs()
        se = samples.std(0) / math.sqrt(M)
        assert bool((error <= 4 * se + 1e-12).all()), (error / se).max()

    within(estimates.detach(), value)
    within(grads, grad)
    first = F.one_hot(index[:, 0], N).to(DOUBLE)
    within(first, a[0].detach())


def test_draws_are_without_replacement_and_zero_noise_is_the_top_k():
    g = torch.Generator().manual_seed(3)
    log_a = torch.randn(500, 30, generator=g).log_softmax(-1)
    index = sampling.sample_without_replacement(log_a, 30, sampling.gumbel_noise((500, 30), log_a, g))
    assert index.shape == (500, 30)
    assert torch.equal(index.sort(-1).values, torch.arange(30).expand(500, 30))  # every cell exactly once
    first = sampling.sample_without_replacement(log_a, 7, sampling.gumbel_noise((500, 30), log_a, g))
    assert all(len(set(row)) == 7 for row in first.tolist())
    top = sampling.sample_without_replacement(log_a, 5)
    assert torch.equal(top, log_a.argsort(-1, descending=True)[:, :5])


def test_feature_weights_are_the_expanded_estimator():
    """w_k = [(1 - s_k) + (K - k) a_{q_k}] / K is (S4) with its terms collected, and the estimate's
    value is sum_k w_k f_{q_k} exactly (the surrogate's ratio is 1 in value)."""
    a = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=DOUBLE)
    w = sampling.without_replacement_weights(a)
    expected = [(1 + 3 * 0.1) / 4, (0.9 + 2 * 0.4) / 4, (0.5 + 0.2) / 4, (0.3 + 0) / 4]
    torch.testing.assert_close(w, torch.tensor([expected], dtype=DOUBLE))
    f = torch.eye(4, dtype=DOUBLE)[None]  # f_{q_k} = e_k: Phi_hat's components are the weights
    torch.testing.assert_close(sampling.expected_features(a, torch.arange(4)[None], f), w)


# ----------------------------------------------------------------------------- patches
def slow_patches(images: torch.Tensor, corners: torch.Tensor, P: int) -> torch.Tensor:
    """One image and one patch at a time: zero-pad the image (by more than any corner lies
    outside), slice."""
    B, C, H, W = images.shape
    out = torch.zeros(B, corners.shape[1], C, P, P, dtype=images.dtype)
    m = 2 * P + max(H, W)
    for b in range(B):
        padded = F.pad(images[b], (m, m, m, m))
        for k, (x0, y0) in enumerate(corners[b].tolist()):
            out[b, k] = padded[:, y0 + m:y0 + m + P, x0 + m:x0 + m + P]
    return out


@pytest.mark.parametrize("shape,P", [((6, 1, 60, 60), 28), ((3, 3, 17, 29), 8), ((2, 2, 9, 9), 12),
                                     ((5, 1, 9, 9), 12), ((1, 1, 40, 30), 5)])
def test_batched_extraction_equals_the_per_image_loop(shape, P):
    """Corners anywhere, patches partly or wholly outside the image (zeros there), any channels;
    the strip read (more than 2 images), and the pixel gather it falls back on (the first and last
    image, a batch of 2, rows narrower than a patch)."""
    g = torch.Generator().manual_seed(4)
    B, C, H, W = shape
    images = torch.rand(shape, generator=g) + 0.5  # no zero pixel inside: outside reads must be the zeros
    K = 7
    corners = torch.stack([torch.randint(-P - 2, W + 2, (B, K), generator=g),
                           torch.randint(-P - 2, H + 2, (B, K), generator=g)], -1)
    fast = sampling.extract_patches(images, corners, P)
    assert fast.shape == (B, K, C, P, P)
    assert torch.equal(fast, slow_patches(images, corners, P))


@pytest.mark.parametrize("B", [5, 2])
def test_the_read_passes_the_gradient_to_the_pixels_read(B):
    """Overlapping strips (as_strided) in the backward pass, and the pixel gather: each pixel gets
    the sum of the gradients of every patch pixel it was read into, as the loop's slices give it."""
    g = torch.Generator().manual_seed(7)
    images = torch.rand(B, 2, 30, 30, generator=g, dtype=DOUBLE, requires_grad=True)
    corners = torch.randint(-10, 32, (B, 6, 2), generator=g)
    weights = torch.randn(B, 6, 2, 12, 12, generator=g, dtype=DOUBLE)
    fast = torch.autograd.grad((sampling.extract_patches(images, corners, 12) * weights).sum(), images)[0]
    slow = torch.autograd.grad((slow_patches(images, corners, 12) * weights).sum(), images)[0]
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)


@pytest.mark.parametrize("image,grid,P", [((60, 60), (15, 15), 28), ((60, 60), (15, 15), 9), ((17, 23), (5, 7), 6),
                                          ((1500, 1500), (180, 180), 50)])
def test_patches_are_centred_on_their_cells(image, grid, P):
    """Every cell's patch corner is its centre minus P/2 rounded to the nearest pixel (halves up),
    computed here with Python fractions; at an integer scale and a patch of the cell's parity the
    patch's centre is the cell's centre exactly."""
    from fractions import Fraction

    (H, W), (h, w) = image, grid
    index = torch.arange(h * w)[None]
    corners = sampling.patch_corners(index, grid, image, P)[0]
    for i, (x0, y0) in zip(index[0].tolist(), corners.tolist()):
        r, c = divmod(i, w)
        assert x0 == math.floor(Fraction(2 * c + 1, 2) * Fraction(W, w) - Fraction(P, 2) + Fraction(1, 2))
        assert y0 == math.floor(Fraction(2 * r + 1, 2) * Fraction(H, h) - Fraction(P, 2) + Fraction(1, 2))
    if H % h == 0 and (H // h - P) % 2 == 0:
        boxes = sampling.patch_boxes(corners, P)
        centres = (boxes[:, :2] + boxes[:, 2:]) / 2
        rows, cols = index[0] // w, index[0] % w
        torch.testing.assert_close(centres, torch.stack([(cols + 0.5) * W / w, (rows + 0.5) * H / h], -1).float())


# ----------------------------------------------------------------------------- the family
def test_gradients_reach_both_networks_through_the_estimator_alone():
    """No REINFORCE term and no entropy term: the attention network still learns, through (S6)."""
    model = tiny(entropy_weight=0.0).train()
    torch.manual_seed(5)
    inputs = model.train_inputs(model.example_batch(6))
    loss, metrics = model.train_loss(**inputs)
    loss.backward()
    assert set(metrics) == {"loss", "ce", "acc", "entropy"} and torch.equal(metrics["loss"], metrics["ce"])
    for name, p in model.named_parameters():
        # the last attention bias shifts every logit alike: the softmax ignores it
        if name != "attention_net.net.2.bias":
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_the_step_reads_its_named_draw():
    """The draw is the step's input (eager and compiled steps consume one stream): the same gumbel,
    the same loss; another draw, other patches."""
    model = tiny().train()
    batch = model.example_batch(4)
    torch.manual_seed(6)
    inputs = model.train_inputs(batch)
    assert inputs["gumbel"].shape == (4, 25)
    first, again = model.train_loss(**inputs)[0], model.train_loss(**inputs)[0]
    assert torch.equal(first, again)
    reads = [model.read(batch[0], model.draw(batch[0]))["index"] for _ in range(4)]
    assert any(not torch.equal(reads[0], r) for r in reads[1:])
    deterministic = model.read(batch[0])
    assert torch.equal(deterministic["index"], deterministic["log_a"].topk(3).indices)


def test_evaluation_draws_are_reproducible():
    model = tiny().eval()
    batch = model.example_batch(4)
    model.on_validation_epoch_start()
    first = model.eval_inputs(batch, "test")["gumbel"]
    model.on_validation_epoch_start()
    assert torch.equal(model.eval_inputs(batch, "test")["gumbel"], first)
    metrics = model.eval_metrics("test", **model.eval_inputs(batch, "test"))
    assert {"loss", "acc", "acc_sampled", "entropy", "error_pct"} <= set(metrics)


def test_the_attention_record_is_the_distribution_and_the_patches_read():
    model = tiny().eval()
    images = model.example_images(3)[0]
    record = model.attention_record(images)
    out = model.read(images)
    assert record.kind == "sampling" and record.maps.shape == (3, 1, 20, 20) and record.boxes.shape == (3, 1, 3, 4)
    assert record.box_labels == ["patch 1", "patch 2", "patch 3"]
    torch.testing.assert_close(record.maps.sum((-2, -1)), torch.ones(3, 1))
    # each 4 x 4 block of pixels holds its cell's attention, spread evenly
    cells = record.maps[:, 0].reshape(3, 5, 4, 5, 4).sum((2, 4)).flatten(1)
    torch.testing.assert_close(cells, out["a"])
    # the boxes are the P x P patches around the K most attended cells
    widths = record.boxes[..., 2:] - record.boxes[..., :2]
    assert bool((widths == 8).all())
    centres = (record.boxes[:, 0, :, :2] + record.boxes[:, 0, :, 2:]) / 2
    rows, cols = out["index"] // 5, out["index"] % 5
    torch.testing.assert_close(centres, torch.stack([cols * 4 + 2.0, rows * 4 + 2.0], -1))
    logits, attention, boxes = model.export_forward(images)
    torch.testing.assert_close(boxes, record.boxes[:, 0])
    torch.testing.assert_close(attention.flatten(1), out["a"])


@pytest.mark.parametrize("overrides,message", [
    ({"num_patches": 26}, r"num_patches must be in 1..25 \(the 5x5 cells"),
    ({"view_scale": 0.0}, r"view_scale is the low-resolution view's scale"),
    ({"patch_size": 4}, r"a 4 px patch is too small"),
    ({"feature_kernel_sizes": [3]}, r"feature_channels and feature_kernel_sizes"),
    ({"smooth": 1.0}, r"smooth must be in \[0, 1\)"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as info:
        tiny(**overrides)
    assert "\n" not in str(info.value)
