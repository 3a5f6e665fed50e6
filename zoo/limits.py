"""Limits before work: what a file or a recipe may ask of us is bounded BEFORE anything is built.

A small file can ask for gigabytes: a pickle whose memo shares one list a billion ways, YAML anchors
that do the same, a config nested 200,000 deep, a 50 MB class name, or plain numbers
(`hidden_size: 60000`, `num_test: 1e9`). Every config read from a file (a checkpoint's
hyper-parameters and zoo config, a safetensors header, a recipe) passes `check_tree`, and every
model or data config from a file passes `check_dimensions`, so a bad value is one line naming the
field and the limit, in well under a second.

- size: the number of nodes AFTER shared references (pickle memo, YAML aliases) are resolved,
  counted WITHOUT expanding them (each distinct object is sized once and its size reused), and a
  cycle is refused;
- depth of nesting; the length of any string;
- the dimensions of models and data modules, by argument name: the shared ones (`DIMENSION_LIMITS`)
  and each family's own (its card's `dimensions`).

The defaults are far above every recipe here; `ZOO_LIMITS="hidden_size=32768,tree_nodes=1000000"`
raises any of them (a dimension's name, or `tree_nodes`, `tree_depth`, `string_length`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import is_dataclass
from typing import Any


from zoo.errors import UserError

#: the structure of anything read from a file
MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_STRING = 100_000
#: characters of a file-provided value an error message quotes
QUOTE = 200

#: argument name -> the largest value a model or data module may be asked for (a list of ints, an
#: image size [H, W], is checked element by element): the names several share (backbone blocks, data
#: modules, decoding); a family states its own in its card (zoo.models.card.FamilyCard.dimensions)
DIMENSION_LIMITS: dict[str, float] = {
    # widths of layers (of a backbone block too: timm's names)
    **dict.fromkeys(["embed_dim", "channels"], 16_384),
    **dict.fromkeys(["depth", "num_heads"], 256),
    # images (`img_size`: timm's name, a field of a backbone block; a model's is `image_size`)
    **dict.fromkeys(["image_size", "img_size", "resize_size", "crop_size"], 4_096),
    "canvas_size": 1_024, "patch_size": 1_024,
    # decoding (a captioner's defaults, and the commands' flags)
    "beam_size": 100, **dict.fromkeys(["decode_max_len", "max_len"], 1_000),
    # data
    **dict.fromkeys(["num_train", "num_val", "num_test", "val_items", "val_size", "limit_train", "limit_eval",
                     "max_vocab"], 10_000_000),
    **dict.fromkeys(["batch_size", "eval_batch_size"], 1_000_000),
    "num_workers": 256, "num_classes": 100_000, "num_colours": 10_000, "max_items": 1_000,
}


def _overrides() -> dict[str, float]:
    raw = os.environ.get("ZOO_LIMITS", "")
    out = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise UserError(f"ZOO_LIMITS: {shorten(item)!r} is not name=number") from None
    return out


def limit(name: str, own: Mapping[str, float] | None = None) -> float:
    """The limit of `name`: ZOO_LIMITS's, else `own` (a family's card), else the shared one."""
    defaults = {**DIMENSION_LIMITS, **(own or {}), "tree_nodes": MAX_NODES, "tree_depth": MAX_DEPTH,
                "string_length": MAX_STRING}
    return _overrides().get(name, defaults.get(name, float("inf")))


def shorten(value: Any, width: int = QUOTE) -> str:
    """A file-provided value as at most `width` characters for an error line (never formats a huge
    or shared structure in full)."""
    if isinstance(value, (list, tuple, dict)):
        text = f"<{type(value).__name__} of {len(value)}>"
    else:
        text = str(value) if isinstance(value, str) else repr(value) if isinstance(value, (int, float, bool)) \
            or value is None else f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def _children(node: Any):
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield key
            yield value
    elif isinstance(node, (list, tuple, set, frozenset)):
        yield from node


def check_tree(tree: Any, what: str) -> None:
    """Refuse (UserError, one line) a structure from a file that is too big once its shared
    references are resolved, nested too deep, cyclic, or holds too long a string. Tensors are leaves
    (their size is the weights', checked by the loaders). Runs in time linear in the DISTINCT objects."""
    max_nodes, max_depth, max_string = limit("tree_nodes"), limit("tree_depth"), limit("string_length")
    sizes: dict[int, int] = {}  # id -> expanded node count of a finished container
    keep = []  # the objects whose ids are in `sizes` stay alive while we count
    on_path: set[int] = set()
    # iterative post-order walk: (node, depth, children iterator or None)
    stack: list[list] = [[tree, 1, None, 1]]
    while stack:
        frame = stack[-1]
        node, depth = frame[0], frame[1]
        if frame[2] is None:  # first visit
            if isinstance(node, str) and len(node) > max_string:
                raise UserError(f"{what}: refused, a string of {len(node):,} characters (the limit is "
                                f"{int(max_string):,}): {shorten(node, 60)}")
            if not isinstance(node, (Mapping, list, tuple, set, frozenset)) or _is_tensor(node):
                stack.pop()
                if stack:
                    stack[-1][3] += 1
                continue
            if id(node) in sizes:
                stack.pop()
                if stack:
                    stack[-1][3] += sizes[id(node)]
                    if stack[-1][3] > max_nodes:
                        _too_big(what, max_nodes)
                continue
            if id(node) in on_path:
                raise UserError(f"{what}: refused, the structure contains itself (a cycle)")
            if depth > max_depth:
                raise UserError(f"{what}: refused, nested more than {int(max_depth)} levels deep")
            on_path.add(id(node))
            frame[2] = iter(list(_children(node)))
        child = next(frame[2], _DONE)
        if child is _DONE:
            stack.pop()
            on_path.discard(id(node))
            sizes[id(node)] = frame[3]
            keep.append(node)
            if stack:
                stack[-1][3] += frame[3]
                if stack[-1][3] > max_nodes:
                    _too_big(what, max_nodes)
            continue
        stack.append([child, depth + 1, None, 1])
    del keep


_DONE = object()


def _too_big(what: str, max_nodes: float):
    raise UserError(f"{what}: refused, more than {int(max_nodes):,} values once its shared references are "
                    "resolved (a small file that expands to gigabytes)")


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
        numbers = value if isinstance(value, (list, tuple)) else [value]
        top = limit(name, own)
        for number in numbers:
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                continue
            if number != number or number > top or number < 0:
                raise UserError(f"{where}.{name}: {shorten(value, 60)} is outside the sane range 0..{top:,.0f} "
                                f"(raise it with ZOO_LIMITS={name}=N if you mean it)")


def check_arguments(cls: type, args: tuple, kwargs: dict, where: str, own: Mapping[str, float] | None = None) -> None:
    """`check_dimensions` on the arguments a call of `cls(*args, **kwargs)` binds (from `__new__`:
    before anything is built, whoever builds it)."""
    import inspect

    given = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs).arguments
    check_dimensions({k: v for k, v in list(given.items())[1:]}, where, own)


def _is_tensor(node) -> bool:
    """A torch tensor (a leaf here), without importing torch where nothing has: then none exists."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(node, torch.Tensor)
