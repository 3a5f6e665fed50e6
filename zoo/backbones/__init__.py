"""Backbones: images [B, C, H, W] -> `PatchFeatures(tokens [B, L, D], grid (h, w))`, attribute
`out_dim` (= D); L = h * w row-major (a ViT with `keep_cls=True` puts its prefix tokens first).

    from zoo.backbones import build_backbone
    enc = build_backbone("stem", in_chans=1, channels=[32, 64], strides=[2, 2])   # 28 px -> 7x7
    enc = build_backbone("timm_cnn", model_name="vgg19", level=4, trainable=False,
                         pretrained_file="vgg19.safetensors")                     # conv5_4, 14x14
    enc = build_backbone("timm_vit", model_name="vit_tiny_patch16_224", img_size=28,
                         patch_size=4, in_chans=1, depth=6, embed_dim=96, num_heads=3)

A model's `backbone:` block is a `BackboneSpec` (zoo.backbones.spec) of plain values.
"""
from __future__ import annotations

from zoo.backbones.common import PatchFeatures, freeze
from zoo.backbones.spec import BACKBONES, BackboneSpec, build_backbone, check_input, load_zoo_backbone
from zoo.backbones.stem import ConvStem
from zoo.backbones.timm_cnn import TimmCNN
from zoo.backbones.timm_vit import TimmViT

__all__ = ["PatchFeatures", "build_backbone", "freeze", "ConvStem", "TimmCNN", "TimmViT", "BACKBONES",
           "BackboneSpec", "check_input", "load_zoo_backbone"]
