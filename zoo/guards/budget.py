"""Limits before work: what a file, a recipe or a flag may ask of us is bounded before anything is built.

`check_tree` bounds a structure read from a file (its size once shared references are resolved, its
depth, no cycle, each string's length); `check_dimensions`, `check_arguments` and `check_flags` bound
each size argument by its name (the shared `DIMENSION_LIMITS`, a family card's `dimensions`);
`check_memory` holds a command's estimated allocations to `memory_mb`. A refusal is one line naming
the field (or the biggest part) and the limit. `ZOO_LIMITS="hidden_size=32768,tree_nodes=1000000"`
raises any limit; `check_environment` checks every number the zoo reads from the environment, once,
up front. Why: docs/design-notes.md, "Limits before work".
"""
from __future__ import annotations

import difflib
import functools
import inspect
import json
import logging
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import is_dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from zoo.guards.errors import UserError, shorten


#: argument name -> the largest value a model or data module may be asked for (a list of ints, an
#: image size [H, W], is checked element by element): the names several share (backbone blocks, data
#: modules, decoding); a family states its own in its card (zoo.models.card.FamilyCard.dimensions)
DIMENSION_LIMITS: dict[str, float] = {
    # widths of layers (of a backbone block too: timm's names)
    **dict.fromkeys(["embed_dim", "channels"], 16_384),
    **dict.fromkeys(["depth", "num_heads"], 256),
    # images (`img_size`: timm's name, a field of a backbone block; a model's is `image_size`)
    **dict.fromkeys(["image_size", "img_size", "resize_size", "crop_size"], 4_096),
    "patch_size": 1_024, "in_chans": 1_024,
    # decoding (a captioner's defaults, and the commands' flags)
    "beam_size": 100, **dict.fromkeys(["decode_max_len", "max_len"], 1_000),
    "export_max_len": 200,  # `zoo export --max-len`: steps unrolled into one program
    # what commands' flags and export sets share with data modules (a data set's own sizes: its card's,
    # zoo.data.card)
    **dict.fromkeys(["limit_eval", "max_vocab"], 10_000_000), "batch_size": 1_000_000,
    "num_classes": 100_000, "num_colours": 10_000,
}
#: every limit: the dimensions, the structure of anything read from a file, and the memory budget
#: of one command (MB: what a model, its data and its decoding may ask for)
DEFAULT_LIMITS = {**DIMENSION_LIMITS, "tree_nodes": 200_000, "tree_depth": 64, "string_length": 100_000,
                  "memory_mb": 4096}


@functools.cache
def _family_limit_names() -> frozenset[str]:
    """The sizes the families' cards bound, as the model index lists them (read without importing a
    family, so a ZOO_LIMITS name is checked before any model is loaded)."""
    try:
        names = json.loads(Path(__file__).parents[1].joinpath("model_index.json").read_text()).get("limit_names", [])
        return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()
    except (OSError, ValueError, AttributeError):
        return frozenset()


def _overrides() -> dict[str, float]:
    raw = os.environ.get("ZOO_LIMITS", "")
    known, out = {**DEFAULT_LIMITS, **dict.fromkeys(_family_limit_names(), 0)}, {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise UserError(f"ZOO_LIMITS: {shorten(item, 60)!r} is not name=number")
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else " (the names: zoo/guards/budget.py)"
            raise UserError(f"ZOO_LIMITS: {shorten(name, 60)!r} is not a limit{hint}")
        out[name] = positive_number(value, f"ZOO_LIMITS {name}", allow_zero=True)
    return out


def positive_number(raw: Any, what: str, allow_zero: bool = False) -> float:
    """`raw` (a string from the environment or a file) as a finite number > 0 (>= 0 with
    `allow_zero`); `nan`, `inf`, a negative value or a word is one line naming `what`."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise UserError(f"{what}={shorten(raw, 40)!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise UserError(f"{what}={shorten(raw, 40)!r}: give a finite number {bound}")
    return value


def env_number(name: str, default: float) -> float:
    """The environment variable `name` as a finite positive number (`default` when unset or empty)."""
    raw = os.environ.get(name, "")
    return default if not raw.strip() else positive_number(raw, name)


#: the numeric environment variables and their defaults (read through `env_number`)
NUMERIC_ENVIRONMENT = {"ZOO_DOWNLOAD_TIMEOUT": 30.0, "ZOO_MAX_DOWNLOAD_MB": 4096.0}
#: what W&B accepts as WANDB_MODE (wandb.sdk.wandb_settings)
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def check_environment(logging: bool = False) -> None:
    """Every setting the zoo reads from the environment, or hands on to a library that reads it
    (the Hugging Face hub's `HF_*`; W&B's `WANDB_*` when the command logs to it), checked once before
    any work or folder: a typo or a non-number is one line naming the variable now, not a traceback
    (or a limit silently off) minutes later. `logging`: the command logs to W&B (training)."""
    _overrides()
    for name, default in NUMERIC_ENVIRONMENT.items():
        env_number(name, default)
    _check_hf_environment()
    mode = os.environ.get("WANDB_MODE", "").strip()
    if logging and mode and mode not in WANDB_MODES:
        close = difflib.get_close_matches(mode, WANDB_MODES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UserError(f"WANDB_MODE={shorten(mode, 40)!r} is not one of {', '.join(WANDB_MODES)}{hint}")
    if logging:
        _check_wandb_environment()


#: the hub's settings the zoo hands on (zoo.weights.hub, zoo.backbones), or huggingface_hub reads when
#: imported (checked: 2.4; a non-integer timeout there is a ValueError at import)
HF_INTEGERS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
HF_SWITCHES = ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_XET",
               "HF_HUB_DISABLE_SYMLINKS_WARNING", "HF_HUB_DISABLE_IMPLICIT_TOKEN")
HF_FOLDERS = ("HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE")
SWITCH_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off")


def _check_hf_environment() -> None:
    environ = os.environ
    for name in HF_INTEGERS:
        raw = environ.get(name, "").strip()
        if raw and not (raw.isdigit() and int(raw) > 0):
            raise UserError(f"{name}={shorten(environ[name], 40)!r}: give a whole number of seconds > 0")
    for name in HF_SWITCHES:  # the hub reads anything but its true words as false: a typo switches nothing
        raw = environ.get(name, "").strip()
        if raw and raw.lower() not in SWITCH_VALUES:
            raise UserError(f"{name}={shorten(environ[name], 40)!r} is not one of {', '.join(SWITCH_VALUES)}")
    for name in HF_FOLDERS:
        raw = environ.get(name, "")
        if raw and os.path.exists(raw) and not os.path.isdir(raw):
            raise UserError(f"{name}={shorten(raw, 80)!r}: exists and is not a folder")
    endpoint = environ.get("HF_ENDPOINT", "")
    if endpoint:
        from urllib.parse import urlparse

        parsed = urlparse(endpoint.strip())
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"HF_ENDPOINT={shorten(endpoint, 80)!r}: give the hub's http(s) URL")
    token = environ.get("HF_TOKEN", "")
    if token and any(ord(c) < 32 or ord(c) == 127 for c in token):
        raise UserError("HF_TOKEN holds a control character (a line break?); give the token alone")


def _check_wandb_environment() -> None:
    """Each `WANDB_*` variable as W&B's own settings read it (wandb.Settings.update_from_env_vars,
    checked: wandb 0.31), one at a time, so that the line names the variable W&B refuses."""
    names = sorted(name for name in os.environ if name.startswith("WANDB_"))
    if not names:
        return
    try:
        from wandb.sdk.wandb_settings import Settings
    except ImportError:  # W&B is not installed: nothing reads these
        return
    for name in names:
        try:
            Settings().update_from_env_vars({name: os.environ[name]})
        except Exception as exc:  # wandb's UsageError, pydantic's ValidationError
            errors = getattr(exc, "errors", None)
            detail = errors()[0].get("msg") if callable(errors) and errors() else str(exc)
            detail = next((line.strip() for line in str(detail).splitlines() if line.strip()), type(exc).__name__)
            raise UserError(f"{name}={shorten(os.environ[name], 40)!r}: W&B refuses it ({shorten(detail, 160)})") from None


def limit(name: str, own: Mapping[str, float] | None = None) -> float:
    """The limit of `name`: ZOO_LIMITS's, else `own` (a family's card), else the shared one."""
    return _overrides().get(name, {**DEFAULT_LIMITS, **(own or {})}.get(name, float("inf")))


def check_tree(tree: Any, what: str, max_nodes: float | None = None) -> None:
    """Refuse (UserError, one line) a structure from a file that is too big once its shared
    references are resolved, nested too deep, cyclic, or holds too long a string. Tensors are leaves
    (their size is the weights', checked by the loaders). Runs in time linear in the DISTINCT objects.
    `max_nodes`: a data file's own bound instead of `tree_nodes` (a COCO captions file is millions)."""
    max_depth, max_string = limit("tree_depth"), limit("string_length")
    max_nodes = limit("tree_nodes") if max_nodes is None else max_nodes
    sizes: dict[int, int] = {}  # id -> expanded node count of a finished container
    keep = []  # the finished containers stay alive (their ids unreused) while we count
    stack: list[list] = []  # the containers being counted: [node, its children left, its count so far]
    on_path: set[int] = set()  # their ids
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", ())

    def visit(node, depth: int) -> int:
        """The node's count when known now (a leaf: 1; a container counted before: its count), else 0
        and the container is pushed onto the stack to be counted."""
        if isinstance(node, str) and len(node) > max_string:
            raise UserError(f"{what}: refused, a string of {len(node):,} characters (the limit is "
                            f"{int(max_string):,}): {shorten(node, 60)}")
        # a torch tensor is a leaf, found without importing torch where nothing has (then none exists)
        if not isinstance(node, (Mapping, list, tuple, set, frozenset)) or isinstance(node, tensor_type):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in on_path:
            raise UserError(f"{what}: refused, the structure contains itself (a cycle)")
        if depth > max_depth:
            raise UserError(f"{what}: refused, nested more than {int(max_depth)} levels deep")
        children = list(chain.from_iterable(node.items())) if isinstance(node, Mapping) else list(node)
        stack.append([node, iter(children), 1])
        on_path.add(id(node))
        return 0

    visit(tree, 1)
    while stack:
        frame = stack[-1]
        child = next(frame[1], frame)  # the frame itself: no child left
        if child is not frame:
            frame[2] += visit(child, len(stack) + 1)
        else:
            stack.pop()
            on_path.discard(id(frame[0]))
            sizes[id(frame[0])] = frame[2]
            keep.append(frame[0])
            if stack:
                stack[-1][2] += frame[2]
        if stack and stack[-1][2] > max_nodes:
            raise UserError(f"{what}: refused, more than {int(max_nodes):,} values once its shared "
                            "references are resolved (a small file that expands to gigabytes)")


def check_dimensions(init_args: Any, where: str, own: Mapping[str, float] | None = None) -> None:
    """Refuse an argument above its limit (or below 0), anywhere in `init_args` (nested mappings and
    dataclasses included: a backbone spec), before the class is built. `own`: the family's limits
    (its card's `dimensions`) beside the shared `DIMENSION_LIMITS`."""
    if is_dataclass(init_args) and not isinstance(init_args, type):
        init_args = vars(init_args)
    if not isinstance(init_args, Mapping):
        return
    for key, value in init_args.items():
        name = str(key)
        if isinstance(value, Mapping) or (is_dataclass(value) and not isinstance(value, type)):
            check_dimensions(value, f"{where}.{name}", own)
            continue
        if name not in DIMENSION_LIMITS and name not in (own or {}):
            continue
        top = limit(name, own)
        for number in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(number, (int, float)) and not isinstance(number, bool) and not 0 <= number <= top:
                raise UserError(f"{where}.{name}: {shorten(value, 60)} is outside the sane range 0..{top:,.0f} "
                                f"(raise it with ZOO_LIMITS={name}=N if you mean it)")


def check_arguments(cls: type, args: tuple, kwargs: dict, where: str, own: Mapping[str, float] | None = None) -> None:
    """`check_dimensions` on the arguments a call of `cls(*args, **kwargs)` binds (from `__new__`:
    before anything is built, whoever builds it)."""
    given = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs).arguments
    check_dimensions({k: v for k, v in list(given.items())[1:]}, where, own)


def check_flags(values: Mapping[str, Any], limit_name: str | None = None) -> None:
    """Command-line numbers (each at least 1) through the same limits as a file's (`--beam-size` is
    `beam_size` of DIMENSION_LIMITS; `limit_name` names another limit for a single flag): one line
    naming the flag."""
    for flag, value in values.items():
        if value is None:
            continue
        name = limit_name or flag.lstrip("-").replace("-", "_")
        top = limit(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= top:
            raising = isinstance(value, (int, float)) and value > top
            raise UserError(f"{flag} {shorten(value, 40)}: outside the sane range 1..{top:,.0f}"
                            + (f" (raise it with ZOO_LIMITS={name}=N if you mean it)" if raising else ""))


# ----------------------------------------------------------------------------- memory
def human_bytes(n: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} bytes"


def check_memory(parts: Mapping[str, float], what: str) -> None:
    """Refuse (one line) a command whose estimated allocations `parts` (name -> bytes) add up to
    more than the memory budget, naming the biggest part: the culprit a user would change."""
    budget = limit("memory_mb") * 2**20
    total = sum(parts.values())
    if total <= budget:
        return
    culprit = max(parts, key=parts.get)
    raise UserError(f"{what}: refused, it would need about {human_bytes(total)} of memory, more than the "
                    f"{human_bytes(budget)} budget ({culprit}: {human_bytes(parts[culprit])}); raise the budget "
                    f"with ZOO_LIMITS=memory_mb=N if you mean it")
