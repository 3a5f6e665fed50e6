"""One acceleration switch for every family's training and evaluation steps.

    model:
      init_args:
        accel: auto        # auto | eager | compile | graph

- eager: plain PyTorch, what the released recipes were trained with (bit for bit).
- compile: `torch.compile(fullgraph=True)` of the family's pure step function (forward and loss;
  AOTAutograd compiles the backward with it) for training, and of its evaluation function. A
  family whose whole step is too long to compile (DRAW, 64 unrolled steps) compiles its per-step
  cell instead (`accel_compile_whole_step = False`, `ZooModule.accel_piece`). The optimizer runs
  its fused kernel.
- graph (CUDA): the whole training step, random draws excepted (forward, loss, backward,
  gradient clipping and the optimizer step), is captured once in a CUDA graph and replayed: one
  launch per step instead of thousands. The first batch of a shape runs eagerly (the first one
  builds the optimizer state) and is then captured; shapes beyond `accel_max_shapes` (an epoch's
  smaller last batch) run eagerly. Evaluation functions are captured per input shape. Needs one
  process (no DDP), no gradient accumulation, full or bf16-true precision and one optimizer;
  otherwise the run falls back to what auto picks without graphs (compile) with one warning.
- auto (default): the fastest mode that is correct on the device and pays for itself within the
  run: on CUDA `ZooModule.accel_cuda` ("compile": "graph" is opt-in and warns until a GPU run of
  scripts/gpu_check.sh passes the CUDA tests whole; docs/acceleration.md has the H200 runs); on CPU, compiled training
  when the run has at least `ZooModule.accel_cpu_compile_min_steps` optimizer steps (compiling
  costs about a minute or two on CPU, so short runs stay eager) and eager evaluation.

A mode that cannot work here falls back with ONE logged warning, never an error: "graph" without
CUDA (or under DDP, accumulation, mixed precision) falls back to what auto would pick; "compile"
without a working compiler (no C++ compiler for CPU code, no Triton for CUDA code, a Python that
torch.compile does not support) falls back to eager. An unknown mode is a UserError.

What a family implements (all of it a few lines on top of its existing code):
    train_inputs(batch) -> tuple          the batch and every random draw of the step (eager)
    train_loss(*inputs) -> (loss, {name: 0-d tensor})
                                           pure: no self.log, no host sync, no Python branch on a
                                           tensor value, no draws (they come in as inputs)
    eval_inputs(batch, stage) -> tuple     likewise for "val" / "test"
    eval_metrics(stage, *inputs) -> {name: tensor}
Logging reads the returned tensors after the step. Random draws are inputs so that every mode
consumes the same random stream: eager, compiled and graphed steps agree given the seed.

`ZOO_COMPILE_BACKEND` (environment; default "inductor") picks the torch.compile backend, for
debugging: "aot_eager" traces and checks without generating code. `ZOO_COMPILE_MODE` (default
unset: torch.compile's default) passes a torch.compile mode, e.g. "reduce-overhead" (inductor's
own CUDA graphs), which benchmarks/accel.py measures beside `graph`.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sysconfig
from typing import Any, Callable, Iterator

import torch

from zoo.errors import UserError

MODES = ("auto", "eager", "compile", "graph")
BACKEND_ENV = "ZOO_COMPILE_BACKEND"
COMPILE_MODE_ENV = "ZOO_COMPILE_MODE"
GRAPH_PRECISIONS = ("32-true", "32", "bf16-true", "16-true", "64-true")

log = logging.getLogger("zoo.accel")


def check_mode(mode: Any, owner: str) -> str:
    if mode not in MODES:
        raise UserError(f"{owner}: accel must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def compile_backend() -> str:
    return os.environ.get(BACKEND_ENV, "inductor")


def compile_mode() -> str | None:
    return os.environ.get(COMPILE_MODE_ENV) or None


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


def _compile_errors() -> tuple[type, ...]:
    """Exceptions that mean torch.compile could not build a function (not that running it failed)."""
    errors: list[type] = [torch._dynamo.exc.TorchDynamoException]
    try:
        from torch._inductor import exc as inductor_exc

        errors += [inductor_exc.CppCompileError, inductor_exc.InvalidCxxCompiler]
    except ImportError:
        pass
    return tuple(errors)


def graph_unavailable(trainer, device: torch.device, kind: str) -> str | None:
    """Why CUDA graphs cannot run this kind of step here (None when they can)."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; this run is on {device.type}"
    precision = str(getattr(trainer, "precision", "32-true"))
    if precision not in GRAPH_PRECISIONS:  # autocast's weight cache does not survive a capture
        return f"CUDA graphs need full or bf16-true precision, not {precision}"
    if kind != "train":
        return None
    if getattr(trainer, "world_size", 1) > 1:
        return f"a CUDA-graphed training step runs in one process; this run has {trainer.world_size} (DDP)"
    if getattr(trainer, "accumulate_grad_batches", 1) != 1:
        return "a CUDA-graphed training step steps the optimizer every batch; accumulate_grad_batches must be 1"
    if len(getattr(trainer, "optimizers", None) or []) > 1:  # empty before configure_optimizers
        return "a CUDA-graphed training step needs exactly one optimizer"
    return None


def _signature(inputs: tuple) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else ("value", t)
                 for t in inputs)


def _rank_zero(trainer) -> bool:
    return getattr(trainer, "global_rank", 0) == 0


class StepAccelerator:
    """Per-module state of the switch: the resolved mode per run and kind of step, compiled
    functions and captured graphs. Not part of the module's state: copies and pickles start empty."""

    def __init__(self) -> None:
        self._modes: dict[tuple, str] = {}
        self._compiled: dict[str, Callable] = {}
        self._train_graph: _GraphedTrainStep | None = None
        self._eval_graphs = _GraphedCalls()
        self._warned: set[str] = set()
        self.active = "eager"  # the mode of the step running now (pieces compiled inside read it)
        self.forced: str | None = None  # `force`: this mode for every step, trainer or not
        self._shapes: dict[str, list] = {}  # the input signatures each step was compiled for

    def __deepcopy__(self, memo) -> "StepAccelerator":
        return StepAccelerator()

    def __reduce__(self):
        return (StepAccelerator, ())

    # ------------------------------------------------------------------ resolving the mode
    def force(self, mode: str | None) -> None:
        """Run every step in `mode` ("eager", "compile" or "graph"; None: resolve as configured),
        also outside a Trainer: for benchmarks and tests."""
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
        requested = module.accel_requested()
        if requested == "auto":
            mode, why = self._auto(module, trainer, device, kind)
        else:
            mode, why = requested, "as configured"
            if mode == "graph" and device.type == "cuda":
                self._warn(trainer, f"accel 'graph' is opt-in: its CUDA tests have not yet passed whole on a GPU "
                                    f"(scripts/gpu_check.sh); {kind} steps run graph as configured")
            problem = graph_unavailable(trainer, device, kind) if mode == "graph" else None
            if problem:
                mode, why = self._auto(module, trainer, device, kind, allow_graph=False)[0], problem
                self._warn(trainer, f"accel 'graph' is not possible here: {problem}; {kind} steps run {mode} instead")
            problem = compile_unavailable(device) if mode == "compile" else None
            if problem:
                mode, why = "eager", problem
                self._warn(trainer, f"accel 'compile' is not possible here: {problem}; {kind} steps run eager instead")
        if _rank_zero(trainer):
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(f"accel: {type(module).__name__} {kind} steps run {mode} ({why})")
        return mode

    def _auto(self, module, trainer, device: torch.device, kind: str, allow_graph: bool = True) -> tuple[str, str]:
        if device.type == "cuda":
            mode = module.accel_cuda
            if mode == "graph" and (not allow_graph or graph_unavailable(trainer, device, kind)):
                mode = "compile"
            if mode == "compile" and compile_unavailable(device):
                mode = "eager"
            return mode, "auto on cuda"
        if kind == "train" and module.accel_cpu_compile_min_steps is not None and not compile_unavailable(device):
            try:
                steps = trainer.estimated_stepping_batches
            except Exception:  # no training data to count
                steps = 0
            if steps >= module.accel_cpu_compile_min_steps:
                return "compile", (f"auto on {device.type}: {steps} steps, compiling pays off from "
                                   f"{module.accel_cpu_compile_min_steps}")
            return "eager", (f"auto on {device.type}: {steps} steps are too few for compiling to pay off "
                             f"(from {module.accel_cpu_compile_min_steps})")
        return "eager", f"auto on {device.type}"

    def _warn(self, trainer, message: str) -> None:
        reason = message.split(";")[0]
        if reason in self._warned:
            return
        self._warned.add(reason)
        if _rank_zero(trainer):
            log.warning(message)

    # ------------------------------------------------------------------ pieces
    def compiled(self, name: str, fn: Callable) -> Callable:
        """fn compiled once per name; one static graph per input shape (`accel_max_shapes` of them)."""
        if name not in self._compiled:
            self._compiled[name] = _Compiled(self, name, fn)
        return self._compiled[name]

    def piece(self, name: str, fn: Callable) -> Callable:
        """`fn`, compiled when the step running now is in compile mode (for families that compile
        parts of their step, e.g. DRAW's cell)."""
        return self.compiled(name, fn) if self.active == "compile" else fn

    # ------------------------------------------------------------------ steps
    def training_step(self, module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Lightning's training step: the loss and metrics; in graph mode the captured step has
        also back-propagated and stepped the optimizer (ZooModule's hooks then skip both)."""
        with self.running(module, "train") as mode:
            inputs = module.train_inputs(batch)
            if mode == "graph":
                trainer = module.trainer
                return self._graphed(module, trainer.optimizers[0], trainer.gradient_clip_val,
                                     trainer.gradient_clip_algorithm)(inputs)
            return self._loss_fn(module, inputs)(*inputs)

    def _loss_fn(self, module, inputs: tuple) -> Callable:
        if self.active == "compile" and not self._admit("train", inputs, module.accel_max_shapes):
            self.active = "eager"  # also for the pieces a family compiles (reset on leaving `running`)
        if self.active == "compile" and module.accel_compile_whole_step:
            return self.compiled("train", module.train_loss)
        return module.train_loss

    def _graphed(self, module, optimizer, clip_val, clip_algorithm) -> "_GraphedTrainStep":
        if self._train_graph is None or self._train_graph.optimizer is not optimizer:
            self._train_graph = _GraphedTrainStep(module, optimizer, clip_val, clip_algorithm, module.accel_max_shapes)
        return self._train_graph

    def fit_step(self, module, batch, optimizer: torch.optim.Optimizer, clip_val: float | None = None,
                 clip_algorithm: str = "norm") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One whole training step outside Lightning (forward, loss, backward, clipping, optimizer
        step) in the module's mode: what benchmarks time and tests compare across modes."""
        with self.running(module, "train") as mode:
            inputs = module.train_inputs(batch)
            if mode == "graph":
                return self._graphed(module, optimizer, clip_val, clip_algorithm)(inputs)
            optimizer.zero_grad(set_to_none=True)
            loss, metrics = self._loss_fn(module, inputs)(*inputs)
            loss.backward()
            _clip([p for g in optimizer.param_groups for p in g["params"]], clip_val, clip_algorithm)
            optimizer.step()
            return loss.detach(), {k: v.detach() for k, v in metrics.items()}

    @contextlib.contextmanager
    def running(self, module, kind: str) -> Iterator[str]:
        """Within: `active` is the mode of the module's `kind` steps, for `call` and `piece`."""
        previous, self.active = self.active, self.mode(module, kind)
        try:
            yield self.active
        finally:
            self.active = previous

    def _admit(self, name: str, inputs: tuple, limit: int) -> bool:
        """Whether compile mode runs step `name` compiled for these input shapes: the first
        `limit` shapes it sees get a static graph each (the run's batch; a family with a few
        fixed shapes, such as caption length buckets, raises `accel_max_shapes`); any other shape
        (an epoch's smaller last batch) runs eagerly rather than compiling again (a minute on CPU)."""
        signature, seen = _signature(inputs), self._shapes.setdefault(name, [])
        if signature in seen:
            return True
        if len(seen) < limit:
            seen.append(signature)
            return True
        return False

    def eval_step(self, module, batch, stage: str) -> dict[str, torch.Tensor]:
        with self.running(module, "eval"):
            inputs = module.eval_inputs(batch, stage)
            return self.call(module, f"eval_{stage}", lambda *x: module.eval_metrics(stage, *x), inputs,
                             whole=module.accel_compile_whole_step)

    def call(self, module, name: str, fn: Callable, inputs: tuple, whole: bool = True) -> Any:
        """fn(*inputs) without gradients, in the active mode: compiled (when `whole`), captured
        per input shape (graph), or as is."""
        if self.active == "graph":
            return self._eval_graphs(name, fn, inputs)
        if self.active == "compile" and not self._admit(name, inputs, module.accel_max_shapes):
            previous, self.active = self.active, "eager"
            try:
                return fn(*inputs)
            finally:
                self.active = previous
        if self.active == "compile" and whole:
            return self.compiled(name, fn)(*inputs)
        return fn(*inputs)


class _Compiled:
    """torch.compile(fn) that runs fn as is when compiling fails: a user's mistake inside the step
    (a wrong image size) then raises its own one-line error, and a function or machine the
    compiler cannot handle (a missing toolchain) trains eagerly after one logged warning."""

    def __init__(self, runner: StepAccelerator, name: str, fn: Callable) -> None:
        self.runner, self.name, self.fn, self.failed = runner, name, fn, False
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=compile_backend(),
                                      mode=compile_mode())

    def __call__(self, *args):
        if self.failed:
            return self.fn(*args)
        try:
            return self.compiled(*args)
        except _compile_errors() as exc:
            out = self.fn(*args)  # raises the step's own error, if it has one
            self.failed = True
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            message = f"torch.compile could not compile the {self.name} step ({reason}); it runs eager"
            if message not in self.runner._warned:
                self.runner._warned.add(message)
                log.warning(message)
            return out


def _clip(params: list[torch.Tensor], clip_val: float | None, algorithm: str = "norm") -> None:
    """Lightning's gradient clipping (trainer.gradient_clip_val / _algorithm), on the device."""
    if not clip_val or clip_val <= 0:
        return
    params = [p for p in params if p.grad is not None]
    if str(getattr(algorithm, "value", algorithm) or "norm") == "value":
        torch.nn.utils.clip_grad_value_(params, float(clip_val))
    else:  # the total norm and the clip factor stay on the device: no host sync
        torch.nn.utils.clip_grad_norm_(params, float(clip_val))


# ----------------------------------------------------------------------------- CUDA graphs
@contextlib.contextmanager
def _capturing(graph: "torch.cuda.CUDAGraph"):
    """torch.cuda.graph with the garbage collector held off. A collection during the capture can
    free an older CUDAGraph (a previous run's, held in a reference cycle), whose teardown is not
    permitted while a stream captures: the capture then fails with cudaErrorStreamCaptureInvalidated
    (seen on an H200; recent torch no longer collects before capturing). So: collect first, then
    capture with collection off."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # loader threads may run
            yield
    finally:
        if enabled:
            gc.enable()


def _on_side_stream(fn: Callable, *args):
    """Run fn on a side stream (warm-up before a capture, as CUDA graph capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    return out


def _copy_into(static: list, inputs: tuple) -> None:
    for dst, src in zip(static, inputs):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src, non_blocking=True)


def _static_copies(inputs: tuple) -> list:
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs]


class _GraphedTrainStep:
    """forward, loss, backward, clipping and optimizer step, captured once per input shape (up to
    `max_shapes`) and replayed. Each new shape first runs one real step eagerly on a side stream
    (the first builds the optimizer state), then is captured; other shapes run eagerly."""

    def __init__(self, module, optimizer: torch.optim.Optimizer, clip_val, clip_algorithm, max_shapes: int = 1) -> None:
        from zoo.models import optim

        self.module, self.optimizer, self.max_shapes = module, optimizer, max_shapes
        self.clip_val = float(clip_val) if clip_val else 0.0
        self.clip_algorithm = str(getattr(clip_algorithm, "value", clip_algorithm) or "norm")
        optim.reconcile(optimizer)  # capturable, lr on the device (also after a checkpoint load)
        optimizer._warned_capturable_if_run_uncaptured = True  # eager warm-up steps are expected
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.graphs: dict[tuple, tuple] = {}  # signature -> (graph, static inputs, packed outputs, keys)

    def _clip(self) -> None:
        _clip(self.params, self.clip_val, self.clip_algorithm)

    def _step(self, *inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # Gradients may alias a graph's memory: drop the references instead of zeroing them.
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self.module.train_loss(*inputs)
        loss.backward()
        self._clip()
        self.optimizer.step()
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}

    def __call__(self, inputs: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        signature = _signature(inputs)
        entry = self.graphs.get(signature)
        if entry is None:
            if len(self.graphs) >= self.max_shapes:  # e.g. the epoch's smaller last batch
                return self._step(*inputs)
            out = _on_side_stream(self._step, *inputs)  # a real step, then the capture
            self.graphs[signature] = self._capture(inputs)
            return out
        graph, static_inputs, packed, keys = entry
        _copy_into(static_inputs, inputs)
        graph.replay()
        values = packed.clone().unbind(0)
        return values[0], dict(zip(keys, values[1:]))

    def _capture(self, inputs: tuple) -> tuple:
        static_inputs = _static_copies(inputs)
        real_grads = [p.grad for p in self.params]  # the eager step's, which the capture does not compute
        self.optimizer.zero_grad(set_to_none=True)  # backward allocates the gradients inside the graph
        graph = torch.cuda.CUDAGraph()
        with _capturing(graph):
            loss, metrics = self.module.train_loss(*static_inputs)
            loss.backward()
            self._clip()
            self.optimizer.step()
            keys = list(metrics)
            packed = torch.stack([loss.detach().float()] + [metrics[k].detach().float() for k in keys])
        with torch.no_grad():  # capturing ran no kernel: the graph's gradient buffers hold nothing yet
            for p, real in zip(self.params, real_grads):
                if p.grad is not None and real is not None:
                    p.grad.copy_(real)
                elif p.grad is not None:
                    p.grad.zero_()
        return graph, static_inputs, packed, keys


class _GraphedCalls:
    """Gradient-free functions captured once per (name, input shapes) and replayed."""

    def __init__(self) -> None:
        self.entries: dict[tuple, tuple] = {}

    def __call__(self, name: str, fn: Callable, inputs: tuple) -> Any:
        key = (name, _signature(inputs))
        entry = self.entries.get(key)
        if entry is None:
            out = _on_side_stream(fn, *inputs)  # warm-up with the real inputs: its result is returned
            static_inputs = _static_copies(inputs)
            graph = torch.cuda.CUDAGraph()
            with _capturing(graph):
                static_out = fn(*static_inputs)
            self.entries[key] = (graph, static_inputs, static_out)
            return out
        graph, static_inputs, static_out = entry
        _copy_into(static_inputs, inputs)
        graph.replay()
        return _clone_tree(static_out)


def _clone_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_tree(v) for v in value)
    return value
