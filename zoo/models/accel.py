"""One acceleration switch for every family's training and evaluation steps, applied from outside
the family (docs/acceleration.md). The family writes pure step functions of named inputs
(zoo.models.base: `train_inputs` -> `train_loss`, `eval_inputs` -> `eval_metrics`; every random
draw is an input, so every mode consumes the same random stream, and a non-tensor input is a
host-side hint that a compiled step gets as None); this module runs them in the run's mode:
eager, compile (`torch.compile(fullgraph=True)`, or the card's `compile.pieces`), reduce-overhead
(CUDA graphs, CUDA only) or auto (compile on CUDA; on CPU only a run of at least the card's
`compile.cpu_min_steps` steps). A mode that cannot work here falls back with ONE logged warning;
an unknown mode is a UserError. `ZOO_COMPILE_BACKEND` (default "inductor") picks the backend.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sysconfig
from typing import Any, Callable, Iterator

import torch

from zoo.guards.errors import UserError

MODES = ("auto", "eager", "compile", "reduce-overhead")
COMPILED = ("compile", "reduce-overhead")
BACKEND_ENV = "ZOO_COMPILE_BACKEND"

log = logging.getLogger("zoo.accel")


def check_mode(mode: Any, owner: str = "--accel") -> str:
    if mode not in MODES:
        raise UserError(f"{owner}: accel must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def compile_backend() -> str:
    return os.environ.get(BACKEND_ENV, "inductor")


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run here (None when it can)."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return "torch.compile does not support this Python version"
    except Exception as exc:  # a broken or partial torch build
        return f"torch.compile is unavailable ({exc})"
    if compile_backend() != "inductor":
        return None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "torch.compile's CUDA code generator needs Triton, which is not installed"
    elif device.type == "cpu":
        if not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
            return "torch.compile's CPU code generator needs a C++ compiler (g++ or clang++); none found"
        include = sysconfig.get_paths().get("include")
        if not include or not os.path.exists(os.path.join(include, "Python.h")):
            return "torch.compile's CPU code generator needs the Python headers (Python.h; e.g. python3-dev)"
    return None


def _signature(inputs: dict) -> tuple:
    return tuple((key, tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else (key, v is None)
                 for key, v in sorted(inputs.items()))


def _static(inputs: dict) -> dict:
    """The inputs a compiled step takes: host-side hints (anything but tensors and None) dropped."""
    return {key: v if v is None or isinstance(v, torch.Tensor) else None for key, v in inputs.items()}


def _rank_zero(trainer) -> bool:
    return getattr(trainer, "global_rank", 0) == 0


class StepAccelerator:
    """Per-module state of the switch: the resolved mode per run and kind of step, and compiled
    functions. Not part of the module's state: copies and pickles start empty."""

    def __init__(self) -> None:
        self.requested = "auto"  # the run's option (`request`)
        self._modes: dict[tuple, str] = {}
        self._compiled: dict[tuple, Callable] = {}
        self._warned: set[str] = set()
        self.forced: str | None = None  # `force`: this mode for every step, trainer or not
        self._shapes: dict[str, list] = {}  # the input signatures each step was compiled for

    def __reduce__(self):  # copy, deepcopy and pickle alike
        return (StepAccelerator, ())

    def request(self, mode: str) -> None:
        """The run's option (`--accel`): the mode its steps resolve (`mode`) from."""
        self.requested = check_mode(mode)
        self._modes.clear()

    def force(self, mode: str | None) -> None:
        """Run every step in `mode` ("eager", "compile" or "reduce-overhead"; None: resolve as
        configured), also outside a Trainer: for benchmarks and tests."""
        if mode is not None and mode not in MODES[1:]:
            raise ValueError(f"mode must be one of {MODES[1:]}, got {mode!r}")
        self.forced = mode

    def mode(self, module, kind: str) -> str:
        """The mode for `kind` ("train" or "eval") steps of the module's current run; "eager"
        outside a Trainer unless forced."""
        if self.forced is not None:
            return self.forced
        trainer = getattr(module, "_trainer", None)
        strategy = getattr(trainer, "strategy", None)
        if trainer is None or strategy is None:
            return "eager"
        key = (id(trainer), str(getattr(getattr(trainer, "state", None), "fn", None)), kind)
        if key not in self._modes:
            self._modes[key] = self._resolve(module, trainer, strategy.root_device, kind)
        return self._modes[key]

    def _resolve(self, module, trainer, device: torch.device, kind: str) -> str:
        requested = self.requested
        if requested == "auto":
            mode, why = self._auto(module, trainer, device, kind)
        else:
            mode, why = requested, "as configured"
            if mode == "reduce-overhead" and device.type != "cuda":
                mode, why = "compile", "reduce-overhead needs CUDA"
                self._warn(trainer, f"accel 'reduce-overhead' replays CUDA graphs and needs a CUDA device; "
                                    f"this run is on {device.type}; {kind} steps run compile instead")
            problem = compile_unavailable(device) if mode in COMPILED else None
            if problem:
                self._warn(trainer, f"accel '{mode}' is not possible here: {problem}; {kind} steps run eager instead")
                mode, why = "eager", problem
        if _rank_zero(trainer):
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(f"accel: {type(module).__name__} {kind} steps run {mode} ({why})")
        return mode

    def _auto(self, module, trainer, device: torch.device, kind: str) -> tuple[str, str]:
        if device.type == "cuda":
            return ("eager" if compile_unavailable(device) else "compile"), "auto on cuda"
        least = module.card.compile.cpu_min_steps
        if kind == "train" and least is not None and not compile_unavailable(device):
            try:
                steps = trainer.estimated_stepping_batches
            except Exception:  # no training data to count
                steps = 0
            if steps >= least:
                return "compile", f"auto on {device.type}: {steps} steps, compiling pays off from {least}"
            return "eager", (f"auto on {device.type}: {steps} steps are too few for compiling to pay off "
                             f"(from {least})")
        return "eager", f"auto on {device.type}"

    def _warn(self, trainer, message: str) -> None:
        reason = message.split(";")[0]
        if reason in self._warned:
            return
        self._warned.add(reason)
        if _rank_zero(trainer):
            log.warning(message)

    def compiled(self, name: str, fn: Callable, mode: str = "compile") -> Callable:
        """fn compiled once per (name, mode); one static graph per input shape."""
        key = (name, mode)
        if key not in self._compiled:
            self._compiled[key] = _Compiled(self, name, fn, mode)
        return self._compiled[key]

    @contextlib.contextmanager
    def running(self, module, name: str, kind: str, inputs: dict | None = None) -> Iterator[str]:
        """Within: the mode of the module's `kind` steps, eager for input shapes beyond the first
        `card.compile.max_shapes` (`inputs`: the step's, for that count), and the family's
        `card.compile.pieces` compiled in a compiled mode (instance attributes shadow the methods)."""
        mode = self.mode(module, kind)
        if mode in COMPILED and inputs is not None:  # another shape (a smaller last batch): no recompile
            signature, seen = _signature(inputs), self._shapes.setdefault(name, [])
            if signature not in seen and len(seen) < module.card.compile.max_shapes:
                seen.append(signature)
            mode = mode if signature in seen else "eager"
        pieces = module.card.compile.pieces if mode in COMPILED else ()
        for piece in pieces:
            module.__dict__[piece] = self.compiled(piece, getattr(type(module), piece).__get__(module), mode)
        try:
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs may be overwritten
            yield mode
        finally:
            for piece in pieces:
                module.__dict__.pop(piece, None)

    def _run(self, module, name: str, kind: str, fn: Callable, inputs: dict, *args) -> Any:
        with self.running(module, name, kind, inputs) as mode:
            if mode in COMPILED and not module.card.compile.pieces:
                out = self.compiled(name, fn, mode)(*args, **_static(inputs))
            else:
                out = fn(*args, **(_static(inputs) if mode in COMPILED else inputs))
        # reduce-overhead's outputs live in CUDA-graph memory that the next replay overwrites: copies
        return _owned(out) if mode == "reduce-overhead" else out

    def training_step(self, module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Lightning's training step: the loss (Lightning back-propagates and steps) and metrics."""
        return self._run(module, "train", "train", module.train_loss, module.train_inputs(batch))

    def eval_step(self, module, batch, stage: str) -> dict[str, torch.Tensor]:
        inputs = module.eval_inputs(batch, stage)
        return self._run(module, f"eval_{stage}", "eval", module.eval_metrics, inputs, stage)

    def fit_step(self, module, batch, optimizer: torch.optim.Optimizer, clip_val: float | None = None,
                 clip_algorithm: str = "norm") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One whole training step outside Lightning (forward, loss, backward, clipping, optimizer
        step) in the module's mode: what benchmarks time and tests compare across modes."""
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = self.training_step(module, batch)
        loss.backward()
        if clip_val and clip_val > 0:  # Lightning's gradient_clip_val / gradient_clip_algorithm
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            if str(getattr(clip_algorithm, "value", clip_algorithm) or "norm") == "value":
                torch.nn.utils.clip_grad_value_(params, float(clip_val))
            else:  # the total norm and the clip factor stay on the device: no host sync
                torch.nn.utils.clip_grad_norm_(params, float(clip_val))
        optimizer.step()
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}


class _Compiled:
    """torch.compile(fn) that runs fn as is when compiling fails: a user's mistake inside the step
    (a wrong image size) raises its own one-line error; what the compiler cannot handle (a missing
    toolchain) trains eagerly after one logged warning."""

    def __init__(self, runner: StepAccelerator, name: str, fn: Callable, mode: str) -> None:
        from torch._inductor import exc as inductor_exc

        self.runner, self.name, self.fn, self.failed = runner, name, fn, False
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=compile_backend(),
                                      mode="reduce-overhead" if mode == "reduce-overhead" else None)
        self.build_errors = (torch._dynamo.exc.TorchDynamoException, inductor_exc.CppCompileError,
                             inductor_exc.InvalidCxxCompiler)

    def __call__(self, *args, **kwargs):
        if self.failed:
            return self.fn(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except self.build_errors as exc:
            out = self.fn(*args, **kwargs)  # raises the step's own error, if it has one
            self.failed = True
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.runner._warn(None, f"torch.compile could not compile the {self.name} step ({reason}); "
                                    "it runs eager")
            return out


def _owned(value: Any) -> Any:
    """value with every tensor cloned (clone keeps the autograd graph: a loss still back-propagates)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _owned(v) for key, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_owned(v) for v in value)
    return value
