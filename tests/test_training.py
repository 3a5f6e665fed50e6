"""train.py end to end, as a subprocess on the tiny Fashion-MNIST: fast_dev_run, --print_config,
checkpoints (best + last), resume from last, W&B offline logs, a real 2-process CPU DDP run,
and a config mistake reported as one line with exit code 2."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import yaml

from conftest import REPO, TINY_VAL, cli_env, run_cli, run_main, tiny_fit_args
from helpers import read_wandb_records

pytestmark = pytest.mark.slow


def _ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _fail(rc, out, err):
    return f"rc {rc}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-6000:]}"


def test_fast_dev_run(tmp_path, tiny_data_dir):
    root = tmp_path / "runs" / "fdr"
    rc, out, err = run_cli(tiny_fit_args("configs/baseline/cnn_centered.yaml", root, "--trainer.fast_dev_run=2"),
                           cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, _fail(rc, out, err)
    assert "fast_dev_run" in out + err
    assert "Traceback" not in err


def test_print_config_shows_base_merged_with_recipe(tmp_path, tiny_data_dir):
    rc, out, err = run_cli(["train.py", "fit", "--config", REPO / "configs/baseline/cnn_centered.yaml",
                            "--trainer.max_epochs=3", "--print_config"], cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, _fail(rc, out, err)
    config = yaml.safe_load(out)
    base = yaml.safe_load((REPO / "configs/base/trainer.yaml").read_text())
    recipe = yaml.safe_load((REPO / "configs/baseline/cnn_centered.yaml").read_text())
    trainer = config["trainer"]
    # from the base file
    assert trainer["logger"]["class_path"] == base["trainer"]["logger"]["class_path"]
    callbacks = [c["class_path"] for c in trainer["callbacks"]]
    assert callbacks == [c["class_path"] for c in base["trainer"]["callbacks"]]
    assert any(c.endswith("RichProgressBar") for c in callbacks)
    assert config["checkpoint"]["save_top_k"] == base["checkpoint"]["save_top_k"]
    # from the recipe, overriding the base
    assert config["model"]["class_path"] == recipe["model"]["class_path"]
    assert config["model"]["init_args"]["arch"] == recipe["model"]["init_args"]["arch"]
    assert config["data"]["init_args"]["variant"] == "centered"
    assert config["checkpoint"]["monitor"] == recipe["checkpoint"]["monitor"]
    assert trainer["default_root_dir"] == recipe["trainer"]["default_root_dir"]
    # from the command line, overriding both
    assert trainer["max_epochs"] == 3
    assert not (tmp_path / "wandb").exists()  # printing the config trains nothing


def test_checkpoints_best_and_last(trained_run):
    checkpoints = trained_run["checkpoints"]
    best = sorted(checkpoints.glob("best-*.ckpt"))
    assert len(best) == 1 and trained_run["last"].is_file()
    for path in (best[0], trained_run["last"]):
        ckpt = _ckpt(path)  # plain hyperparameters: loads with weights_only=True
        assert ckpt["global_step"] == trained_run["steps"]
        assert ckpt["zoo"]["class_path"] == "zoo.models.baselines.Classifier"
        assert ckpt["zoo"]["data"]["init_args"]["variant"] == "centered"
        assert ckpt["zoo"]["data"]["init_args"]["val_size"] == TINY_VAL
        monitors = [v for k, v in ckpt["callbacks"].items() if k.startswith("ZooCheckpoint{")]
        assert monitors and monitors[0]["monitor"] == "val/acc"
        # last.ckpt is written after the epoch's validation, so it knows the best score too
        assert monitors[0]["best_model_score"] is not None
    # saved at the same step, best and last are one file stored once
    assert os.path.samefile(best[0], trained_run["last"])
    # the resolved config (base + recipe + command line) is saved beside the checkpoints
    saved = yaml.safe_load((trained_run["root"] / "config.yaml").read_text())
    assert saved["data"]["init_args"]["val_size"] == TINY_VAL
    assert saved["trainer"]["max_epochs"] == 1 and saved["model"]["init_args"]["arch"] == "paper_cnn"


def test_resume_from_last_continues_at_saved_step(tmp_path, trained_run, tiny_data_dir):
    root = tmp_path / "runs" / "cnn"
    shutil.copytree(trained_run["root"], root)
    before = _ckpt(root / "checkpoints" / "last.ckpt")
    assert before["global_step"] == 4 and before["epoch"] == 0
    best_before = {p.name: p.read_bytes() for p in root.glob("checkpoints/best-*.ckpt")}
    # 3 batches in the second epoch: resumed -> 4 + 3 = 7 steps; a fresh start would give 6
    rc, out, err = run_cli(tiny_fit_args("configs/baseline/cnn_centered.yaml", root, "--trainer.max_epochs=2",
                                         "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
                                         "--ckpt_path=last"),
                           cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, _fail(rc, out, err)
    assert "Restoring states from the checkpoint" in out + err
    after = _ckpt(root / "checkpoints" / "last.ckpt")
    assert after["global_step"] == 7
    assert after["epoch"] == 1
    # the optimizer state was restored too: Adam's step count continues
    steps = [s["step"] for s in after["optimizer_states"][0]["state"].values()]
    assert all(float(s) == 7 for s in steps)
    # the best is last.ckpt's file exactly when it was saved at the last step; an earlier best keeps its bytes
    # (the copy's folder is not the one its best was saved in: Lightning leaves that best where it is)
    for best in root.glob("checkpoints/best-*.ckpt"):
        shared = os.path.samefile(best, root / "checkpoints" / "last.ckpt")
        assert shared == (_ckpt(best)["global_step"] == 7)
        assert shared or best_before[best.name] == best.read_bytes()


def test_a_shared_file_keeps_its_bytes_when_the_other_name_is_rewritten(tmp_path):
    """zoo.guards.writes.share_file: best and last stored once, until last's next atomic save."""
    from zoo.guards.writes import atomic_write_bytes, share_file

    last, best = tmp_path / "last.ckpt", tmp_path / "best-epoch=000.ckpt"
    last.write_bytes(b"epoch 0"), best.write_bytes(b"epoch 0, saved at validation")
    assert share_file(last, best) and os.path.samefile(last, best) and best.read_bytes() == b"epoch 0"
    atomic_write_bytes(last, b"epoch 1")
    assert best.read_bytes() == b"epoch 0" and last.read_bytes() == b"epoch 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch=000.ckpt", "last.ckpt"]  # no temporaries


def test_wandb_offline_run_has_config_and_metrics(trained_run):
    runs = sorted((trained_run["work"] / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "one offline run directory under ./wandb"
    files = list(runs[0].glob("run-*.wandb"))
    assert len(files) == 1
    records = read_wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds and "exit" in kinds  # a complete run: `wandb sync` can upload it
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "attention-zoo"
    config_keys = {item.key for r in records if r.WhichOneof("record_type") == "config" for item in r.config.update}
    assert {"arch", "lr", "data.variant", "data.batch_size"} <= config_keys  # model + data hyperparameters
    history: dict[str, list[float]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                history.setdefault(key, []).append(yaml.safe_load(item.value_json))
    for metric in ("train/loss", "train/acc", "val/loss", "val/acc"):
        assert metric in history, f"{metric} not logged; got {sorted(history)}"
        assert all(isinstance(v, float) for v in history[metric])
    assert 0.0 <= history["val/acc"][-1] <= 1.0
    assert len(history["train/loss"]) == trained_run["steps"]  # log_every_n_steps=1


def test_ddp_two_cpu_processes_end_with_identical_weights(tmp_path, tiny_data_dir):
    recipe = yaml.safe_load((REPO / "configs/baseline/mlp_centered.yaml").read_text())
    recipe["model"]["class_path"] = "helpers.DumpingClassifier"
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(recipe))
    root, dump = tmp_path / "runs" / "ddp", tmp_path / "dump"
    args = tiny_fit_args("configs/baseline/mlp_centered.yaml", root, "--trainer.max_epochs=1",
                         "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
                         "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu")
    args[args.index("--config") + 1] = str(config)
    rc, out, err = run_cli(args, cwd=tmp_path, env=cli_env(tiny_data_dir, ZOO_TEST_DUMP_DIR=str(dump)))
    assert rc == 0, _fail(rc, out, err)
    dumps = {name: torch.load(dump / f"{name}.pt", weights_only=True)
             for name in ("rank0_start", "rank1_start", "rank0_end", "rank1_end")}
    assert dumps["rank0_end"]["world_size"] == 2 and dumps["rank1_end"]["world_size"] == 2
    assert dumps["rank0_end"]["global_step"] == dumps["rank1_end"]["global_step"] == 3
    end0, end1 = dumps["rank0_end"]["state"], dumps["rank1_end"]["state"]
    assert end0.keys() == end1.keys()
    for key in end0:
        assert torch.equal(end0[key], end1[key]), f"ranks differ in {key}"
    # training moved the weights (identical end states are not just identical initialisations)
    start = dumps["rank0_start"]["state"]
    assert any(not torch.equal(start[k], end0[k]) for k in start)
    # each rank trained on its own shard: 3 batches of 32, different examples
    seen0, seen1 = dumps["rank0_end"]["seen"], dumps["rank1_end"]["seen"]
    assert len(seen0) == len(seen1) == 3 * 32
    assert not torch.equal(seen0, seen1)
    # and the checkpoint holds those same weights
    saved = _ckpt(root / "checkpoints" / "last.ckpt")["state_dict"]
    for key in end0:
        assert torch.equal(saved[key], end0[key])
    # rank 0 alone logged the model's attention figure to the W&B offline run
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history_keys = {item.key or "/".join(item.nested_key) for r in read_wandb_records(next(runs[0].glob("*.wandb")))
                    if r.WhichOneof("record_type") == "history" for item in r.history.item}
    # one key per figure (wandb flattens an image list's fields)
    assert "val/attention/0/filenames" in history_keys  # a stable key per figure index
    assert len(list((runs[0] / "files" / "media" / "images").rglob("*.png"))) == 1


def test_attention_figures_saved_as_png_without_wandb(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from helpers import DumpingClassifier
    from zoo.training.callbacks import AttentionImageLogger

    model = DumpingClassifier(arch="mlp", hidden=[8], image_size=28)
    data = TensorDataset(torch.rand(8, 1, 28, 28), torch.arange(8) % 10)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=[AttentionImageLogger()])
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    pngs = sorted((tmp_path / "figures").rglob("*.png"))
    assert len(pngs) == 1
    from PIL import Image

    assert Image.open(pngs[0]).size == (56, 56)


def test_config_mistake_is_one_line_and_exit_2(tmp_path, tiny_data_dir):
    recipe = yaml.safe_load((REPO / "configs/baseline/cnn_centered.yaml").read_text())
    recipe["data"].setdefault("init_args", {})["variant"] = "rotated"
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(recipe))
    rc, out, err = run_cli(["train.py", "fit", "--config", config, f"--trainer.default_root_dir={tmp_path / 'r'}"],
                           cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 2, _fail(rc, out, err)
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("train.py: error:")
    assert "rotated" in errors[0] and "variant" in errors[0]



def test_last_checkpoint_follows_every_epoch_even_without_a_new_best(tmp_path):
    """Lightning's save_last rewrites last.ckpt only with a new top-k save; ZooCheckpoint writes it
    after every epoch, so a resume after a non-improving epoch starts where the run stopped."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from zoo.training.callbacks import ZooCheckpoint

    class Worsening(L.LightningModule):  # val/score falls every epoch: only epoch 0 is ever best
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, _):
            return (self.w - batch[0]).pow(2).mean()

        def validation_step(self, batch, _):
            self.log("val/score", -float(self.current_epoch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)
    checkpoint = ZooCheckpoint(dirpath=tmp_path, filename="best-{epoch:03d}", monitor="val/score", mode="max")
    trainer = L.Trainer(max_epochs=3, callbacks=[checkpoint], logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Worsening(), data, data)
    assert [p.name for p in sorted(tmp_path.glob("best-*.ckpt"))] == ["best-epoch=000.ckpt"]
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert last["epoch"] == 2  # the third epoch, finished: not the best one


def test_a_plain_cpu_fit_prints_its_model_summary_without_a_flops_count_or_warnings(tmp_path, tiny_data_dir):
    """Lightning counts FLOPs only through an `example_input_array` (no family sets one) and printed
    "Total FLOPs: 0" and a column of zeros (zoo.training.callbacks.ZooModelSummary drops them); nor
    does a loader pin memory on a CPU trainer (torch's pin_memory warning)."""
    rc, out, err = run_main(tiny_fit_args("configs/baseline/mlp_centered.yaml", tmp_path / "run", "--trainer.max_epochs=1",
                                          "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
                                          "--trainer.accelerator=cpu", "--trainer.enable_model_summary=true"),
                            cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, err[-3000:]
    assert "Total params" in out and "Modules in eval mode" in out  # the summary is there
    assert "flops" not in (out + err).lower() and "pin_memory" not in err
    assert "already configured with model summary" not in out + err  # Lightning adds none beside it
    rc, out, err = run_main(tiny_fit_args("configs/baseline/mlp_centered.yaml", tmp_path / "off", "--trainer.max_epochs=1",
                                          "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
                                          "--trainer.accelerator=cpu"), cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0 and "Total params" not in out  # --trainer.enable_model_summary=false: none
