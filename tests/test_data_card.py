"""The data card (zoo.data.card): every data module of the zoo declares one; a card is checked
against its class when the class is defined; and every registered data set keeps its card's
promises on its tiny configuration (the size, channels and labels of what it serves, its boxes,
its limits). Registry-wide: the data sets come from the cards, never from a hand list."""
from __future__ import annotations

import inspect
import json

import pytest
import torch

from zoo import registry
from zoo.classes import registered, resolve_class
from zoo.data.base import SplitDataModule
from zoo.data.card import DataCard, data_sets, dimensions_of, tiny_data
from zoo.guards.errors import UserError

TINY = tiny_data()
SETS = sorted(data_sets().items())


def _built(cls, init_args: dict):
    dm = cls(**init_args)
    dm.setup()
    return dm


def _images(batch) -> torch.Tensor:
    return batch[0] if isinstance(batch, (tuple, list)) else batch["images"]


def test_every_data_module_of_the_zoo_declares_its_card():
    own = [resolve_class(path, "data") for path in registered("data") if path.startswith("zoo.data.")]
    assert own and all("card" in cls.__dict__ and isinstance(cls.card, DataCard) for cls in own), \
        [cls.__name__ for cls in own if "card" not in cls.__dict__]
    assert {f"{cls.__module__}.{cls.__qualname__}" for cls in own} <= set(data_sets())


@pytest.mark.parametrize("path, cls", SETS, ids=[cls.__name__ for _, cls in SETS])
def test_every_card_gives_a_tiny_configuration_or_says_why_not(path, cls):
    assert cls.card.tiny or cls.card.skip.get("tiny"), f"{path}: card.tiny, or card.skip['tiny'] with the reason"


@pytest.mark.parametrize("name, cls, init_args", TINY, ids=[t[0] for t in TINY])
def test_a_tiny_data_set_serves_what_its_card_promises(tiny_data, name, cls, init_args):
    """A training batch has the size `image_size_for` gives the model, the channels
    `image_chans_for` gives it and labels of its class names, with pixels in [0, 1] once on the device."""
    dm = _built(cls, init_args)
    arguments = cls.arguments(**init_args)
    batch = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    images = _images(batch)
    assert images.dtype == torch.float32 and images.dim() == 4 and 0 <= images.min() and images.max() <= 1
    assert tuple(images.shape[2:]) == cls.image_size_for(**arguments)
    assert images.shape[1] == cls.image_chans_for(**arguments) == cls.card.channels
    names = cls.class_names_for(**arguments)
    assert names == (list(cls.card.class_names) if cls.card.class_names else None)
    if names and isinstance(batch, (tuple, list)):
        labels = batch[1]
        assert labels.dtype == torch.int64 and 0 <= labels.min() and labels.max() < len(names)
    assert name in dm.summary()


@pytest.mark.parametrize("name, cls, init_args", TINY, ids=[t[0] for t in TINY])
def test_known_boxes_lie_on_the_images(tiny_data, name, cls, init_args):
    if cls.boxed_examples is SplitDataModule.boxed_examples:
        with pytest.raises(UserError, match="no item boxes"):
            _built(cls, init_args).boxed_examples("test", 2)
        return
    examples = _built(cls, init_args).boxed_examples("test", 3)
    images, targets = examples["images"], examples["targets"]
    assert len(images) == len(targets) == 3 and targets.dim() == 3 and targets.shape[-1] == 4
    height, width = images.shape[2:]
    real = targets[(targets >= 0).all(-1)]  # -1: an empty slot
    assert len(real) and (real[:, 0] < real[:, 2]).all() and (real[:, 1] < real[:, 3]).all()
    assert (real[:, 2] <= width).all() and (real[:, 3] <= height).all()


@pytest.mark.parametrize("path, cls", SETS, ids=[cls.__name__ for _, cls in SETS])
def test_each_size_argument_is_refused_above_its_limit_in_one_line(path, cls):
    for name, top in dimensions_of(cls).items():
        with pytest.raises(UserError, match=rf"data.init_args.{name}: .* 0..{top:,.0f} .*ZOO_LIMITS={name}=N") as err:
            cls(**{name: int(top) + 1})
        assert "\n" not in str(err.value)


def test_zoo_limits_knows_every_cards_names_before_importing_the_data():
    """ZOO_LIMITS=<name>=N names a card's limit: zoo.guards.budget reads the names from the model index."""
    stored = set(json.loads(registry.INDEX_PATH.read_text())["limit_names"])
    missing = {name for cls in data_sets().values() for name in dimensions_of(cls)} - stored
    assert not missing, f"run python scripts/model_index.py: {sorted(missing)}"


def test_the_card_sets_the_facts_readers_take_from_the_class():
    for cls in data_sets().values():
        card = cls.card
        assert cls.image_size_argument == card.image_size and cls.image_chans == card.channels
        assert cls.path_arguments == card.path_arguments
        assert cls.class_names == (list(card.class_names) if card.class_names is not None else None)
        params = inspect.signature(cls.__init__).parameters
        assert card.image_size is None or card.image_size in params


# ----------------------------------------------------------------------------- registration
class _Base(SplitDataModule):
    def __init__(self, canvas_size: int = 32, num_train: int = 10, root: str | None = None, batch_size: int = 4):
        super().__init__()
        self.save_hyperparameters()

    def loader(self, split):
        raise NotImplementedError


@pytest.mark.parametrize("card, message", [
    (DataCard(image_size="side"), r"card.image_size names 'side', which its constructor does not take"),
    (DataCard(dimensions={"depth": 3}), r"card.dimensions names 'depth'"),
    (DataCard(path_arguments=("folder",)), r"card.path_arguments names 'folder'"),
    (DataCard(path_arguments=("root",), tiny={"root": "/tmp"}), r"card.tiny sets the path argument\(s\) root"),
    (DataCard(image_size="canvas_size", tiny={"canvas_size": 8}),
     r"card.tiny sets 'canvas_size', the size of its images"),
    ({"channels": 1}, r"card must be a DataCard, got dict")])
def test_a_card_that_does_not_fit_its_class_is_refused_when_the_class_is_defined(card, message):
    known = data_sets()
    with pytest.raises(TypeError, match=message):
        type("Misfit", (_Base,), {"card": card, "__module__": __name__})
    assert data_sets() == known


def test_a_fact_is_stated_on_the_card_only():
    with pytest.raises(TypeError, match=r"image_chans come from its card \(card.channels\); state them there only"):
        type("Twice", (_Base,), {"card": DataCard(channels=1), "image_chans": 1, "__module__": __name__})


def test_a_data_set_registers_by_its_card_and_its_limits_follow(monkeypatch):
    from zoo.data import card as card_module

    monkeypatch.setattr(card_module, "_DATA", dict(card_module._DATA))
    monkeypatch.setitem(registry.ALLOWED_CLASSES, "data", set(registry.ALLOWED_CLASSES["data"]))

    class Squares(_Base):
        card = DataCard(image_size="canvas_size", channels=1, class_names=("a", "b"), path_arguments=("root",),
                        dimensions={"canvas_size": 64}, tiny={"num_train": 2})

    class Instrumented(Squares):
        pass

    path = f"{__name__}.{Squares.__qualname__}"
    assert data_sets()[path] is Squares and path in registry.ALLOWED_CLASSES["data"]
    assert Squares.class_names == ["a", "b"] and Squares.path_arguments == ("root",) and Instrumented.image_chans == 1
    assert Squares.image_size_for(canvas_size=48) == (48, 48)
    assert dimensions_of(Squares) == {"num_train": 10_000_000, "canvas_size": 64}  # shared ones it takes, its own
    with pytest.raises(UserError, match=r"data.init_args.canvas_size: 65 is outside the sane range 0..64"):
        Instrumented(canvas_size=65)
    monkeypatch.setenv("ZOO_LIMITS", "canvas_size=100")
    assert Instrumented(canvas_size=65).hparams.canvas_size == 65


@pytest.mark.parametrize("path, cls", SETS, ids=[cls.__name__ for _, cls in SETS])
def test_every_data_set_names_itself_as_a_hub_card_does(path, cls):
    """`dataset_for`: the id and title a model card's model-index gives the data set (zoo card)."""
    dataset_id, name = cls.dataset_for(**cls.arguments())
    assert dataset_id.isidentifier() and dataset_id == dataset_id.lower() and "datamodule" not in dataset_id
    assert name and name[0].isupper() and "DataModule" not in name and "\n" not in name
    size = cls.image_size_for(**cls.arguments())
    assert size is None or f"{size[1]}x{size[0]}" in name  # the served size tells the variants apart


def test_loaders_pin_memory_only_for_a_trainer_on_cuda(tmp_path, recwarn):
    """Pinned batches help copies to CUDA only; on a CPU trainer (or none) torch would warn that they
    are unused: every data module's loaders (SplitDataModule.plain_loader, bucketed_loader) ask the trainer."""
    import types

    import lightning as L
    import numpy as np
    from lightning.pytorch.accelerators import CUDAAccelerator
    from PIL import Image

    from zoo.data.imagefolder import ImageFolderDataModule

    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / split / "cat" / "0.png")
    data = ImageFolderDataModule(str(tmp_path), image_size=8, batch_size=1, num_workers=0)
    data.setup("fit")
    assert not data.val_dataloader().pin_memory  # no trainer
    data.trainer = L.Trainer(accelerator="cpu", logger=False)
    loader = data.train_dataloader()
    assert not loader.pin_memory
    next(iter(loader))
    assert not [w for w in recwarn if "pin_memory" in str(w.message)]
    data.trainer = types.SimpleNamespace(accelerator=CUDAAccelerator())  # a trainer on CUDA (no GPU needed)
    assert data.train_dataloader().pin_memory and data.val_dataloader().pin_memory
