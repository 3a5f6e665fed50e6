"""The papers' comparison classifiers: output shapes for every arch and canvas size, input checks,
and that a few optimiser steps fit a fixed batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.guards.errors import UserError
from zoo.models.baselines import Classifier

ARCHS = {"mlp": {"hidden": [32, 16]},
         "cnn": {"channels": [8, 16], "cnn_hidden": 32},
         "paper_cnn": {"channels": [8], "kernel_size": 10, "stride": 5, "cnn_hidden": 32}}


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("size", [28, 60, 100])
def test_forward_shapes(arch, size):
    model = Classifier(arch=arch, image_size=size, num_classes=10, **ARCHS[arch]).eval()
    logits = model(torch.rand(3, 1, size, size))
    assert logits.shape == (3, 10) and torch.isfinite(logits).all()
    # eval mode is per-example: an image's logits do not depend on the rest of the batch
    images = torch.rand(3, 1, size, size)
    with torch.no_grad():
        assert torch.allclose(model(images)[:1], model(images[:1]), atol=1e-5)


def test_mlp_has_two_hidden_layers_of_the_given_widths():
    model = Classifier(arch="mlp", image_size=60, hidden=[256, 256])
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3600, 256), (256, 256), (256, 10)]


def test_paper_cnn_is_one_strided_conv_layer():
    model = Classifier(arch="paper_cnn", image_size=28, channels=[8], kernel_size=10, stride=5, cnn_hidden=256)
    convs = [m for m in model.net if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 and convs[0].weight.shape == (8, 1, 10, 10) and convs[0].stride == (5, 5)
    side = (28 - 10) // 5 + 1
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert linears[0].in_features == 8 * side * side and linears[0].out_features == 256


@pytest.mark.parametrize("arch", list(ARCHS))
def test_wrong_input_size_is_a_user_error(arch):
    model = Classifier(arch=arch, image_size=60, **ARCHS[arch])
    with pytest.raises(UserError, match=r"\(1, 28, 28\).*\(1, 60, 60\)"):
        model(torch.rand(2, 1, 28, 28))
    with pytest.raises(UserError, match="expects"):
        model(torch.rand(2, 3, 60, 60))


def test_unknown_arch_is_a_user_error():
    with pytest.raises(UserError, match="arch"):
        Classifier(arch="transformer")


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_few_steps_fit_a_fixed_batch(arch):
    torch.manual_seed(0)
    model = Classifier(arch=arch, image_size=28, dropout=0.0, **ARCHS[arch])
    images, labels = torch.rand(16, 1, 28, 28), torch.arange(16) % 10
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(40):
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses[::8]
    # (training-mode logits: BatchNorm's running statistics lag after only 40 steps)
    assert (logits.argmax(-1) == labels).float().mean() >= 0.9


def test_hparams_are_plain_and_optimizer_follows_them():
    model = Classifier(arch="mlp", hidden=(8, 8), lr=0.05, weight_decay=0.01, lr_schedule="none")
    config = model.zoo_config()
    assert config["family"] == "baseline" and config["init_args"]["hidden"] == [8, 8]
    optimizer = model.configure_optimizers()
    assert optimizer.param_groups[0]["lr"] == 0.05 and optimizer.param_groups[0]["weight_decay"] == 0.01
