"""Any timm CNN as a grid of feature vectors, at a chosen feature level (e.g. VGG-19 conv5_4, the
Show-Attend-Tell encoder: `model_name="vgg19", level=4` gives 14x14x512 at 224 px)."""
from __future__ import annotations

from zoo.backbones.common import Backbone, create_timm


class TimmCNN(Backbone):
    """timm `features_only` model at feature level `level` (an index into its feature_info; negative
    counts from the end); pretrained / pretrained_file: as `create_timm`."""

    def __init__(self, model_name: str = "resnet18", level: int = -1, in_chans: int = 3,
                 pretrained: bool = False, pretrained_file: str | None = None,
                 trainable: bool = True, normalize: bool | None = None, mean: list[float] | None = None,
                 std: list[float] | None = None, model_kwargs: dict | None = None):
        super().__init__(in_chans, trainable)
        self.net = create_timm(model_name, pretrained=pretrained, pretrained_file=pretrained_file,
                               features_only=True, out_indices=(level,), in_chans=in_chans,
                               **(model_kwargs or {}))
        self.out_dim = self.net.feature_info.channels()[-1]
        self.stride = self.net.feature_info.reduction()[-1]
        cfg = getattr(self.net, "pretrained_cfg", {}) or {}
        self.finish(normalize, mean, std, cfg.get("mean", (0.485, 0.456, 0.406)), cfg.get("std", (0.229, 0.224, 0.225)),
                    pretrained or bool(pretrained_file))

    def features(self, x):
        return self.net(x)[-1]  # [B, D, h, w] with h = H / reduction
