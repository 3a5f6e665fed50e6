"""Any timm CNN as a grid of feature vectors, at a chosen feature level (e.g. VGG-19 conv5_4, the
Show-Attend-Tell encoder: `model_name="vgg19", level=4` gives 14x14x512 at 224 px)."""
from __future__ import annotations

from zoo.backbones.common import Frozen, PatchFeatures, create_timm, freeze, match_channels, register_normalization


class TimmCNN(Frozen):
    """timm `features_only` model at feature level `level` (an index into its feature_info;
    negative counts from the end).

    pretrained: timm's hub weights; pretrained_file: a local checkpoint instead (offline use).
    normalize: apply `mean`/`std` (given, or the pretrained weights' own) to inputs in [0, 1];
    None means "when pretrained or when mean/std are given". trainable=False freezes the weights
    and keeps BatchNorm in eval mode."""

    def __init__(self, model_name: str = "resnet18", level: int = -1, in_chans: int = 3,
                 pretrained: bool = False, pretrained_file: str | None = None,
                 trainable: bool = True, normalize: bool | None = None, mean: list[float] | None = None,
                 std: list[float] | None = None, model_kwargs: dict | None = None):
        super().__init__()
        self.net = create_timm(model_name, pretrained=pretrained, pretrained_file=pretrained_file,
                               features_only=True, out_indices=(level,), in_chans=in_chans,
                               **(model_kwargs or {}))
        self.in_chans = in_chans
        self.out_dim = self.net.feature_info.channels()[-1]
        self.reduction = self.stride = self.net.feature_info.reduction()[-1]
        pretrained_any = pretrained or bool(pretrained_file)
        self.normalize = (pretrained_any or mean is not None or std is not None) if normalize is None else normalize
        cfg = getattr(self.net, "pretrained_cfg", {}) or {}
        register_normalization(self, mean if mean is not None else cfg.get("mean", (0.485, 0.456, 0.406)),
                               std if std is not None else cfg.get("std", (0.229, 0.224, 0.225)), in_chans)
        self.trainable = trainable
        if not trainable:
            freeze(self)
            self.eval()

    def forward(self, images):
        # images [B, C, H, W] in [0, 1] -> tokens [B, h*w, D], grid (h, w) with h = H / reduction
        x = match_channels(images, self.in_chans)
        if self.normalize:
            x = (x - self.mean) / self.std
        with self._grad_context():
            feats = self.net(x)[-1]  # [B, D, h, w]
        return PatchFeatures(feats.flatten(2).transpose(1, 2), tuple(feats.shape[-2:]))
