"""The data card: a data set's facts, stated once next to its data module, and the registry of data
sets by their cards. A SplitDataModule subclass declaring `card` in its own body is a data set: when
it is defined, the card is checked against its constructor, the class facts (CLASS_FACTS) are set
from it, and it is registered. CONTRIBUTING.md ("Data") says what each field means.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

#: the largest sane values of the arguments most data modules take (split sizes, loader workers);
#: `batch_size`, `limit_eval` and `max_vocab` are zoo.guards.budget's
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
    image_size: str | None = None  # the argument that fixes the served images' size
    channels: int | None = None  # None: `image_chans_for(**init_args)` decides
    class_names: tuple[str, ...] | None = None  # None: `class_names_for(**init_args)`, or no labels
    path_arguments: tuple[str, ...] = ()  # places on disk: a file's data config never sets them
    dimensions: dict[str, float] = field(default_factory=dict)  # the largest sane value of each size argument
    tiny: dict[str, Any] = field(default_factory=dict)  # cheap settings for the tests, never its image size
    skip: dict[str, str] = field(default_factory=dict)  # registry-wide checks that leave it out, and why

    def __post_init__(self):
        object.__setattr__(self, "path_arguments", tuple(self.path_arguments))
        if self.class_names is not None:
            object.__setattr__(self, "class_names", tuple(self.class_names))


def register(cls: type) -> type:
    """Register the data set `cls` declares, once its card agrees with its constructor (TypeError otherwise)."""
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
    """The largest sane value of each size argument of `cls`: its card's and the SHARED_DIMENSIONS it takes."""
    card = getattr(cls, "card", None)
    params = inspect.signature(cls.__init__).parameters
    return {**{k: v for k, v in SHARED_DIMENSIONS.items() if k in params}, **(card.dimensions if card else {})}


def data_sets() -> dict[str, type]:
    """Every registered data set by class path (each module of zoo.data imported first)."""
    from zoo.classes import registered

    registered("data")
    return dict(sorted(_DATA.items()))


def tiny_data() -> list[tuple[str, type, dict]]:
    """(class name, class, init_args) of every data set's tiny configuration, for the registry-wide tests."""
    return [(cls.__name__, cls, dict(cls.card.tiny)) for cls in data_sets().values() if cls.card.tiny]
