"""Resuming is continuing the same run: the data it trains and validates on may not change; a
missing `last.ckpt` is one line; a save interrupted by a full disk or Ctrl-C is one line."""
from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser, Namespace

from conftest import REPO, cli_env, run_cli, run_main, tiny_fit_args
from zoo import registry
from zoo.data.fashion_mnist import FashionMNISTDataModule
from zoo.guards.errors import UserError
from zoo.models.base import class_path
from zoo.models.baselines import Classifier
from zoo.models.card import tiny_models
from zoo.training import runs
from zoo.training.callbacks import AtomicCheckpointIO


@pytest.fixture
def run(trained_run, tmp_path):
    """A copy of the shared tiny training (1 epoch), with its config.yaml and W&B run, to resume."""
    work = tmp_path / "work"
    shutil.copytree(trained_run["work"], work)
    return {"work": work, "root": work / "runs" / "cnn"}


def _resume(run, tiny_data_dir, *extra):
    args = tiny_fit_args("configs/baseline/cnn_centered.yaml", run["root"], "--trainer.max_epochs=2",
                         "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2", "--ckpt_path", "last",
                         *extra)
    return run_main(args, cwd=run["work"], env=cli_env(tiny_data_dir))


def _snapshot(run) -> dict:
    files = [run["root"] / "config.yaml", *sorted((run["work"] / "wandb").rglob("*"))]
    return {str(p): p.read_bytes() if p.is_file() else None for p in files}


@pytest.mark.parametrize("flag", ["--data.init_args.val_size=64", "--data.init_args.seed=7",
                                  "--data.init_args.variant=translated"])
def test_a_data_edit_on_resume_is_refused_before_anything_is_written(run, tiny_data_dir, flag):
    before = _snapshot(run)
    code, out, err = _resume(run, tiny_data_dir, flag)
    lines = [line for line in err.splitlines() if line.strip()]
    key = flag.split("=")[0].removeprefix("--")
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert f"but {key} differs" in lines[0] and "--init_from" in lines[0]
    assert _snapshot(run) == before  # config.yaml and the W&B run untouched


@pytest.mark.slow
def test_a_changed_batch_size_resumes_with_one_warning(run, tiny_data_dir):
    code, out, err = _resume(run, tiny_data_dir, "--data.init_args.batch_size=16")
    assert code == 0, err[-2000:]
    assert sum("resuming with data.init_args.batch_size 16" in line for line in err.splitlines()) == 1


@pytest.mark.parametrize("budget", ["--trainer.max_epochs=1", "--trainer.max_steps=1"])
def test_a_resume_that_would_train_nothing_is_one_line(run, tiny_data_dir, budget):
    """The shared run trained 1 epoch: resuming it at that budget would exit 0 having done nothing."""
    before = _snapshot(run)
    code, out, err = _resume(run, tiny_data_dir, budget)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert "nothing would train; raise --trainer.max_" in lines[0] and budget.split("=")[0].lstrip("-") in lines[0]
    assert _snapshot(run) == before


def test_ckpt_path_last_without_a_checkpoint_names_the_folder(tmp_path, tiny_data_dir):
    root = tmp_path / "typo"
    code, out, err = run_main(tiny_fit_args("configs/baseline/mlp_centered.yaml", root, "--ckpt_path", "last"),
                              cwd=tmp_path, env=cli_env(tiny_data_dir))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert f"no last.ckpt in {root}/checkpoints" in lines[0]
    assert not (root / "checkpoints").exists()


class _FullDisk:
    """A file whose writes fail with ENOSPC after `room` bytes, as a full disk's do."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data):
        if self.room < len(data):
            raise OSError(28, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_full_disk_during_a_real_checkpoint_write_is_the_disk_error(tmp_path, monkeypatch):
    """torch's zip writer turns the write error into 'unexpected pos'; the save raises the OSError
    (which train.py reports in one line) and leaves the old checkpoint and no temporary."""
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"epoch": 1}, path)
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _FullDisk(f, room=64) if "x" in mode else f

    monkeypatch.setattr("builtins.open", full_disk_open)
    with pytest.raises(OSError) as error:
        io.save_checkpoint({"epoch": 2, "weights": torch.zeros(10_000)}, path)
    monkeypatch.undo()
    assert error.value.errno == 28 and error.value.filename == str(path)
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.slow
def test_ctrl_c_saves_and_says_so_in_one_line(tmp_path, tiny_data_dir):
    root = tmp_path / "run"
    args = [sys.executable, *tiny_fit_args("configs/baseline/mlp_centered.yaml", root, "--trainer.max_epochs=500",
                                           "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false")]
    args[1] = str(REPO / args[1])
    # Ctrl-C as a terminal sends it: a test runner started in the background (`make test &`) ignores
    # SIGINT, and a child inherits that (Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen(args, cwd=tmp_path, env=cli_env(tiny_data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (root / "checkpoints" / "last.ckpt").exists() and time.monotonic() < deadline:  # an epoch has run
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"train.py: error: stopped by Ctrl-C: saved {root}/checkpoints/last.ckpt; "
                                            "resume with --ckpt_path last")
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["zoo_run"]["interrupted"] == "KeyboardInterrupt"


@pytest.mark.slow
def test_a_run_stopped_during_validation_validates_that_epoch_on_resume(tmp_path, tiny_data_dir):
    """SIGTERM lands in epoch 0's validation: the run saves and stops; the resumed run validates
    epoch 0 before going on, so that epoch gets its metrics and its best-checkpoint candidate."""
    root = tmp_path / "run"
    common = tiny_fit_args("configs/baseline/mlp_centered.yaml", root, "--trainer.max_epochs=2",
                           "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2",
                           "--trainer.enable_progress_bar=false", "--checkpoint.save_top_k=2")
    code, out, err = run_cli([*common, "--trainer.callbacks+=helpers.SigtermInValidation"], cwd=tmp_path,
                             env=cli_env(tiny_data_dir, ZOO_TEST_SIGTERM_EPOCH="0"))
    assert code == 143, err[-2000:]
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["zoo_run"]["interrupted_in"] == "validation"
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["last.ckpt"]  # epoch 0 never validated
    code, out, err = run_cli([*common, "--ckpt_path", "last"], cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert code == 0, err[-2000:]
    assert "could not find the monitored key" not in err
    names = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert names == ["best-epoch=000.ckpt", "best-epoch=001.ckpt", "last.ckpt"]


# ----------------------------------------------------------------------------- the comparison (issue 42)
#: the first tiny configuration of every registered family
FIRST = [(name, cls, hp) for name, cls, hp in tiny_models() if name == cls.card.name]
CLUTTERED = Namespace(class_path="zoo.data.fashion_mnist.FashionMNISTDataModule",
                      init_args=Namespace(variant="cluttered60"))


def _parsed(cls, init_args: dict):
    """`init_args` as LightningCLI holds them: every argument, typed blocks as Namespaces of every field."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model", fail_untyped=False)
    return parser.parse_object({"model": init_args}).model


def _checkpoint(model) -> dict:
    """What Lightning and the zoo save of a model's hyperparameters."""
    return {"hyper_parameters": dict(model.hparams), "zoo": {"class_path": class_path(type(model))}}


def _blocks(cls) -> list[str]:
    """The family's hyperparameters typed as a block (a dataclass: a backbone)."""
    hints = typing.get_type_hints(cls.__init__)
    return [key for key, hint in hints.items()
            if any(dataclasses.is_dataclass(t) for t in (hint, *typing.get_args(hint)))]


def _tiny(cls, hparams: dict) -> dict:
    return {**{k: v for k, v in cls.card.filled_by_data.items() if hparams.get(k) is None}, **hparams}


@pytest.mark.parametrize("name,cls,hparams", FIRST, ids=[n for n, _, _ in FIRST])
def test_a_parsed_config_resumes_its_own_checkpoint_and_a_changed_block_is_one_line(name, cls, hparams):
    """b22de23 compared a parsed block (a Namespace listing every field, unset ones None) with the
    checkpoint's dict of the fields set, and refused every family with a backbone."""
    tiny = _tiny(cls, hparams)
    model = registry.build({"class_path": class_path(cls), "init_args": tiny})
    runs.check_resume_model(_checkpoint(model), class_path(cls), _parsed(cls, tiny), Path("last.ckpt"))
    for key in _blocks(cls):
        block = dict(tiny.get(key) or {})
        field = next((f for f, v in sorted(block.items()) if isinstance(v, list) and v and isinstance(v[0], int)
                      or isinstance(v, int) and not isinstance(v, bool)), None)
        if field is None:  # the tiny configuration sets no size in this block: nothing of it to change
            continue
        block[field] = [v + 1 for v in block[field]] if isinstance(block[field], list) else block[field] + 1
        with pytest.raises(UserError) as refused:
            runs.check_resume_model(_checkpoint(model), class_path(cls), _parsed(cls, {**tiny, key: block}),
                                    Path("last.ckpt"))
        message = str(refused.value)
        assert f"but model.init_args.{key}.{field} differs" in message and len(message.splitlines()) == 1
        assert "Namespace" not in message and "--init_from last.ckpt" in message


def _normalizing_blocks(cls) -> list[str]:
    """The blocks with a `normalize` field (a backbone's: a pretrained weight's own, when unset)."""
    hints = typing.get_type_hints(cls.__init__)
    return [key for key in _blocks(cls) if any(dataclasses.is_dataclass(t) and "normalize" in
                                               {f.name for f in dataclasses.fields(t)}
                                               for t in (hints[key], *typing.get_args(hints[key])))]


WITH_BLOCKS = [(name, cls, hp) for name, cls, hp in FIRST if _normalizing_blocks(cls)]


@pytest.mark.parametrize("name,cls,hparams", WITH_BLOCKS, ids=[n for n, _, _ in WITH_BLOCKS])
def test_a_block_field_left_unset_takes_the_checkpoints(name, cls, hparams):
    """A field the config leaves unset is the kind's or its pretrained weight's, which the checkpoint
    recorded (sat_soft_scenes: its backbone_fmnist_stem release's `normalize`): it resumes with it."""
    tiny = _tiny(cls, hparams)
    model = registry.build({"class_path": class_path(cls), "init_args": tiny})
    key = _normalizing_blocks(cls)[0]
    checkpoint = _checkpoint(model)
    checkpoint["hyper_parameters"][key] = {**checkpoint["hyper_parameters"][key], "normalize": False}
    init_args = _parsed(cls, tiny)
    assert init_args[key].normalize is None
    runs.check_resume_model(checkpoint, class_path(cls), init_args, Path("last.ckpt"))
    assert init_args[key].normalize is False


def test_a_size_the_data_decides_is_compared_after_the_link():
    """The checkpoint holds the image size its data gave the model (60 px); the command line the
    class default (28): b22de23 refused `baseline_cnn_cluttered60` and the RAM cluttered recipes."""
    spec = {"class_path": class_path(Classifier), "init_args": {"arch": "mlp", "hidden": [8]}}
    trained = registry.build(registry.linked(spec, CLUTTERED.as_dict()))
    assert trained.hparams.image_size == 60 and trained.hparams.class_names == FashionMNISTDataModule.class_names
    init_args = _parsed(Classifier, {"arch": "mlp", "hidden": [8]})
    assert init_args.image_size == 28 and init_args.class_names is None
    runs.check_resume_model(_checkpoint(trained), class_path(Classifier), init_args, Path("last.ckpt"), CLUTTERED)
    older = _checkpoint(trained)
    older["hyper_parameters"]["class_names"] = None  # saved before models kept their data's class names
    runs.check_resume_model(older, class_path(Classifier), init_args, Path("last.ckpt"), CLUTTERED)
    centered = Namespace(class_path=CLUTTERED.class_path, init_args=Namespace(variant="centered"))
    with pytest.raises(UserError, match=r"but model.init_args.image_size differs \(28 here, 60 in the checkpoint\)"):
        runs.check_resume_model(_checkpoint(trained), class_path(Classifier), init_args, Path("last.ckpt"), centered)
    with pytest.raises(UserError, match=r"model.init_args.hidden differs \(\[16\] here, \[8\] in the checkpoint\)"):
        runs.check_resume_model(_checkpoint(trained), class_path(Classifier),
                                _parsed(Classifier, {"arch": "mlp", "hidden": [16]}), Path("last.ckpt"), CLUTTERED)


def test_a_run_folder_named_like_its_recipe_leaves_the_name_the_recipe(tmp_path, monkeypatch):
    """`fit --config vit_fmnist --trainer.default_root_dir vit_fmnist`, then the same with
    `--ckpt_path last`: the run's folder is no config file, the name still means the recipe."""
    from zoo.training.recipe_args import with_recipe_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vit_fmnist" / "checkpoints").mkdir(parents=True)
    recipe = str(registry.get_entry("vit_fmnist").recipe)
    assert with_recipe_paths(["fit", "--config", "vit_fmnist", "--ckpt_path", "last"]) == [
        "fit", "--config", recipe, "--ckpt_path", "last"]
