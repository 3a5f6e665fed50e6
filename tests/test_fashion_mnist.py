"""Fashion-MNIST: IDX parsing on tiny files written here, where the files are looked for, and the
RAM paper's task variants (shape, range, determinism, the item on the canvas, distractors)."""
from __future__ import annotations

import gzip
import sys
import types

import numpy as np
import pytest
import torch

from conftest import TINY_TEST, TINY_TRAIN, TINY_VAL, idx_bytes, structured_images, write_fashion_mnist, write_idx
from zoo.data import fashion_mnist as fm
from zoo.guards.errors import UserError

VARIANT_SPECS = {"centered": (28, 0), "translated": (60, 0), "cluttered60": (60, 4), "cluttered100": (100, 8)}


# ----------------------------------------------------------------------------- IDX parsing
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, gz):
    images = np.random.default_rng(0).integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = np.arange(7, dtype=np.uint8)
    ip = write_idx(tmp_path / "imgs-idx3-ubyte", images, gz)
    lp = write_idx(tmp_path / "labels-idx1-ubyte", labels, gz)
    assert ip.name.endswith(".gz") == gz
    np.testing.assert_array_equal(fm.read_idx(ip), images)
    np.testing.assert_array_equal(fm.read_idx(lp), labels)


def test_idx_header_is_big_endian(tmp_path):
    # 300 > 255 items: a little-endian header would read a different count
    labels = (np.arange(300) % 10).astype(np.uint8)
    path = write_idx(tmp_path / "l", labels)
    assert path.read_bytes()[4:8] == (300).to_bytes(4, "big")
    assert fm.read_idx(path).shape == (300,)


def _bad_files():
    good = idx_bytes(np.ones((3, 28, 28), np.uint8))
    return {
        "truncated": good[:-10],
        "too_long": good + b"\x00" * 5,
        "bad_magic": b"\x01\x02" + good[2:],
        "float_type": good[:2] + b"\x0d" + good[3:],
        "short_header": good[:6],
        "empty": b"",
    }


@pytest.mark.parametrize("kind", ["truncated", "too_long", "bad_magic", "float_type", "short_header", "empty"])
@pytest.mark.parametrize("gz", [False, True])
def test_corrupt_idx_is_a_user_error_naming_the_file(tmp_path, kind, gz):
    data = _bad_files()[kind]
    path = tmp_path / (f"{kind}-idx3-ubyte" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(UserError) as err:
        fm.read_idx(path)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_broken_gzip_is_a_user_error(tmp_path):
    data = gzip.compress(idx_bytes(np.ones((3, 28, 28), np.uint8)))
    for name, payload in {"cut.gz": data[: len(data) // 2], "notgz.gz": b"plain bytes, not gzip"}.items():
        path = tmp_path / name
        path.write_bytes(payload)
        with pytest.raises(UserError, match=name):
            fm.read_idx(path)


# ----------------------------------------------------------------------------- finding the files
@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """cwd without ./data, no ZOO_DATA_DIR, no Debian directory, and a torchvision whose
    download fails at once (we are offline)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZOO_DATA_DIR", raising=False)
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "no-debian")

    class FailingDownload:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("offline (test)")

    fake = types.ModuleType("torchvision.datasets")
    fake.FashionMNIST = FailingDownload
    monkeypatch.setitem(sys.modules, "torchvision.datasets", fake)
    return tmp_path


@pytest.mark.parametrize("gz", [False, True])
def test_load_from_zoo_data_dir(isolated, monkeypatch, gz):
    write_fashion_mnist(isolated / "zd", n_train=30, n_test=20, gz=gz)
    monkeypatch.setenv("ZOO_DATA_DIR", str(isolated / "zd"))
    images, labels = fm.load_fashion_mnist("train")
    expected, expected_labels = structured_images(30, 0)
    assert images.dtype == torch.uint8 and images.shape == (30, 28, 28)
    assert labels.dtype == torch.int64 and labels.shape == (30,)
    np.testing.assert_array_equal(images.numpy(), expected)
    np.testing.assert_array_equal(labels.numpy(), expected_labels)
    assert fm.load_fashion_mnist("test")[0].shape == (20, 28, 28)


def test_search_order_zoo_data_dir_first_then_local_data(isolated, monkeypatch):
    write_fashion_mnist(isolated / "zd", n_train=30, n_test=20)
    write_fashion_mnist(isolated / "data", n_train=40, n_test=20)  # ./data/fashion-mnist
    monkeypatch.setenv("ZOO_DATA_DIR", str(isolated / "zd"))
    assert len(fm.load_fashion_mnist("train")[0]) == 30
    monkeypatch.delenv("ZOO_DATA_DIR")
    assert len(fm.load_fashion_mnist("train")[0]) == 40


def test_debian_directory_is_used_after_local_ones(isolated, monkeypatch):
    debian = write_fashion_mnist(isolated / "debian", n_train=50, n_test=20)
    monkeypatch.setattr(fm, "DEBIAN_DIR", debian)
    assert len(fm.load_fashion_mnist("train")[0]) == 50
    write_fashion_mnist(isolated / "data", n_train=40, n_test=20)
    assert len(fm.load_fashion_mnist("train")[0]) == 40


def test_no_data_anywhere_is_a_clear_error(isolated):
    with pytest.raises(UserError, match="dataset-fashion-mnist|ZOO_DATA_DIR"):
        fm.load_fashion_mnist("train")


def test_missing_labels_file_names_it(isolated, monkeypatch):
    directory = write_fashion_mnist(isolated / "zd", n_train=30, n_test=20)
    (directory / "train-labels-idx1-ubyte").unlink()
    monkeypatch.setenv("ZOO_DATA_DIR", str(isolated / "zd"))
    with pytest.raises(UserError, match="train-labels-idx1-ubyte"):
        fm.load_fashion_mnist("train")


def test_images_and_labels_of_different_length_refused(isolated, monkeypatch):
    directory = write_fashion_mnist(isolated / "zd", n_train=30, n_test=20)
    write_idx(directory / "train-labels-idx1-ubyte", np.zeros(29, np.uint8))
    monkeypatch.setenv("ZOO_DATA_DIR", str(isolated / "zd"))
    with pytest.raises(UserError, match="train-labels-idx1-ubyte"):
        fm.load_fashion_mnist("train")


def test_labels_out_of_range_refused(isolated, monkeypatch):
    directory = write_fashion_mnist(isolated / "zd", n_train=30, n_test=20)
    write_idx(directory / "train-labels-idx1-ubyte", np.full(30, 10, np.uint8))
    monkeypatch.setenv("ZOO_DATA_DIR", str(isolated / "zd"))
    with pytest.raises(UserError, match="train-labels-idx1-ubyte"):
        fm.load_fashion_mnist("train")


def test_unknown_split_refused():
    with pytest.raises(UserError, match="split"):
        fm.load_fashion_mnist("validation")


# ----------------------------------------------------------------------------- variants
def reference_variant(images, variant, seed, distractor_source=None):
    """Slow, obvious per-sample construction drawing the same random numbers in the same order:
    the item's position (all rows, then all columns), then per distractor: which image, the
    crop's position, the paste position."""
    size, n_distractors = VARIANT_SPECS[variant]
    n = len(images)
    if size == 28:
        return images.copy(), np.tile([0, 0, 28, 28], (n, 1))
    rng = np.random.default_rng(seed)
    top = rng.integers(0, size - 28 + 1, size=n)
    left = rng.integers(0, size - 28 + 1, size=n)
    source = images if distractor_source is None else distractor_source
    draws = []
    for _ in range(n_distractors):
        which = rng.integers(0, len(source), size=n)
        cy = rng.integers(0, 28 - 8 + 1, size=n)
        cx = rng.integers(0, 28 - 8 + 1, size=n)
        py = rng.integers(0, size - 8 + 1, size=n)
        px = rng.integers(0, size - 8 + 1, size=n)
        draws.append((which, cy, cx, py, px))
    canvases = np.zeros((n, size, size), np.uint8)
    boxes = np.zeros((n, 4), np.int64)
    for i in range(n):
        canvases[i, top[i]:top[i] + 28, left[i]:left[i] + 28] = images[i]
        boxes[i] = (left[i], top[i], left[i] + 28, top[i] + 28)
        for which, cy, cx, py, px in draws:
            crop = source[which[i], cy[i]:cy[i] + 8, cx[i]:cx[i] + 8]
            region = canvases[i, py[i]:py[i] + 8, px[i]:px[i] + 8]
            canvases[i, py[i]:py[i] + 8, px[i]:px[i] + 8] = np.maximum(region, crop)
    return canvases, boxes


@pytest.fixture(scope="module")
def items():
    return structured_images(40, seed=3)[0]


@pytest.fixture(scope="module")
def source():
    return structured_images(60, seed=4)[0]


@pytest.mark.parametrize("variant", list(VARIANT_SPECS))
def test_make_variant_equals_slow_reference(items, source, variant):
    canvases, boxes = fm.make_variant(items, variant, seed=11, distractor_source=source)
    ref_canvases, ref_boxes = reference_variant(items, variant, 11, source)
    np.testing.assert_array_equal(canvases, ref_canvases)
    np.testing.assert_array_equal(np.asarray(boxes), ref_boxes)


@pytest.mark.parametrize("variant", list(VARIANT_SPECS))
def test_variant_shape_range_and_item_inside_canvas(items, source, variant):
    size, n_distractors = VARIANT_SPECS[variant]
    canvases, boxes = fm.make_variant(items, variant, seed=5, distractor_source=source)
    boxes = np.asarray(boxes)
    assert canvases.shape == (len(items), size, size) and canvases.dtype == np.uint8
    assert boxes.shape == (len(items), 4)
    x0, y0, x1, y1 = boxes.T
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x1 <= size).all() and (y1 <= size).all()
    assert ((x1 - x0) == 28).all() and ((y1 - y0) == 28).all()
    outside_mass = []
    for canvas, item, (a, b, c, d) in zip(canvases, items, boxes):
        # every pixel of the item is on the canvas (pasting distractors only ever raises pixels)
        window = canvas[b:d, a:c]
        assert (window >= item).all()
        if n_distractors == 0:
            np.testing.assert_array_equal(window, item)
        outside = canvas.astype(np.int64).sum() - window.astype(np.int64).sum()
        outside_mass.append(outside)
    outside_mass = np.array(outside_mass)
    if n_distractors == 0:
        assert (outside_mass == 0).all()  # nothing but the item on the canvas
    else:
        # the distractors put mass outside the item's box on (nearly) every canvas; at most
        # n_distractors 8x8 crops of at most 255 each
        assert (outside_mass > 0).mean() > 0.9
        assert outside_mass.max() <= n_distractors * 64 * 255


@pytest.mark.parametrize("variant", ["cluttered60", "cluttered100"])
def test_distractors_are_8x8_crops_of_the_source(variant):
    # items are all zero and the source is all 255: the canvas shows exactly the distractors,
    # each an 8x8 square of 255 (overlaps allowed), n_distractors of them
    size, n_distractors = VARIANT_SPECS[variant]
    items = np.zeros((20, 28, 28), np.uint8)
    canvases, _ = fm.make_variant(items, variant, seed=0, distractor_source=np.full((5, 28, 28), 255, np.uint8))
    lit = (canvases == 255).sum(axis=(1, 2))
    assert set(np.unique(canvases)) <= {0, 255}
    assert (lit <= n_distractors * 64).all() and (lit >= 64).all()
    assert (lit == n_distractors * 64).mean() > 0.3  # most canvases: non-overlapping distractors
    assert lit.max() == n_distractors * 64


@pytest.mark.parametrize("variant", ["translated", "cluttered60", "cluttered100"])
def test_variant_deterministic_under_seed_and_differs_across_seeds(items, source, variant):
    a = fm.make_variant(items, variant, seed=7, distractor_source=source)
    b = fm.make_variant(items, variant, seed=7, distractor_source=source)
    c = fm.make_variant(items, variant, seed=8, distractor_source=source)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
    assert not np.array_equal(a[0], c[0])
    assert not np.array_equal(np.asarray(a[1]), np.asarray(c[1]))


def test_translated_positions_cover_the_canvas():
    items = structured_images(400, seed=1)[0]
    _, boxes = fm.make_variant(items, "translated", seed=0)
    boxes = np.asarray(boxes)
    # uniform over 0..32: both extremes and the middle are reached
    assert boxes[:, 0].min() == 0 and boxes[:, 0].max() == 60 - 28
    assert boxes[:, 1].min() == 0 and boxes[:, 1].max() == 60 - 28
    assert 12 < boxes[:, 0].mean() < 20


def test_unknown_variant_is_a_user_error(items):
    with pytest.raises(UserError, match="variant"):
        fm.make_variant(items, "cluttered", seed=0)
    with pytest.raises(UserError, match="variant"):
        fm.FashionMNISTDataModule(variant="rotated")


# ----------------------------------------------------------------------------- the data module
def _setup(**kwargs):
    dm = fm.FashionMNISTDataModule(**{"val_size": TINY_VAL, "batch_size": 16, **kwargs})
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("variant", list(VARIANT_SPECS))
def test_datamodule_batches(tiny_data, variant):
    dm = fm.FashionMNISTDataModule(variant=variant, val_size=TINY_VAL, batch_size=16)
    size = VARIANT_SPECS[variant][0]
    assert dm.image_size == size and dm.num_classes == 10  # known before setup
    dm.setup("fit")
    assert len(dm.datasets["train"]) == TINY_TRAIN - TINY_VAL
    assert len(dm.datasets["val"]) == TINY_VAL
    assert len(dm.datasets["test"]) == TINY_TEST
    images, labels = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert images.shape == (16, 1, size, size) and images.dtype == torch.float32
    assert labels.shape == (16,) and labels.dtype == torch.int64
    assert images.min() >= 0 and images.max() <= 1 and images.max() > 0.5
    assert 0 <= labels.min() and labels.max() <= 9


def test_val_split_is_carved_from_train_with_a_fixed_split_seed(tiny_data):
    a, b = _setup(seed=0), _setup(seed=5)
    train_all, labels_all = fm.load_fashion_mnist("train")
    flat = {bytes(x.numpy().tobytes()): i for i, x in enumerate(train_all)}
    val_rows = [flat[bytes(x[0].numpy().tobytes())] for x in a.datasets["val"].tensors[0]]
    train_rows = [flat[bytes(x[0].numpy().tobytes())] for x in a.datasets["train"].tensors[0]]
    assert len(set(val_rows)) == TINY_VAL
    assert not set(val_rows) & set(train_rows)  # disjoint
    assert len(set(val_rows) | set(train_rows)) == TINY_TRAIN  # together: all of train
    np.testing.assert_array_equal(a.datasets["val"].tensors[1].numpy(), labels_all[val_rows].numpy())
    # the training seed does not move examples between train and val
    for split in ("train", "val"):
        assert torch.equal(a.datasets[split].tensors[0], b.datasets[split].tensors[0])
    c = _setup(split_seed=1)
    assert not torch.equal(a.datasets["val"].tensors[1], c.datasets["val"].tensors[1])


def test_cluttered_train_depends_on_seed_but_test_set_does_not(tiny_data):
    a, b = _setup(variant="cluttered60", seed=0), _setup(variant="cluttered60", seed=1)
    assert not torch.equal(a.datasets["train"].tensors[0], b.datasets["train"].tensors[0])
    assert torch.equal(a.datasets["train"].tensors[1], b.datasets["train"].tensors[1])  # same items
    assert torch.equal(a.datasets["test"].tensors[0], b.datasets["test"].tensors[0])
    assert torch.equal(a.boxes["test"], b.boxes["test"])
    again = _setup(variant="cluttered60", seed=0)
    assert torch.equal(a.datasets["train"].tensors[0], again.datasets["train"].tensors[0])


def test_limited_test_set_is_a_prefix_of_the_full_one(tiny_data):
    full, limited = _setup(variant="translated"), _setup(variant="translated", limit_eval=50, limit_train=64)
    assert len(limited.datasets["test"]) == 50 and len(limited.datasets["val"]) == 50
    assert len(limited.datasets["train"]) == 64
    assert torch.equal(limited.datasets["test"].tensors[0], full.datasets["test"].tensors[0][:50])


def test_test_split_attribute_serves_val(tiny_data):
    dm = _setup()
    dm.test_split = "val"
    assert len(dm.test_dataloader().dataset) == TINY_VAL
    dm.test_split = "test"
    assert len(dm.test_dataloader().dataset) == TINY_TEST


# ----------------------------------------------------------------------------- two items on 60x60
def _apart(boxes):
    """boxes [N, 2, 4] -> bool [N]: the two frames are separated along x or along y."""
    a, b = boxes[:, 0], boxes[:, 1]
    sep_x = (a[:, 2] <= b[:, 0]) | (b[:, 2] <= a[:, 0])
    sep_y = (a[:, 3] <= b[:, 1]) | (b[:, 3] <= a[:, 1])
    return sep_x, sep_y


def test_two_items_canvas_holds_exactly_its_two_items_apart():
    images = structured_images(300, seed=5)[0]  # noise floor 5..40: every pixel of an item is > 0
    canvases, boxes, sources = fm.make_variant(images, "two_items60", seed=3, return_sources=True)
    n = len(images)
    assert canvases.shape == (n, 60, 60) and canvases.dtype == np.uint8
    assert boxes.shape == (n, 2, 4) and sources.shape == (n, 2)
    np.testing.assert_array_equal(sources[:, 0], np.arange(n))  # canvas i shows image i ...
    assert (sources[:, 1] != sources[:, 0]).all() and (0 <= sources).all() and (sources < n).all()
    assert len(np.unique(sources[:, 1])) > n / 2  # ... and a random other one
    assert (boxes[..., :2] >= 0).all() and (boxes[..., 2:] <= 60).all()
    assert ((boxes[..., 2] - boxes[..., 0]) == 28).all() and ((boxes[..., 3] - boxes[..., 1]) == 28).all()
    sep_x, sep_y = _apart(boxes)
    assert (sep_x | sep_y).all()  # the 28x28 frames never overlap
    for canvas, (first, second), frames in zip(canvases, sources, boxes):
        inside = np.zeros((60, 60), bool)
        for item, (x0, y0, x1, y1) in zip((first, second), frames):
            np.testing.assert_array_equal(canvas[y0:y1, x0:x1], images[item])
            inside[y0:y1, x0:x1] = True
        assert (canvas[~inside] == 0).all()  # exactly two items, nothing else
    # without return_sources: the same canvases and boxes
    again = fm.make_variant(images, "two_items60", seed=3)
    assert len(again) == 2
    np.testing.assert_array_equal(again[0], canvases)
    np.testing.assert_array_equal(again[1], boxes)


def test_two_items_layouts_are_uniform_over_non_overlapping_ones():
    # Corners are 0..32 per axis: 30 of the 33 x 33 x-pairs separate two 28-px frames, so of the
    # 64440 valid layouts 31770 separate along x only, 31770 along y only and 900 along both.
    images = structured_images(4000, seed=6)[0]
    _, boxes, _ = fm.make_variant(images, "two_items60", seed=0, return_sources=True)
    sep_x, sep_y = _apart(boxes)
    n = len(images)
    assert abs((sep_x & ~sep_y).mean() - 31770 / 64440) < 0.03
    assert abs((sep_y & ~sep_x).mean() - 31770 / 64440) < 0.03
    assert (sep_x & sep_y).sum() < 4 * 900 / 64440 * n
    corners = boxes[..., :2].reshape(-1)
    assert corners.min() == 0 and corners.max() == 32  # the whole canvas is reachable


def test_two_items_deterministic_under_seed():
    images = structured_images(50, seed=7)[0]
    a = fm.make_variant(images, "two_items60", seed=9, return_sources=True)
    b = fm.make_variant(images, "two_items60", seed=9, return_sources=True)
    c = fm.make_variant(images, "two_items60", seed=10, return_sources=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[1], c[1])
    assert not np.array_equal(a[2], c[2])  # the pairing changes with the seed too


def test_two_items_needs_two_images():
    with pytest.raises(UserError, match="at least 2"):
        fm.make_variant(np.zeros((1, 28, 28), np.uint8), "two_items60", seed=0)


def _item_rows(dataset, boxes, lookup):
    """The source rows (via lookup: item bytes -> row) of every item on every canvas: [N, 2]."""
    canvases = dataset.tensors[0][:, 0].numpy()
    rows = np.empty(boxes.shape[:2], np.int64)
    for i, frames in enumerate(boxes.numpy()):
        for k, (x0, y0, x1, y1) in enumerate(frames):
            rows[i, k] = lookup.get(canvases[i, y0:y1, x0:x1].tobytes(), -1)
    return rows


def test_two_items_datamodule_splits_and_fixed_test_set(tiny_data):
    dm = _setup(variant="two_items60", seed=0)
    assert dm.image_size == 60
    assert len(dm.datasets["train"]) == TINY_TRAIN - TINY_VAL and len(dm.datasets["test"]) == TINY_TEST
    images, labels = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert images.shape == (16, 1, 60, 60) and labels.shape == (16, 2) and labels.dtype == torch.int64
    train_all, train_labels = fm.load_fashion_mnist("train")
    test_all, test_labels = fm.load_fashion_mnist("test")
    train_rows = {x.numpy().tobytes(): i for i, x in enumerate(train_all)}
    test_rows = {x.numpy().tobytes(): i for i, x in enumerate(test_all)}
    assert not set(train_rows) & set(test_rows)
    val_pool = {train_rows[x[0].numpy().tobytes()] for x in _setup(variant="centered").datasets["val"].tensors[0]}
    found = {}
    for split, lookup in (("train", train_rows), ("val", train_rows), ("test", test_rows)):
        rows = _item_rows(dm.datasets[split], dm.boxes[split], lookup)
        assert (rows >= 0).all(), split  # every item is an image of its own source split ...
        other = test_rows if lookup is train_rows else train_rows
        assert (_item_rows(dm.datasets[split], dm.boxes[split], other) < 0).all(), split  # ... not the other's
        labels_all = test_labels if split == "test" else train_labels
        np.testing.assert_array_equal(dm.datasets[split].tensors[1].numpy(), labels_all[rows].numpy())
        found[split] = set(rows.ravel().tolist())
    # validation canvases hold validation items only, training canvases never one of them
    assert found["val"] <= val_pool and not found["train"] & val_pool
    # the test set is fixed: another training seed changes train canvases, not the test ones
    other = _setup(variant="two_items60", seed=1)
    assert torch.equal(other.datasets["test"].tensors[0], dm.datasets["test"].tensors[0])
    assert torch.equal(other.boxes["test"], dm.boxes["test"])
    assert not torch.equal(other.datasets["train"].tensors[0], dm.datasets["train"].tensors[0])
    limited = _setup(variant="two_items60", limit_eval=50)
    assert torch.equal(limited.datasets["test"].tensors[0], dm.datasets["test"].tensors[0][:50])


# ----------------------------------------------------------------------------- curriculum, boxes
@pytest.mark.parametrize("variant", ["cluttered60", "cluttered100"])
def test_fewer_distractors_are_nested_in_the_full_canvases(items, source, variant):
    """A curriculum stage keeps every item at its place and pastes the first k of the same
    distractors: k = 0 is the translated task, and each stage lies under the next pixel by pixel."""
    full = VARIANT_SPECS[variant][1]
    stages = [fm.make_variant(items, variant, seed=3, distractor_source=source, distractors=k) for k in range(full + 1)]
    np.testing.assert_array_equal(stages[-1][0], fm.make_variant(items, variant, seed=3, distractor_source=source)[0])
    if variant == "cluttered60":
        np.testing.assert_array_equal(stages[0][0], fm.make_variant(items, "translated", seed=3)[0])
    for (fewer, boxes), (more, more_boxes) in zip(stages, stages[1:]):
        np.testing.assert_array_equal(boxes, more_boxes)
        assert (fewer <= more).all() and (fewer != more).any()


def test_curriculum_adds_distractors_epoch_by_epoch_with_a_loader_per_epoch(tiny_data):
    from types import SimpleNamespace

    dm = _setup(variant="cluttered60", curriculum_epochs=4)
    assert [dm.distractors_at(e) for e in range(6)] == [0, 1, 2, 3, 4, 4]
    full = dm.datasets["train"].tensors[0].clone()
    lit = []
    for epoch in range(5):
        dm.trainer = SimpleNamespace(reload_dataloaders_every_n_epochs=1, current_epoch=epoch)
        dm.train_dataloader()
        canvases = dm.datasets["train"].tensors[0]
        assert (canvases <= full).all()
        lit.append(int((canvases > 0).sum()))
    assert lit == sorted(lit) and lit[0] < lit[-1] and torch.equal(canvases, full)
    dm.trainer = SimpleNamespace(reload_dataloaders_every_n_epochs=0, current_epoch=0)  # Lightning's default
    dm.train_dataloader()
    assert dm.trainer.reload_dataloaders_every_n_epochs == 1 and dm.datasets["train"].tensors[0].sum() < full.sum()
    dm.trainer = SimpleNamespace(reload_dataloaders_every_n_epochs=3, current_epoch=0)
    with pytest.raises(UserError, match="reload_dataloaders_every_n_epochs is 3"):
        dm.train_dataloader()
    with pytest.raises(UserError, match="no distractors"):
        fm.FashionMNISTDataModule(variant="translated", curriculum_epochs=2)


def test_with_boxes_serves_the_items_box_with_every_batch(tiny_data):
    dm = _setup(variant="cluttered60", with_boxes=True)
    for split in ("train", "val", "test"):
        images, labels, boxes = dm.on_after_batch_transfer(next(iter(dm.loader(split))), 0)
        assert boxes.shape == (16, 4) and boxes.dtype == torch.float32
        order = dm.datasets[split].tensors[0][:16]  # the eval loaders keep the split's order
        if split != "train":
            assert torch.equal(boxes, dm.boxes[split][:16].float()) and torch.equal(images, order.float() / 255)
        assert ((boxes[:, 2:] - boxes[:, :2]) == 28).all()
    assert len(_setup(variant="cluttered60").datasets["train"].tensors) == 2
