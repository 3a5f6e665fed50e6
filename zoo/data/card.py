"""The data card: a data set's facts, stated once next to its data module, and the registry that
finds every data set by its card (never by a hand-kept list), as zoo.models.card does for families.

    class ClutteredScaleDataModule(GeneratedCanvasModule):
        card = DataCard(image_size="canvas_size", channels=1, class_names=CLASS_NAMES,
                        dimensions={"canvas_size": 4_096, "distractors": 100_000},
                        tiny=dict(val_size=16, limit_train=16, limit_eval=16, batch_size=8))

A SplitDataModule subclass that declares `card` in its own body is a data set. When the class is
defined its card is checked against its constructor (every name the card gives is an argument; the
tiny configuration sets no path nor image size), the facts readers take from the class
(`image_size_argument`, `image_chans`, `class_names`, `path_arguments`) are set from it, and it is
registered: files may name it (zoo.classes), zoo.guards.budget bounds its size arguments, and the
registry-wide tests build its tiny configuration (a batch of the promised size, channels and
labels; boxes inside the canvas).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

#: the arguments most data modules take (split sizes, loader workers) and their largest sane values:
#: a card bounds those its constructor takes without restating them (`batch_size`, `limit_eval` and
#: `max_vocab`, which commands' flags and export sets share, are zoo.guards.budget')
SHARED_DIMENSIONS: dict[str, float] = {
    **dict.fromkeys(["num_train", "num_val", "num_test", "val_items", "val_size", "limit_train"], 10_000_000),
    "eval_batch_size": 1_000_000, "num_workers": 256,
}
#: the facts a card states that readers take from the class, by class attribute
CLASS_FACTS = {"image_size_argument": "image_size", "image_chans": "channels", "class_names": "class_names",
               "path_arguments": "path_arguments"}

_DATA: dict[str, type] = {}


@dataclass(frozen=True)
class DataCard:
    #: the argument that fixes the size of the served images (`image_size_for` reads it; a module
    #: whose size follows from another argument, a variant, overrides `image_size_for`); None: none does
    image_size: str | None = None
    #: channels of every image it serves; None: `image_chans_for(**init_args)` decides (ImageFolder's
    #: `in_chans`)
    channels: int | None = None
    #: the label set, known before anything is built; None: found from the arguments by
    #: `class_names_for(**init_args)` (ImageFolder's class folders), or no labels (captions)
    class_names: tuple[str, ...] | None = None
    #: arguments that name places on disk: a checkpoint's or release's data config never sets them
    path_arguments: tuple[str, ...] = ()
    #: the largest sane value of each of its own size arguments (a list's elements each), beside
    #: SHARED_DIMENSIONS and zoo.guards.budget' names shared with models (`image_size`, `num_classes`)
    dimensions: dict[str, float] = field(default_factory=dict)
    #: arguments that make it cheap (split sizes, batches) on the tests' tiny Fashion-MNIST
    #: (tests/conftest.py), never what an image is (a recipe's images stay the recipe's): what the
    #: registry-wide tests build, and every recipe's real step on top of the recipe's arguments
    tiny: dict[str, Any] = field(default_factory=dict)
    #: registry-wide checks that leave it out, and why (exclusions as data)
    skip: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "path_arguments", tuple(self.path_arguments))
        if self.class_names is not None:
            object.__setattr__(self, "class_names", tuple(self.class_names))


def register(cls: type) -> type:
    """Register the data set `cls` declares (called by SplitDataModule when a class with a card is
    defined): the card's names must be its constructor's arguments, the class must not restate a
    fact the card gives, and the tiny configuration must set no path."""
    card = cls.card
    if not isinstance(card, DataCard):
        raise TypeError(f"{cls.__qualname__}.card must be a DataCard, got {type(card).__name__}")
    restated = [name for name in CLASS_FACTS if name in cls.__dict__]
    if restated:
        raise TypeError(f"{cls.__qualname__}: {', '.join(restated)} come from its card "
                        f"({', '.join(f'card.{CLASS_FACTS[n]}' for n in restated)}); state them there only")
    params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    named = {"image_size": [card.image_size] if card.image_size else [], "path_arguments": card.path_arguments,
             "dimensions": list(card.dimensions), "tiny": list(card.tiny)}
    for what, names in named.items():
        unknown = [name for name in names if name not in params]
        if unknown:
            raise TypeError(f"{cls.__qualname__}: card.{what} names {', '.join(map(repr, unknown))}, "
                            "which its constructor does not take")
    paths = set(card.tiny) & set(card.path_arguments)
    if paths:
        raise TypeError(f"{cls.__qualname__}: card.tiny sets the path argument(s) {', '.join(sorted(paths))}; "
                        "a test gives paths, the card never does")
    if card.image_size in card.tiny:
        raise TypeError(f"{cls.__qualname__}: card.tiny sets {card.image_size!r}, the size of its images; tiny "
                        "settings make data cheap, a recipe's images stay the recipe's")
    for name, attribute in CLASS_FACTS.items():
        value = getattr(card, attribute)
        setattr(cls, name, list(value) if name == "class_names" and value is not None else value)
    _DATA[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


def dimensions_of(cls: type) -> dict[str, float]:
    """The largest sane value of each size argument of data module `cls` (zoo.guards.budget checks a
    config's values by name against these, beside its shared names): its card's `dimensions` and
    the SHARED_DIMENSIONS its constructor takes."""
    card = getattr(cls, "card", None)
    params = inspect.signature(cls.__init__).parameters
    return {**{k: v for k, v in SHARED_DIMENSIONS.items() if k in params}, **(card.dimensions if card else {})}


def data_sets() -> dict[str, type]:
    """Every registered data set by class path: the zoo's own (each module of zoo.data imported) and
    any other that has been defined."""
    from zoo.classes import registered

    registered("data")
    return dict(sorted(_DATA.items()))


def tiny_data() -> list[tuple[str, type, dict]]:
    """(id, data module class, init_args) of every data set's tiny configuration, for the
    registry-wide tests (the id is the class name)."""
    return [(cls.__name__, cls, dict(cls.card.tiny)) for cls in data_sets().values() if cls.card.tiny]
