"""Spatial Transformer Networks (Jaderberg, Simonyan, Zisserman, Kavukcuoglu 2015, arXiv 1506.02025):
a classifier that first warps its input into a small patch where the item is, with a transform it
predicts itself and learns by plain backprop (the sampler is differentiable).

    theta = f_loc(x)                      localisation network -> an affine transform [2, 3]
    patch = sample(x, theta)              eqs. 1 and 5-7 (zoo.attention.affine): a patch_size^2 grid
    y     = softmax(f_cls(patch))         a CNN on the transformed patch (the paper's ST-CNN)

- The localisation net starts at the identity (sec. 4.2: zero weights, bias [1, 0, 0, 0, 1, 0]).
  The default patch (20 px; the paper's is 30 for a 60 px canvas) blurs a 28 px item seen whole, so
  zooming in pays from the start, which our short CPU budget (13k steps against 150k) needs.
- `transform`: "affine" (six parameters, ST-CNN Aff) or "attention" (A = [[s, 0, tx], [0, s, ty]],
  sec. 3.1: the sampled region stays a square box).
- `num_glimpses` > 1: the recurrent spatial transformer (Sonderby et al. 2015, arXiv 1509.05329), a
  GRU over the localisation features giving a transform per glimpse; the class is read from the
  mean of the glimpses' patch features.
- `loc_lr_scale`: the localisation net's learning rate over `lr` (the paper: 0.1 on SVHN; 1 here:
  at 0.1 the grid did not move in short runs).
The attention record: per glimpse the sampled region's bounding box and its footprint over the
input (zoo.attention.affine.footprint); a grid wholly off the canvas maps to zeros, reported degenerate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import affine
from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.base import ClassifierModule
from zoo.models.card import CompileHints, FamilyCard, StepCost

TRANSFORMS = {"affine": affine.IDENTITY, "attention": affine.ATTENTION_IDENTITY}
TINY = dict(image_size=20, num_classes=4, patch_size=10, loc_channels=[4, 4], loc_kernel_size=3, loc_hidden=8,
            cnn_channels=[4, 8], cnn_kernel_sizes=[3, 3], cnn_hidden=16)


def conv_stack(in_chans: int, channels: list[int], kernel_sizes: list[int]) -> nn.Sequential:
    """[conv k x k (valid) -> ReLU -> max-pool 2] per stage (the paper's CNNs)."""
    layers: list[nn.Module] = []
    for width, k in zip(channels, kernel_sizes):
        layers += [nn.Conv2d(in_chans, width, k), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        in_chans = width
    return nn.Sequential(*layers, nn.Flatten())


def _flat_size(net: nn.Module, chans: int, side: int) -> int:
    with torch.no_grad():
        return int(net(torch.zeros(1, chans, side, side)).shape[1])


class STN(ClassifierModule):
    """images [B, C, H, W] in [0, 1] -> logits [B, num_classes], through `num_glimpses` patches."""

    card = FamilyCard(
        "stn", resize="exact", attention="transform", head_keys=("head.",), exports=("logits", "theta"),
        # CPU: compiled steps run at 0.73x eager (benchmarks/accel.py): auto never compiles it there
        compile=CompileHints(cpu_min_steps=None), bench_recipes=("stn_fmnist_cluttered60",),
        steps=StepCost("num_glimpses", once=("loc",)),
        tiny={"": TINY, "attention_recurrent": {**TINY, "transform": "attention", "num_glimpses": 2, "rnn_hidden": 8}},
        dimensions={"patch_size": 1024, "loc_channels": 16384, "loc_hidden": 16384, "rnn_hidden": 16384,
                    "cnn_channels": 16384, "cnn_hidden": 16384, "num_glimpses": 64})

    def __init__(self, image_size: int = 60, in_chans: int = 1, num_classes: int = 10,
                 class_names: list[str] | None = None,
                 # the transformer
                 transform: str = "affine", patch_size: int = 20, num_glimpses: int = 1,
                 loc_downsample: int = 2, loc_channels: list[int] = (20, 20), loc_kernel_size: int = 5,
                 loc_hidden: int = 20, rnn_hidden: int = 256,
                 # the classifier on the patch
                 cnn_channels: list[int] = (32, 64), cnn_kernel_sizes: list[int] = (5, 3), cnn_hidden: int = 256,
                 dropout: float = 0.0,
                 # optimisation
                 lr: float = 1e-3, loc_lr_scale: float = 1.0, weight_decay: float = 0.0, lr_schedule: str = "cosine",
                 num_figures: int = 4):
        super().__init__()
        self.save_hyperparameters()
        optim.check_schedule(lr_schedule, "STN")
        if transform not in TRANSFORMS:
            raise UserError(f"STN: transform must be one of {', '.join(TRANSFORMS)}, got {transform!r}")
        if num_glimpses < 1 or loc_downsample < 1 or len(cnn_channels) != len(cnn_kernel_sizes):
            raise UserError("STN: num_glimpses and loc_downsample are >= 1, and cnn_channels and cnn_kernel_sizes "
                            f"of one length, got {num_glimpses}, {loc_downsample}, {cnn_channels}, {cnn_kernel_sizes}")
        loc_convs = conv_stack(in_chans, list(loc_channels), [loc_kernel_size] * len(loc_channels))
        trunk = conv_stack(in_chans, list(cnn_channels), list(cnn_kernel_sizes))
        try:  # the paper's stacks: ST-CNN's localisation net on the input at 1 / loc_downsample
            loc_features = _flat_size(loc_convs, in_chans, image_size // loc_downsample)
            patch_features = _flat_size(trunk, in_chans, patch_size)
        except RuntimeError:
            raise UserError(f"STN: a {image_size} px image (localised at 1/{loc_downsample}) or a {patch_size} px "
                            "patch is too small for its convolutions and poolings") from None
        self.loc = nn.Sequential(nn.AvgPool2d(loc_downsample), loc_convs, nn.Linear(loc_features, loc_hidden),
                                 nn.ReLU(inplace=True))
        self.core = nn.GRUCell(loc_hidden, rnn_hidden) if num_glimpses > 1 else None
        self.where = nn.Linear(rnn_hidden if self.core is not None else loc_hidden, len(TRANSFORMS[transform]))
        nn.init.zeros_(self.where.weight)  # the identity transform at first (sec. 4.2)
        with torch.no_grad():
            self.where.bias.copy_(torch.tensor(TRANSFORMS[transform]))
        self.sampler = affine.AffineSampler(patch_size)
        self.trunk = nn.Sequential(trunk, nn.Linear(patch_features, cnn_hidden), nn.ReLU(inplace=True),
                                   nn.Dropout(dropout))
        self.head = nn.Linear(cnn_hidden, num_classes)

    def transforms(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] -> theta [B, T, 2, 3], one transform per glimpse."""
        features = self.loc(images)  # [B, loc_hidden]
        if self.core is None:
            params = self.where(features)[:, None]  # [B, 1, 6 or 3]
        else:
            h, steps = features.new_zeros(features.shape[0], self.core.hidden_size), []
            for _ in range(self.hparams.num_glimpses):  # Sonderby et al.: the same features, a new state
                h = self.core(features, h)
                steps.append(self.where(h))
            params = torch.stack(steps, 1)  # [B, T, 6 or 3]
        if self.hparams.transform == "attention":
            return affine.attention_theta(params)
        return params.view(*params.shape[:2], 2, 3)

    def forward(self, images: torch.Tensor, theta: torch.Tensor | None = None) -> torch.Tensor:
        """images [B, C, H, W] -> logits [B, num_classes] (theta [B, T, 2, 3]: given, or predicted)."""
        self.check_images(images)
        theta = self.transforms(images) if theta is None else theta
        B, T = theta.shape[:2]
        patches = self.sampler(images if T == 1 else images.repeat_interleave(T, 0), theta.flatten(0, 1))  # [B T, C, P, P]
        return self.head(self.trunk(patches).view(B, T, -1).mean(1))

    def export_forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, C, H, W] -> (logits [B, classes], theta [B, T, 2, 3]: where each glimpse sampled)."""
        self.check_images(images)
        theta = self.transforms(images)
        return self(images, theta), theta

    @torch.no_grad()
    def attention_record(self, images: torch.Tensor):
        """One step per glimpse: the sampled region's footprint as the map, its bounding box as the box."""
        from zoo.attention import record

        self.check_images(images)
        theta = self.transforms(images)  # [B, T, 2, 3]
        B, T = theta.shape[:2]
        size = self.input_size
        cover = affine.footprint(theta.flatten(0, 1).float(), size)  # [B T, H, W]
        total = cover.flatten(1).sum(1).clamp_min(1e-30)[:, None, None]
        maps = (cover / total).view(B, T, *size)  # a grid wholly off the canvas stays all zero: degenerate
        boxes = affine.bounding_box(affine.outline(theta.flatten(0, 1).float(), size)).view(B, T, 1, 4)
        probs = self(images, theta).float().softmax(-1)
        return record.AttentionRecord(
            family=self.family, kind="transform", maps=maps, labels=record.step_labels("glimpse", B, T),
            step_mask=record.full_mask(B, T, images.device), boxes=boxes, box_labels=["grid"],
            prediction={"probs": probs, "label": probs.argmax(-1), "class_names": self.hparams.class_names})

    def configure_optimizers(self):
        hp = self.hparams
        located = [p for m in (self.loc, self.core, self.where) if m is not None for p in m.parameters()]
        ids = {id(p) for p in located}
        groups = [{"params": [p for p in self.parameters() if id(p) not in ids]},
                  {"params": located, "lr": hp.lr * hp.loc_lr_scale}]
        return optim.configure(self, groups, "adam", lr=hp.lr, weight_decay=hp.weight_decay, schedule=hp.lr_schedule)
