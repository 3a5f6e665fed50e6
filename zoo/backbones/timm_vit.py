"""A timm VisionTransformer as patch tokens: the ViT classifier's trunk and, through the same
object, a captioner's encoder (soft attention over the h x w patch tokens)."""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import HybridEmbed

from zoo.backbones.common import Backbone, PatchFeatures, create_timm
from zoo.backbones.stem import ConvStem


class TimmViT(Backbone):
    """Any timm VisionTransformer variant by name, the given sizes overriding its defaults (None keeps
    them). `num_classes=0` (an encoder) leaves the head out; a classifier sets it and calls
    `forward_head(forward_features(x))`. forward(images) returns the patch tokens only, unless
    `keep_cls` keeps timm's prefix tokens in front. pretrained / pretrained_file: as `create_timm`.

    conv_stem: the widths of 3x3 stride-2 conv -> BatchNorm -> ReLU layers that replace the patchify
    convolution (Xiao et al. 2021, "Early convolutions help transformers see better"), through timm's
    `HybridEmbed`, with the same token grid: `patch_size` is still the total stride, a multiple of
    2 ** len(conv_stem). conv_stem_blocks > 1 adds stride-1 layers after each stride-2 one."""

    def __init__(self, model_name: str = "vit_tiny_patch16_224", img_size: int | list[int] | None = None,
                 patch_size: int | None = None, in_chans: int = 3, depth: int | None = None,
                 embed_dim: int | None = None, num_heads: int | None = None, mlp_ratio: float | None = None,
                 num_classes: int = 0, global_pool: str | None = None, class_token: bool | None = None,
                 drop_rate: float = 0.0, drop_path_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 pretrained: bool = False, pretrained_file: str | None = None, keep_cls: bool = False,
                 trainable: bool = True, normalize: bool | None = None, mean: list[float] | None = None,
                 std: list[float] | None = None, dynamic_img_size: bool = False,
                 conv_stem: list[int] | None = None, conv_stem_blocks: int = 1,
                 model_kwargs: dict | None = None):
        super().__init__(in_chans, trainable)
        given = {"img_size": tuple(img_size) if isinstance(img_size, (list, tuple)) else img_size,
                 "patch_size": patch_size, "depth": depth, "embed_dim": embed_dim, "num_heads": num_heads,
                 "mlp_ratio": mlp_ratio, "global_pool": global_pool, "class_token": class_token}
        kwargs = {k: v for k, v in given.items() if v is not None}
        switches = {"drop_path_rate": drop_path_rate, "attn_drop_rate": attn_drop_rate,
                    "dynamic_img_size": dynamic_img_size}
        kwargs.update({k: v for k, v in switches.items() if v})  # passed only when on
        if conv_stem:
            kwargs.update(self._conv_stem_embed(conv_stem, conv_stem_blocks, in_chans, patch_size))
        self.vit = create_timm(model_name, pretrained=pretrained, pretrained_file=pretrained_file,
                               in_chans=in_chans, num_classes=num_classes, drop_rate=drop_rate,
                               **kwargs, **(model_kwargs or {}))
        for attr in ("patch_embed", "blocks", "num_prefix_tokens"):
            if not hasattr(self.vit, attr):
                raise ValueError(f"timm model '{model_name}' is not a VisionTransformer (no {attr})")
        self.out_dim = self.vit.embed_dim
        self.num_prefix_tokens = self.vit.num_prefix_tokens if keep_cls else 0
        self.keep_cls = keep_cls
        cfg = getattr(self.vit, "pretrained_cfg", {}) or {}
        self.finish(normalize, mean, std, cfg.get("mean", (0.5,) * 3), cfg.get("std", (0.5,) * 3),
                    pretrained or bool(pretrained_file))

    @staticmethod
    def _conv_stem_embed(widths: list[int], blocks: int, in_chans: int, patch_size: int | None) -> dict:
        """timm kwargs for a conv stem of len(widths) stride-2 layers in place of the patchify conv."""
        stride = 2 ** len(widths)
        if patch_size is None or patch_size % stride:
            raise ValueError(f"conv_stem of {len(widths)} stride-2 layers needs patch_size to be a multiple of "
                             f"{stride}, got {patch_size}")
        stem = ConvStem(in_chans, channels=list(widths), strides=[2] * len(widths),
                        blocks_per_stage=blocks).body  # [B, C, H/s, W/s]
        # timm's patch_size is now the projection's kernel over the stem's feature map.
        return {"patch_size": patch_size // stride, "embed_layer": partial(HybridEmbed, backbone=stem)}

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid (h, w) for an input of height x width."""
        pe = self.vit.patch_embed
        if getattr(self.vit, "dynamic_img_size", False):
            return tuple(pe.dynamic_feat_size((height, width)))
        return tuple(pe.grid_size)

    @property
    def img_size(self) -> tuple[int, int]:
        return tuple(self.vit.patch_embed.img_size)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        # images [B, C, H, W] -> timm's features [B, prefix + h*w, D] (after the final norm)
        with self._grad_context():
            return self.vit.forward_features(self.prepare(images))

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        # [B, prefix + h*w, D] -> logits [B, num_classes] (timm's pooling, fc_norm and head)
        return self.vit.forward_head(features)

    def forward(self, images: torch.Tensor) -> PatchFeatures:
        # images [B, C, H, W] -> tokens [B, (prefix if keep_cls) + h*w, D], grid (h, w)
        features = self.forward_features(images)
        if not self.keep_cls:
            features = features[:, self.vit.num_prefix_tokens:]
        return PatchFeatures(features, self.grid_for(*images.shape[-2:]))
