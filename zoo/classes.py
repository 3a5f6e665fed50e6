"""The allow-list: the only model and data classes a file (weights, checkpoint, manifest, config) may
name, looked up BEFORE anything is imported. A class registers itself (a family by its card, a data
module by subclassing SplitDataModule; your own, from Python code, with `allow_class`); the one
import a file's class_path can cause is of the zoo's own module file in the kind's package."""
from __future__ import annotations

import importlib
from pathlib import Path

from zoo.guards.errors import UserError, shorten

PACKAGES = {"model": "zoo.models", "data": "zoo.data"}
FOLDERS = {kind: Path(__file__).resolve().parent / package.split(".", 1)[1]  # zoo/models, zoo/data
           for kind, package in PACKAGES.items()}
ALLOWED_CLASSES: dict[str, set[str]] = {"model": set(), "data": set()}


def allow_class(cls: type, kind: str = "model") -> type:
    """Let files name `cls`, a class of your own (from Python code, never from a file); a decorator."""
    ALLOWED_CLASSES[kind].add(f"{cls.__module__}.{cls.__qualname__}")
    return cls


def _own_module(path: str, kind: str) -> str | None:
    """The zoo module `path` lives in when it is a file of the kind's package, else None."""
    module = path.rpartition(".")[0]
    package, _, name = module.rpartition(".")
    if package != PACKAGES[kind] or not name.isidentifier() or not (FOLDERS[kind] / f"{name}.py").is_file():
        return None
    return module


def is_allowed(path, kind: str = "model") -> bool:
    """Whether files may name the class `path` (importing at most the zoo module it would be in)."""
    if not isinstance(path, str):
        return False
    if path not in ALLOWED_CLASSES[kind] and (module := _own_module(path, kind)):
        importlib.import_module(module)  # the zoo's own file: it registers its classes
    return path in ALLOWED_CLASSES[kind]


def check_allowed(path, kind: str = "model") -> str:
    """`path` when it names an allow-listed class, else one refusing line."""
    if not is_allowed(path, kind):
        raise UserError(f"refused: the file names {kind} class {shorten(path)!r}, which is not one of the zoo's "
                        f"{kind} classes; a file may not choose code to run")
    return path


def resolve_class(path: str, kind: str = "model") -> type:
    """The allow-listed class `path` names, imported only after the check."""
    module, _, name = check_allowed(path, kind).rpartition(".")
    return getattr(importlib.import_module(module), name)


def registered(kind: str) -> set[str]:
    """Every class of `kind` on the list, once each module of the kind's package has registered its own."""
    for file in sorted(FOLDERS[kind].glob("*.py")):
        if file.stem != "__init__":
            importlib.import_module(f"{PACKAGES[kind]}.{file.stem}")
    return set(ALLOWED_CLASSES[kind])
