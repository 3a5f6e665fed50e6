"""The shared backbone's pretraining: item canvases (splits, painting, determinism), per-cell
targets against a slow reference, a short fit that learns, and the release that a captioner loads
by name."""
from __future__ import annotations

import pytest
import torch
from conftest import structured_images

from zoo.data.item_canvases import ItemCanvasesDataModule
from zoo.data.scene_generation import PALETTE
from zoo.guards.errors import UserError
from zoo.models.item_grid import ItemGridClassifier

SMALL = {"kind": "stem", "in_chans": 3, "channels": [8, 16], "strides": [4, 2]}


def items(split):
    return structured_images(200, 0 if split == "train" else 1)


def make_dm(**kw):
    args = dict(num_train=64, num_val=16, num_test=16, val_items=50, batch_size=16, canvas_size=32,
                item_sizes=[12], max_items=2, item_loader=items)
    return ItemCanvasesDataModule(**{**args, **kw})


def test_canvases_are_deterministic_painted_from_their_split_and_boxes_fit():
    dm = make_dm()
    dm.setup()
    again = make_dm()
    again.setup()
    for split in ("train", "val", "test"):
        a, b = dm.datasets[split], again.datasets[split]
        batch = a.__getitems__(list(range(len(a))))
        assert torch.equal(batch["images"], b.__getitems__(list(range(len(b))))["images"])
    # validation items are train items never used for training canvases; test uses the test source
    train_src = set(dm.datasets["train"].layouts["source_index"].ravel()) - {-1}
    val_src = set(dm.datasets["val"].layouts["source_index"].ravel()) - {-1}
    assert not train_src & val_src and dm.datasets["test"].items is not dm.datasets["train"].items
    batch = dm.datasets["train"].__getitems__([0, 1, 2, 3])
    for i in range(4):
        lay = {k: v[i] for k, v in dm.datasets["train"].layouts.items()}
        for k in range(lay["n_items"]):
            x0, y0, x1, y1 = batch["boxes"][i, k].int().tolist()
            x, y = lay["corners"][k]  # items are resized to 12 px, inside their square
            assert x <= x0 < x1 <= x + 12 and y <= y0 < y1 <= y + 12
            drawn = batch["images"][i, :, y0:y1, x0:x1]
            ratio = drawn.sum((1, 2)) / drawn.sum()  # the tint's share per channel
            tint = torch.tensor(PALETTE[lay["colours"][k]])
            torch.testing.assert_close(ratio, tint / tint.sum(), atol=0.02, rtol=0)
            assert batch["labels"][i, k] == items("train")[1][lay["source_index"][k]]
        assert (batch["labels"][i, lay["n_items"]:] == -1).all()


def test_cell_targets_equal_a_slow_reference():
    model = ItemGridClassifier(backbone=SMALL, image_size=[32, 32])
    dm = make_dm()
    dm.setup()
    batch = dm.datasets["train"].__getitems__(list(range(8)))
    classes, colours, masks = model.targets(batch, (4, 4), (32, 32))
    for b in range(8):
        for r in range(4):
            for c in range(4):
                cx, cy = (c + 0.5) * 8, (r + 0.5) * 8
                want_class, want_colour = 10, -1
                for k in range(batch["boxes"].shape[1]):
                    x0, y0, x1, y1 = batch["boxes"][b, k].tolist()
                    if batch["labels"][b, k] >= 0 and x0 <= cx < x1 and y0 <= cy < y1:
                        want_class, want_colour = int(batch["labels"][b, k]), int(batch["colours"][b, k])
                assert (int(classes[b, r * 4 + c]), int(colours[b, r * 4 + c])) == (want_class, want_colour)


def test_short_fit_learns_and_only_the_backbone_is_released(tmp_path):
    from zoo.backbones import BackboneSpec
    from zoo.weights import hub

    torch.manual_seed(0)
    model = ItemGridClassifier(backbone=SMALL, image_size=[32, 32], lr=5e-3)
    dm = make_dm(num_train=128)
    dm.setup()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    batch = dm.datasets["train"].__getitems__(list(range(64)))
    first = None
    for _ in range(40):
        terms = model.loss_terms(batch)
        first = first if first is not None else float(terms["loss"])
        optimizer.zero_grad()
        terms["loss"].backward()
        optimizer.step()
    assert float(terms["loss"]) < 0.5 * first and float(terms["colour_acc"]) > 0.5  # chance: 1/8
    path = tmp_path / "backbone.safetensors"
    hub.save_release(model, model.zoo_config(), path)
    spec = BackboneSpec.coerce({"kind": "stem", "pretrained": str(path), "trainable": False})
    encoder = spec.build()
    model.eval()
    x = batch["images"][:4]
    assert torch.equal(encoder(x).tokens, model.backbone(x).tokens)
    assert spec.channels == SMALL["channels"]


def test_fewer_colours_than_the_palette_is_one_line():
    with pytest.raises(UserError, match=f"num_colours 3 is fewer than the {len(PALETTE)} colours"):
        ItemGridClassifier(num_colours=3)
    assert ItemGridClassifier(num_colours=len(PALETTE)).colour_head.out_features == len(PALETTE)
