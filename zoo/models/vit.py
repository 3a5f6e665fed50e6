"""Vision Transformer classifier (Dosovitskiy et al. 2021) over the zoo's timm ViT backbone.

The trunk is a `backbone:` block of kind `timm_vit` (zoo.backbones.spec), the object a captioner
uses as its encoder; here timm's pooling and head turn its features into logits. Any timm ViT
variant is accepted by name, with `patch_size`, `depth`, ... overriding it; `backbone.conv_stem`
swaps the patchify convolution for a small conv stem (Xiao et al. 2021). Training for small data:
AdamW (no weight decay on biases, norms, position embeddings and the cls token), linear warm-up
then cosine decay per step, label smoothing, stochastic depth and batch augmentation
(`zoo.data.augment`); `bf16` autocast (where the device computes bf16: `CPU_BF16`) and
`channels_last` for speed. Pretrained weights: the zoo's
release (`zoo.create_model("vit_fmnist", pretrained=True)`), `backbone.pretrained_file: PATH` (any
timm ViT checkpoint, adapted by timm), `backbone.pretrained: true` (timm's hub) or a zoo release's
trunk (`backbone.pretrained: NAME`).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info

from zoo.backbones.spec import BackboneSpec
from zoo.data.augment import BatchAugment, mixup
from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.base import ClassifierModule
from zoo.models.card import FamilyCard


#: the trunk a ViT classifier takes when its recipe gives no `backbone:` block
DEFAULT_BACKBONE = {"kind": "timm_vit", "model_name": "vit_tiny_patch16_224", "patch_size": 4, "depth": 6,
                    "embed_dim": 96, "num_heads": 3, "mlp_ratio": 2.0, "drop_path_rate": 0.1}
TINY = dict(backbone={"kind": "timm_vit", "model_name": "vit_tiny_patch16_224", "patch_size": 7, "depth": 2,
                      "embed_dim": 24, "num_heads": 2, "mlp_ratio": 2.0, "drop_path_rate": 0.0})
#: whether this CPU computes bf16 (oneDNN's kernels: AVX512-BF16 or AMX). Without them CPU autocast
#: emulates bf16 and is far slower than fp32 (ViT-B/16 at 224 px, batch 2, one forward and backward
#: on an AVX2 core: 140 s against 4.5 s), so `bf16` autocasts on such a CPU only when this is true.
CPU_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class ViTClassifier(ClassifierModule):
    """images [B, in_chans, H, W] in [0, 1] -> logits [B, num_classes]; evaluated as every
    ClassifierModule, trained with its own loss and optimiser (the module docstring)."""

    card = FamilyCard(
        "vit", attention="rollout", head_keys=("backbone.vit.head.",), bench_recipes=("vit_fmnist",),
        tiny={"": TINY, "augment_mixup": {**TINY, "translate": 2, "hflip": 0.5, "erase": 0.5, "mixup_alpha": 0.4}})

    def __init__(self, backbone: BackboneSpec | None = None, image_size: int | list[int] = 28, in_chans: int = 1,
                 num_classes: int = 10,
                 # optimisation
                 lr: float = 1e-3, weight_decay: float = 0.05, betas: list[float] = (0.9, 0.999),
                 warmup_epochs: float = 2.0, min_lr: float = 1e-5, label_smoothing: float = 0.1,
                 # batch augmentation (training only)
                 translate: int = 0, hflip: float = 0.0, erase: float = 0.0, erase_area: float = 0.1,
                 mixup_alpha: float = 0.0,
                 # speed
                 bf16: bool = False, channels_last: bool = False,
                 # figures
                 class_names: list[str] | None = None, num_figures: int = 4):
        super().__init__()
        spec = BackboneSpec.coerce(backbone, default=DEFAULT_BACKBONE)
        if spec.kind != "timm_vit":
            raise UserError(f"ViT: the backbone must be of kind timm_vit, got {spec.kind!r}")
        self.save_hyperparameters()
        # the model's facts the trunk takes; timm's pooling and head turn its features into logits
        self.backbone = spec.build(img_size=image_size, in_chans=in_chans, num_classes=num_classes)
        self.backbone_spec = spec
        self.hparams.backbone = spec.to_dict()
        self.augment = BatchAugment(translate, hflip, erase, erase_area)

    @property
    def vit(self):
        """The timm VisionTransformer inside."""
        return self.backbone.vit

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.hparams.channels_last:
            self.to(memory_format=torch.channels_last)
        if self.hparams.bf16 and not CPU_BF16 and self._trainer and self.trainer.strategy.root_device.type == "cpu":
            rank_zero_info("bf16: this CPU has no bf16 kernels (AVX512-BF16 or AMX): autocast is off, steps run fp32")

    def _autocast(self, device: torch.device) -> bool:
        return self.hparams.bf16 and (device.type != "cpu" or CPU_BF16)

    @property
    def input_size(self) -> tuple[int, int]:
        return tuple(self.backbone.img_size)  # as timm resolved it

    def takes_any_image_size(self) -> bool:
        return getattr(self.vit, "dynamic_img_size", False)

    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        # images [B, C, H, W] -> logits [B, num_classes]
        return self.backbone.forward_head(self.backbone.forward_features(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.check_images(images)
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        # entered only when on: a disabled autocast still leaves a node that torch.export cannot save
        autocast = torch.autocast(images.device.type, dtype=torch.bfloat16) if self._autocast(images.device) \
            else nullcontext()
        with autocast:
            logits = self._logits(images)
        return logits.float()

    def train_inputs(self, batch):
        """Augmented images and labels, with mixup's partner labels and weight when it is on."""
        images, labels = batch
        images = self.augment(images)
        if self.hparams.mixup_alpha > 0:
            images, labels, partner, lam = mixup(images, labels, self.hparams.mixup_alpha)
            return {"images": images, "labels": labels, "partner": partner, "lam": lam}
        return {"images": images, "labels": labels}

    def train_loss(self, images, labels, partner=None, lam=None):
        smoothing = self.hparams.label_smoothing
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
        if partner is not None:  # mixup: both images' labels, weighted as their pixels are
            loss = lam * loss + (1 - lam) * F.cross_entropy(logits, partner, label_smoothing=smoothing)
        return loss, {"loss": loss.detach(), "acc": (logits.argmax(-1) == labels).float().mean()}

    def parameter_groups(self) -> list[dict]:
        """AdamW groups: weight decay only on matrices, not on biases, norms, position embeddings
        and prefix tokens (timm's `no_weight_decay`)."""
        skip = {f"backbone.vit.{n}" for n in getattr(self.vit, "no_weight_decay", lambda: set())()}
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
        return [{"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def configure_optimizers(self):
        hp = self.hparams
        return optim.configure(self, self.parameter_groups(), "adamw", lr=hp.lr, betas=hp.betas,
                               schedule="warmup_cosine", warmup_epochs=hp.warmup_epochs, min_lr=hp.min_lr)

    @torch.no_grad()
    def attention_maps(self, images: torch.Tensor, head_fusion: str = "mean", residual: float = 0.5) -> dict:
        """images [B, C, H, W] in [0, 1] -> {"logits" [B, K], "attention" [layers, B, heads, N, N],
        "layers" [layers, B, heads, h, w] (CLS to patches), "last" [B, heads, h, w] (the last
        layer's), "rollout" [B, h, w]}."""
        from zoo.attention import rollout as maps

        self.check_images(images)
        vit = self.vit
        cls_index = 0 if getattr(vit, "cls_token", None) is not None else None
        with maps.record_attention(vit) as recorded:
            logits = self._logits(images).float()
        attention = torch.stack(recorded).float()
        grid = self.backbone.grid_for(*images.shape[-2:])
        layers = maps.cls_attention(attention, vit.num_prefix_tokens, grid, cls_index)
        joint = maps.rollout(attention, head_fusion=head_fusion, residual=residual)
        return {"logits": logits, "attention": attention, "layers": layers, "last": layers[-1],
                "rollout": maps.rollout_map(joint, vit.num_prefix_tokens, grid, cls_index)}

    @torch.no_grad()
    def attention_record(self, images: torch.Tensor, heads: bool = False, head_fusion: str = "mean",
                         residual: float = 0.5):
        """One step per layer (the CLS token's attention to the patches, heads averaged), with `heads`
        one per head of the last layer, and the rollout last (Abnar & Zuidema 2020; `head_fusion`,
        `residual`: zoo.attention.rollout); each map renormalised without the prefix tokens."""
        from zoo.attention import record

        if head_fusion not in ("mean", "max", "min") or not 0 <= residual < 1:
            raise ValueError(f"head_fusion must be mean, max or min and residual in [0, 1), got {head_fusion!r}, "
                             f"{residual!r}")
        out = self.attention_maps(images, head_fusion, residual)
        layers = out["layers"].mean(2).transpose(0, 1)  # [B, layers, h, w]
        last = out["last"] if heads else layers[:, :0]  # [B, heads, h, w]
        cells = torch.cat([layers, last, out["rollout"][:, None]], 1)
        cells = cells / cells.sum((-2, -1), keepdim=True).clamp_min(1e-30)
        B, T = cells.shape[:2]
        step_labels = ([f"layer {t + 1}" for t in range(layers.shape[1])]
                       + [f"head {k + 1}" for k in range(last.shape[1])] + ["rollout"])
        probs = out["logits"].softmax(-1)
        return record.AttentionRecord(
            family=self.family, kind="rollout", maps=record.maps_from_cells(cells, tuple(images.shape[-2:])),
            labels=[list(step_labels) for _ in range(B)], step_mask=record.full_mask(B, T, images.device), headline="last",
            prediction={"probs": probs, "label": probs.argmax(-1), "class_names": self.hparams.class_names})
