"""The papers' comparison models (Mnih et al. 2014, sec. 4.1): `mlp`, RAM's FC baseline (two
hidden layers of 256 ReLUs: 1 M parameters at 60x60, larger than RAM's 0.2-0.26 M, as in the
paper); `paper_cnn`, its convolutional baseline (8 10x10 filters at stride 5, 256 ReLUs: 0.25 M at
60x60); `cnn`, a stronger modern small CNN (conv-BN-ReLU-pool blocks, global pooling), for context.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.base import ClassifierModule
from zoo.models.card import FamilyCard


def mlp(in_features: int, hidden: list[int], num_classes: int, dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    for width in hidden:
        layers += [nn.Linear(in_features, width), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        in_features = width
    layers.append(nn.Linear(in_features, num_classes))
    return nn.Sequential(*layers)


def small_cnn(in_chans: int, channels: list[int], kernel_size: int, hidden: int, num_classes: int,
              dropout: float) -> nn.Sequential:
    """conv-BN-ReLU-maxpool blocks, global average pooling, one hidden FC layer."""
    layers: list[nn.Module] = []
    for width in channels:
        layers += [nn.Conv2d(in_chans, width, kernel_size, padding=kernel_size // 2, bias=False),
                   nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        in_chans = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_chans, hidden), nn.ReLU(inplace=True),
               nn.Dropout(dropout), nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)


def paper_cnn(in_chans: int, image_size: int, filters: int, kernel_size: int, stride: int, hidden: int,
              num_classes: int, dropout: float) -> nn.Sequential:
    side = (image_size - kernel_size) // stride + 1
    return nn.Sequential(nn.Conv2d(in_chans, filters, kernel_size, stride=stride), nn.ReLU(inplace=True),
                         nn.Flatten(), nn.Linear(filters * side * side, hidden), nn.ReLU(inplace=True),
                         nn.Dropout(dropout), nn.Linear(hidden, num_classes))


class Classifier(ClassifierModule):
    """A plain image classifier (MLP or CNN): images [B, C, H, W] in [0, 1] -> logits [B, num_classes]."""

    card = FamilyCard(
        "baseline", bench_recipes=("baseline_smallcnn_cluttered60",), dimensions={"hidden": 16_384, "cnn_hidden": 16_384},
        tiny={"": dict(arch="mlp", image_size=16, hidden=[16, 16], dropout=0.0),
              "cnn": dict(arch="cnn", image_size=16, channels=[4, 8], cnn_hidden=8, dropout=0.0)})

    @property
    def head_keys(self) -> tuple[str, ...]:
        return (f"net.{len(self.net) - 1}.",)  # every arch ends in its Linear classifier

    def __init__(self, arch: str = "cnn", image_size: int = 28, in_chans: int = 1, num_classes: int = 10,
                 hidden: list[int] = (256, 256), channels: list[int] = (32, 64, 128), kernel_size: int = 3,
                 cnn_hidden: int = 256, stride: int = 5, dropout: float = 0.1, lr: float = 1e-3, weight_decay: float = 0.0,
                 lr_schedule: str = "cosine", class_names: list[str] | None = None):
        super().__init__()
        self.save_hyperparameters()
        optim.check_schedule(lr_schedule, "baseline")
        if arch == "mlp":
            self.net = mlp(in_chans * image_size * image_size, list(hidden), num_classes, dropout)
        elif arch == "cnn":
            self.net = small_cnn(in_chans, list(channels), kernel_size, cnn_hidden, num_classes, dropout)
        elif arch == "paper_cnn":
            # `channels[0]` filters of kernel_size x kernel_size at `stride`, then cnn_hidden units
            self.net = paper_cnn(in_chans, image_size, channels[0], kernel_size, stride, cnn_hidden,
                                 num_classes, dropout)
        else:
            raise UserError(f"unknown baseline arch '{arch}' (mlp, paper_cnn or cnn)")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.check_images(images)
        return self.net(images)
