"""A recipe on the command line, before LightningCLI parses it: a registry name stands for its recipe
file, every --config file is checked (a YAML mapping within zoo.guards.budget), and an old recipe or
flag is read in current names (zoo.hparams). `BASE_CONFIG` is applied before every recipe.

    argv = recipe_args.prepare(["fit", "--config", "ram_fmnist_centered", "--seed_everything", "1"])
"""
from __future__ import annotations

import difflib
import json
import logging
import re
from pathlib import Path

import yaml

from zoo import registry
from zoo.guards.budget import check_tree
from zoo.guards.errors import UserError, shorten
from zoo.hparams import RETIRED, current_class_path, current_class_paths, current_spec
from zoo.weights.hub import MAX_CONFIG_BYTES

log = logging.getLogger("zoo")
BASE_CONFIG = str(registry.SHIPPED_CONFIGS / "base" / "trainer.yaml")
CONFIG = ("--config", "-c")
ACCEL = "--model.init_args.accel"  # an old recipe's model option, now the run's --accel
NESTED_NULL = re.compile(r"^(--model\.init_args\.backbone)\.(\w+)$")  # a BackboneSpec field


def prepare(argv: list[str]) -> list[str]:
    """The command line as LightningCLI is to parse it (`check_config_files` first)."""
    argv = with_nested_nulls(with_recipe_paths(argv))
    check_config_files(argv)
    return with_current_names(argv)


def _options(argv: list[str], takes_value) -> list[tuple[str, str | None, list[str]]]:
    """`argv` as (key, value, its items): `--key=value`, or `KEY VALUE` where `takes_value(KEY)`;
    any other item as (item, None, [item])."""
    out, i = [], 0
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if eq and key.startswith("--"):
            out.append((key, value, argv[i:i + 1]))
        elif takes_value(argv[i]) and i + 1 < len(argv):
            out.append((argv[i], argv[i + 1], argv[i:i + 2]))
            i += 1
        else:
            out.append((argv[i], None, argv[i:i + 1]))
        i += 1
    return out


def with_recipe_paths(argv: list[str]) -> list[str]:
    """`--config ram_fmnist_centered` (a registry name that is no file here) means that entry's recipe."""
    names, out = set(registry.list_models()), []
    for key, value, items in _options(argv, CONFIG.__contains__):
        # a folder of that name (the run's own: --trainer.default_root_dir vit_fmnist) is no config
        if key in CONFIG and value in names and not Path(value).is_file() and registry.get_entry(value).recipe:
            recipe = str(registry.get_entry(value).recipe)
            items = [f"{key}={recipe}"] if len(items) == 1 else [key, recipe]
        out += items
    return out


def with_nested_nulls(argv: list[str]) -> list[str]:
    """`--model.init_args.backbone.level null` as `--model.init_args.backbone '{"level": null}'`, which
    jsonargparse merges field-wise (a nested dataclass field's null would read as the string 'None')."""
    out = []
    for key, value, items in _options(argv, NESTED_NULL.match):
        field = NESTED_NULL.match(key)
        null = field and value in ("null", "None", "~")
        out += [field.group(1), json.dumps({field.group(2): None})] if null else items
    return out


def check_config_files(argv: list[str]) -> None:
    """Every --config file is a non-empty YAML mapping, and neither it nor a command-line value expands
    past zoo.guards.budget (anchors, nesting), before jsonargparse would spend gigabytes on it."""
    paths = [BASE_CONFIG]
    for key, value, items in _options(argv, CONFIG.__contains__):
        if key in CONFIG and value is not None:
            paths.append(value)
        elif set("&[{") & set(items[0]):
            what = f"command-line value {shorten(items[0], 60)!r}"
            try:  # a command-line value is YAML to jsonargparse as well
                check_tree(yaml.safe_load(items[0] if value is None else value), what)
            except RecursionError:
                raise UserError(f"{what}: refused, nested too deep") from None
            except yaml.YAMLError:
                pass  # not YAML: jsonargparse reports it
    for path in map(Path, paths):
        if not path.is_file():
            close = difflib.get_close_matches(str(path), registry.list_models(), n=1)
            hint = "is a directory, not a YAML file" if path.is_dir() else \
                f"no such file{f'; did you mean {close[0]}?' if close else ''}"
            raise UserError(f"--config {path}: {hint}")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"--config {path}: refused, a recipe of more than {MAX_CONFIG_BYTES:,} bytes")
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise UserError(f"--config {path}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--config {path}: cannot read ({exc})") from None
        except RecursionError:
            raise UserError(f"--config {path}: refused, nested too deep") from None
        if content is None:
            raise UserError(f"--config {path}: the file is empty")
        check_tree(content, f"--config {path}")
        if not isinstance(content, dict):
            raise UserError(f"--config {path}: expected a mapping of keys (model:, data:, trainer:, ...), "
                            f"got a {type(content).__name__}")


def with_current_names(argv: list[str]) -> list[str]:
    """Old recipes and flags in current names (zoo.hparams), one warning each."""
    out = []
    for key, value, items in _options(argv, (*CONFIG, ACCEL).__contains__):
        if key in CONFIG and value is not None:
            recipe = yaml.safe_load(Path(value).read_text())
            relocated = current_class_paths(recipe)  # a run saved before the layout of zoo/ changed
            if relocated is not recipe:
                log.warning("%s: read with the current module paths of its classes", value)
            current = in_current_names(relocated) if isinstance(relocated, dict) else relocated
            if current != relocated:
                moved = RETIRED.keys() & recipe["model"]["init_args"].keys()
                accel = f" (its model's accel is the run's --accel {current.get('accel', 'auto')})"
                log.warning("%s: read in current hyperparameter names%s", value, accel if moved else "")
            out += [key, value if current == recipe else yaml.safe_dump(current, sort_keys=False)]
        elif key == ACCEL and value is not None:
            log.warning("%s is the run option --accel now: read as --accel %s", ACCEL, value)
            out += ["--accel", value]
        else:
            out += [current_flag(item) for item in items]
    return out


def current_flag(item: str) -> str:
    """A command-line item naming a class at an old module path (`--trainer.logger=...`), at its current one."""
    key, eq, value = item.partition("=")
    return f"{key}={current_class_path(value)}" if eq and key.startswith("--") else current_class_path(item)


def in_current_names(recipe: dict) -> dict:
    """A parsed recipe with its model in current names; an old model's `accel` (ViT's `compile`) becomes
    the run's `accel`, where the recipe gives none."""
    model = recipe.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("init_args"), dict):
        return recipe
    init_args = dict(model["init_args"])
    retired = {name: init_args.pop(name) for name in RETIRED if name in init_args}
    out = {**recipe, "model": current_spec({**model, "init_args": init_args})}
    mode = "compile" if retired.get("compile") is True else retired.get("accel", "auto")
    if mode != "auto" and "accel" not in out:
        out["accel"] = mode
    return out
