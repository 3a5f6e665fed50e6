"""FashionScenes: deterministic generation, geometry, captions, splits, cache, batches."""
import re

import numpy as np
import pytest
import torch

from zoo.data import scene_grammar as G, scenes as S
from zoo.data.scene_generation import PALETTE, Scenes, generate_scenes
from zoo.data.scene_grammar import COLOUR_NAMES, HEAD_WORDS, ITEM_NAMES
from zoo.data.scenes import FashionScenesDataModule
from zoo.data.vocab import END_ID, PAD_ID, START_ID, Vocab, tokenize
from zoo.guards.errors import UserError


def synthetic_items(n, seed):
    """Fake Fashion-MNIST: a bright rectangle of random size and place per 28x28 item."""
    rng = np.random.default_rng(seed)
    items = np.zeros((n, 28, 28), dtype=np.uint8)
    for k in range(n):
        h, w = rng.integers(6, 29, size=2)
        y, x = rng.integers(0, 29 - h), rng.integers(0, 29 - w)
        items[k, y:y + h, x:x + w] = rng.integers(40, 256, size=(h, w))
    labels = np.arange(n) % 10
    return items, labels


SOURCES = {"train": synthetic_items(60, 1), "test": synthetic_items(40, 2)}
CALLS = []


def loader(split):
    CALLS.append(split)
    return SOURCES[split]


def make_dm(tmp_path, **kw):
    args = dict(num_train=120, num_val=30, num_test=40, batch_size=16, cache_dir=str(tmp_path),
                item_loader=loader)
    args.update(kw)
    return FashionScenesDataModule(**args)


@pytest.fixture(scope="module")
def train_scenes():
    items, labels = SOURCES["train"]
    return generate_scenes(items, labels, np.arange(len(items)), 300, seed=0, split="train")


# ----------------------------------------------------------------------------- generation
def test_deterministic_under_seed_and_prefix_stable():
    items, labels = SOURCES["train"]
    pool = np.arange(len(items))
    a = generate_scenes(items, labels, pool, 600, seed=5, split="train")
    b = generate_scenes(items, labels, pool, 600, seed=5, split="train")
    c = generate_scenes(items, labels, pool, 600, seed=6, split="train")
    short = generate_scenes(items, labels, pool, 270, seed=5, split="train")  # crosses a block edge
    assert np.array_equal(a.images, b.images) and a.captions == b.captions
    assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.source_index, b.source_index)
    assert not np.array_equal(a.images, c.images)
    assert np.array_equal(short.images, a.images[:270]) and short.captions == a.captions[:270]


def test_shapes_and_ranges(train_scenes):
    s = train_scenes
    n = len(s)
    assert s.images.shape == (n, 3, 64, 64) and s.images.dtype == np.uint8
    assert set(np.unique(s.n_items)) == {1, 2, 3}
    assert all(3 <= len(c) <= 5 for c in s.captions)
    assert all(len(set(c)) == len(c) for c in s.captions)  # distinct references
    active = np.arange(3)[None] < s.n_items[:, None]
    assert (s.labels[active] >= 0).all() and (s.labels[~active] == -1).all()
    assert s.images.max() > 200  # items are drawn


def render_reference(scenes, items, i):
    """Slow obvious renderer: paint each item at the corner implied by its tight box."""
    canvas = np.zeros((3, 64, 64), dtype=np.uint8)
    for k in range(scenes.n_items[i]):
        tinted = np.rint(items[scenes.source_index[i, k]].astype(np.float32)[None]
                         * PALETTE[scenes.colours[i, k]][:, None, None]).astype(np.uint8)
        ys, xs = np.nonzero(tinted.max(0))
        x0, y0 = scenes.boxes[i, k, :2].astype(int)
        top, left = y0 - ys.min(), x0 - xs.min()
        assert scenes.boxes[i, k, 2] == left + xs.max() + 1 and scenes.boxes[i, k, 3] == top + ys.max() + 1
        assert 0 <= top and top + 28 <= 64 and 0 <= left and left + 28 <= 64  # item inside the canvas
        canvas[:, top:top + 28, left:left + 28] = np.maximum(canvas[:, top:top + 28, left:left + 28], tinted)
    return canvas


def test_items_inside_canvas_boxes_match_pixels_and_do_not_overlap(train_scenes):
    s = train_scenes
    items = SOURCES["train"][0]
    for i in range(len(s)):
        boxes = s.item_boxes(i)
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 64).all()
        assert (boxes[:, 2:] > boxes[:, :2]).all()
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                ba, bb = boxes[a], boxes[b]
                overlap = min(ba[2], bb[2]) > max(ba[0], bb[0]) and min(ba[3], bb[3]) > max(ba[1], bb[1])
                assert not overlap, (i, ba, bb)
        drawn = s.images[i].max(0) > 0
        inside = np.zeros_like(drawn)
        for x0, y0, x1, y1 in boxes.astype(int):
            inside[y0:y1, x0:x1] = True
            # tight: every edge row/column of the box holds a drawn pixel
            assert drawn[y0, x0:x1].any() and drawn[y1 - 1, x0:x1].any()
            assert drawn[y0:y1, x0].any() and drawn[y0:y1, x1 - 1].any()
        assert not (drawn & ~inside).any()
        assert np.array_equal(render_reference(s, items, i), s.images[i])
    assert s.item_words(0) == [HEAD_WORDS[c] for c in s.labels[0, :s.n_items[0]]]


NP = r"(?:a pair of|an|a|the) (" + "|".join(COLOUR_NAMES) + r") (" + "|".join(ITEM_NAMES) + ")"
REL = r"(?:is )?(left of|right of|above|below|to the left of|to the right of)"
FORWARD = re.compile(NP + " " + REL + " " + NP)
WITH = re.compile(NP + " with " + NP + " " + REL + " it")


def _holds(rel, a, b):
    rel = rel.replace("to the ", "")
    return {"left of": a[2] <= b[0], "right of": b[2] <= a[0],
            "above": a[3] <= b[1], "below": b[3] <= a[1]}[rel]


def test_captions_mention_the_items_and_true_relations(train_scenes):
    s = train_scenes
    checked = 0
    for i in range(len(s)):
        n = s.n_items[i]
        present = [(COLOUR_NAMES[s.colours[i, k]], ITEM_NAMES[s.labels[i, k]]) for k in range(n)]
        boxes = s.item_boxes(i)

        def boxes_of(colour, name):
            return [boxes[k] for k in range(n) if present[k] == (colour, name)]

        for caption in s.captions[i]:
            mentioned = re.findall(NP, caption)
            assert set(mentioned) == set(present), (caption, present)
            for m in FORWARD.finditer(caption):
                subj, rel, obj = (m.group(1), m.group(2)), m.group(3), (m.group(4), m.group(5))
                assert any(_holds(rel, a, b) for a in boxes_of(*subj) for b in boxes_of(*obj)), (caption, boxes)
                checked += 1
            for m in WITH.finditer(caption):
                anchor, other, rel = (m.group(1), m.group(2)), (m.group(3), m.group(4)), m.group(5)
                assert any(_holds(rel, a, b) for a in boxes_of(*other) for b in boxes_of(*anchor)), (caption, boxes)
                checked += 1
    assert checked > 200  # the check is not vacuous


def test_relations_reference():
    # an L-shaped layout: the relation names a separating axis
    boxes = np.array([[[0, 0, 20, 20], [30, 5, 50, 25], [5, 40, 25, 60]]], dtype=np.float32)
    rel = G.relations(boxes)[0]
    assert rel[0, 1] == G.LEFT and rel[1, 0] == G.RIGHT
    assert rel[0, 2] == G.ABOVE and rel[2, 0] == G.BELOW
    assert rel[1, 2] in (G.RIGHT, G.ABOVE)  # separated on both axes; both are true


def test_scaled_items_and_placement_errors():
    items, labels = SOURCES["train"]
    s = generate_scenes(items, labels, np.arange(len(items)), 50, seed=0, split="train", item_sizes=(16, 28))
    widths = s.boxes[..., 2] - s.boxes[..., 0]
    assert widths[s.labels >= 0].max() <= 28 and (widths[s.labels >= 0] <= 16).any()
    for canvas in (40, 50):  # too small by area; large enough by area but no layout fits
        with pytest.raises(UserError, match="cannot place"):
            generate_scenes(items, labels, np.arange(len(items)), 5, seed=0, split="train",
                            canvas_size=canvas, min_items=3, max_items=3)
    with pytest.raises(UserError):
        generate_scenes(items, labels, np.arange(len(items)), 5, seed=0, split="train", max_items=4)


# ----------------------------------------------------------------------------- splits + cache
def test_splits_draw_from_disjoint_sources(tmp_path):
    CALLS.clear()
    dm = make_dm(tmp_path)
    dm.prepare_data()
    train, val, test = (dm.build_split(x) for x in ("train", "val", "test"))
    assert not set(val.source_index[val.labels >= 0]) & set(test.source_index[test.labels >= 0])
    assert set(CALLS) == {"train", "test"}
    # train scenes are painted from train items, evaluation scenes from test items
    for i in range(5):
        assert np.array_equal(render_reference(train, SOURCES["train"][0], i), train.images[i])
        assert np.array_equal(render_reference(test, SOURCES["test"][0], i), test.images[i])
    # the test scenes do not depend on the training seed
    other = make_dm(tmp_path / "b", seed=7)
    assert np.array_equal(other.build_split("test").images, test.images)
    assert not np.array_equal(other.build_split("train").images, train.images)


def test_cache_round_trip(tmp_path, monkeypatch):
    dm = make_dm(tmp_path)
    first = dm.build_split("train")
    path = dm.cache_path("train")
    assert path.is_file() and path.parent == tmp_path
    assert not list(tmp_path.glob(".*tmp*"))  # atomic write leaves no temporary file

    def no_generation(*a, **k):
        raise AssertionError("should load from the cache")

    monkeypatch.setattr(S, "generate_scenes", no_generation)
    again = make_dm(tmp_path).build_split("train")
    for field in ("images", "n_items", "labels", "colours", "boxes", "source_index"):
        assert np.array_equal(getattr(first, field), getattr(again, field))
    assert again.captions == first.captions
    # another setting, another file
    assert make_dm(tmp_path, num_train=121).cache_path("train") != path
    assert make_dm(tmp_path, max_captions=4).cache_path("train") != path
    # a damaged cache file is rebuilt
    monkeypatch.undo()
    path.write_bytes(b"garbage")
    rebuilt = make_dm(tmp_path).build_split("train")
    assert np.array_equal(rebuilt.images, first.images)
    assert Scenes.load(path, 64).captions == first.captions


# ----------------------------------------------------------------------------- datamodule
def test_training_batches(tmp_path):
    dm = make_dm(tmp_path, max_len=12)
    assert dm.image_size == 64
    dm.setup("fit")
    vocab = dm.vocab
    train = dm.build_split("train")
    assert vocab == Vocab.build([tokenize(c) for caps in train.captions for c in caps])
    kept = sum(len(tokenize(c)) <= 12 for caps in train.captions for c in caps)
    loader = dm.train_dataloader()
    total = 0
    for batch in loader:
        images, captions, lengths = batch["images"], batch["captions"], batch["lengths"]
        b = len(lengths)
        total += b
        assert images.shape == (b, 3, 64, 64) and images.dtype == torch.float32
        assert 0 <= images.min() and images.max() <= 1
        assert captions.dtype == torch.long and lengths.dtype == torch.long and len(batch["image_ids"]) == b
        assert captions.shape[1] == lengths.max() <= 14
        assert (captions[:, 0] == START_ID).all()
        assert (captions[torch.arange(b), lengths - 1] == END_ID).all()
        pad = torch.arange(captions.shape[1])[None] >= lengths[:, None]
        assert (captions[pad] == PAD_ID).all() and (captions[~pad] != PAD_ID).all()
        for row, image_id in zip(captions, batch["image_ids"]):
            words = vocab.decode(row)
            assert words in [tokenize(c) for c in train.captions[image_id]]
        assert torch.equal(images[0], torch.from_numpy(train.images[batch["image_ids"][0]]).float() / 255)
    assert total == kept < sum(map(len, train.captions))  # one example per (image, caption) pair


def test_eval_batches(tmp_path):
    dm = make_dm(tmp_path, batch_size=8)
    dm.setup("fit")
    val = dm.build_split("val")
    ids = []
    for batch in dm.val_dataloader():
        b = len(batch["image_ids"])
        assert batch["images"].shape == (b, 3, 64, 64)
        assert len(batch["references"]) == len(batch["boxes"]) == len(batch["box_words"]) == b
        for k, i in enumerate(batch["image_ids"]):
            assert batch["references"][k] == val.captions[i]
            assert batch["boxes"][k].dtype == torch.float32 and batch["boxes"][k].shape == (val.n_items[i], 4)
            assert batch["box_words"][k] == val.item_words(i)
            assert all(w in tokenize(" ".join(batch["references"][k])) for w in batch["box_words"][k])
        ids += batch["image_ids"]
    assert ids == list(range(30))  # each image once
    dm.test_split = "val"
    assert len(dm.test_dataloader().dataset) == 30


def test_vocab_is_available_before_setup(tmp_path):
    dm = make_dm(tmp_path)
    assert dm.vocab_size == len(dm.vocab) > 20 and "shirt" in dm.vocab


def test_bad_settings(tmp_path):
    with pytest.raises(UserError):
        make_dm(tmp_path, num_test=0)
    with pytest.raises(UserError):
        make_dm(tmp_path, max_len=0)


def test_real_fashion_mnist_scenes(tmp_path):
    """With the real items when they are installed: a few scenes, boxes and words agree."""
    try:
        from zoo.data.fashion_mnist import load_fashion_mnist

        load_fashion_mnist("test")
    except Exception as exc:  # no data on this machine
        pytest.skip(f"Fashion-MNIST not available: {exc}")
    dm = FashionScenesDataModule(num_train=20, num_val=10, num_test=10, cache_dir=str(tmp_path))
    test = dm.build_split("test")
    assert test.images.shape == (10, 3, 64, 64)
    for i in range(10):
        assert len(test.item_boxes(i)) == test.n_items[i]
        assert all(w in tokenize(" ".join(test.captions[i])) for w in test.item_words(i))


def test_export_pngs_round_trip(tmp_path):
    import json

    from zoo.preprocess import Preprocessing, load_batch

    dm = make_dm(tmp_path / "cache")
    paths = dm.export_pngs("test", tmp_path / "pngs", 3)
    images, good, errors = load_batch(paths, Preprocessing(3, (dm.image_size, dm.image_size)))
    assert not errors and len(good) == 3
    test = dm.build_split("test")
    assert torch.equal(images, torch.from_numpy(test.images[:3]).float() / 255)
    refs = json.loads((tmp_path / "pngs" / "references.json").read_text())
    assert refs[paths[0].name]["references"] == test.captions[0]
    assert refs[paths[0].name]["box_words"] == test.item_words(0)


def test_word_items_name_the_item_each_colour_and_item_word_belongs_to(tmp_path):
    """The grammar knows which item each noun phrase names: every colour word and item word of a
    training caption points at the slot of an item with that colour / that name, and no other
    word points anywhere."""
    dm = make_dm(tmp_path)
    dm.setup("fit")
    train = dm.build_split("train")
    item_tokens = {w for name in ITEM_NAMES for w in name.split()}
    checked = 0
    for batch in dm.train_dataloader():
        captions, items, boxes = batch["captions"], batch["word_items"], batch["item_boxes"]
        assert items.shape == captions.shape and boxes.shape == (len(captions), 3, 4)
        for row, slots, scene, scene_boxes in zip(captions.tolist(), items.tolist(), batch["image_ids"], boxes):
            assert torch.equal(scene_boxes, torch.from_numpy(train.boxes[scene]))
            for token, slot in zip(row, slots):
                word = dm.vocab.itos[token]
                if word in COLOUR_NAMES or word in item_tokens:
                    assert 0 <= slot < train.n_items[scene], (word, slot)
                    assert word == COLOUR_NAMES[train.colours[scene, slot]] or \
                        word in ITEM_NAMES[train.labels[scene, slot]].split()
                    checked += 1
                else:
                    assert slot == -1, word
    assert checked > 500
    # repeated items (two red shirts) are told apart: each phrase names its own slot
    s = G.untag(G.noun_phrase(6, 0, slot=0) + " left of " + G.noun_phrase(6, 0, True, slot=1))
    assert s == ("a red shirt left of the red shirt", [-1, 0, 0, -1, -1, -1, 1, 1])


def test_pad_to_multiple_pads_caption_batches_to_few_lengths(tmp_path):
    plain, padded = make_dm(tmp_path), make_dm(tmp_path, pad_to_multiple=8)
    for dm in (plain, padded):
        dm.setup("fit")
    widths = set()
    for a, b in zip(plain.train_dataloader(), padded.train_dataloader()):
        width = b["captions"].shape[1]
        widths.add(width)
        assert width % 8 == 0 and width >= a["captions"].shape[1]
        assert torch.equal(b["captions"][:, :a["captions"].shape[1]], a["captions"])
        assert (b["captions"][:, a["captions"].shape[1]:] == PAD_ID).all()
        assert (b["word_items"][:, a["captions"].shape[1]:] == -1).all()
    assert len(widths) <= 3
    val = next(iter(padded.val_dataloader()))
    assert val["captions"].shape[1] % 8 == 0 and val["word_items"].shape == val["captions"].shape
