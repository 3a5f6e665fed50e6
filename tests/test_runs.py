"""Issue 35: a run's saved config.yaml is a recipe, never a resume, and a checkpoint of a run that
is still training is not resumed into another folder (zoo/training/runs.py). Issue 42: a run folder belongs
to one run, named by its claim; a new run goes only into a new or empty folder, a resumed one only
into its own run's, and a refused run leaves every file as it was."""
from __future__ import annotations

import fcntl
import json
import os
import re

import pytest
import torch
import yaml
from jsonargparse import Namespace

import zoo.training.train as TRAIN
from conftest import REPO, TINY_VAL, wandb_runs
from zoo.training import runs


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
    runs_dirs = [run_id for run_id, _ in wandb_runs(tmp_path)]
    assert sorted(set(runs_dirs)) == sorted({resumed["zoo_run"]["wandb_id"], fresh["zoo_run"]["wandb_id"]})
    assert runs_dirs.count(fresh["zoo_run"]["wandb_id"]) == 1


def test_a_config_saved_by_an_older_zoo_has_its_resume_dropped_with_one_warning():
    """config.yaml files written before issue 35 hold ckpt_path and the W&B id: given as --config,
    they must not resume the old run (here the function train.py calls on the parsed config)."""
    logger = Namespace(class_path="zoo.training.callbacks.ZooWandbLogger",
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
    # stopped: still not in another folder (issue 42: a run continues only in its own), in one line
    with pytest.raises(SystemExit) as stopped:
        TRAIN.main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stopped.value.code == 2 and len(err) == 1, err
    assert f"{elsewhere} is not its run's folder" in err[0]
    assert f"resume it there (--trainer.default_root_dir {trained_run['root']})" in err[0]
    assert not elsewhere.exists() and not (tmp_path / "wandb").exists()


def test_a_results_run_leaves_the_checkpoints_of_a_run_training_there(tmp_path, monkeypatch):
    from test_results_run import _load_script

    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "run", lambda cmd: pytest.fail(f"ran {cmd}"))
    root = tmp_path / "runs/results/fam_recipe/seed0"
    runs.claim(root)  # as train.py does: the run holds its folder
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"a live run's")
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
    logger = Namespace(class_path="zoo.training.callbacks.ZooWandbLogger",
                       init_args=Namespace(project="attention-zoo", id=None))
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


# ----------------------------------------------------------------------------- issue 42: one run per run folder
def _snapshot(folder) -> dict:
    """Everything under `folder`, hidden entries too: a file's bytes, a link's target, a folder."""
    return {str(p.relative_to(folder)): ("link", os.readlink(p)) if p.is_symlink() else p.read_bytes() if p.is_file()
            else "folder" for p in sorted(folder.rglob("*"))}


def _claimed_run(root, checkpoints: bool = True) -> str:
    """A run folder as a finished run leaves it: its claim, its config.yaml and (`checkpoints`) a
    best and a last checkpoint that carry its run id. Returns the run's id."""
    run_id = runs.claim(root, command=["train.py", "fit", "--config", "recipe.yaml"])
    runs.release()
    (root / "config.yaml").write_text("model: {}\n")
    if checkpoints:
        (root / "checkpoints").mkdir()
        checkpoint = {"state_dict": {}, "global_step": 3,
                      "hyper_parameters": {"_class_path": CLASSIFIER, "arch": "mlp", "lr": 0.001},
                      "datamodule_hyper_parameters": {"variant": "centered", "batch_size": 64},
                      "zoo_run": {"run_dir": str(root.resolve()), "run_id": run_id, "wandb_id": f"w{run_id[:7]}"}}
        torch.save(checkpoint, root / "checkpoints" / "best-epoch=000.ckpt")
        torch.save(checkpoint, root / "checkpoints" / runs.LAST)
    return run_id


def _claim(root, resume=None) -> str:
    try:
        return runs.claim(root, resume=resume)
    finally:
        runs.release()


def _refused(args, capsys) -> str:
    """train.py's one stderr line for `args`, which must end with exit code 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        TRAIN.main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stopped.value.code == 2 and len(err) == 1, err
    return err[0]


def test_a_new_run_claims_a_new_or_empty_folder_and_the_claim_names_it(tmp_path):
    new, empty = tmp_path / "a" / "new", tmp_path / "empty"
    empty.mkdir()
    ids = []
    for root in (new, empty):
        try:
            ids.append(runs.claim(root, command=["train.py", "fit", "--config", "my recipe.yaml"]))
        finally:
            runs.release()
        claimed = json.loads((root / runs.CLAIM).read_text())
        assert claimed["run_id"] == ids[-1] == runs.run_id(root)
        assert claimed["command"] == "train.py fit --config 'my recipe.yaml'"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", claimed["created"])
        assert sorted(p.name for p in root.iterdir()) == sorted([runs.CLAIM, runs.RUN_LOCK])
    # a run that stopped before it wrote anything (a claim and a lock, nothing else): a new run goes there
    assert _claim(empty) not in ids and runs.run_id(empty) not in ids
    # a W&B logger saving into the run folder writes nothing there before the claim (then it is the run's)
    from zoo.training.callbacks import ZooWandbLogger

    ZooWandbLogger(save_dir=str(tmp_path / "wb" / "wandb"))
    assert not (tmp_path / "wb").exists()
    _claim(tmp_path / "wb")


def test_case_a_a_checkpoint_is_not_resumed_into_another_runs_folder(tmp_path):
    """Issue 42 (a): run A's checkpoint with run B's folder as default_root_dir would have rewritten
    B's best and last checkpoints and its config.yaml."""
    a, b = tmp_path / "a", tmp_path / "b"
    a_id, b_id = _claimed_run(a), _claimed_run(b)
    before = _snapshot(b)
    theirs = a / "checkpoints" / runs.LAST
    expected = (rf"--ckpt_path {theirs} is a checkpoint of the run in {a.resolve()}, and {b} is the folder of another "
                rf"run \(run {b_id}, started [0-9T:Z-]+\): a run continues only in its own folder; resume it there "
                rf"\(--trainer.default_root_dir {a.resolve()}\), or start a new run from its weights with --init_from "
                rf"{theirs}")
    with pytest.raises(runs.UserError) as refused:  # train.py's check at parse time
        runs.check_resume(_resume_config(b, ckpt_path=str(theirs)), ["fit", "--ckpt_path", str(theirs)], fitting=True)
    assert re.fullmatch(expected, str(refused.value)), str(refused.value)
    with pytest.raises(runs.UserError) as refused:  # and the claim's, under the run lock
        runs.claim(b, resume=theirs)
    assert re.fullmatch(expected, str(refused.value))
    assert _snapshot(b) == before
    # its own folder takes it: B's checkpoint resumes in B, and A's in A moved elsewhere (its claim moves with it)
    config = _resume_config(b)
    runs.check_resume(config, GIVEN, fitting=True)
    assert _claim(b, resume=config.ckpt_path) == b_id and _snapshot(b) == before
    moved = tmp_path / "moved"
    a.rename(moved)
    config = _resume_config(moved)
    runs.check_resume(config, GIVEN, fitting=True)
    assert _claim(moved, resume=config.ckpt_path) == a_id == runs.run_id(moved)


def test_case_b_a_users_files_are_never_a_run_folder(tmp_path):
    """Issue 42 (b): `fit` overwrote a config.yaml the user keeps in the folder given as default_root_dir."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "config.yaml").write_text("mine: true\n")
    (root / "notes").mkdir()
    before = _snapshot(root)
    with pytest.raises(runs.UserError) as refused:
        runs.claim(root)
    assert str(refused.value) == (f"--trainer.default_root_dir {root} holds files the zoo did not write there "
                                  "(config.yaml, notes); a new run writes only into a new or empty directory: give "
                                  "it one")
    _claimed_run(tmp_path / "run")
    theirs = tmp_path / "run" / "checkpoints" / runs.LAST
    with pytest.raises(runs.UserError, match=r"project holds files that are not its run's \(config.yaml, notes\)"):
        runs.claim(root, resume=theirs)  # nor does a resumed run go there
    assert _snapshot(root) == before  # not even a lock file
    (root / "config.yaml").unlink()
    (root / "notes").rmdir()
    (root / runs.CLAIM).write_text('{"mine": "a file of that name, not a claim"}')
    with pytest.raises(runs.UserError, match=r"holds files the zoo did not write there \(.*not a zoo run's claim"):
        runs.claim(root)


def test_case_c_a_run_without_checkpoints_keeps_its_folder(tmp_path):
    """Issue 42 (c): a second run into a run folder without checkpoints replaced its config.yaml."""
    root = tmp_path / "run"
    run_id = _claimed_run(root, checkpoints=False)
    before = _snapshot(root)
    with pytest.raises(runs.UserError) as refused:
        runs.claim(root)
    assert re.fullmatch(rf"--trainer.default_root_dir {root} holds an earlier run's files \(run {run_id}, started "
                        r"[0-9T:Z-]+: config.yaml\) and no checkpoint to resume; give this run a new directory",
                        str(refused.value)), str(refused.value)
    assert _snapshot(root) == before


def test_a_folder_of_a_zoo_before_claims_resumes_and_is_claimed(tmp_path):
    legacy = tmp_path / "legacy"
    _saved_run(legacy)  # checkpoints that name their folder, no claim
    config = _resume_config(legacy)
    runs.check_resume(config, GIVEN, fitting=True)
    run_id = _claim(legacy, resume=config.ckpt_path)
    assert runs.run_id(legacy) == run_id
    runs.check_resume(_resume_config(legacy), GIVEN, fitting=True)  # its old checkpoints stay its own
    with pytest.raises(runs.UserError, match="already holds an earlier run's checkpoints"):
        runs.claim(tmp_path / "legacy")  # a new run does not go there
    # a checkpoint no run folder names (not the zoo's) starts its run in a new folder, not in another's
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {}, "global_step": 1}, bare)
    for root, refused in ((tmp_path / "new", None), (legacy, "is the folder of another run")):
        config = _resume_config(root, ckpt_path=str(bare))
        if refused is None:
            runs.check_resume(config, ["fit", "--ckpt_path", str(bare)], fitting=True)
        else:
            with pytest.raises(runs.UserError, match=refused):
                runs.check_resume(config, ["fit", "--ckpt_path", str(bare)], fitting=True)


def test_ddp_ranks_after_the_first_go_on_in_the_folder_it_claimed(tmp_path, monkeypatch):
    """DDP re-executes train.py per rank: rank 0 checks and claims, and by the time rank 1 checks,
    the folder holds rank 0's claim (with a new id: the checkpoint named no run) and config.yaml."""
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {}, "global_step": 1}, bare)
    root, given = tmp_path / "run", ["fit", "--ckpt_path", str(bare)]
    config = _resume_config(root, ckpt_path=str(bare))
    runs.check_resume(config, given, fitting=True)
    _claim(root, resume=config.ckpt_path)
    (root / "config.yaml").write_text("model: {}\n")  # rank 0's SaveConfigToRunDir
    with pytest.raises(runs.UserError, match="is the folder of another run"):  # to a launching process
        runs.check_resume(_resume_config(root, ckpt_path=str(bare)), given, fitting=True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    config = _resume_config(root, ckpt_path=str(bare))
    runs.check_resume(config, given, fitting=True)  # rank 1's run is rank 0's
    assert config.ckpt_path == str(bare)


@pytest.mark.slow
def test_case_a_train_py_keeps_another_runs_folder_byte_identical(tmp_path, tiny_data, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    TRAIN.main(_fit(a, "--trainer.max_epochs=1"))
    TRAIN.main(_fit(b, "--trainer.max_epochs=1"))
    before, wandb_runs = _snapshot(b), sorted((tmp_path / "wandb").iterdir())
    assert {"config.yaml", runs.CLAIM, "checkpoints/last.ckpt", "checkpoints/best-epoch=000.ckpt"} <= set(before)
    theirs = a / "checkpoints" / runs.LAST
    line = _refused(_fit(b, "--trainer.max_epochs=2", "--ckpt_path", str(theirs)), capsys)
    assert line.startswith(f"train.py: error: --ckpt_path {theirs} is a checkpoint of the run in {a.resolve()}, "
                           f"and {b} is the folder of another run (run {runs.run_id(b)}, started ")
    assert _snapshot(b) == before and sorted((tmp_path / "wandb").iterdir()) == wandb_runs


def test_case_b_train_py_leaves_a_users_folder_as_it_was(tmp_path, tiny_data, capsys):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "config.yaml").write_text("# my own notes, not a run's\n")
    before = _snapshot(root)
    line = _refused(_fit(root, "--trainer.max_epochs=1"), capsys)
    assert line == (f"train.py: error: --trainer.default_root_dir {root} holds files the zoo did not write there "
                    "(config.yaml); a new run writes only into a new or empty directory: give it one")
    assert _snapshot(root) == before and not (tmp_path / "wandb").exists()


@pytest.mark.slow
def test_case_c_train_py_keeps_a_checkpointless_runs_folder_and_its_wandb_files(tmp_path, tiny_data, capsys):
    root = tmp_path / "run"  # its W&B files inside it: the run's own, not a reason to refuse the run
    TRAIN.main(_fit(root, "--trainer.max_epochs=1", "--trainer.enable_checkpointing=false",
                    f"--trainer.logger.init_args.save_dir={root}"))
    before = _snapshot(root)
    assert {"config.yaml", runs.CLAIM, "wandb"} <= set(before) and "checkpoints" not in before
    line = _refused(_fit(root, "--trainer.max_epochs=1"), capsys)
    assert re.fullmatch(rf"train.py: error: --trainer.default_root_dir {root} holds an earlier run's files \(run "
                        rf"{runs.run_id(root)}, started [0-9T:Z-]+: config.yaml, wandb\) and no checkpoint to resume; "
                        "give this run a new directory", line), line
    # W&B's service may still be writing the first run's log (its own file): the refused run started
    # no W&B run, and every other file is byte-identical
    assert sorted((root / "wandb").glob("offline-run-*")) == [root / name for name in before
                                                              if re.fullmatch(r"wandb/offline-run-[^/]+", name)]
    assert {k: v for k, v in _snapshot(root).items() if not k.startswith("wandb/")} == \
        {k: v for k, v in before.items() if not k.startswith("wandb/")}
    assert not (tmp_path / "wandb").exists()
