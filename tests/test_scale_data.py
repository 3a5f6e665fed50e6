"""The scale family of cluttered canvases (zoo.data.cluttered_scale) and Megapixel Fashion
(zoo.data.megapixel), on the tests' tiny Fashion-MNIST: canvases painted per index equal a slow
per-canvas reference and do not depend on the batch, the loader's workers or the split's size;
train, val and test items never cross; the item boxes hold the items; the clutter keeps
cluttered60's density; nothing holds a split's canvases; the batch is painted by a loop over
pasting slots, never over canvases."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from zoo.data import cluttered_scale as cs, megapixel as mp
from zoo.data.cluttered_scale import ClutteredScaleDataModule
from zoo.data.fashion_mnist import ITEM_SIZE, PATCH, load_fashion_mnist
from zoo.data.megapixel import MegapixelFashionDataModule
from zoo.guards.errors import UserError

SMALL = dict(val_size=100, batch_size=8)  # the tiny Fashion-MNIST's 600 train items: 100 of them for val


def _scale(**kwargs) -> ClutteredScaleDataModule:
    dm = ClutteredScaleDataModule(**{**SMALL, **kwargs})
    dm.setup()
    return dm


def _mega(**kwargs) -> MegapixelFashionDataModule:
    dm = MegapixelFashionDataModule(**{**SMALL, "canvas_size": 200, "num_train": 32, "num_val": 8, "num_test": 16,
                                       **kwargs})
    dm.setup()
    return dm


def _find(crop: np.ndarray, items: np.ndarray) -> int:
    """The index of the 28x28 `crop` in items [N, 28, 28] (-1: none equal)."""
    hits = np.flatnonzero((items == crop).all((1, 2)))
    return int(hits[0]) if len(hits) else -1


# ----------------------------------------------------------------------------- the scale family
def test_distractors_keep_cluttered60s_density_per_area():
    assert {s: cs.distractors_for(s) for s in (60, 100, 200, 400)} == {60: 4, 100: 11, 200: 44, 400: 178}
    assert all(cs.distractors_for(s) == round(4 * s * s / 3600) for s in range(28, 1000, 7))


def _reference_scale(dm: ClutteredScaleDataModule, split: str, index: int) -> np.ndarray:
    """Canvas `index` of `split` painted alone, pixel by pixel, from the same draws of its RNG."""
    data = dm.datasets[split]
    painter, size, k = data.painter, dm.hparams.canvas_size, dm.distractors
    high = [size - ITEM_SIZE + 1] * 2 + [len(painter.items), ITEM_SIZE - PATCH + 1, ITEM_SIZE - PATCH + 1,
                                          size - PATCH + 1, size - PATCH + 1] * k
    draws = data.rng(index).integers(0, np.array(high))
    canvas = np.zeros((size, size), np.uint8)
    top, left = draws[:2]
    canvas[top:top + ITEM_SIZE, left:left + ITEM_SIZE] = painter.items[index]
    for which, cy, cx, py, px in draws[2:].reshape(k, 5):
        crop = painter.items[which][cy:cy + PATCH, cx:cx + PATCH]
        for y in range(PATCH):
            for x in range(PATCH):
                canvas[py + y, px + x] = max(canvas[py + y, px + x], crop[y, x])
    return canvas


@pytest.mark.parametrize("size", [60, 200])
def test_scale_canvases_equal_a_per_canvas_reference_whatever_the_batch(tiny_data, size):
    dm = _scale(canvas_size=size)
    for split in ("train", "test"):
        images, labels = dm.datasets[split].__getitems__([5, 0, 3])
        for row, index in enumerate([5, 0, 3]):
            np.testing.assert_array_equal(images[row, 0].numpy(), _reference_scale(dm, split, index))
        assert torch.equal(labels, torch.from_numpy(dm.datasets[split].painter.labels[[5, 0, 3]]))
        alone, _ = dm.datasets[split].__getitems__([3])
        assert torch.equal(alone[0], images[2])  # canvas 3 is canvas 3 in any batch


def test_canvases_are_fixed_by_split_index_and_seed_and_the_test_set_by_test_seed(tiny_data):
    a, b, other = _scale(canvas_size=60), _scale(canvas_size=60, limit_train=7), _scale(canvas_size=60, seed=1)
    first = lambda dm, split: dm.datasets[split].__getitems__(list(range(7)))[0]  # noqa: E731
    assert torch.equal(first(a, "train"), first(b, "train"))  # the split's size changes no canvas
    assert not torch.equal(first(a, "train"), first(other, "train"))
    assert not torch.equal(first(a, "val"), first(other, "val"))
    assert torch.equal(first(a, "test"), first(other, "test"))  # one test set whatever the training seed
    assert not torch.equal(first(a, "test"), first(_scale(canvas_size=60, test_seed=5), "test"))
    assert len(b.datasets["train"]) == 7 and len(a.datasets["train"]) == 500 and len(a.datasets["test"]) == 200


def test_train_val_and_test_canvases_show_their_own_splits_items(tiny_data):
    dm = _scale(canvas_size=60, distractors=0, with_boxes=True)
    train_x, _ = load_fashion_mnist("train")
    test_x, _ = load_fashion_mnist("test")
    val_items = dm.datasets["val"].painter.items
    found = {}
    for split in ("train", "val", "test"):
        images, labels, boxes = dm.datasets[split].__getitems__(list(range(40)))
        crops = [images[i, 0, int(y0):int(y1), int(x0):int(x1)].numpy() for i, (x0, y0, x1, y1) in enumerate(boxes)]
        found[split] = [(_find(c, train_x.numpy()), _find(c, test_x.numpy()), _find(c, val_items)) for c in crops]
    assert all(tr >= 0 and te < 0 and va < 0 for tr, te, va in found["train"])
    assert all(tr >= 0 and te < 0 and va >= 0 for tr, te, va in found["val"])
    assert all(tr < 0 and te >= 0 for tr, te, _ in found["test"])


def test_the_box_holds_the_item_and_nothing_else_is_drawn_without_distractors(tiny_data):
    dm = _scale(canvas_size=100, distractors=0, with_boxes=True)
    images, labels, boxes = dm.datasets["train"].__getitems__(list(range(16)))
    assert boxes.shape == (16, 4) and images.dtype == torch.uint8
    for i, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
        assert x1 - x0 == y1 - y0 == ITEM_SIZE and 0 <= x0 and x1 <= 100 and 0 <= y0 and y1 <= 100
        np.testing.assert_array_equal(images[i, 0, y0:y1, x0:x1].numpy(), dm.datasets["train"].painter.items[i])
        outside = images[i, 0].clone()
        outside[y0:y1, x0:x1] = 0
        assert not outside.any()
    cluttered = _scale(canvas_size=100, with_boxes=True).datasets["train"].__getitems__(list(range(16)))
    for i, (x0, y0, x1, y1) in enumerate(cluttered[2].long().tolist()):  # distractors paste by pixel max
        assert (cluttered[0][i, 0, y0:y1, x0:x1] >= images[i, 0, y0:y1, x0:x1]).all()


def test_clutter_covers_the_same_share_of_the_canvas_at_every_side(tiny_data):
    """The tiny items are nonzero everywhere, so a distractor is a solid 8x8 square: K squares at
    random places cover about 1 - (1 - 64 / S^2)^K of the canvas, the same at every side when K
    grows with the area (edge effects aside)."""
    shares = {}
    for size in (60, 200):
        dm = _scale(canvas_size=size, with_boxes=True)
        images, _, boxes = dm.datasets["train"].__getitems__(list(range(64 if size == 60 else 16)))
        outside = torch.ones_like(images[:, 0], dtype=torch.bool)
        for i, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
            outside[i, y0:y1, x0:x1] = False
        shares[size] = ((images[:, 0] > 0) & outside).sum().item() / outside.sum().item()
    expected = 1 - (1 - PATCH ** 2 / 60 ** 2) ** 4
    assert all(0.75 * expected < share < 1.1 * expected for share in shares.values()), (shares, expected)
    assert abs(shares[60] - shares[200]) < 0.25 * expected, shares


# ----------------------------------------------------------------------------- Megapixel Fashion
def test_megapixel_canvases_hold_three_items_of_the_label_and_two_of_others(tiny_data):
    dm = _mega(noise_patches=0, with_boxes=True)
    data = dm.datasets["train"]
    images, labels, boxes = data.__getitems__(list(range(12)))
    assert images.shape == (12, 1, 200, 200) and boxes.shape == (12, 3, 4)
    painter = data.painter
    for i in range(12):
        draws = painter._draw(data.rng(i))
        sources = draws[1:6]
        assert draws[0] == labels[i] and (painter.labels[sources[:3]] == labels[i].item()).all()
        assert (painter.labels[sources[3:]] != labels[i].item()).all()
        for (x0, y0, x1, y1), source in zip(boxes[i].long().tolist(), sources[:3]):
            np.testing.assert_array_equal(images[i, 0, y0:y1, x0:x1].numpy(), painter.items[source])
        drawn = (images[i, 0] > 0).sum().item()
        assert drawn == sum((painter.items[s] > 0).sum() for s in sources)  # five items, apart, nothing else


def test_megapixel_noise_covers_items_by_assignment_in_order_as_the_reference_code(tiny_data):
    dm = _mega(with_boxes=True)
    data = dm.datasets["test"]
    painter = data.painter
    images, labels, _ = data.__getitems__([4, 1])
    for row, index in enumerate([4, 1]):
        draws = painter._draw(data.rng(index))
        canvas = np.zeros((200, 200), np.uint8)
        for source, (x, y) in zip(draws[1:6], draws[6:16].reshape(5, 2)):
            canvas[y:y + ITEM_SIZE, x:x + ITEM_SIZE] = painter.items[source]
        for pattern, (top, left) in zip(draws[16:66], draws[66:].reshape(50, 2)):
            assert ITEM_SIZE <= top < 200 - ITEM_SIZE and ITEM_SIZE <= left < 200 - ITEM_SIZE
            canvas[top:top + ITEM_SIZE, left:left + ITEM_SIZE] = painter.patterns[pattern]
        np.testing.assert_array_equal(images[row, 0].numpy(), canvas)


def test_megapixel_noise_patterns_are_fixed_pairs_of_lines(tiny_data):
    patterns = mp.noise_patterns(np.random.default_rng([1234, mp.NOISE_CODE]))
    assert patterns.shape == (50, 28, 28) and patterns.dtype == np.uint8
    lit = patterns[patterns > 0]
    assert lit.min() >= int(0.8 * 255) - 1  # each line pixel is scaled by U(0.8, 1)
    assert ((patterns > 0).sum((1, 2)) >= ITEM_SIZE).all()  # a line crosses the whole pattern
    np.testing.assert_array_equal(patterns, mp.noise_patterns(np.random.default_rng([1234, mp.NOISE_CODE])))
    a, b = _mega(seed=0), _mega(seed=3)
    assert np.array_equal(a.datasets["train"].painter.patterns, b.datasets["test"].painter.patterns)


def test_megapixel_splits_draw_their_own_items_and_the_test_set_is_fixed(tiny_data):
    dm, other = _mega(noise_patches=0), _mega(noise_patches=0, seed=7, num_test=3)
    test_x, _ = load_fashion_mnist("test")
    train_items = dm.datasets["train"].painter.items
    for split, inside, outside in (("train", train_items, test_x.numpy()), ("test", test_x.numpy(), train_items)):
        data = dm.datasets[split]
        images, _ = data.__getitems__(list(range(4)))
        for i in range(4):
            draws = data.painter._draw(data.rng(i))
            for x, y in draws[6:16].reshape(5, 2):
                crop = images[i, 0, y:y + ITEM_SIZE, x:x + ITEM_SIZE].numpy()
                assert _find(crop, inside) >= 0 and _find(crop, outside) < 0
    train_x = load_fashion_mnist("train")[0].numpy()
    val_items = dm.datasets["val"].painter.items
    assert all(_find(item, train_x) >= 0 and _find(item, train_items) < 0 for item in val_items)
    first = lambda d, split: d.datasets[split].__getitems__([0, 1, 2])[0]  # noqa: E731
    assert torch.equal(first(dm, "test"), first(other, "test"))
    assert not torch.equal(first(dm, "train"), first(other, "train"))


def test_megapixel_served_smaller_is_the_canvas_area_mean_and_its_boxes_scale(tiny_data):
    full, small = _mega(with_boxes=True), _mega(with_boxes=True, image_size=50)
    images, labels, boxes = full.datasets["val"].__getitems__(list(range(6)))
    served, served_labels, served_boxes = small.datasets["val"].__getitems__(list(range(6)))
    assert served.shape == (6, 1, 50, 50) and torch.equal(labels, served_labels)
    means = images.double().reshape(6, 1, 50, 4, 50, 4).mean((3, 5))
    assert (served.double() - means).abs().max() <= 0.5 + 1e-9  # the 4x4 mean, rounded to a byte
    torch.testing.assert_close(served_boxes, boxes / 4)
    assert MegapixelFashionDataModule.image_size_for(image_size=50) == (50, 50)
    assert MegapixelFashionDataModule.image_size_for(canvas_size=300) == (300, 300)


@pytest.mark.parametrize("size, side", [(300, 100), (301, 77), (61, 59), (29, 28), (9, 4), (12, 12)])
def test_the_sparse_area_resize_equals_torchs_area_resize(size, side):
    rng = np.random.default_rng(size)
    canvases = ((rng.random((3, size, size)) < 0.1) * rng.integers(0, 256, (3, size, size))).astype(np.uint8)
    reference = torch.nn.functional.interpolate(torch.from_numpy(canvases)[:, None].double(), size=(side, side),
                                                mode="area")[:, 0].numpy()
    served = cs.downsample(canvases, side)
    assert served.shape == (3, side, side) and served.dtype == np.uint8
    assert np.abs(served - reference).max() <= 0.5 + 1e-9  # the mean, rounded to a byte (ties either way)


@pytest.mark.parametrize("kwargs, message", [
    (dict(canvas_size=60), "canvas_size must be at least 84"), (dict(canvas_size=200, image_size=300), "image_size"),
    (dict(target_items=2, other_items=2), "target_items > other_items"), (dict(num_test=0), "num_test must be >= 1"),
    (dict(canvas_size=5000), "outside the sane range")])
def test_megapixel_refuses_impossible_settings_in_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as err:
        MegapixelFashionDataModule(**kwargs)
    assert "\n" not in str(err.value)


def test_scale_refuses_a_canvas_smaller_than_the_item():
    with pytest.raises(UserError, match="at least the item's 28 px"):
        ClutteredScaleDataModule(canvas_size=20)


# ----------------------------------------------------------------------------- both: memory, loaders, work
@pytest.mark.parametrize("kind", ["scale", "megapixel"])
def test_no_split_is_held_what_a_worker_receives_does_not_grow_with_the_canvases(tiny_data, kind):
    if kind == "scale":
        small, large = _scale(canvas_size=100), _scale(canvas_size=400)
    else:
        small, large = _mega(canvas_size=200, num_train=8), _mega(canvas_size=400, num_train=10**6)
    for split in ("train", "test"):
        a, b = (len(pickle.dumps(dm.datasets[split])) for dm in (small, large))
        assert abs(a - b) < 1024, (split, a, b)  # the items and a few numbers, whatever the side or the count
        assert b < 2 * 600 * ITEM_SIZE ** 2 + 100_000
    assert len(large.datasets["train"]) * 400 ** 2 > 100 * len(pickle.dumps(large.datasets["train"]))


@pytest.mark.parametrize("make", [lambda: _scale(canvas_size=100, with_boxes=True, num_workers=2),
                                  lambda: _mega(with_boxes=True, num_workers=2, num_val=16)],
                         ids=["scale", "megapixel"])
def test_a_loader_with_workers_serves_the_canvases_of_the_indices(tiny_data, make):
    dm = make()
    loaded = list(dm.val_dataloader())
    assert sum(len(batch[0]) for batch in loaded) == len(dm.datasets["val"])
    images, labels, boxes = loaded[1]
    again = dm.datasets["val"].__getitems__(list(range(8, 8 + len(images))))
    assert all(torch.equal(x, y) for x, y in zip((images, labels, boxes), again))
    on_device = dm.on_after_batch_transfer(loaded[0], 0)
    assert on_device[0].dtype == torch.float32 and 0 <= on_device[0].min() and on_device[0].max() <= 1


@pytest.mark.parametrize("make, slots", [(lambda: _scale(canvas_size=400), lambda dm: 2 * dm.distractors + 1),
                                         (lambda: _mega(), lambda dm: 5 + 50)], ids=["scale", "megapixel"])
def test_a_batch_is_painted_slot_by_slot_over_all_its_canvases_at_once(tiny_data, make, slots, monkeypatch):
    """The work is vectorised over the batch: the paste operations per batch are as many for 32
    canvases as for 2 (one per pasting slot), so a batch costs numpy work, not Python loops."""
    dm = make()
    calls, original = [], cs.window
    for module in (cs, mp):
        monkeypatch.setattr(module, "window", lambda *a: calls.append(1) or original(*a))
    counts = []
    for n in (2, 32):
        calls.clear()
        dm.datasets["train"].__getitems__(list(range(n)))
        counts.append(len(calls))
    assert counts[0] == counts[1] == slots(dm)
