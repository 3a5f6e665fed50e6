"""A small convolutional stem for 28-100 px inputs (Fashion-MNIST and its cluttered variants),
where an ImageNet CNN's stride-32 features would leave a 1x1 grid."""
from __future__ import annotations

import math

from torch import nn

from zoo.backbones.common import Backbone


class ConvStem(Backbone):
    """Stages of [conv k x k -> BatchNorm -> ReLU] x blocks_per_stage, the first conv of stage i at
    stride strides[i]: the grid's stride is prod(strides) (28 px, strides [2, 2] -> 7x7 tokens).
    `normalize` is off by default: the first BatchNorm absorbs the scale of images in [0, 1]."""

    def __init__(self, in_chans: int = 1, channels: list[int] = (32, 64), strides: list[int] = (2, 2),
                 blocks_per_stage: int = 1, kernel_size: int = 3, trainable: bool = True,
                 normalize: bool | None = None, mean: list[float] | None = None, std: list[float] | None = None):
        super().__init__(in_chans, trainable)
        if len(channels) != len(strides) or not channels:
            raise ValueError("channels and strides need the same, non-zero length")
        layers, prev = [], in_chans
        for width, stride in zip(channels, strides):
            for b in range(blocks_per_stage):
                layers += [nn.Conv2d(prev, width, kernel_size, stride=stride if b == 0 else 1,
                                     padding=kernel_size // 2, bias=False),
                           nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
                prev = width
        self.body = nn.Sequential(*layers)
        self.out_dim = prev
        self.stride = math.prod(strides)
        self.finish(normalize, mean, std, (0.0,) * in_chans, (1.0,) * in_chans)

    def features(self, x):
        return self.body(x)  # [B, D, h, w]
