"""One name per hyperparameter fact across the zoo, and the old names that files still carry.

A fact that several families or data modules share is spelled one way, so recipes read alike and
the code that joins data to model (zoo.registry.link_data) or reads a config needs no per-family case:

- `image_size`: the images a model takes or a data module serves (one side, or [height, width]);
- `in_chans`: their channels;
- `num_classes`: the size of the label set;
- `lr_schedule`: the learning-rate schedule a recipe chooses ("none" or "cosine");
- `num_figures`: how many validation images are drawn as attention figures.

A family's own symbol stays where it names that family's own quantity (DRAW's `T`, RAM's
`num_glimpses`), and timm's names stay where we call timm (zoo.backbones: `img_size`, `drop_rate`).

Files written before a rename keep the old name. `RENAMED` is the one table of old names (`MOVED`
of arguments that moved into a block, `RETIRED` of arguments that went: `accel`, now the run's
option); `current_spec` / `current_config` apply them, and every reader of hyperparameters from a
file goes through them (zoo.hub, zoo.registry.instantiate, ZooModule's checkpoint loading, train.py's
resume checks, tools/release), so an old file loads to the same model. Only argument names (and
the values of a switch that became a choice) change: a class path is never rewritten, so the
allow-list (zoo.classes) still decides every class a file may name.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from zoo.errors import UserError

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

#: class path -> (block, {argument: its default then}): arguments that moved from the model into
#: one of its blocks (ViT's trunk into its `backbone:` spec); a config that gives any of them is
#: from before the move, and one it left out meant that default
MOVED: dict[str, tuple[str, dict[str, Any]]] = {
    "zoo.models.vit.ViTClassifier": ("backbone", {
        "kind": "timm_vit", "model_name": "vit_tiny_patch16_224", "patch_size": 4, "depth": 6, "embed_dim": 96,
        "num_heads": 3, "mlp_ratio": 2.0, "global_pool": None, "drop_rate": 0.0, "drop_path_rate": 0.1,
        "attn_drop_rate": 0.0, "mean": None, "std": None, "conv_stem": None, "conv_stem_blocks": 1,
        "pretrained": False, "pretrained_file": None, "model_kwargs": None}),
}

#: arguments no class takes any more -> (the value that asked for nothing, what took their place):
#: a file that gives that value loses the argument silently, any other value after one warning
RETIRED: dict[str, tuple[Any, str]] = {
    "accel": ("auto", "speed is a run option now (zoo train fit --accel MODE)"),
    "compile": (False, "speed is a run option now (zoo train fit --accel compile)"),  # ViT's older spelling
}

_noted: set[tuple] = set()


def renamed_for(class_path: Any) -> dict[str, str]:
    """{old name: current name} for the class a file names ({} for any other value)."""
    return RENAMED.get(class_path, {}) if isinstance(class_path, str) else {}


def current_init_args(class_path: Any, init_args: Any) -> Any:
    """`init_args` of `class_path` with its old names renamed (a new mapping; `init_args` itself when
    nothing is renamed, or when it is not a mapping). An old and a current name that disagree are
    refused in one line: the file does not say which it means."""
    renames = renamed_for(class_path)
    block, then = MOVED.get(class_path, (None, {})) if isinstance(class_path, str) else (None, {})
    if not isinstance(init_args, Mapping) or not (renames.keys() | RETIRED.keys() | then.keys()) & init_args.keys():
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
    moved = [name for name in then if name in out]
    if moved:
        if block in out:
            raise UserError(f"{class_path}: the config gives {moved[0]} (now a field of {block}) and a {block} "
                            f"block; keep the {block} block only")
        fields = {name: out.pop(name, default) for name, default in then.items()}
        out[block] = {name: value for name, value in fields.items() if value is not None}
        done.append(f"{', '.join(moved)} -> {block}")
    if done and (class_path, tuple(done)) not in _noted:  # one line per class and set of renames
        _noted.add((class_path, tuple(done)))
        log.info("%s: hyperparameters saved under old names read as %s", class_path.rsplit(".", 1)[-1],
                 ", ".join(done))
    return out


def current_spec(spec: Any) -> Any:
    """A {class_path, init_args} mapping (a model's or a data module's; or a zoo config, as
    checkpoints and releases carry it, with its `data` spec) in current names."""
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
