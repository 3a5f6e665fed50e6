"""Limits before work: what a file or a recipe may ask of us is bounded BEFORE anything is built.

A small file can ask for gigabytes: a pickle whose memo shares one list a billion ways, YAML anchors
that do the same, a config nested 200,000 deep, a 50 MB class name, or plain numbers
(`hidden_size: 60000`, `num_test: 1e9`). So every config read from a file (a checkpoint's
hyper-parameters and zoo config, a safetensors header, a recipe) passes `check_tree` (its size once
shared references are resolved, counted WITHOUT expanding them; no cycle; its depth; each string's
length), every model or data config from a file `check_dimensions` (by argument name: the shared
`DIMENSION_LIMITS` and each family card's `dimensions`), and a command's memory `check_memory` (a
model built on the `meta` device, allocating nothing: its weights and one forward pass, or for
training a training step at the data's `batch_size` and an evaluation step at its
`eval_batch_size`; a data module's arrays; a beam search's hypotheses; `--boxes` scoring; 4 GiB,
`memory_mb`). A bad value is one line naming the field (or the biggest part) and the limit.

The defaults are far above every recipe here; `ZOO_LIMITS="hidden_size=32768,tree_nodes=1000000"`
raises any of them (a dimension's name, or `tree_nodes`, `tree_depth`, `string_length`,
`memory_mb`). Every environment variable the zoo reads a number from is checked once, up front
(`check_environment`): `nan`, `inf`, a negative value or a word is one line, never a limit
silently switched off.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import json
import logging
import math
import os
import sys
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import is_dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from zoo.errors import UserError

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
        names = json.loads(Path(__file__).with_name("model_index.json").read_text()).get("limit_names", [])
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
            hint = f"; did you mean {close[0]}?" if close else " (the names: zoo/limits.py)"
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


#: the hub's settings the zoo hands on (zoo.hub, zoo.backbones), or huggingface_hub reads when
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


def shorten(value: Any, width: int = QUOTE) -> str:
    """A file-provided value as at most `width` characters for an error line (never formats a huge
    or shared structure in full)."""
    scalar = (int, float, bool, type(None))
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        text = f"<an integer of {value.bit_length():,} bits>"  # Python refuses to format 4,300+ digits
    elif isinstance(value, (list, tuple)) and len(value) <= 16 and all(
            isinstance(v, scalar) and not (isinstance(v, int) and v.bit_length() > 1000) for v in value):
        text = repr(list(value))  # a shape, a size, a box: short, and worth showing
    elif isinstance(value, (list, tuple, dict)):
        text = f"<{type(value).__name__} of {len(value)}>"
    else:
        text = str(value) if isinstance(value, str) else repr(value) if isinstance(value, (int, float, bool)) \
            or value is None else f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


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


def model_memory(cls, init_args: Mapping, batch: int = 1) -> dict[str, float]:
    """What `cls(**init_args)` would allocate, measured without allocating: the model is built on
    torch's `meta` device (shapes, no storage) for its parameters and buffers, and a forward pass of
    `batch` inputs of its own input size runs there too, for the peak of the activations alive at
    once. {} when the class cannot be built on `meta` (the real build then decides). Measured once
    per class and arguments in a process (a meta forward pass costs up to a second)."""
    return _measured(("model", batch), cls, init_args, lambda: _model_memory(cls, init_args, batch))


def training_memory(cls, init_args: Mapping, batch_size: int, eval_batch_size: int | None = None,
                    where: str = "data.init_args.") -> dict[str, float]:
    """What training `cls(**init_args)` would allocate at its data's batch sizes, measured on the
    `meta` device like `model_memory`: its weights four times (the weights, their gradients and
    Adam's two moments), and the larger of a training step of `batch_size` examples (forward and
    backward: the batch, the tensors autograd keeps for the backward pass, the gradients) and an
    evaluation step of `eval_batch_size` (forward without gradients). A step's batch is the
    family's `example_batch` grown to the batch size along its first dimension (the other
    dimensions, a caption's length, are the example's). A step that cannot run on `meta` (an op
    without a meta kernel, a data-dependent branch) falls back to the forward pass of
    `model_memory` at that batch size: fewer bytes than the step takes. `where` prefixes the batch
    arguments' names in the parts. {} when the class cannot be built on `meta`."""
    # an evaluation step (no gradients, nothing kept for a backward pass) of no more examples than a
    # training step's takes less than it: measured only when its batch is larger
    steps = ((True, f"{where}batch_size", batch_size),
             *([(False, f"{where}eval_batch_size", eval_batch_size)] if (eval_batch_size or 0) > batch_size else []))
    return _measured(("training", *steps), cls, init_args, lambda: _steps_memory(cls, init_args, steps, 4))


def evaluation_memory(cls, init_args: Mapping, batch: int, name: str = "batch_size") -> dict[str, float]:
    """What evaluating `cls(**init_args)` (already built: its weights are not counted again) would
    allocate at `batch` examples a step (its argument `name`), measured as `training_memory`'s
    evaluation step."""
    steps = ((False, name, batch),)
    return _measured(("evaluation", *steps), cls, init_args, lambda: _steps_memory(cls, init_args, steps, 0))


_MEASURED: dict[tuple, dict[str, float]] = {}


def _measured(kind: tuple, cls, init_args: Mapping, measure) -> dict[str, float]:
    """`measure()`, once per class, arguments and `kind` in a process."""
    try:
        key = (f"{cls.__module__}.{cls.__qualname__}", json.dumps(init_args, sort_keys=True, default=repr), *kind)
    except (TypeError, ValueError, RecursionError):
        return measure()
    if key not in _MEASURED:
        _MEASURED[key] = measure()
    return dict(_MEASURED[key])


@contextlib.contextmanager
def _on_meta():
    """torch's `meta` device as the default, with a build's notices and warnings kept quiet (the real
    build prints them)."""
    import torch

    disabled = logging.root.manager.disable
    logging.disable(max(disabled, logging.WARNING))
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)


def _build_on_meta(cls, init_args: Mapping):
    """`cls(**init_args)` on the meta device, or None where it needs real data to be built (the
    real build then decides); a value it refuses is one line."""
    try:
        return cls(**init_args)
    except UserError:
        raise
    except (TypeError, ValueError) as exc:  # an argument it does not take, or a value it refuses
        raise UserError(f"{cls.__name__}: bad arguments ({shorten(str(exc), 200)})") from None
    except Exception:
        return None


def _weights(model, init_args: Mapping) -> dict[str, float]:
    return {_largest_tensor(model, init_args): float(sum(t.numel() * t.element_size() for t in
                                                       [*model.parameters(), *model.buffers()]))}


def _model_memory(cls, init_args: Mapping, batch: int) -> dict[str, float]:
    with _on_meta():
        model = _build_on_meta(cls, init_args)
        if model is None:
            return {}
        parts = _weights(model, init_args)
        activations, largest = _forward_peak(model, batch)
        if activations:
            parts[f"activations of a forward pass of {batch} input(s), the largest {largest}"] = activations
        return parts


def _steps_memory(cls, init_args: Mapping, steps, weights: int) -> dict[str, float]:
    """The weights `weights` times and the largest of `steps` ((train, argument name, batch)...)."""
    # hyperparameters the data fills in when training starts (a captioner's vocabulary): the card's
    # example value, so that the model can be built and stepped here
    filled = getattr(getattr(cls, "card", None), "filled_by_data", None) or {}
    init_args = {**init_args, **{k: v for k, v in filled.items() if init_args.get(k) is None}}
    with _on_meta():
        model = _build_on_meta(cls, init_args)
        if model is None:
            return {}
        parts = {f"{name} with gradients and optimizer state (x{weights})": weights * size
                 for name, size in _weights(model, init_args).items()} if weights else {}
        measured = []
        for train, name, batch in steps:
            step = "a training step (forward and backward)" if train else "an evaluation step (forward)"
            peak, largest = _step_peak(model, batch, train)
            if peak is None:
                step = f"the forward pass of a{' training' if train else 'n evaluation'} step"
                peak, largest = _forward_peak(model, batch)
            if peak is not None:
                measured.append((peak, f"{step} of {name}={batch:,}, the largest tensor {largest}"))
        if measured:
            peak, what = max(measured)
            parts[what] = peak
        return parts


def _largest_tensor(model, init_args: Mapping) -> str:
    """'the weights (largest: <name> [shape], from <arg>=<value>)': the tensor a user would shrink,
    and the hyperparameters whose values are among its dimensions."""
    named = [*model.named_parameters(), *model.named_buffers()]
    if not named:
        return "the weights"
    name, tensor = max(named, key=lambda item: item[1].numel())
    dims = list(tensor.shape)

    def sizes_it(value) -> bool:  # a dimension is the value, a small multiple of it, or it plus a little
        return (isinstance(value, int) and not isinstance(value, bool) and value >= 16
                and any(d % value == 0 and d // value <= 8 or value < d <= value + 64 for d in dims))

    def causes(prefix: str, node) -> list[str]:  # "key=value" of each argument that sizes it, nested too
        found = []
        for key, value in (node.items() if isinstance(node, Mapping) else vars(node).items()):
            if isinstance(value, Mapping) or is_dataclass(value):
                found += causes(f"{prefix}{key}.", value)
            elif sizes_it(value) or isinstance(value, (list, tuple)) and any(map(sizes_it, value)):
                found.append(f"{prefix}{key}={value if sizes_it(value) else shorten(value, 40)}")
        return found

    found = sorted(causes("", init_args))
    cause = ", from " + ", ".join(found) if found else ""
    return f"the weights (largest: {name} {list(tensor.shape)}{cause})"


def _live_bytes():
    """A dispatch mode that counts the bytes of the tensors alive at once while it is on (every op's
    new outputs, until they are freed): its `peak`, and the largest tensor ('[shape] from op')."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = self.largest = 0
            self.largest_is = ""
            self.seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and id(t) not in self.seen and not t._is_view():
                    n = t.numel() * t.element_size()
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    if n > self.largest:
                        self.largest, self.largest_is = n, f"{list(t.shape)} from {func.overloadpacket.__name__}"
                    self.seen.add(id(t))
                    weakref.finalize(t, self._free, id(t), n)
            return out

        def _free(self, key: int, n: int) -> None:
            self.live -= n
            self.seen.discard(key)

    return LiveBytes()


def _forward_peak(model, batch: int) -> tuple[float | None, str]:
    """The peak bytes of tensors alive at once during `model`'s forward pass (on `meta`) of `batch`
    inputs of its input size, and the largest of them ('[shape] from op': the shape says which
    setting grew it); None when it cannot run there (an op without a meta kernel)."""
    import torch

    size, chans = getattr(model, "input_size", None), getattr(model, "input_chans", None)
    probe = getattr(model, "memory_probe", None) or model
    if size is None or chans is None:
        return None, ""
    try:
        images = torch.zeros(batch, int(chans), *map(int, size), device="meta")
        counter = _live_bytes()
        model.eval()
        with torch.no_grad(), counter:
            probe(images)
        return float(counter.peak + images.numel() * images.element_size()), counter.largest_is or "the input"
    except UserError:
        raise
    except Exception:  # an op without a meta kernel, or a data-dependent step: no estimate
        return None, ""


def _step_peak(model, batch: int, train: bool) -> tuple[float | None, str]:
    """The peak bytes of tensors alive at once during one training step (forward and backward) or
    evaluation step (forward, no gradients) of `model` (on `meta`) on its example batch grown to
    `batch` examples, and the largest of them; None when the step cannot run there."""
    import torch
    from torch.utils._pytree import tree_map

    if not all(hasattr(model, hook) for hook in ("example_batch", "train_inputs", "train_loss", "eval_inputs",
                                                 "eval_metrics")):
        return None, ""
    try:
        with torch.device("cpu"):
            example = model.example_batch(2)  # real and tiny: its form, dtypes and trailing sizes
        counter = _live_bytes()
        model.train(train)
        with torch.set_grad_enabled(train), counter:
            grown = tree_map(lambda t: torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta")
                             if isinstance(t, torch.Tensor) and t.dim() else t, example)
            if train:
                loss, _ = model.train_loss(**model.train_inputs(grown))
                loss.backward()
            else:
                model.eval_metrics("val", **model.eval_inputs(grown, "val"))
        return float(counter.peak), counter.largest_is or "the batch"
    except Exception:  # an op without a meta kernel, a data-dependent step, a family's UserError: no estimate
        return None, ""
    finally:
        model.zero_grad(set_to_none=True)


def data_memory(cls, init_args: Mapping) -> dict[str, float]:
    """The arrays a data module would generate or hold (its `memory_for`, by name), or {}."""
    try:
        return dict(cls.memory_for(**init_args)) if hasattr(cls, "memory_for") else {}
    except TypeError:  # arguments it does not take: the real build reports them
        return {}


# ----------------------------------------------------------------------------- JSON from files
#: Python objects of parsed JSON per byte of its text, at most (a file of small numbers)
JSON_EXPANSION = 12


def parse_json(text: str | bytes, what: str, expect: type | None = None,
               max_nodes: float | None = None) -> Any:
    """JSON text from a file as one line on every failure: not JSON, a 5,000-digit number (Python's
    int limit), nested past the recursion limit, past `check_tree`'s limits, or not of the
    `expect`ed type (dict, list...)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise UserError(f"{what}: refused, nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, an integer of too many digits
        raise UserError(f"{what}: not valid JSON ({shorten(str(exc), 120)})") from None
    check_tree(value, what, max_nodes)
    if expect is not None and not isinstance(value, expect):
        kind = {"dict": "an object", "list": "a list"}.get(expect.__name__, expect.__name__)
        raise UserError(f"{what}: expected {kind}, got {'null' if value is None else type(value).__name__}")
    return value


def read_json(path: str | os.PathLike, what: str | None = None, expect: type | None = None,
              max_bytes: int = 64 * 2**20, max_nodes: float | None = None) -> Any:
    """A JSON file, read and parsed with one-line errors (see `parse_json`); `what` prefixes them
    (default: the path). Its parsed size is checked against the memory budget before it is read."""
    path = Path(path)
    what = what or str(path)
    try:
        if path.is_dir():
            raise UserError(f"{what}: is a directory, not a JSON file")
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(f"{what}: refused, {size:,} bytes is more than a {max_bytes:,}-byte JSON file may hold")
        check_memory({f"{what}, parsed": float(size * JSON_EXPANSION)}, what)
        text = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{what}: cannot read ({exc.strerror or exc})") from None
    return parse_json(text, what, expect, max_nodes)
