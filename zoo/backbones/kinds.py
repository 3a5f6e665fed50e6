"""The backbone kinds (a `BackboneSpec`'s `kind`) and the one way to build one from plain kwargs."""
from __future__ import annotations

from torch import nn

from zoo.backbones.stem import ConvStem
from zoo.backbones.timm_cnn import TimmCNN
from zoo.backbones.timm_vit import TimmViT
from zoo.errors import UserError

BACKBONES = {"stem": ConvStem, "timm_cnn": TimmCNN, "timm_vit": TimmViT}


def build_backbone(kind: str, **kwargs) -> nn.Module:
    """Instantiate the backbone `kind` ("stem", "timm_cnn" or "timm_vit") with plain kwargs."""
    if kind not in BACKBONES:
        raise UserError(f"unknown backbone kind '{kind}'; choose one of {', '.join(BACKBONES)}")
    try:
        return BACKBONES[kind](**kwargs)
    except TypeError as exc:
        raise UserError(f"backbone '{kind}': bad arguments ({exc})") from None
    except ValueError as exc:
        raise UserError(f"backbone '{kind}': {exc}") from None
