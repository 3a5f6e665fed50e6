"""The family card: a family's facts, stated once next to its model (CONTRIBUTING.md), and the
registry that finds every family by its card. A class that declares `card` in its own body is a
family: when it is defined its hooks are checked and it is registered (zoo.classes may then name
it); everything that needs the families (preprocessing, export, golden outputs, compiled steps,
benchmarks, registry-wide tests) reads the cards, exclusions as data (`skip`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.classes import allow_class

OUTPUTS = ("logits", "caption", "sample")
RESIZE_RULES = ("squash", "exact")
#: the hooks every family writes (zoo.models.base); `attention_record` too where the card attends
HOOKS = ("train_loss", "eval_metrics", "example_batch")

_FAMILIES: dict[str, type] = {}


@dataclass(frozen=True)
class CompileHints:
    """How zoo.models.accel compiles the family's steps, as measured by benchmarks/accel.py."""

    #: methods compiled instead of a step too long to compile whole (DRAW's cell)
    pieces: tuple[str, ...] = ()
    #: input shapes per step that get their own static graph (caption length buckets); others run eager
    max_shapes: int = 1
    #: the fewest optimizer steps of a CPU run for which compiling pays off (`--accel auto`); None: never
    cpu_min_steps: int | None = None


@dataclass(frozen=True)
class StepCost:
    """How a glimpse family's cost splits into steps: the hyperparameter counting them, and the
    submodules run once per image (a context network), for MACs per step (zoo.commands.cost)."""

    count: str
    once: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyCard:
    #: short name: checkpoints, exports and messages say it ("ram", "captioner")
    name: str
    #: what the model answers an image with: "logits", "caption" or "sample" (a generator: nothing to
    #: export; its golden output is a seeded sample)
    output: str = "logits"
    #: how a user's image reaches the input size: "squash" (resize) or "exact" (refuse another size:
    #: the model's coordinates are input pixels)
    resize: str = "squash"
    #: channels every model of the family takes (None: its `in_chans` hyperparameter)
    channels: int | None = None
    #: the kind of its attention record (zoo.attention.record); None: it records none
    attention: str | None = None
    #: the names of `export_forward`'s outputs (families that answer "logits")
    exports: tuple[str, ...] = ("logits",)
    #: parameter-name prefixes of the classifier head: a new label set starts them fresh
    head_keys: tuple[str, ...] = ()
    #: parameters whose rows are indexed by the vocabulary (kept per known word on a new vocabulary)
    vocab_keys: tuple[str, ...] = ()
    #: metrics shown in the progress bar
    progress_bar: tuple[str, ...] = ("loss", "acc")
    compile: CompileHints = CompileHints()
    #: its glimpse steps, for MACs per step (None: one pass over the image)
    steps: StepCost | None = None
    #: the largest sane value of each of its size arguments, checked before a model is built
    #: (zoo.guards.budget, beside the shared ones)
    dimensions: dict[str, float] = field(default_factory=dict)
    #: hyperparameters the data fills in (a captioner's vocabulary), with an example value
    filled_by_data: dict[str, Any] = field(default_factory=dict)
    #: tiny configurations by name for the registry-wide tests, the first the smallest
    tiny: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: registry-wide checks that leave the family out, and why (exclusions as data)
    skip: dict[str, str] = field(default_factory=dict)
    #: the registry names (recipes) benchmarks/accel.py times for the family
    bench_recipes: tuple[str, ...] = ()

    def __post_init__(self):
        for key, allowed in (("output", OUTPUTS), ("resize", RESIZE_RULES)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"family card {self.name!r}: {key} must be one of {allowed}, "
                                 f"got {getattr(self, key)!r}")


def register(cls: type, base: type) -> type:
    """Register the family `cls` (called by ZooModule, `base`): its hooks written, its name unique."""
    card = cls.card
    if not isinstance(card, FamilyCard):
        raise TypeError(f"{cls.__qualname__}.card must be a FamilyCard, got {type(card).__name__}")
    hooks = HOOKS + (("attention_record",) if card.attention else ())
    missing = [hook for hook in hooks if getattr(cls, hook) is getattr(base, hook)]
    if missing:
        raise TypeError(f"{cls.__qualname__} (family {card.name!r}) must write {', '.join(missing)}: "
                        "the family contract (zoo.models.base)")
    absent = [piece for piece in card.compile.pieces if not callable(getattr(cls, piece, None))]
    if absent:
        raise TypeError(f"{cls.__qualname__}: card.compile.pieces names no method {', '.join(absent)}")
    known = _FAMILIES.get(card.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise TypeError(f"family name {card.name!r} is taken by {known.__module__}.{known.__qualname__}")
    cls.family = card.name
    _FAMILIES[card.name] = cls
    return allow_class(cls, "model")


def families() -> dict[str, type]:
    """Every registered family by name (the zoo's own imported, and any other defined)."""
    from zoo.classes import registered

    registered("model")
    return dict(sorted(_FAMILIES.items()))


def tiny_models() -> list[tuple[str, type, dict]]:
    """(id, family class, hyperparameters) of every family's tiny configurations ("ram", "ram-dram_shaped")."""
    return [(name if not variant else f"{name}-{variant}", cls, hparams)
            for name, cls in families().items() for variant, hparams in cls.card.tiny.items()]
