"""Pretraining a shared backbone: Fashion-MNIST item classification at every grid cell.

Show, Attend and Tell (Xu et al. 2015, sec. 3.1.1) attends over a pretrained, frozen CNN; our
offline stand-in for ImageNet trains a backbone (any `zoo.backbones` kind) so that EVERY cell of its
h x w grid classifies what lies at its centre (zoo.metrics.localization's cell convention):

    tokens [B, L, D] -> class logits [B, L, 11]  (the 10 Fashion-MNIST classes, or background)
                     -> colour logits [B, L, 8]  (the item's tint; scored on item cells only)

The colour head makes every item cell keep the colour FashionScenes captions name (an item
classifier may discard it); per cell, because the captioner attends over cells. Any family loads the
released weight with `backbone: {kind: stem, pretrained: <release name>, trainable: false}`. Test
numbers (per item: the class from the mean of its cells' logits) are no classifier benchmark.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.backbones.spec import BackboneSpec
from zoo.data.scene_generation import PALETTE
from zoo.guards.errors import UserError
from zoo.metrics.localization import cell_masks
from zoo.models import optim
from zoo.models.base import ClassifierModule
from zoo.models.card import FamilyCard

DEFAULT_BACKBONE = {"kind": "stem", "in_chans": 3, "channels": [32, 64, 128, 128], "strides": [2, 2, 2, 1]}


class ItemGridClassifier(ClassifierModule):
    """images [B, 3, H, W] in [0, 1] -> per-cell class logits [B, L, classes + 1] and colour
    logits [B, L, colours] (see the module docstring). Adam, optional cosine schedule."""

    card = FamilyCard("backbone", progress_bar=("loss", "item_acc"), head_keys=("class_head.",),
                      exports=("class_logits", "colour_logits"),
                      # num_colours left at the palette's size: ItemCanvases paints with all of it
                      tiny={"": dict(backbone={"kind": "stem", "in_chans": 3, "channels": [8], "strides": [4]},
                                     image_size=[16, 16])})

    def __init__(self, backbone: BackboneSpec | None = None, image_size: list[int] = (64, 64),
                 num_classes: int = 10, num_colours: int = 8, colour_weight: float = 1.0,
                 lr: float = 2e-3, weight_decay: float = 0.0, lr_schedule: str = "cosine",
                 class_names: list[str] | None = None):
        super().__init__()
        optim.check_schedule(lr_schedule, "backbone")
        if num_colours < len(PALETTE):  # a colour target past the head would be a traceback mid-epoch
            raise UserError(f"ItemGridClassifier: num_colours {num_colours} is fewer than the {len(PALETTE)} "
                            "colours ItemCanvases paints items with; give at least that many")
        spec = BackboneSpec.coerce(backbone, default=DEFAULT_BACKBONE)
        self.save_hyperparameters()
        self.hparams.image_size = [int(s) for s in image_size]
        self.backbone = spec.build()
        self.backbone_spec = spec
        self.hparams.backbone = spec.to_dict()
        D = self.backbone.out_dim
        self.class_head = nn.Linear(D, num_classes + 1)  # index num_classes: background
        self.colour_head = nn.Linear(D, num_colours)

    def example_batch(self, n: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
        """ItemCanvases' batch form: images, one item box per image (its top-left quarter), class, colour."""
        images, _ = self.example_images(n, seed)
        H, W = self.input_size
        return {"images": images, "boxes": torch.tensor([[[0.0, 0.0, W / 2, H / 2]]] * n),
                "labels": torch.ones(n, 1, dtype=torch.long), "colours": torch.full((n, 1), 2, dtype=torch.long)}

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """images [B, 3, H, W] -> (class logits [B, L, classes + 1], colour logits [B, L, colours], grid)."""
        self.check_images(images)
        tokens, grid = self.backbone(images)
        return self.class_head(tokens), self.colour_head(tokens), tuple(int(g) for g in grid)

    def export_forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, 3, H, W] -> per-cell class and colour logits (the grid is the backbone's)."""
        return self(images)[:2]

    def targets(self, batch: dict, grid, image_size) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per cell: class [B, L] (num_classes = background), colour [B, L] (-1 off items), and the
        item masks [B, K, L] (cells whose centre lies in each item's box)."""
        masks = cell_masks(batch["boxes"], grid, image_size)  # [B, K, L]; empty slots hold no cell
        on_item = masks.any(1)  # [B, L]
        slot = masks.to(torch.uint8).argmax(1)  # [B, L]: the item whose box holds the cell (boxes are disjoint)
        classes = torch.where(on_item, batch["labels"].gather(1, slot), self.hparams.num_classes)
        colours = torch.where(on_item, batch["colours"].gather(1, slot), -1)
        return classes, colours, masks

    def loss_terms(self, batch: dict) -> dict[str, torch.Tensor]:
        """Losses and accuracies of a batch, as tensors (no logging, no host sync)."""
        images = batch["images"]
        class_logits, colour_logits, grid = self(images)
        classes, colours, masks = self.targets(batch, grid, tuple(images.shape[-2:]))
        class_loss = F.cross_entropy(class_logits.flatten(0, 1), classes.flatten())
        on_item = colours >= 0
        colour_loss = F.cross_entropy(colour_logits.flatten(0, 1), colours.flatten(), ignore_index=-1)
        # per item: mean logits over its cells, as a classifier pooled over the item would decide
        weights = masks.to(class_logits.dtype)  # [B, K, L]
        seen = masks.any(-1)  # [B, K]: the items that hold a cell
        pooled = torch.einsum("bkl,blc->bkc", weights, class_logits[..., :self.hparams.num_classes])
        pooled_colour = torch.einsum("bkl,blc->bkc", weights, colour_logits)
        item_right = (pooled.argmax(-1) == batch["labels"]) & seen
        colour_right = (pooled_colour.argmax(-1) == batch["colours"]) & seen
        n_items = seen.sum().clamp(min=1)
        return {"loss": class_loss + self.hparams.colour_weight * colour_loss, "class_loss": class_loss,
                "colour_loss": colour_loss,
                "cell_acc": (class_logits.argmax(-1) == classes).float().mean(),
                "item_cell_acc": ((class_logits.argmax(-1) == classes) & on_item).sum() / on_item.sum().clamp(min=1),
                "item_acc": item_right.sum() / n_items, "colour_acc": colour_right.sum() / n_items}

    def train_loss(self, **batch):
        terms = self.loss_terms(batch)
        return terms["loss"], {name: value.detach() for name, value in terms.items()}

    def eval_metrics(self, stage: str, **batch) -> dict[str, torch.Tensor]:
        terms = self.loss_terms(batch)
        if stage == "test":
            terms["error_pct"] = 100 * (1 - terms["item_acc"])
        return terms
