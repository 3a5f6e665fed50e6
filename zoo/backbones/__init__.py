"""Backbones: what an image becomes before content-based attention sees it.

Every backbone maps images [B, C, H, W] to `PatchFeatures(tokens [B, L, D], grid (h, w))` and has
the attribute `out_dim` (= D). L = h * w, row-major over the grid, except for a ViT built with
`keep_cls=True`, whose tokens start with its `num_prefix_tokens` prefix (cls/register) tokens and
end with the h * w patch tokens.

    from zoo.backbones import build_backbone
    enc = build_backbone("stem", in_chans=1, channels=[32, 64], strides=[2, 2])   # 28 px -> 7x7
    enc = build_backbone("timm_cnn", model_name="vgg19", level=4, trainable=False,
                         pretrained_file="vgg19.safetensors")                     # conv5_4, 14x14
    enc = build_backbone("timm_vit", model_name="vit_tiny_patch16_224", img_size=28,
                         patch_size=4, in_chans=1, depth=6, embed_dim=96, num_heads=3)

All constructor arguments are plain values so that a model can keep them in its hparams.
A model's `backbone:` config block is a typed `BackboneSpec` (zoo.backbones.spec): the same
fields plus `kind`, and `pretrained: NAME` to load a released zoo backbone by name.
"""
from __future__ import annotations

from zoo.backbones.common import PatchFeatures, freeze
from zoo.backbones.spec import BACKBONES, BackboneSpec, build_backbone, check_input, load_zoo_backbone
from zoo.backbones.stem import ConvStem
from zoo.backbones.timm_cnn import TimmCNN
from zoo.backbones.timm_vit import TimmViT

__all__ = ["PatchFeatures", "build_backbone", "freeze", "ConvStem", "TimmCNN", "TimmViT", "BACKBONES",
           "BackboneSpec", "check_input", "load_zoo_backbone"]
