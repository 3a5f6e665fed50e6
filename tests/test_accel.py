"""The acceleration switch (zoo.models.accel): every family's whole training step and evaluation
step trace with torch.compile(fullgraph=True) without graph breaks, compiled steps equal eager
(AOT tracing and the real inductor backend), the switch works through Lightning (fit, validation,
test, checkpoints, resume across modes, DDP, train.py and eval.py), a mode that cannot work falls
back with one warning, and, on a CUDA device only, compiled and reduce-overhead (CUDA-graph)
steps equal eager and a whole step makes no host synchronisation.

Tolerances. The loss and every gradient of a compiled step equal eager's within a relative error
of 1e-5 (aot_eager: the same ATen kernels, decomposed) or 1e-3 (inductor: fused, reordered float32
arithmetic), gradients measured by the norm of the difference per tensor (+1e-6 absolute, for
gradients that are exactly 0 in eager).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

import zoo
from conftest import REPO, cli_env, run_cli, tiny_fit_args
from zoo.guards.errors import UserError
from zoo.models import accel
from zoo.models.card import families, tiny_models
from zoo.training.callbacks import Accelerate

#: every tiny configuration of every registered family (its card's `tiny`), by id ("ram",
#: "ram-annealed_random"); short unrolls, as tracing time grows with the number of steps
TINY = {name: (cls, hparams) for name, cls, hparams in tiny_models()}
#: each family's own tiny configuration, less the checks its card leaves out (`skip`)
def _first(check: str) -> list[str]:
    return [name for name, cls in families().items() if cls.card.tiny and check not in cls.card.skip]


INDUCTOR = _first("inductor")  # the real inductor backend: compiling costs seconds to a minute


def _own_first(cases) -> list:
    """`cases` (TINY's ids, or tuples starting with one) as parameters: each family's own (first) tiny
    configuration in `make test-fast`, its other configurations (tracing costs seconds to a minute
    each) in `make test`."""
    own = {next(name for name in TINY if TINY[name][0] is cls) for cls, _ in TINY.values()}
    params = []
    for case in cases:
        values = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param(*values, marks=() if values[0] in own else pytest.mark.slow))
    return params


def build(name: str, mode: str = "eager", **overrides):
    cls, hparams = TINY[name]
    torch.manual_seed(0)
    model = cls(**{**hparams, **overrides})
    model.accel.force(mode)
    return model


def batch(name: str, n: int = 6, seed: int = 0):
    """The family's own example batch (its `example_batch`), n examples."""
    return _example_model(name).example_batch(n, seed)


@functools.cache
def _example_model(name: str):
    return build(name)


def _set_compile_hints(monkeypatch, model, **hints) -> None:
    """The family's card with other compile hints, for this test."""
    cls = type(model)
    monkeypatch.setattr(cls, "card", dataclasses.replace(cls.card, compile=dataclasses.replace(cls.card.compile, **hints)))


def grads(model) -> dict[str, torch.Tensor]:
    return {k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for k, p in model.named_parameters() if p.requires_grad}


def assert_close_grads(got: dict, want: dict, rel: float) -> None:
    for key, g in want.items():
        err = (got[key] - g).norm()
        assert err <= rel * g.norm() + 1e-6, f"{key}: |diff| {err:.3g} vs |grad| {g.norm():.3g}"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _loss_and_grads(model, fn, inputs):
    model.zero_grad(set_to_none=True)
    loss, metrics = fn(**inputs)
    loss.backward()
    return loss.detach(), metrics, grads(model)


# ----------------------------------------------------------------------------- tracing (CPU)
@pytest.mark.parametrize("name", _own_first(TINY))
def test_whole_training_step_traces_without_graph_breaks_and_equals_eager(name):
    """fullgraph=True raises on any graph break; the compiled forward + backward must give eager's
    loss and gradients over a few optimizer steps (the parameters move in between)."""
    eager = build(name).train()
    traced = copy.deepcopy(eager)
    step = torch.compile(traced.train_loss, fullgraph=True, backend="aot_eager")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_t = torch.optim.SGD(traced.parameters(), lr=0.05)
    for i in range(3):
        torch.manual_seed(100 + i)
        inputs = eager.train_inputs(batch(name, seed=i))
        loss_e, metrics_e, grads_e = _loss_and_grads(eager, eager.train_loss, inputs)
        loss_t, metrics_t, grads_t = _loss_and_grads(traced, step, inputs)
        torch.testing.assert_close(loss_t, loss_e, rtol=1e-5, atol=1e-6)
        assert metrics_t.keys() == metrics_e.keys() and all(v.dim() == 0 for v in metrics_t.values())
        assert_close_grads(grads_t, grads_e, rel=1e-5)
        opt_e.step()
        opt_t.step()


# "val" computes a subset of "test" for the classifiers; each family's own configuration runs both
EVAL_CASES = [(name, "test") for name in TINY] + [(name, "val") for name in _first("eval_val")]


@pytest.mark.parametrize("name,stage", _own_first(EVAL_CASES))
def test_evaluation_step_traces_without_graph_breaks_and_equals_eager(name, stage):
    model = build(name).eval()
    model.on_validation_epoch_start()  # what Lightning calls first (RAM seeds its evaluation draws)
    inputs = model.eval_inputs(batch(name), stage)
    fn = torch.compile(lambda x: model.eval_metrics(stage, **x), fullgraph=True, backend="eager")
    with torch.no_grad():
        want = model.eval_metrics(stage, **inputs)
        got = fn(inputs)
    assert got.keys() == want.keys() and ("loss" in got or "nelbo" in got)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_draw_compiles_its_cell_not_the_unroll(monkeypatch):
    """The production granularity for DRAW: one step of eqs. 3-8 traces as one graph, and compile
    mode compiles exactly that cell (a T=64 unroll would not compile in minutes)."""
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    model = build("draw", "compile")
    inputs = model.train_inputs(batch("draw"))
    x = inputs["x"]
    h = x.new_zeros(x.shape[0], model.hparams.enc_size)
    args = (x, torch.zeros_like(x), h, h, h, h, inputs["noise"][0])
    traced = torch.compile(model._cell, fullgraph=True, backend="aot_eager")
    for got, want in zip(traced(*args)[:10], model._cell(*args)[:10]):
        torch.testing.assert_close(got, want)
    model.accel.fit_step(model, batch("draw"), torch.optim.Adam(model.parameters()))
    assert list(model.accel._compiled) == [("_cell", "compile")]
    assert "_cell" not in model.__dict__  # the compiled cell is in place during the step only


# ----------------------------------------------------------------------------- real inductor (CPU)
@pytest.mark.parametrize("name", INDUCTOR)
def test_inductor_steps_equal_eager(name):
    """Three whole training steps (draws, forward, loss, backward, clipping, optimizer step) with
    the real inductor backend against eager, from the same parameters each step."""
    eager, compiled = build(name, "eager").train(), build(name, "compile").train()
    opt_e = eager.configure_optimizers()
    opt_c = compiled.configure_optimizers()
    opt_e = opt_e["optimizer"] if isinstance(opt_e, dict) else opt_e
    opt_c = opt_c["optimizer"] if isinstance(opt_c, dict) else opt_c
    for i in range(3):
        compiled.load_state_dict(eager.state_dict())
        torch.manual_seed(10 + i)
        loss_e, metrics_e = eager.accel.fit_step(eager, batch(name, seed=i), opt_e, clip_val=5.0)
        grads_e = grads(eager)
        torch.manual_seed(10 + i)
        loss_c, metrics_c = compiled.accel.fit_step(compiled, batch(name, seed=i), opt_c, clip_val=5.0)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-3, atol=1e-5)
        assert_close_grads(grads(compiled), grads_e, rel=1e-3)
    assert compiled.accel._compiled  # it did compile
    # a batch of another size (an epoch's last) runs eagerly instead of compiling again
    torch.manual_seed(0)
    loss_small, _ = compiled.accel.fit_step(compiled, batch(name, n=4), opt_c)
    assert torch.isfinite(loss_small)
    assert _batch_sizes(compiled) == [6, 4][:compiled.card.compile.max_shapes]


def _batch_sizes(model) -> list[int]:
    """The batch size of each input signature the training step was compiled for."""
    return [next(entry[1][0] for entry in signature if entry[0] in ("images", "x"))
            for signature in model.accel._shapes["train"]]


def test_a_few_fixed_shapes_each_get_a_graph(monkeypatch):
    """A family with a few fixed batch shapes (caption length buckets) raises accel_max_shapes:
    each of the first shapes is compiled, any further one runs eagerly."""
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    model = build("baseline", "compile")
    _set_compile_hints(monkeypatch, model, max_shapes=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in (6, 4, 6, 5):
        model.accel.fit_step(model, batch("baseline", n=n), opt)
    assert _batch_sizes(model) == [6, 4]


# ----------------------------------------------------------------------------- modes and fallbacks
def test_speed_is_the_runs_option_not_a_hyperparameter():
    for cls, _ in TINY.values():
        assert "accel" not in inspect.signature(cls).parameters, cls
    with pytest.raises(UserError, match="accel must be one of auto, eager, compile, reduce-overhead"):
        Accelerate("fast")


@pytest.mark.slow
def test_train_py_rejects_an_unknown_mode_with_one_line(tmp_path, tiny_data_dir):
    args = tiny_fit_args("configs/baseline/mlp_centered.yaml", tmp_path / "r", "--accel=turbo")
    rc, out, err = run_cli(args, cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 2, err[-3000:]
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith("train.py: error:") and "turbo" in lines[0]


def _loaders(name: str, n: int = 40, batch_size: int = 16):
    data = TensorDataset(*batch(name, n=n, seed=5))
    return DataLoader(data, batch_size=batch_size, shuffle=True), DataLoader(data, batch_size=batch_size)


def _fit(model, name: str, root, epochs: int = 1, ckpt_path=None, accel: str = "auto", **trainer_kwargs):
    """A short fit whose run asks for `accel` (train.py's --accel: the Accelerate callback)."""
    L.seed_everything(0)
    train, val = _loaders(name)
    trainer = L.Trainer(max_epochs=epochs, default_root_dir=root, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0,
                        gradient_clip_val=5.0, callbacks=[Accelerate(accel)], **trainer_kwargs)
    trainer.fit(model, train, val, ckpt_path=ckpt_path)
    return trainer


def _resolved(model) -> dict[str, str]:
    return {key[2]: mode for key, mode in model.accel._modes.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ram", "draw"])  # a whole-step family and a cell-compiling one
def test_compiled_fit_validate_test_and_checkpoints(name, tmp_path, monkeypatch):
    """Through Lightning: training and evaluation steps compiled (AOT tracing for speed), the
    epoch's smaller last batch eager, checkpoints with the module's own keys, and a resume in
    eager mode from the compiled run's checkpoint."""
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    model = build(name, None)
    trainer = _fit(model, name, tmp_path, accel="compile")
    assert _resolved(model) == {"train": "compile", "eval": "compile"}
    assert {name for name, _ in model.accel._compiled} & {"train", "_cell"}
    metrics = trainer.callback_metrics
    assert all(torch.isfinite(v) for v in metrics.values()) and "train/loss" in metrics
    assert set(model.state_dict()) == set(build(name).state_dict())  # no `_orig_mod.` keys
    test = trainer.test(model, _loaders(name)[1], verbose=False)[0]
    assert all(k.startswith("test/") for k in test)
    path = tmp_path / "compiled.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert not any(isinstance(g["lr"], torch.Tensor) for g in ckpt["optimizer_states"][0]["param_groups"])
    loaded = zoo.load_checkpoint(path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    # resume the compiled run eagerly: the mode is the run's, nothing of it is in the checkpoint
    assert "accel" not in ckpt["hyper_parameters"] and "accel" not in ckpt["zoo"]["init_args"]
    resumed = build(name, None)
    trainer = _fit(resumed, name, tmp_path / "resumed", epochs=2, ckpt_path=path, accel="eager")
    assert trainer.global_step == 2 * 3 and _resolved(resumed)["train"] == "eager"


@pytest.mark.slow
def test_auto_on_cpu_compiles_only_runs_long_enough(tmp_path, monkeypatch):
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    short = build("ram", None)
    _set_compile_hints(monkeypatch, short, cpu_min_steps=6)
    _fit(short, "ram", tmp_path / "a", epochs=1)  # 3 steps
    assert _resolved(short) == {"train": "eager", "eval": "eager"}
    long = build("ram", None)
    _fit(long, "ram", tmp_path / "b", epochs=2)  # 6 steps
    assert _resolved(long) == {"train": "compile", "eval": "eager"}
    _set_compile_hints(monkeypatch, short, cpu_min_steps=None)  # a family that never pays off on CPU
    never = build("ram", None)
    _fit(never, "ram", tmp_path / "c", epochs=2)
    assert _resolved(never)["train"] == "eager"


def test_reduce_overhead_without_cuda_compiles_after_one_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    model = build("baseline", None)
    with caplog.at_level(logging.WARNING, logger="zoo.accel"):
        _fit(model, "baseline", tmp_path, accel="reduce-overhead")
    warnings = [r.getMessage() for r in caplog.records if r.name == "zoo.accel"]
    assert len(warnings) == 1 and "needs a CUDA device; this run is on cpu" in warnings[0]
    assert _resolved(model) == {"train": "compile", "eval": "compile"}


def test_compile_without_a_compiler_falls_back_with_one_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(accel, "compile_unavailable", lambda device: "no C++ compiler (test)")
    model = build("baseline", None)
    with caplog.at_level(logging.WARNING, logger="zoo.accel"):
        _fit(model, "baseline", tmp_path, accel="compile")
    warnings = [r for r in caplog.records if r.name == "zoo.accel"]
    assert len(warnings) == 1 and "no C++ compiler (test)" in warnings[0].getMessage()
    assert _resolved(model) == {"train": "eager", "eval": "eager"} and not model.accel._compiled


def test_compile_unavailable_reasons(monkeypatch):
    monkeypatch.delenv(accel.BACKEND_ENV, raising=False)
    assert accel.compile_unavailable(torch.device("cpu")) is None  # this machine has g++ and Python.h
    monkeypatch.setattr(accel.sysconfig, "get_paths", lambda: {"include": "/nonexistent"})
    assert "Python headers" in accel.compile_unavailable(torch.device("cpu"))
    monkeypatch.setattr(accel.shutil, "which", lambda name: None)
    assert "C++ compiler" in accel.compile_unavailable(torch.device("cpu"))
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")  # no code generation: nothing to compile
    assert accel.compile_unavailable(torch.device("cpu")) is None


def test_a_compiler_failure_trains_eagerly_after_one_warning(monkeypatch, caplog):
    def broken(fn, **kwargs):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("C++ toolchain broke (test)")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    model = build("baseline", "compile")
    reference = build("baseline", "eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    with caplog.at_level(logging.WARNING, logger="zoo.accel"):
        for i in range(2):
            losses = [m.accel.fit_step(m, batch("baseline", seed=i), o)[0]
                      for m, o in zip((model, reference), opts)]
            assert torch.equal(losses[0], losses[1])
    warnings = [r.getMessage() for r in caplog.records if r.name == "zoo.accel"]
    assert len(warnings) == 1 and "C++ toolchain broke (test)" in warnings[0] and "runs eager" in warnings[0]


def test_a_user_mistake_inside_a_compiled_step_is_its_own_one_line_error(monkeypatch):
    """Dynamo would wrap an exception raised while tracing; the step's UserError must surface."""
    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    model = build("baseline", "compile")
    wrong = (torch.rand(2, 1, 20, 20), torch.zeros(2, dtype=torch.long))
    with pytest.raises(UserError, match=r"images are \(1, 20, 20\), the model expects \(1, 16, 16\)"):
        model.accel.fit_step(model, wrong, torch.optim.SGD(model.parameters(), lr=0.1))


def test_accelerator_state_is_not_copied_or_pickled():
    import pickle

    model = build("baseline", "compile")
    model.accel.compiled("train", model.train_loss)
    clone = copy.deepcopy(model)
    assert clone.accel is not model.accel and not clone.accel._compiled and clone.accel.forced is None
    assert not pickle.loads(pickle.dumps(model)).accel._compiled


def test_retina_constants_are_buffers_outside_the_checkpoint():
    from zoo.attention.glimpse import Retina

    with_size, without = Retina(4, 2, image_size=(20, 24)), Retina(4, 2)
    images, locations = torch.rand(3, 1, 20, 24), torch.rand(3, 2) * 2 - 1
    assert torch.equal(with_size(images, locations), without(images, locations))
    assert torch.equal(with_size.boxes(locations, 20, 24), without.boxes(locations, 20, 24))
    assert with_size.state_dict() == {} and build("ram").glimpse.retina.image_hw == (20, 20)


# ----------------------------------------------------------------------------- entry points
@pytest.mark.slow
def test_ddp_two_processes_with_compiled_steps(tmp_path, tiny_data_dir):
    recipe = yaml.safe_load((REPO / "configs/baseline/mlp_centered.yaml").read_text())
    recipe["model"]["class_path"] = "helpers.DumpingClassifier"
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(recipe))
    root, dump = tmp_path / "runs" / "ddp", tmp_path / "dump"
    args = tiny_fit_args("configs/baseline/mlp_centered.yaml", root, "--trainer.max_epochs=1",
                         "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
                         "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--accel=compile")
    args[args.index("--config") + 1] = str(config)
    rc, out, err = run_cli(args, cwd=tmp_path, env=cli_env(tiny_data_dir, ZOO_TEST_DUMP_DIR=str(dump),
                                                              ZOO_COMPILE_BACKEND="aot_eager"))
    assert rc == 0, err[-5000:]
    assert "DumpingClassifier train steps run compile" in out + err
    end0, end1 = (torch.load(dump / f"rank{r}_end.pt", weights_only=True) for r in (0, 1))
    start = torch.load(dump / "rank0_start.pt", weights_only=True)["state"]
    assert end0["global_step"] == end1["global_step"] == 3
    for key in end0["state"]:
        assert torch.equal(end0["state"][key], end1["state"][key]), f"ranks differ in {key}"
    assert any(not torch.equal(start[k], end0["state"][k]) for k in start)


@pytest.mark.slow
def test_eval_py_in_compiled_mode_matches_eager(trained_run, tmp_path, tiny_data_dir):
    results = {}
    for mode in ("eager", "compile"):
        out = tmp_path / f"{mode}.json"
        rc, stdout, err = run_cli(["eval.py", "--checkpoint", trained_run["last"], "--split", "val", "--limit", "64",
                                   "--accel", mode, "--json", out],
                                  cwd=tmp_path, env=cli_env(tiny_data_dir, ZOO_COMPILE_BACKEND="aot_eager"))
        assert rc == 0, err[-4000:]
        results[mode] = yaml.safe_load(out.read_text())["metrics"]
    assert results["compile"].keys() == results["eager"].keys()
    for key, value in results["eager"].items():
        assert results["compile"][key] == pytest.approx(value, rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------------------- CUDA only
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA_FAMILIES = _first("cuda")


def _no_host_sync(fn):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda
@pytest.mark.parametrize("name", CUDA_FAMILIES)
@pytest.mark.parametrize("mode", ["compile", "reduce-overhead"])
def test_cuda_compiled_training_steps_equal_eager_and_make_no_host_sync(name, mode):
    """Four whole steps from the same parameters against eager (reduce-overhead records its CUDA
    graphs in the first steps and replays them after), then one more that must not synchronise."""
    from zoo.models import optim

    eager, compiled = build(name, "eager").cuda().train(), build(name, mode).cuda().train()
    opt_e, opt_c = (optim.build_optimizer(m.parameters(), "adam", lr=1e-3) for m in (eager, compiled))
    assert opt_e.param_groups[0]["fused"] is True  # on CUDA, the fused kernel
    for i in range(4):
        compiled.load_state_dict(eager.state_dict())
        data = tuple(t.cuda() for t in batch(name, n=8, seed=i))
        torch.manual_seed(50 + i)
        loss_e, metrics_e = eager.accel.fit_step(eager, data, opt_e, clip_val=1.0)
        torch.manual_seed(50 + i)
        loss_c, metrics_c = compiled.accel.fit_step(compiled, data, opt_c, clip_val=1.0)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-3, atol=1e-5)
        assert metrics_c.keys() == metrics_e.keys()
        assert_close_grads(grads(compiled), grads(eager), rel=1e-3)
    data = tuple(t.cuda() for t in batch(name, n=8))
    for model, opt in ((eager, opt_e), (compiled, opt_c)):
        loss, _ = _no_host_sync(lambda: model.accel.fit_step(model, data, opt, clip_val=1.0))
        assert torch.isfinite(loss)


@cuda
@pytest.mark.parametrize("name", CUDA_FAMILIES)
@pytest.mark.parametrize("stage", ["val", "test"])
def test_cuda_compiled_evaluation_equals_eager_and_makes_no_host_sync(name, stage):
    model = build(name).cuda().eval()
    data = tuple(t.cuda() for t in batch(name, n=8))
    results = []
    for i, mode in enumerate(("eager", "reduce-overhead", "reduce-overhead", "reduce-overhead")):
        model.accel.force(mode)
        model.on_validation_epoch_start()  # the same evaluation draws for every mode
        with torch.inference_mode():
            step = lambda: model.accel.eval_step(model, data, stage)  # noqa: E731
            results.append(_no_host_sync(step) if i == 3 else step())
    for got in results[1:]:
        for key, value in results[0].items():
            torch.testing.assert_close(got[key], value, rtol=1e-3, atol=1e-5)


@cuda
@pytest.mark.parametrize("name", ["ram", "draw"])  # a whole-step family and DRAW's compiled cell
def test_cuda_reduce_overhead_training_through_lightning(name, tmp_path):
    model = build(name, None)
    train, val = _loaders(name, n=40, batch_size=16)
    trainer = L.Trainer(max_epochs=2, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="gpu", devices=1, gradient_clip_val=5.0,
                        num_sanity_val_steps=0, callbacks=[Accelerate("reduce-overhead")])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(model, train, val)
    assert _resolved(model) == {"train": "reduce-overhead", "eval": "reduce-overhead"}
    assert trainer.global_step == 6 and torch.isfinite(trainer.callback_metrics["train/loss"])
    assert any(not torch.equal(before[k], v.cpu()) for k, v in model.state_dict().items())
    trainer.save_checkpoint(tmp_path / "ro.ckpt")
    loaded = zoo.load_checkpoint(tmp_path / "ro.ckpt")
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value.cpu())


# ----------------------------------------------------------------------------- the captioner
def _captioner_batch(T: int, seed: int = 0) -> dict:
    from test_captioner import batch_of

    b = batch_of(B=4, T=T, seed=seed)
    b["item_boxes"] = torch.tensor([[[0, 0, 16, 16]]] * 4, dtype=torch.float32)
    b["word_items"] = torch.where(b["captions"] > 3, 0, -1)
    return b


@pytest.mark.slow
def test_captioner_compiled_fit_steps_equal_eager_across_caption_lengths(monkeypatch):
    """Through the switch: compile mode gives each caption length its own graph (up to
    accel_max_shapes) and the same losses and parameters as eager steps."""
    from test_captioner import tiny

    monkeypatch.setenv(accel.BACKEND_ENV, "aot_eager")
    runs = {}
    for mode in ("eager", "compile"):
        model = tiny("hard", dropout=0.0).train()
        model.accel.force(mode)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        for i, T in enumerate((7, 5, 7)):
            torch.manual_seed(10 + i)
            losses.append(model.accel.fit_step(model, _captioner_batch(T=T, seed=i), opt)[0])
        runs[mode] = (torch.stack(losses), model.state_dict())
        if mode == "compile":  # two caption lengths, two static graphs, none run eagerly
            assert len(model.accel._shapes["train"]) == 2 and model.accel.mode(model, "train") == "compile"
    torch.testing.assert_close(runs["compile"][0], runs["eager"][0], rtol=1e-5, atol=1e-6)
    for key, value in runs["eager"][1].items():
        torch.testing.assert_close(runs["compile"][1][key], value, rtol=1e-4, atol=1e-6, msg=key)


def test_reduce_overhead_outputs_are_the_callers_own_copies():
    """Outputs in CUDA-graph memory are overwritten by the next replay: _run hands out clones that
    still back-propagate."""
    w = torch.ones(3, requires_grad=True)
    loss, metrics = accel._owned(((w * 2).sum(), {"acc": w.detach()}))
    assert metrics["acc"].data_ptr() != w.data_ptr() and torch.equal(metrics["acc"], w.detach())
    loss.backward()
    assert torch.equal(w.grad, torch.full((3,), 2.0))
