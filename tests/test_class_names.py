"""Class names travel with every family that has a classifier head (every family whose constructor
takes `class_names`, found by registration): from a data module through a plain
`Trainer.fit(model, datamodule)`, through `create_model(..., class_names=...)`, into checkpoints,
attention records and exports; every classifier release names its classes."""
from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch

import zoo
from zoo import registry
from zoo.guards.errors import UserError
from zoo.models.base import class_path
from zoo.models.card import tiny_models
from zoo.weights.hub import manifest

#: the first tiny configuration of every family whose head is named (class_names in its constructor)
NAMED_HEADS = [(name, cls, hp) for name, cls, hp in tiny_models()
               if "class_names" in inspect.signature(cls).parameters and name == cls.card.name]


def _tiny(cls, hparams, **overrides):
    return registry.build({"class_path": class_path(cls), "init_args": dict(hparams)}, **overrides)


class NamedBatches(L.LightningDataModule):
    """A data module that serves one batch (the model's own example form) and names its classes."""

    def __init__(self, batch, class_names):
        super().__init__()
        self.batch, self.class_names = batch, list(class_names)

    def train_dataloader(self):
        return torch.utils.data.DataLoader([0], collate_fn=lambda _: self.batch)

    val_dataloader = train_dataloader


def _fit(model, names):
    trainer = L.Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    model.accel.force("eager")
    trainer.fit(model, datamodule=NamedBatches(model.example_batch(2), names))
    return trainer


@pytest.mark.parametrize("name,cls,hparams", NAMED_HEADS, ids=[n for n, _, _ in NAMED_HEADS])
def test_a_plain_trainer_fit_names_the_head_after_its_data_and_the_names_travel(name, cls, hparams, tmp_path):
    model = _tiny(cls, hparams)
    assert model.class_names is None
    names = [f"kind {i}" for i in range(model.hparams.num_classes)]
    trainer = _fit(model, names)
    assert model.class_names == names
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True, map_location="cpu")
    assert saved["hyper_parameters"]["class_names"] == names
    assert saved["zoo"]["init_args"]["class_names"] == names
    loaded = zoo.load_checkpoint(path)
    assert loaded.class_names == names
    from zoo.weights.export import describe

    assert describe(loaded, "onnx")["class_names"] == names
    if loaded.card.attention:
        record = loaded.eval().attention_record(loaded.example_images(1)[0])
        assert record.prediction["class_names"] == names


@pytest.mark.parametrize("name,cls,hparams", NAMED_HEADS, ids=[n for n, _, _ in NAMED_HEADS])
def test_a_plain_trainer_fit_refuses_data_of_another_label_set_size(name, cls, hparams):
    model = _tiny(cls, hparams)
    names = [f"kind {i}" for i in range(model.hparams.num_classes + 1)]
    with pytest.raises(UserError, match=f"NamedBatches serves {len(names)} classes; the model's head has"):
        _fit(model, names)
    assert model.class_names is None


@pytest.mark.parametrize("name,cls,hparams", NAMED_HEADS, ids=[n for n, _, _ in NAMED_HEADS])
def test_class_names_given_to_a_model_are_checked_against_its_head(name, cls, hparams):
    count = _tiny(cls, hparams).hparams.num_classes
    names = [f"c{i}" for i in range(count)]
    assert _tiny(cls, hparams, class_names=names).class_names == names
    wider = names + ["extra"]
    assert _tiny(cls, hparams, num_classes=count + 1, class_names=wider).class_names == wider
    with pytest.raises(UserError, match=f"{count + 1} class_names for a head of num_classes {count}"):
        _tiny(cls, hparams, class_names=wider)
    with pytest.raises(UserError, match="class_names must be a list of strings"):
        _tiny(cls, hparams, class_names=list(range(count)))


def test_fitting_names_the_head_after_the_data_it_learns_and_other_verbs_keep_the_models():
    name, cls, hparams = NAMED_HEADS[0]
    model = _tiny(cls, hparams, class_names=[f"old {i}" for i in range(_tiny(cls, hparams).hparams.num_classes)])
    old = model.class_names
    new = [f"new {i}" for i in range(len(old))]
    trainer = L.Trainer(limit_val_batches=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    model.accel.force("eager")
    trainer.validate(model, datamodule=NamedBatches(model.example_batch(2), new), verbose=False)
    assert model.class_names == old
    _fit(model, new)
    assert model.class_names == new


CLASSIFIER_RELEASES = sorted(n for n, r in manifest().items()
                             if "class_names" in inspect.signature(registry.resolve_class(r["config"]["class_path"])).parameters)


@pytest.mark.parametrize("name", CLASSIFIER_RELEASES)
def test_every_classifier_release_names_its_classes(name):
    """Releases trained before their model stored names take them from the data they were trained on."""
    from zoo.commands.info import describe
    from zoo.viz.record import prediction_text

    model = zoo.create_model(name, pretrained=True).eval()
    names = model.class_names
    assert names and len(names) == model.hparams.num_classes
    assert describe(name)["class_names"] == names
    if model.card.attention:
        record = model.attention_record(model.example_images(1)[0])
        assert prediction_text(record, 0).split(" (")[0] in names


def test_a_release_for_a_new_label_set_is_unnamed_until_given_names():
    name = CLASSIFIER_RELEASES[0]
    count = zoo.create_model(name, pretrained=True).hparams.num_classes
    assert zoo.create_model(name, pretrained=True, num_classes=count + 1).class_names is None
    names = [f"n{i}" for i in range(count + 1)]
    assert zoo.create_model(name, pretrained=True, num_classes=count + 1, class_names=names).class_names == names
    with pytest.raises(UserError, match="class_names for a head of num_classes"):
        zoo.create_model(name, pretrained=True, class_names=names)
