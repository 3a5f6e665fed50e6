"""Issue 34, item 1: the Lightning verbs on a finished run. `validate`, `test` and `predict` with the
run's own config.yaml and a checkpoint need no other flag, leave every file of the run as it was
and log to a W&B run of their own; `predict` writes each family's answers as JSON lines (zoo/training/verbs.py,
zoo/models/predict.py); `fit --config RUN/config.yaml` still starts a run afterwards."""
from __future__ import annotations

import inspect
import json

import lightning as L
import numpy as np
import pytest
import torch

import zoo.training.train as TRAIN
from conftest import REPO, TINY_TEST, TINY_VAL, wandb_runs
from zoo import registry
from zoo.data.fashion_mnist import FashionMNISTDataModule
from zoo.guards.errors import UserError
from zoo.models.base import class_path
from zoo.models.card import tiny_models
from zoo.models.predict import PredictionWriter


@pytest.fixture(autouse=True)
def offline_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B runs land in tmp_path/wandb, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _wandb_ids(tmp_path) -> list[str]:
    return [run_id for run_id, _ in wandb_runs(tmp_path)]


def _refused(args, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        TRAIN.main(args)
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_validate_test_and_predict_read_a_run_and_never_write_it(tmp_path, tiny_data, capsys):
    root = tmp_path / "run"
    TRAIN.main(["fit", "--config", str(REPO / "configs/baseline/mlp_centered.yaml"), f"--trainer.default_root_dir={root}",
                f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32", "--trainer.max_epochs=1",
                "--trainer.enable_model_summary=false", "--trainer.enable_progress_bar=false",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])
    before = _files(root)
    trained_id = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["zoo_run"]["wandb_id"]
    on_run = ["--config", str(root / "config.yaml"), "--ckpt_path", str(root / "checkpoints" / "last.ckpt")]
    predictions = tmp_path / "predictions.jsonl"
    for verb in (["validate"], ["test"], ["predict", "--predictions", str(predictions)]):
        TRAIN.main([*verb, *on_run])  # no other flag
    assert _files(root) == before  # config.yaml byte-identical, no checkpoint, figure or lock rewritten
    ids = _wandb_ids(tmp_path)
    assert ids.count(trained_id) == 1 and len(set(ids)) == len(ids) == 4  # each verb a W&B run of its own

    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(TINY_TEST))  # the test split, in order
    # which image each answers: the split predict served, and (no files: IDX arrays) the data set's index
    assert all(line["split"] == "test" and line["data_index"] == line["index"] and "path" not in line for line in lines)
    names = FashionMNISTDataModule.class_names  # the run's data named its classes
    assert all(c["name"] == names[c["class"]] and 0 <= c["prob"] <= 1 for line in lines for c in line["classes"])
    assert all(len(line["classes"]) == 5 for line in lines)

    # bad input: one line, exit 2, the existing file left alone
    assert "give --predictions FILE" in _refused(["predict", *on_run], capsys)
    kept = predictions.read_bytes()
    assert "exists; --overwrite replaces it" in _refused(["predict", *on_run, "--predictions", str(predictions)], capsys)
    assert predictions.read_bytes() == kept
    TRAIN.main(["predict", *on_run, "--predictions", str(predictions), "--overwrite", "--top_k", "2"])
    assert all(len(json.loads(line)["classes"]) == 2 for line in predictions.read_text().splitlines())
    assert _files(root) == before

    # the saved config is still a recipe that fit takes
    second = tmp_path / "second"
    TRAIN.main(["fit", "--config", str(root / "config.yaml"), f"--trainer.default_root_dir={second}"])
    assert torch.load(second / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


#: the first tiny configuration of every registered family
FIRST = [(name, cls, hp) for name, cls, hp in tiny_models() if name == cls.card.name]


def _predict(model, batch, path, **writer):
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", callbacks=[PredictionWriter(path, **writer)])
    loader = torch.utils.data.DataLoader([0, 1], batch_size=1, collate_fn=lambda _: batch)  # the batch twice
    trainer.predict(model, dataloaders=loader, return_predictions=False)
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name,cls,hparams", FIRST, ids=[n for n, _, _ in FIRST])
def test_predict_writes_what_each_family_answers(name, cls, hparams, tmp_path):
    named = "class_names" in inspect.signature(cls).parameters
    num_classes = hparams.get("num_classes", 10)
    names = [f"kind {i}" for i in range(num_classes)] if named else None
    torch.manual_seed(0)
    model = registry.build({"class_path": class_path(cls), "init_args": dict(hparams)},
                           **({"class_names": names} if named else {})).eval()
    model.accel.force("eager")
    batch = model.example_batch(3)
    images = batch["images"] if isinstance(batch, dict) else batch[0]
    path = tmp_path / "out.jsonl"
    if cls.card.output == "sample":
        with pytest.raises(UserError, match="is a generator: it answers no image"):
            _predict(model, batch, path)
        assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written
        return
    lines = _predict(model, batch, path, top_k=3)
    assert [line["index"] for line in lines] == list(range(6))
    # a loader given without a data module: no split; its batches hold more images than indices
    assert all(line["split"] is None and line["data_index"] == line["index"] for line in lines)
    with torch.no_grad():
        if cls.card.output == "caption":
            captions = [" ".join(r["words"]) for r in model.caption(images)]
            assert [line["caption"] for line in lines] == captions * 2
            return
        scores = model.export_forward(images)
        scores = scores[0] if isinstance(scores, (tuple, list)) else scores
    best = scores.argmax(-1).tolist()  # [B] or [B, cells]
    for line, expected in zip(lines, best * 2):
        if isinstance(expected, list):  # an answer per position
            assert [cell["class"] for cell in line["cells"]] == expected
            continue
        ranked = line["classes"]
        assert len(ranked) == min(3, scores.shape[-1]) and ranked[0]["class"] == expected
        assert [c["prob"] for c in ranked] == sorted((c["prob"] for c in ranked), reverse=True)
        assert sum(c["prob"] for c in ranked) <= 1 + 1e-5
        if names:
            assert [c["name"] for c in ranked] == [names[c["class"]] for c in ranked]


def test_predict_records_name_each_image_file_of_a_folder_and_the_split(tmp_path):
    """ImageFolder data: each line carries its image's path and the split predict served
    (`test_split`, as eval.py --split sets it), in the loader's order."""
    from PIL import Image

    from zoo.data.imagefolder import ImageFolderDataModule
    from zoo.models.baselines import Classifier

    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2 if split == "test" else 1):
                Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / split / cls / f"{i}.png")
    model = Classifier(arch="mlp", image_size=16, in_chans=3, num_classes=2, hidden=[8], class_names=["cat", "dog"])
    for split, expected in (("test", ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"]), ("val", ["cat/0.png", "dog/0.png"])):
        data = ImageFolderDataModule(str(tmp_path), image_size=16, batch_size=3, num_workers=0)
        data.test_split = split
        path = tmp_path / f"{split}.jsonl"
        trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", callbacks=[PredictionWriter(path, top_k=1)])
        trainer.predict(model, datamodule=data, return_predictions=False)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [line["path"] for line in lines] == [str(tmp_path / split / name) for name in expected]
        assert all(line["split"] == split and "data_index" not in line for line in lines)
        assert [line["index"] for line in lines] == list(range(len(expected)))
