"""One name per hyperparameter fact across the zoo, and the old names that files still carry.

Shared facts: `image_size` (one side, or [height, width]), `in_chans`, `num_classes`, `lr_schedule`
("none" or "cosine"), `num_figures`; a family's own quantity keeps the paper's symbol (DRAW's `T`),
timm's names stay where we call timm. A wide family groups its arguments in `Block`s (dataclasses
of plain values, parsed field by field). Files written before a rename keep the old name: `RENAMED`,
`MOVED` (into a block), `RETIRED` and `MOVED_MODULES` (callbacks' and loggers' module paths) are the
tables every reader of a file's hyperparameters applies (`current_spec` / `current_config`); a
model's or data module's class path is never rewritten, so the allow-list still decides every class.
"""
from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Mapping
from typing import Any, Literal

from zoo.guards.errors import UserError

log = logging.getLogger("zoo")

#: class path -> {old argument name: current name}
RENAMED: dict[str, dict[str, str]] = {
    "zoo.models.vit.ViTClassifier": {"img_size": "image_size", "figure_images": "num_figures"},
    "zoo.models.baselines.Classifier": {"cosine_schedule": "lr_schedule"},
    "zoo.models.draw.DRAW": {"num_figure_images": "num_figures"},
    "zoo.models.draw.DRAWClassifier": {"cosine_schedule": "lr_schedule", "num_figure_images": "num_figures"},
    "zoo.models.item_grid.ItemGridClassifier": {"cosine_schedule": "lr_schedule"},
    "zoo.data.imagefolder.ImageFolderDataModule": {"channels": "in_chans"},
}

#: old argument name -> {old value: current value}, where a switch became a choice
RENAMED_VALUES: dict[str, dict[Any, Any]] = {
    "cosine_schedule": {True: "cosine", False: "none"},
}

#: class path -> {block: {argument: its default then}}: arguments that moved into a block; a config
#: giving any of a block's is from before the move, and one it left out meant that default
MOVED: dict[str, dict[str, dict[str, Any]]] = {
    "zoo.models.vit.ViTClassifier": {"backbone": {
        "kind": "timm_vit", "model_name": "vit_tiny_patch16_224", "patch_size": 4, "depth": 6, "embed_dim": 96,
        "num_heads": 3, "mlp_ratio": 2.0, "global_pool": None, "drop_rate": 0.0, "drop_path_rate": 0.1,
        "attn_drop_rate": 0.0, "mean": None, "std": None, "conv_stem": None, "conv_stem_blocks": 1,
        "pretrained": False, "pretrained_file": None, "model_kwargs": None}},
    "zoo.models.ram.RAM": {
        "retina": {"patch_size": 8, "num_scales": 1, "scale_factor": 2, "retina_method": "crop",
                   "retina_subpixel": True},
        "network": {"glimpse_hidden": 128, "location_hidden": 128, "glimpse_dim": 256, "hidden_size": 256,
                    "core": "rnn"},
        "policy": {"location_policy": "learned", "location_mean": "tanh", "std": 0.15, "std_mode": "fixed",
                   "std_final": 0.05, "std_anneal_steps": 10000, "reinforce_weight": 1.0, "baseline_weight": 1.0,
                   "reinforce_to_core": False, "train_samples": 1},
        "remedies": {"where_layer": False, "where_hidden": 256, "context": "none", "context_size": 12,
                     "context_channels": None, "reward": "correct", "reward_at": "last",
                     "classify_every_glimpse": False, "baseline": "shared", "location_supervision": 0.0},
        "optimization": {"optimizer": "adam", "lr": 1e-3, "momentum": 0.9, "weight_decay": 0.0,
                         "lr_schedule": "cosine", "location_lr_scale": 1.0}},
    "zoo.models.captioner.Captioner": {
        "decoder": {"score": "additive", "annotation_coords": False, "embed_dim": 64, "hidden_dim": 256,
                    "attention_dim": 128, "init_layers": 1, "gate": True, "deep_output": True,
                    "deep_output_activation": "tanh", "dropout": 0.5, "feed_context": True,
                    "attention_query": "previous", "active_rows": True},
        "hard": {"hard_estimator": "reinforce", "hard_samples": 1, "hard_test_mode": "expected",
                 "semi_sampling_p": 0.5, "entropy_coef": 0.002, "reward_scale": 0.1, "baseline": "moving_average",
                 "baseline_decay": 0.9, "reinforce_cost": "caption", "reinforce_discount": 0.0,
                 "gumbel_temperature": 1.0},
        "optimization": {"optimizer": "adam", "lr": 1e-3, "backbone_lr": None, "weight_decay": 0.0,
                         "lr_schedule": "none"}},
}
#: class path -> {old argument: its field name in the block}, where the block names it otherwise
MOVED_AS: dict[str, dict[str, str]] = {
    "zoo.models.ram.RAM": {"retina_method": "method", "retina_subpixel": "subpixel"},
    "zoo.models.captioner.Captioner": {"hard_estimator": "estimator", "hard_samples": "samples",
                                       "hard_test_mode": "test_mode"},
}

#: arguments no class takes any more -> (the value that asked for nothing, what took their place):
#: a file that gives that value loses the argument silently, any other value after one warning
RETIRED: dict[str, tuple[Any, str]] = {
    "accel": ("auto", "speed is a run option now (zoo train fit --accel MODE)"),
    "compile": (False, "speed is a run option now (zoo train fit --accel compile)"),  # ViT's older spelling
}

#: old module of a class path -> its module since zoo/ was grouped into packages (a run's config.yaml
#: names its logger `zoo.callbacks.ZooWandbLogger`)
MOVED_MODULES: dict[str, str] = {
    "zoo.errors": "zoo.guards.errors", "zoo.io": "zoo.guards.writes", "zoo.limits": "zoo.guards.budget",
    "zoo.hub": "zoo.weights.hub", "zoo.export": "zoo.weights.export", "zoo.export_set": "zoo.weights.export_set",
    "zoo.train": "zoo.training.train", "zoo.runs": "zoo.training.runs", "zoo.callbacks": "zoo.training.callbacks",
    "zoo.recipe_args": "zoo.training.recipe_args", "zoo.verbs": "zoo.training.verbs",
    "zoo.predict": "zoo.models.predict", "zoo.cli": "zoo.commands.cli", "zoo.evaluate": "zoo.commands.evaluate",
    "zoo.cost": "zoo.commands.cost", "zoo.info": "zoo.commands.info", "zoo.hf": "zoo.commands.card",
    "zoo.text": "zoo.guards.text",
}


def current_class_path(path: Any) -> Any:
    """A class path (a callback, logger or plugin a run's config.yaml names) in the current layout."""
    if not isinstance(path, str):
        return path
    module, _, name = path.rpartition(".")
    return f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else path


def current_class_paths(tree: Any) -> Any:
    """A parsed config with every `class_path` in the current layout (`tree` itself when none moved)."""
    if isinstance(tree, Mapping):
        new = {k: current_class_path(v) if k == "class_path" else current_class_paths(v) for k, v in tree.items()}
        return tree if all(new[k] is tree[k] for k in tree) else new
    if isinstance(tree, list):
        new = [current_class_paths(v) for v in tree]
        return tree if all(a is b for a, b in zip(new, tree)) else new
    return tree


_noted: set[tuple] = set()


def renamed_for(class_path: Any) -> dict[str, str]:
    """{old name: current name} (`block.field` for one that moved into a block) of a class path."""
    if not isinstance(class_path, str):
        return {}
    moved_as = MOVED_AS.get(class_path, {})
    moved = {old: f"{block}.{moved_as.get(old, old)}" for block, then in MOVED.get(class_path, {}).items()
             for old in then}
    return {**moved, **RENAMED.get(class_path, {})}


def current_init_args(class_path: Any, init_args: Any) -> Any:
    """`init_args` of `class_path` in current names (itself when nothing is renamed); an old and a
    current name that disagree are refused in one line."""
    renames = RENAMED.get(class_path, {}) if isinstance(class_path, str) else {}
    blocks = MOVED.get(class_path, {}) if isinstance(class_path, str) else {}
    moved_names = {name for then in blocks.values() for name in then}
    if not isinstance(init_args, Mapping) or not (renames.keys() | RETIRED.keys() | moved_names) & init_args.keys():
        return init_args
    out, done = dict(init_args), []
    for name in RETIRED.keys() & out.keys():
        value, (nothing, why) = out.pop(name), RETIRED[name]
        if value != nothing and (class_path, name, str(value)) not in _noted:
            _noted.add((class_path, name, str(value)))
            log.warning("%s: %s: %s is not applied; %s", str(class_path).rsplit(".", 1)[-1], name, value, why)
    for old, new in renames.items():
        if old not in out:
            continue
        value = _converted(old, out.pop(old))
        if new in out and out[new] != value:
            raise UserError(f"{class_path}: the config gives {old} (the old name of {new}) and {new}, with "
                            f"different values ({value!r}, {out[new]!r}); keep {new} only")
        out[new] = value
        done.append(f"{old} -> {new}")
    moved_as = MOVED_AS.get(class_path, {})
    for block, then in blocks.items():
        moved = [name for name in then if name in out]
        if not moved:
            continue
        if block in out:
            raise UserError(f"{class_path}: the config gives {moved[0]} (now a field of {block}) and the {block} "
                            f"block; keep the {block} block only")
        fields = {moved_as.get(name, name): out.pop(name, default) for name, default in then.items()}
        out[block] = {name: value for name, value in fields.items() if value is not None}
        done.append(f"{', '.join(moved)} -> {block}")
    if done and (class_path, tuple(done)) not in _noted:  # one line per class and set of renames
        _noted.add((class_path, tuple(done)))
        log.info("%s: hyperparameters saved under old names read as %s", class_path.rsplit(".", 1)[-1],
                 ", ".join(done))
    return out


def current_spec(spec: Any) -> Any:
    """A {class_path, init_args} mapping (or a zoo config, with its `data` spec) in current names."""
    if not isinstance(spec, Mapping):
        return spec
    new = {"init_args": current_init_args(spec.get("class_path"), spec.get("init_args")),
           "data": current_spec(spec.get("data"))}
    changed = {key: value for key, value in new.items() if value is not spec.get(key)}
    return {**spec, **changed} if changed else spec


current_config = current_spec  # a zoo config: the model's spec with its data spec


def _converted(old: str, value: Any) -> Any:
    """An old switch's value as the current argument's (any other value as it is: the class refuses it)."""
    try:
        return RENAMED_VALUES.get(old, {}).get(value, value)
    except TypeError:  # unhashable: none of the table's values
        return value


# ----------------------------------------------------------------------------- blocks
@dataclasses.dataclass
class Block:
    """A block of a model's hyperparameters: a dataclass of plain values, parsed field by field, kept as
    `to_dict()`; a `Literal` field is a choice, checked by `coerce`."""

    def __post_init__(self):
        # jsonargparse hands a nested `--model.init_args.BLOCK.FIELD null` over as the string "None"
        for f in dataclasses.fields(self):
            if getattr(self, f.name) == "None":
                setattr(self, f.name, None)

    @classmethod
    def coerce(cls, value: Any, where: str) -> "Block":
        """A block from a block, a dict or None (the defaults), checked; errors name `where` ("RAM: retina")."""
        if value is None:
            value = {}
        if isinstance(value, cls):
            block = dataclasses.replace(value)
        elif isinstance(value, Mapping):
            names = [f.name for f in dataclasses.fields(cls)]
            unknown = sorted(str(k) for k in value if k not in names)
            if unknown:
                raise UserError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(names)}")
            block = cls(**value)
        else:
            raise UserError(f"{where}: expected a mapping of fields, got {type(value).__name__}")
        for name, allowed in choices(cls).items():
            if getattr(block, name) not in allowed:
                raise UserError(f"{where}.{name} must be one of {', '.join(map(str, allowed))}, "
                                f"got '{getattr(block, name)}'")
        return block

    def to_dict(self) -> dict:
        """Every field as a plain value (tuples as lists), for hparams and checkpoints."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def choices(cls: type) -> dict[str, tuple]:
    """{field: its allowed values} of a block's `Literal` fields."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        options = [hint, *typing.get_args(hint)] if typing.get_origin(hint) is not Literal else [hint]
        literal = next((h for h in options if typing.get_origin(h) is Literal), None)
        if literal is not None:
            out[name] = typing.get_args(literal)
    return out


def block_types(cls: type) -> dict[str, type[Block]]:
    """{argument: its Block class} of a model class's constructor."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve: no block is declared there
        return {}
    out = {}
    for name, hint in hints.items():
        for option in (hint, *typing.get_args(hint)):
            if isinstance(option, type) and issubclass(option, Block):
                out[name] = option
    return out


def block_defaults(cls: type) -> dict[str, Any]:
    """{"block.field": default} of every block field of a model class's constructor."""
    return {f"{name}.{f.name}": _plain(f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for name, block in block_types(cls).items() for f in dataclasses.fields(block)}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value
