"""COCO captions JSON and Karpathy split JSON, written tiny by the tests, with tiny images."""
import json

import numpy as np
import pytest
import torch
from conftest import REPO
from PIL import Image

from zoo.data.captions import (CaptionsDataModule, read_coco_captions,
                               read_karpathy)
from zoo.data.sampling import BucketBatchSampler
from zoo.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID, tokenize
from zoo.guards.errors import UserError
from zoo.training.train import main

TRAIN_CAPTIONS = {
    1: ["A dog runs on the grass.", "a brown dog running", "The dog is running on grass"],
    2: ["A cat sleeps on a red sofa", "a cat on a sofa", "A sleeping cat."],
    3: ["Two dogs play with a ball", "dogs playing on the grass with a ball in a big green park today"],
}
VAL_CAPTIONS = {10: ["A zebra on the grass", "a zebra standing"], 11: ["a cat on a sofa", "A red sofa."]}


def write_image(path, size=(40, 30), mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "L":
        Image.fromarray(rng.integers(0, 256, size=(size[1], size[0]), dtype=np.uint8), "L").save(path)
    else:
        channels = 4 if mode == "RGBA" else 3
        Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8), mode).save(path)


def write_coco(path, captions, folder, tmp_path):
    images, annotations = [], []
    for k, (image_id, caps) in enumerate(captions.items()):
        name = f"{folder}_{image_id:06d}.png"
        write_image(tmp_path / folder / name, mode=["RGB", "L", "RGBA"][k % 3], seed=image_id)
        images.append({"id": image_id, "file_name": name, "width": 40, "height": 30})
        annotations += [{"id": 100 * image_id + j, "image_id": image_id, "caption": c} for j, c in enumerate(caps)]
    images.append({"id": 999, "file_name": "uncaptioned.png"})  # no captions: left out
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


@pytest.fixture
def coco(tmp_path):
    train = write_coco(tmp_path / "captions_train.json", TRAIN_CAPTIONS, "train2014", tmp_path)
    val = write_coco(tmp_path / "captions_val.json", VAL_CAPTIONS, "val2014", tmp_path)
    return tmp_path, train, val


def write_karpathy(tmp_path, with_filepath=True):
    entries = []
    splits = {1: "train", 2: "train", 3: "restval", 10: "val", 11: "test"}
    for image_id, caps in {**TRAIN_CAPTIONS, **VAL_CAPTIONS}.items():
        folder = "train2014" if splits[image_id] in ("train", "restval") else "val2014"
        name = f"img_{image_id}.jpg"
        write_image(tmp_path / "images" / (folder if with_filepath else "") / name, seed=image_id)
        entry = {"filename": name, "imgid": image_id + 1000, "split": splits[image_id],
                 "sentences": [{"tokens": tokenize(c), "raw": c} for c in caps]}
        if with_filepath:
            entry.update(filepath=folder, cocoid=image_id)
        entries.append(entry)
    path = tmp_path / ("dataset_coco.json" if with_filepath else "dataset_flickr8k.json")
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return path


# ----------------------------------------------------------------------------- readers
def test_read_coco_captions(coco):
    root, train, _ = coco
    records = read_coco_captions(train, root / "train2014")
    assert [r.image_id for r in records] == [1, 2, 3]  # the uncaptioned image is left out
    assert records[0].references == TRAIN_CAPTIONS[1]
    assert records[0].tokens[0] == ["a", "dog", "runs", "on", "the", "grass"]
    assert records[1].path == root / "train2014" / "train2014_000002.png"


def test_read_karpathy_restval_and_paths(tmp_path):
    path = write_karpathy(tmp_path)
    splits = read_karpathy(path, tmp_path / "images")
    assert [r.image_id for r in splits["train"]] == [1, 2, 3]
    assert [r.image_id for r in splits["val"]] == [10] and [r.image_id for r in splits["test"]] == [11]
    assert splits["train"][0].path == tmp_path / "images" / "train2014" / "img_1.jpg"
    assert splits["val"][0].references == VAL_CAPTIONS[10]
    no_restval = read_karpathy(path, tmp_path / "images", restval_in_train=False)
    assert [r.image_id for r in no_restval["train"]] == [1, 2]
    flickr = read_karpathy(write_karpathy(tmp_path, with_filepath=False), tmp_path / "images")
    assert flickr["train"][0].image_id == 1001 and flickr["train"][0].path == tmp_path / "images" / "img_1.jpg"


# ----------------------------------------------------------------------------- datamodule
def coco_dm(root, train, val, **kw):
    args = dict(format="coco", train_annotations=str(train), val_annotations=str(val),
                test_annotations=str(val), train_image_root=str(root / "train2014"),
                val_image_root=str(root / "val2014"), test_image_root=str(root / "val2014"),
                image_size=16, resize_size=20, batch_size=3, min_freq=2, max_len=10, num_workers=0,
                max_vocab=None)
    args.update(kw)
    return CaptionsDataModule(**args)


def test_vocab_from_training_captions_only(coco):
    dm = coco_dm(*coco)
    vocab = dm.vocab  # available before setup
    assert "zebra" not in vocab and "standing" not in vocab  # validation-only words
    assert "dog" in vocab and "sofa" in vocab and "grass" in vocab
    assert "brown" not in vocab  # seen once in training, min_freq=2
    dm.setup("fit")
    zebra = dm.datasets["val"].captions[0]  # "a zebra on the grass" through the training vocabulary
    assert zebra[2].item() == UNK_ID and zebra[0].item() == START_ID
    assert len(coco_dm(*coco, min_freq=1, max_vocab=3).vocab) == 4 + 3


def test_training_batches_are_bucketed_pairs(coco):
    dm = coco_dm(*coco)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(loader.batch_sampler, BucketBatchSampler)
    captions_seen = []
    for batch in loader:
        b = len(batch["image_ids"])
        assert batch["images"].shape == (b, 3, 16, 16) and batch["images"].dtype == torch.float32
        caps, lengths = batch["captions"], batch["lengths"]
        assert caps.shape[1] == lengths.max()
        assert (caps[:, 0] == START_ID).all() and (caps[torch.arange(b), lengths - 1] == END_ID).all()
        assert (caps[torch.arange(caps.shape[1])[None] >= lengths[:, None]] == PAD_ID).all()
        for row, image_id in zip(caps, batch["image_ids"]):
            captions_seen.append((image_id, row[1:int((row != PAD_ID).sum()) - 1].tolist()))
    # every (image, caption) pair once; the 14-word caption (> max_len=10) left out of training
    vocab = dm.vocab
    expected = [(i, vocab.encode(tokenize(c))) for i, caps in TRAIN_CAPTIONS.items() for c in caps
                if len(tokenize(c)) <= 10]
    assert sorted(captions_seen) == sorted(expected) and len(expected) == 7


def test_eval_batches_are_the_shared_preprocessing_and_never_normalised(coco):
    from zoo.guards.files import load_image
    from zoo.preprocess import Preprocessing

    dm = coco_dm(*coco)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert batch["image_ids"] == [10, 11]
    assert batch["references"] == [VAL_CAPTIONS[10], VAL_CAPTIONS[11]]
    images = batch["images"]
    assert images.shape[1:] == (3, 16, 16) and 0 <= images.min() and images.max() <= 1
    # the same file, prepared the way `zoo caption` and `zoo.get_weights(...).transforms()` do
    spec = Preprocessing(3, (16, 16), "crop", 20)
    for image, record in zip(images, dm.records("val")[:2]):
        assert torch.equal(image, spec(load_image(record.path)))
    # normalisation belongs to the model's encoder: the data module has no such argument
    with pytest.raises(TypeError, match="normalize"):
        coco_dm(*coco, normalize=True)
    # eval.py's --split val switch
    dm.test_split = "val"
    dm.setup("test")
    assert next(iter(dm.test_dataloader()))["image_ids"] == [10, 11]


def test_normalize_is_refused_as_any_unknown_argument(tmp_path, capsys):
    """Normalisation belongs to the model's encoder (model.init_args.backbone.normalize); the data
    module has no `normalize` argument, so train.py refuses one like any unknown argument."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(REPO / "configs/sat/coco_soft.yaml"), "--data.init_args.normalize", "true",
              f"--trainer.default_root_dir={tmp_path}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: error: data (CaptionsDataModule): Option 'normalize' is not accepted")


def test_karpathy_datamodule(tmp_path):
    path = write_karpathy(tmp_path)
    dm = CaptionsDataModule(format="karpathy", karpathy_json=str(path), image_root=str(tmp_path / "images"),
                            image_size=16, resize_size=18, batch_size=4, min_freq=1, max_len=20, num_workers=0)
    dm.setup()
    assert len(dm.datasets["train"]) == sum(len(c) for c in TRAIN_CAPTIONS.values())
    assert "zebra" not in dm.vocab
    assert next(iter(dm.test_dataloader()))["image_ids"] == [11]
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape[1:] == (3, 16, 16)


# ----------------------------------------------------------------------------- errors
def test_missing_and_malformed_files_are_clear_errors(coco, tmp_path):
    root, train, val = coco
    with pytest.raises(UserError, match="nope.json: no such file"):
        coco_dm(root, tmp_path / "nope.json", val).vocab
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="bad.json: not valid JSON"):
        coco_dm(root, bad, val).vocab
    bad.write_text(json.dumps({"images": []}))
    with pytest.raises(UserError, match="bad.json: not a COCO captions file"):
        coco_dm(root, bad, val).vocab
    bad.write_text(json.dumps({"images": [{"id": 1}], "annotations": []}))
    with pytest.raises(UserError, match=r"bad.json: images\[0\] needs"):
        coco_dm(root, bad, val).vocab
    bad.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}],
                               "annotations": [{"image_id": 2, "caption": "x"}]}))
    with pytest.raises(UserError, match="bad.json: 1 captions refer to images not listed"):
        coco_dm(root, bad, val).vocab
    with pytest.raises(UserError, match="is a directory"):
        read_coco_captions(tmp_path, tmp_path)
    bad.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "nope", "sentences": []}]}))
    with pytest.raises(UserError, match=r"bad.json: images\[0\] needs"):
        read_karpathy(bad, tmp_path)
    with pytest.raises(UserError, match="captions_train.json: this is a COCO captions file, not a Karpathy split; "
                                        "use format: coco with train_annotations"):
        read_karpathy(train, tmp_path)  # a COCO file given as a Karpathy split
    karpathy = write_karpathy(tmp_path)
    with pytest.raises(UserError, match="this is a Karpathy split file, not COCO captions; use format: karpathy"):
        coco_dm(root, karpathy, val).vocab  # and the reverse
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(UserError, match="bad.json: not a Karpathy split file"):
        read_karpathy(bad, tmp_path)


def test_missing_images_and_bad_settings(coco, tmp_path):
    root, train, val = coco
    (root / "train2014" / "train2014_000002.png").unlink()
    with pytest.raises(UserError, match=r"1 of 3 train images are missing, e\.g\. .*train2014_000002\.png"):
        coco_dm(root, train, val).setup("fit")
    with pytest.raises(UserError, match="empty vocabulary"):
        coco_dm(root, train, val, min_freq=1000).vocab
    with pytest.raises(UserError, match=r"image root .*nowhere \(train\) is not a directory; set data.init_args.train_image_root"):
        coco_dm(root, train, val, train_image_root=str(tmp_path / "nowhere")).setup("fit")
    with pytest.raises(UserError, match="unknown format"):
        CaptionsDataModule(format="flickr")
    with pytest.raises(UserError, match="needs karpathy_json"):
        CaptionsDataModule(format="karpathy")
    with pytest.raises(UserError, match="no test_annotations"):
        coco_dm(root, train, val, test_annotations=None).setup("test")
    # a corrupt image file is reported by name when it is loaded
    (root / "val2014" / "val2014_000010.png").write_bytes(b"not an image")
    dm = coco_dm(root, train, val)
    with pytest.raises(UserError, match="val2014_000010.png: not a readable image"):
        dm.setup("validate")
        next(iter(dm.val_dataloader()))


def test_a_given_vocabulary_says_how_many_training_words_become_unk(coco, caplog):
    dm = coco_dm(*coco, vocab=["<pad>", "<start>", "<end>", "<unk>", "dog", "grass"])
    words = [w for image in dm.training_tokens() for caption in image if 0 < len(caption) <= 10 for w in caption]
    unknown = [w for w in words if w not in ("dog", "grass")]
    assert 0 < len(unknown) < len(words)
    with caplog.at_level("WARNING", logger="zoo"):
        dm.setup("fit")
    assert (f"{len(unknown)} of {len(words)} training caption words ({len(set(unknown))} distinct) are not in "
            "the given vocabulary of 2 words: they read as <unk>") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="zoo"):
        coco_dm(*coco).setup("fit")  # a vocabulary built from these captions loses nothing to say
    assert "read as <unk>" not in caplog.text


def test_caption_files_name_each_rows_image_file_for_predict_records(coco):
    """`train.py predict` on caption files writes each image's path (zoo.models.predict.item_source)."""
    from zoo.models.predict import item_source

    dm = coco_dm(*coco)
    dm.setup("test")
    test = dm.datasets["test"]
    files = [item_source(test, i) for i in range(len(test))]
    assert files == [{"path": str(record.path)} for record in dm.records("test")]
    assert files[0]["path"].endswith("val2014_000010.png")
