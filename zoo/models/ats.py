"""Attention sampling (Katharopoulos & Fleuret 2019, "Processing Megapixel Images with Deep
Attention-Sampling Models", ICML, arXiv 1905.03711): a classifier that reads K full-resolution
patches, drawn from an attention distribution computed on a low-resolution view of the image, and
trains end to end by plain backprop through an unbiased estimator (zoo.attention.sampling, whose
labels (S1)-(S6) the comments use).

    v      = V(x, s)                      the image area-averaged to scale s (`view_scale`)
    a      = softmax(f_att(v))            attention network: 'same' convolutions, tanh, over v's h x w cells (S2)
    q      ~ a, K without replacement     Gumbel-top-k (S3); the k-th patch is centred on cell q_k's centre
    f_q    = f_feat(x[patch q])           feature network on each full-resolution P x P patch
    Psi    = sum_k w_k f_{q_k}            the unbiased estimate of E_{I ~ a}[f_I] (S4), gradients (S5)-(S6)
    y      = softmax(W Psi + b)           classifier

Defaults are the authors' Megapixel MNIST model (`scripts/mnist.py` of idiap/attention-sampling):
attention net Conv3x3(8, tanh) -> Conv3x3(8, tanh) -> Conv3x3(1); feature net Conv7x7(32) ->
3 x Conv3x3(32), ReLU, valid padding, global max pooling and L2 normalisation (both of the authors'
feature nets end in it: the paper's minimum-variance result is for normalised features); the
entropy regulariser lambda = 1e-4 and the smoothing (S2) eps = 1e-5. The recipes set the scale,
K and P for each canvas.

Training draws the Gumbel noise in `train_inputs` (named `gumbel`, [B, N] from torch's global
generator), so eager, compiled and CUDA-graphed steps consume one random stream. The loss is the
cross-entropy of the estimate's prediction plus lambda sum_i a_i log a_i (no REINFORCE term).

Evaluation: the authors' layer samples in every mode (whether the paper's test numbers come from
samples is not stated in what could be read). The headline `acc` (and the checkpoint's selection)
here is deterministic: the K most attended cells, in decreasing order, through the same estimator
(Gumbel-top-k with zero noise); `acc_sampled` is one draw from the evaluation generator (seeded
by `eval_seed` at the start of every evaluation epoch).

Its attention record: one step, the attention distribution spread over each cell's pixels
(`record.maps_from_cells`), and the K patches read (the deterministic ones) as boxes, in input pixels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import sampling
from zoo.data.base import as_size
from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.base import ZooModule
from zoo.models.card import CompileHints, FamilyCard, StepCost

TINY = dict(image_size=20, num_classes=4, view_scale=0.25, num_patches=3, patch_size=8, attention_channels=[4],
            feature_channels=[4, 8], feature_kernel_sizes=[3, 3])


class AttentionNetwork(nn.Module):
    """f_att: 'same' k x k convolutions with tanh, then one to a logit per cell.
    view [B, C, h, w] -> logits [B, h w]."""

    def __init__(self, in_chans: int, channels: list[int], kernel_size: int):
        super().__init__()
        layers, width = [], in_chans
        for out in channels:
            layers += [nn.Conv2d(width, out, kernel_size, padding=kernel_size // 2), nn.Tanh()]
            width = out
        layers.append(nn.Conv2d(width, 1, kernel_size, padding=kernel_size // 2))
        self.net = nn.Sequential(*layers)

    def forward(self, view: torch.Tensor) -> torch.Tensor:
        return self.net(view).flatten(1)


class FeatureNetwork(nn.Module):
    """f_feat: valid convolutions with ReLU, global max pooling, optionally L2-normalised.
    patches [M, C, P, P] -> features [M, D] (D = the last width)."""

    def __init__(self, in_chans: int, channels: list[int], kernel_sizes: list[int], normalize: bool):
        super().__init__()
        layers, width = [], in_chans
        for out, k in zip(channels, kernel_sizes):
            layers += [nn.Conv2d(width, out, k), nn.ReLU(inplace=True)]
            width = out
        self.net = nn.Sequential(*layers)
        self.normalize = normalize
        self.out_dim = width

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        features = self.net(patches).amax((-2, -1))
        return F.normalize(features, dim=-1) if self.normalize else features


class ATS(ZooModule):
    """images [B, C, H, W] in [0, 1] -> logits [B, num_classes], from `num_patches` patches."""

    card = FamilyCard(
        "ats", resize="exact", attention="sampling", head_keys=("classifier.",),
        exports=("logits", "attention", "boxes"),
        # not measured by benchmarks/accel.py yet: auto does not compile it on CPU
        compile=CompileHints(cpu_min_steps=None), steps=StepCost("num_patches", once=("attention_net",)),
        dimensions={"num_patches": 100_000, "attention_channels": 16_384, "attention_kernel_size": 1_024,
                    "feature_channels": 16_384, "feature_kernel_sizes": 1_024},
        tiny={"": TINY})

    def __init__(self, image_size: int | list[int] = 60, in_chans: int = 1, num_classes: int = 10,
                 class_names: list[str] | None = None,
                 # attention on the low-resolution view
                 view_scale: float = 0.25, attention_channels: list[int] = (8, 8), attention_kernel_size: int = 3,
                 smooth: float = 1e-5, entropy_weight: float = 1e-4,
                 # sampling and the patches at full resolution
                 num_patches: int = 5, patch_size: int = 24,
                 feature_channels: list[int] = (32, 32, 32, 32), feature_kernel_sizes: list[int] = (7, 3, 3, 3),
                 normalize_features: bool = True,
                 # optimisation
                 lr: float = 1e-3, weight_decay: float = 0.0, lr_schedule: str = "cosine",
                 # evaluation
                 eval_seed: int = 0, num_figures: int = 4):
        super().__init__()
        self.save_hyperparameters()
        optim.check_schedule(lr_schedule, "ATS")
        self.image_hw = as_size(image_size)
        if len(self.image_hw) != 2 or min(self.image_hw) < 1:
            raise UserError(f"ATS: image_size is an int or [H, W] of positive sides, got {image_size}")
        if not 0 < view_scale <= 1:
            raise UserError(f"ATS: view_scale is the low-resolution view's scale, in (0, 1], got {view_scale}")
        if not 0 <= smooth < 1 or entropy_weight < 0:
            raise UserError(f"ATS: smooth must be in [0, 1) and entropy_weight >= 0, got {smooth}, {entropy_weight}")
        if len(feature_channels) != len(feature_kernel_sizes) or not feature_channels or 0 in feature_channels:
            raise UserError("ATS: feature_channels and feature_kernel_sizes are non-empty lists of one length, got "
                            f"{list(feature_channels)}, {list(feature_kernel_sizes)}")
        H, W = self.image_hw
        self.grid = (max(1, round(H * view_scale)), max(1, round(W * view_scale)))  # the view's h x w cells
        cells = self.grid[0] * self.grid[1]
        if not 1 <= num_patches <= cells:
            raise UserError(f"ATS: num_patches must be in 1..{cells} (the {self.grid[0]}x{self.grid[1]} cells of "
                            f"the view at scale {view_scale}), got {num_patches}")
        if patch_size - sum(k - 1 for k in feature_kernel_sizes) < 1:
            raise UserError(f"ATS: a {patch_size} px patch is too small for the feature network's valid "
                            f"convolutions (kernels {list(feature_kernel_sizes)})")
        if attention_kernel_size < 1 or attention_kernel_size % 2 == 0:
            raise UserError(f"ATS: attention_kernel_size must be odd ('same' padding), got {attention_kernel_size}")
        self.attention_net = AttentionNetwork(in_chans, list(attention_channels), attention_kernel_size)
        self.feature_net = FeatureNetwork(in_chans, list(feature_channels), list(feature_kernel_sizes),
                                          normalize_features)
        self.classifier = nn.Linear(self.feature_net.out_dim, num_classes)

    # ------------------------------------------------------------------ the model
    def attention(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, C, H, W] -> (a [B, N], log a [B, N]) over the view's N = h w cells, row-major."""
        view = sampling.downsample(images, self.grid)
        return sampling.attention_distribution(self.attention_net(view), self.hparams.smooth)

    def read(self, images: torch.Tensor, gumbel: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The whole model on images [B, C, H, W]; gumbel [B, N]: the draw (S3), or None for the K
        most attended cells. -> logits [B, classes], a / log_a [B, N], index [B, K] (draw order),
        corners [B, K, 2] (x0, y0 of each patch), expected [B, D] (S4)."""
        self.check_images(images)
        a, log_a = self.attention(images)
        K, P = self.hparams.num_patches, self.hparams.patch_size
        index = sampling.sample_without_replacement(log_a, K, gumbel)
        corners = sampling.patch_corners(index, self.grid, self.image_hw, P)
        patches = sampling.extract_patches(images, corners, P)  # [B, K, C, P, P]
        B = images.shape[0]
        features = self.feature_net(patches.reshape(B * K, *patches.shape[2:])).view(B, K, -1)
        expected = sampling.expected_features(a, index, features)
        return {"logits": self.classifier(expected), "a": a, "log_a": log_a, "index": index, "corners": corners,
                "expected": expected}

    def forward(self, images: torch.Tensor, gumbel: torch.Tensor | None = None) -> torch.Tensor:
        """images [B, C, H, W] -> logits [B, num_classes] (the deterministic read unless `gumbel`)."""
        return self.read(images, gumbel)["logits"]

    def export_forward(self, images: torch.Tensor):
        """images -> (logits [B, classes], attention [B, h, w] (the distribution a over the view's
        cells), boxes [B, K, 4] (x0, y0, x1, y1 pixel edges of the patches read))."""
        out = self.read(images)
        return (out["logits"], out["a"].view(-1, *self.grid),
                sampling.patch_boxes(out["corners"], self.hparams.patch_size))

    # ------------------------------------------------------------------ steps (zoo.models.accel)
    example_batch = ZooModule.labelled_batch

    def draw(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The random draws of one read of `like` [B, ...]: Gumbel noise [B, N] (S3)."""
        return sampling.gumbel_noise((like.shape[0], self.grid[0] * self.grid[1]), like, generator)

    def train_inputs(self, batch):
        images, labels = batch[:2]
        return {"images": images, "labels": labels, "gumbel": self.draw(images)}

    def train_loss(self, images, labels, gumbel):
        out = self.read(images, gumbel)
        ce = F.cross_entropy(out["logits"], labels)
        neg_entropy = sampling.negative_entropy(out["a"], out["log_a"]).mean()
        loss = ce + self.hparams.entropy_weight * neg_entropy
        return loss, {"loss": loss.detach(), "ce": ce.detach(), "acc": _accuracy(out["logits"], labels),
                      "entropy": -neg_entropy.detach()}

    def _generator(self) -> torch.Generator:
        generator = getattr(self, "_eval_generator", None)
        if generator is None or generator.device != self.device:
            self.on_validation_epoch_start()
        return self._eval_generator

    def on_validation_epoch_start(self) -> None:
        self._eval_generator = torch.Generator(device=self.device).manual_seed(self.hparams.eval_seed)

    on_test_epoch_start = on_validation_epoch_start

    def eval_inputs(self, batch, stage):
        images, labels = batch[:2]
        return {"images": images, "labels": labels, "gumbel": self.draw(images, self._generator())}

    def eval_metrics(self, stage, images, labels, gumbel):
        det = self.read(images)
        metrics = {"loss": F.cross_entropy(det["logits"], labels), "acc": _accuracy(det["logits"], labels),
                   "acc_sampled": _accuracy(self(images, gumbel), labels),
                   "entropy": -sampling.negative_entropy(det["a"], det["log_a"]).mean()}
        if stage == "test":
            metrics["error_pct"] = 100 * (1 - metrics["acc"])
        return metrics

    # ------------------------------------------------------------------ where it looked
    @torch.no_grad()
    def attention_record(self, images: torch.Tensor, gumbel: torch.Tensor | None = None):
        """One step: the attention distribution as a pixel map (each cell's mass spread over its
        pixels) and the K patches read as boxes (the deterministic ones unless `gumbel` [B, N])."""
        from zoo.attention import record

        out = self.read(images, gumbel)
        B, K = out["index"].shape
        maps = record.maps_from_cells(out["a"].float().view(B, 1, *self.grid), self.image_hw)
        boxes = sampling.patch_boxes(out["corners"], self.hparams.patch_size).view(B, 1, K, 4)
        probs = out["logits"].float().softmax(-1)
        return record.AttentionRecord(
            family=self.family, kind="sampling", maps=maps, labels=record.step_labels("attention", B, 1),
            step_mask=record.full_mask(B, 1, images.device), boxes=boxes,
            box_labels=[f"patch {k + 1}" for k in range(K)],
            prediction={"probs": probs, "label": probs.argmax(-1), "class_names": self.hparams.class_names})

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.hparams
        return optim.configure(self, self.parameters(), "adam", lr=hp.lr, weight_decay=hp.weight_decay,
                               schedule=hp.lr_schedule)


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) == labels).float().mean()
