"""What a model would allocate, measured before it is built: it is built on torch's `meta`
device (shapes, no storage) and its forward pass runs there (`model_memory`); a data module
states its arrays (`data_memory`). zoo.guards.budget's `check_memory` holds the sums to the
budget."""
from __future__ import annotations

import contextlib
import json
import logging
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import is_dataclass

from zoo.guards.errors import UserError, shorten


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


#: meta kernels and CPU kernels differ by a few small tensors (a fused cell's scratch, a reduction's
#: scalar: tens of bytes in a captioner's tiny step), so a step measured on meta is taken this many
#: bytes larger to stay at or above the real one
STEP_SLACK = 1024


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
            parts[what] = peak + STEP_SLACK
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


class _Unkeyable(Exception):
    """An op argument the memo of `_live_bytes` cannot key: the op runs."""


def _op_key(value, torch):
    """What an op's output can depend on in `value`, one of its arguments, as a hashable: a meta
    tensor's metadata (never its data: it has none), a plain value itself."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta" or value.layout != torch.strided:
            raise _Unkeyable
        return (value.dtype, tuple(value.shape), value.stride(), value.storage_offset(), value.is_conj(),
                value.is_neg())
    if isinstance(value, (list, tuple)):
        return (type(value), *(_op_key(v, torch) for v in value))
    if isinstance(value, dict):
        return (dict, *((k, _op_key(v, torch)) for k, v in value.items()))
    if value is None or isinstance(value, (int, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value), value)
    raise _Unkeyable


def _live_bytes():
    """A dispatch mode that counts the bytes of the tensors alive at once while it is on (every op's
    new outputs, until they are freed): its `peak`, and the largest tensor ('[shape] from op').

    On the meta device an op's outputs are a function of the op and its arguments' metadata, and
    most meta kernels are Python (torch._refs), a millisecond an op: an unrolled model (DRAW's T
    steps, a captioner's words) repeats the same op on the same shapes, so the outputs of a
    functional op (no in-place or out= argument, no output aliasing an input) are remembered by
    that key and made again as empty meta tensors of the same shapes, strides and dtypes: the same
    bytes counted, in microseconds."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

    functional: dict = {}  # op -> its schema neither mutates an argument nor returns an alias of one

    def is_functional(func) -> bool:
        if func not in functional:
            schema = func._schema
            functional[func] = not func.is_view and not schema.is_mutable and not any(
                r.alias_info is not None for r in schema.returns)
        return functional[func]

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = self.largest = 0
            self.largest_is = ""
            self.seen: set[int] = set()
            self.outputs: dict = {}  # (op, its arguments' keys) -> (output tree spec, its leaves)
            self.reused = 0  # ops whose outputs were made again from `outputs`

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                key = (func, _op_key(args, torch), _op_key(kwargs, torch)) if is_functional(func) else None
            except _Unkeyable:
                key = None
            if key in self.outputs:
                spec, leaves = self.outputs[key]
                self.reused += 1
                out = tree_unflatten([torch.empty_strided(leaf[1], leaf[2], dtype=leaf[3], device="meta")
                                      if leaf[0] else leaf[1] for leaf in leaves], spec)
            else:
                out = func(*args, **kwargs)
                if key is not None:
                    self._remember(key, out, args, kwargs)
            if func.is_view:  # a view (as_strided included) allocates nothing; under a dispatch mode
                return out    # its output is not marked as a view, so the schema says it
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

        def _remember(self, key, out, args, kwargs) -> None:
            """The op's outputs by `key`, where new empty meta tensors stand for them exactly: each a
            tensor of its own (not an input, not twice, not a view, at offset 0) or a plain value."""
            flat, spec = tree_flatten(out)
            inputs = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            leaves, ids = [], set()
            for leaf in flat:
                if isinstance(leaf, torch.Tensor):
                    if (leaf.device.type != "meta" or leaf.layout != torch.strided or id(leaf) in inputs
                            or id(leaf) in ids or leaf._is_view() or leaf.storage_offset() or leaf.is_conj()
                            or leaf.is_neg()):
                        return
                    ids.add(id(leaf))
                    leaves.append((True, tuple(leaf.shape), leaf.stride(), leaf.dtype))
                elif leaf is None or isinstance(leaf, (bool, int, float)):
                    leaves.append((False, leaf))
                else:
                    return
            self.outputs[key] = (spec, leaves)

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
