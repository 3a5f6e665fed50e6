"""Issue 35: a run's saved config.yaml is a recipe, never a resume, and a checkpoint of a run that
is still training is not resumed into another folder (zoo/runs.py)."""
from __future__ import annotations

import fcntl

import pytest
import torch
import yaml
from jsonargparse import Namespace

import zoo.train as TRAIN
from conftest import REPO, TINY_VAL
from zoo import runs


@pytest.fixture(autouse=True)
def offline_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B runs land in tmp_path/wandb, no network
    monkeypatch.chdir(tmp_path)


def _fit(root, *extra: str, config=REPO / "configs/baseline/mlp_centered.yaml") -> list[str]:
    return ["fit", "--config", str(config), f"--trainer.default_root_dir={root}",
            f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32",
            "--trainer.enable_model_summary=false", "--trainer.enable_progress_bar=false",
            "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", *extra]


def _last(root) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)


def _wandb_logger(config: dict) -> dict:
    return config["trainer"]["logger"]["init_args"]


def test_a_resumed_runs_config_is_a_recipe_that_starts_a_new_run(tmp_path, tiny_data, capsys):
    first = tmp_path / "first"
    TRAIN.main(_fit(first, "--trainer.max_epochs=1"))
    TRAIN.main(_fit(first, "--trainer.max_epochs=2", "--ckpt_path", "last"))
    resumed = _last(first)
    assert resumed["global_step"] == 4 and resumed["zoo_run"]["run_dir"] == str(first.resolve())
    saved = yaml.safe_load((first / "config.yaml").read_text())
    assert saved["ckpt_path"] is None
    assert _wandb_logger(saved).get("id") is None and "resume" not in _wandb_logger(saved)
    capsys.readouterr()
    # the saved config as a recipe for a new run elsewhere: one epoch from step 0, a W&B run of its own
    second = tmp_path / "second"
    TRAIN.main(["fit", "--config", str(first / "config.yaml"), f"--trainer.default_root_dir={second}",
                "--trainer.max_epochs=1"])
    fresh = _last(second)
    assert fresh["global_step"] == 2 and fresh["epoch"] == 0
    assert fresh["zoo_run"]["wandb_id"] != resumed["zoo_run"]["wandb_id"]
    assert "a run's saved config" not in capsys.readouterr().err  # nothing to drop: it held no run identity
    runs_dirs = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert sorted(set(runs_dirs)) == sorted({resumed["zoo_run"]["wandb_id"], fresh["zoo_run"]["wandb_id"]})
    assert runs_dirs.count(fresh["zoo_run"]["wandb_id"]) == 1


def test_a_config_saved_by_an_older_zoo_has_its_resume_dropped_with_one_warning():
    """config.yaml files written before issue 35 hold ckpt_path and the W&B id: given as --config,
    they must not resume the old run (here the function train.py calls on the parsed config)."""
    logger = Namespace(class_path="zoo.callbacks.ZooWandbLogger",
                       init_args=Namespace(project="attention-zoo", id="eygns26a", resume="allow"))
    config = Namespace(ckpt_path="/old/run/checkpoints/last.ckpt", trainer=Namespace(logger=logger))
    with pytest.warns(UserWarning, match="a run's saved config, not a recipe") as caught:
        runs.drop_inherited_identity(config, ["fit", "--config", "old/config.yaml"])
    assert len(caught) == 1 and "ckpt_path /old/run/checkpoints/last.ckpt" in str(caught[0].message)
    assert config.ckpt_path is None and config.trainer.logger.init_args.id is None
    assert config.trainer.logger.init_args.resume is None
    # given on the command line, they are the user's own request
    config = Namespace(ckpt_path="last", trainer=Namespace(logger=logger.clone()))
    config.trainer.logger.init_args.id = "mine"
    runs.drop_inherited_identity(config, ["fit", "--ckpt_path=last", "--trainer.logger.init_args.id", "mine"])
    assert config.ckpt_path == "last" and config.trainer.logger.init_args.id == "mine"
    saved = runs.as_recipe(config)
    assert saved.ckpt_path is None and saved.trainer.logger.init_args.id is None
    assert "resume" not in saved.trainer.logger.init_args and config.ckpt_path == "last"  # a copy


def test_a_running_runs_checkpoint_is_not_resumed_in_another_folder(trained_run, tmp_path, tiny_data, capsys):
    last = trained_run["last"]  # its run folder is trained_run["root"]
    elsewhere = tmp_path / "elsewhere"
    args = _fit(elsewhere, "--trainer.max_epochs=1", "--ckpt_path", str(last),
                config=REPO / "configs/baseline/cnn_centered.yaml")
    with open(trained_run["root"] / runs.RUN_LOCK, "a") as held:  # that run's process, still training
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("4242 on node7")
        held.flush()
        with pytest.raises(SystemExit) as stopped:
            TRAIN.main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stopped.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: --ckpt_path {last}: its run ({trained_run['root'].resolve()})")
    assert "still training (pid 4242 on node7)" in err[0] and "--init_from" in err[0]
    assert not elsewhere.exists() and not (tmp_path / "wandb").exists()  # refused before anything started
    # stopped: the resume goes ahead, and says whose run it continues, in one line
    TRAIN.main(args)
    warned = [line for line in capsys.readouterr().err.splitlines() if "is a checkpoint of the run in" in line]
    assert len(warned) == 1 and f"{elsewhere} continues that run" in warned[0]


def test_a_results_run_leaves_the_checkpoints_of_a_run_training_there(tmp_path, monkeypatch):
    from test_results_run import _load_script

    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "run", lambda cmd: pytest.fail(f"ran {cmd}"))
    root = tmp_path / "runs/results/fam_recipe/seed0"
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"a live run's")
    runs.claim(root, resuming=True)  # as train.py does: the run holds its folder
    try:
        with pytest.raises(SystemExit, match="runs/results/fam_recipe/seed0 is in use by another training run"):
            script.main(["configs/fam/recipe.yaml", "--seeds", "0"])
    finally:
        runs.release()
    assert (root / "checkpoints" / "last.ckpt").read_bytes() == b"a live run's"


# ----------------------------------------------------------------------------- check_resume, without LightningCLI
CLASSIFIER, FMNIST = "zoo.models.baselines.Classifier", "zoo.data.fashion_mnist.FashionMNISTDataModule"
GIVEN = ["fit", "--ckpt_path", "last"]  # the command line: a resume is asked for there, never inherited


def _resume_config(root, ckpt_path="last", lr=0.001, variant="centered", batch_size=64) -> Namespace:
    """A parsed `fit` config as LightningCLI hands it over (only the keys check_resume reads)."""
    logger = Namespace(class_path="zoo.callbacks.ZooWandbLogger", init_args=Namespace(project="attention-zoo", id=None))
    return Namespace(ckpt_path=ckpt_path, init_from=None, sha256=None, weights_only=True,
                     model=Namespace(class_path=CLASSIFIER, init_args=Namespace(arch="mlp", lr=lr)),
                     data=Namespace(class_path=FMNIST, init_args=Namespace(variant=variant, batch_size=batch_size)),
                     trainer=Namespace(default_root_dir=str(root), logger=logger),
                     checkpoint=Namespace(dirpath=str(root / "checkpoints")))


def _saved_run(root, step=3) -> None:
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "global_step": step,
                "hyper_parameters": {"_class_path": CLASSIFIER, "arch": "mlp", "lr": 0.001},
                "datamodule_hyper_parameters": {"variant": "centered", "batch_size": 64},
                "zoo_run": {"run_dir": str(root), "wandb_id": "w4nd8id"}}, root / "checkpoints" / runs.LAST)


def test_check_resume_continues_the_run_and_its_wandb_run(tmp_path, recwarn):
    root = tmp_path / "run"
    _saved_run(root)
    config = _resume_config(root, batch_size=128)  # how the data is served may change, with one warning
    runs.check_resume(config, GIVEN, fitting=True)
    assert config.ckpt_path == str(root / "checkpoints" / runs.LAST)
    logger = config.trainer.logger.init_args
    assert (logger.id, logger.resume) == ("w4nd8id", "allow")
    assert [str(w.message) for w in recwarn if "batch_size" in str(w.message)] == [
        "resuming with data.init_args.batch_size 128 (the checkpoint's run used 64): the schedule and the epoch "
        "length change"]


@pytest.mark.parametrize("change, expected", [
    (dict(lr=0.01), "model.init_args.lr differs (0.01 here, 0.001 in the checkpoint)"),
    (dict(variant="cluttered60"), "data.init_args.variant differs (cluttered60 here, centered in the checkpoint)"),
])
def test_check_resume_refuses_another_model_or_other_data(tmp_path, change, expected):
    root = tmp_path / "run"
    _saved_run(root)
    with pytest.raises(runs.UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        runs.check_resume(_resume_config(root, **change), GIVEN, fitting=True)


def test_check_resume_names_the_newest_readable_checkpoint_beside_a_damaged_one(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(runs.UserError, match=f"no {runs.LAST} in {root / 'checkpoints'}"):
        runs.check_resume(_resume_config(root), GIVEN, fitting=True)
    _saved_run(root, step=7)
    (root / "checkpoints" / runs.LAST).rename(root / "checkpoints" / "epoch=6.ckpt")
    _saved_run(root, step=2)
    (root / "checkpoints" / "epoch=1.ckpt").write_bytes((root / "checkpoints" / runs.LAST).read_bytes())
    (root / "checkpoints" / runs.LAST).write_bytes(b"PK\x03\x04 cut off")
    with pytest.raises(runs.UserError, match=r"the newest readable checkpoint is .*epoch=6\.ckpt"):
        runs.check_resume(_resume_config(root), GIVEN, fitting=True)
    with pytest.raises(runs.UserError, match="would let a checkpoint run code"):
        config = _resume_config(root)
        config.weights_only = False
        runs.check_resume(config, GIVEN, fitting=True)


def test_resuming_a_fine_tune_with_init_from_on_the_command_line_says_drop_it(tmp_path):
    root = tmp_path / "run"
    _saved_run(root)
    config = _resume_config(root)
    config.init_from = "vit_fmnist"
    with pytest.raises(runs.UserError, match="drop --init_from to resume"):
        runs.check_resume(config, [*GIVEN, "--init_from", "vit_fmnist"], fitting=True)
    with pytest.raises(runs.UserError, match="drop --init_from to resume"):
        runs.check_resume(config, [*GIVEN, "--init_from=vit_fmnist"], fitting=False)


@pytest.mark.parametrize("fitting", [True, False])
def test_a_fine_tunes_saved_init_from_gives_way_to_its_checkpoint(tmp_path, fitting):
    """`validate --config RUN/config.yaml --ckpt_path last` (or fit, resuming) needs no --init_from null:
    the run's checkpoint holds the weights its saved init_from gave."""
    root = tmp_path / "run"
    _saved_run(root)
    config = _resume_config(root)
    config.init_from = "vit_fmnist"
    runs.check_resume(config, ["validate", "--config", str(root / "config.yaml"), "--ckpt_path", "last"],
                      fitting=fitting)
    assert config.init_from is None and config.ckpt_path == str(root / "checkpoints" / runs.LAST)
