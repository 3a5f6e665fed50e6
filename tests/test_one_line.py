"""One line, everywhere: each environment and config mistake below gave a traceback (or silently
did something else) before, in some command; now it is one line on stderr and exit code 2, and a
refusal comes before a run folder, config.yaml or a W&B run exists (issue: Reliability III)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import zoo
import zoo.train as TRAIN
from conftest import REPO, TINY_VAL
from zoo import cli, hub
from zoo.errors import UserError


pytestmark = pytest.mark.usefixtures("offline_in_tmp")


def _one_line(err: str, prog: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip() and not line.startswith("UserWarning")]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), err[-2000:]
    return lines[0]


def _image(tmp_path, size: int = 64) -> str:
    Image.new("RGB", (size, size)).save(tmp_path / "scene.png")
    return str(tmp_path / "scene.png")


@pytest.mark.parametrize("name, value, expected", [
    ("ZOO_DOWNLOAD_TIMEOUT", "soon", "ZOO_DOWNLOAD_TIMEOUT='soon' is not a number"),
    ("ZOO_DOWNLOAD_TIMEOUT", "nan", "ZOO_DOWNLOAD_TIMEOUT='nan': give a finite number > 0"),
    ("ZOO_DOWNLOAD_TIMEOUT", "-1", "ZOO_DOWNLOAD_TIMEOUT='-1': give a finite number > 0"),
    ("ZOO_DOWNLOAD_TIMEOUT", "0", "ZOO_DOWNLOAD_TIMEOUT='0': give a finite number > 0"),
    ("ZOO_MAX_DOWNLOAD_MB", "inf", "ZOO_MAX_DOWNLOAD_MB='inf': give a finite number > 0"),
    ("ZOO_MAX_DOWNLOAD_MB", "nan", "ZOO_MAX_DOWNLOAD_MB='nan': give a finite number > 0"),
    ("ZOO_MAX_DOWNLOAD_MB", "-5", "ZOO_MAX_DOWNLOAD_MB='-5': give a finite number > 0"),
])
def test_numeric_environment_variables_are_checked_up_front(tmp_path, monkeypatch, capsys, name, value, expected):
    monkeypatch.setenv(name, value)
    assert cli.main(["caption", _image(tmp_path), "--checkpoint", "http://127.0.0.1:9/w.safetensors"]) == 2
    assert _one_line(capsys.readouterr().err, "zoo caption") == f"zoo caption: error: {expected}"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("cache", ["a file", "/sys/zoo-cache"])
def test_an_unusable_download_cache_is_one_line(tmp_path, monkeypatch, capsys, cache):
    if cache == "a file":
        (tmp_path / "a_file").write_text("not a folder")
        cache = str(tmp_path / "a_file")
    monkeypatch.setenv("ZOO_CACHE_DIR", cache)
    assert cli.main(["caption", _image(tmp_path), "--checkpoint", "http://127.0.0.1:9/w.safetensors"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # nothing before it (no "not pinned" warning: nothing was served)
    line = _one_line(err, "zoo caption")
    assert f"the download cache {cache}: cannot write there" in line and "ZOO_CACHE_DIR" in line


def test_an_unusable_data_cache_is_one_line(tmp_path):
    from zoo.data.scenes import FashionScenesDataModule

    (tmp_path / "a_file").write_text("not a folder")
    items = (torch.rand(20, 28, 28) * 255).to(torch.uint8).numpy()
    dm = FashionScenesDataModule(num_train=4, num_val=2, num_test=2, cache_dir=str(tmp_path / "a_file"),
                                 item_loader=lambda split: (items, torch.arange(20).numpy() % 10))
    with pytest.raises(UserError, match=r"the scenes cache .*a_file: cannot write there \(.*\); set ZOO_DATA_DIR"):
        dm.build_split("train")


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.ENOTDIR])
def test_a_full_or_read_only_output_folder_is_one_line_in_every_command(tmp_path, monkeypatch, capsys, number):
    """The machine's OSErrors while writing (a full disk, a read-only or vanished folder), from any
    command (here `zoo attend` writing its figure; eval.py shares the same reporting)."""
    import zoo.io

    def full(*args, **kwargs):
        raise OSError(number, "simulated", str(tmp_path / "out" / "scene_attend.png"))

    monkeypatch.setattr(zoo.io, "atomic_save_image", full)
    assert cli.main(["attend", _image(tmp_path, 28), "--model", "vit_fmnist", "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys.readouterr().err, "zoo attend")
    assert f"cannot use {tmp_path / 'out' / 'scene_attend.png'}: simulated" in line


def test_eval_reports_the_machines_oserrors_in_one_line(tmp_path, monkeypatch, capsys):
    import zoo.evaluate as EVAL

    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "data" / "scenes"))

    monkeypatch.setattr(zoo, "create_model", broken)
    assert EVAL.main(["--model", "vit_fmnist"]) == 2
    assert "No space left on device" in _one_line(capsys.readouterr().err, "eval.py")


def test_a_wandb_mode_typo_is_one_line_before_the_run(tmp_path, monkeypatch, capsys, tiny_data):
    monkeypatch.setenv("WANDB_MODE", "ofline")
    with pytest.raises(SystemExit) as exit_info:
        TRAIN.main(["fit", "--config", str(REPO / "configs/baseline/mlp_centered.yaml"),
                    f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert exit_info.value.code == 2
    assert "WANDB_MODE='ofline' is not one of online, offline" in _one_line(capsys.readouterr().err, "train.py")
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("text, expected", [
    ("{", "not valid JSON"),
    ("[1, 2]", "expected an object, got list"),
    ("[" * 100_000 + "]" * 100_000, "refused, nested too deep"),
])
def test_a_malformed_weights_manifest_is_one_line(tmp_path, monkeypatch, capsys, text, expected):
    (tmp_path / "MANIFEST.json").write_text(text)
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path))
    assert cli.main(["list"]) == 2
    assert expected in _one_line(capsys.readouterr().err, "zoo list")


def test_a_bad_manifest_record_is_skipped_with_a_warning(tmp_path, monkeypatch):
    records = json.loads((REPO / "weights/MANIFEST.json").read_text())
    records = {"vit_fmnist": records["vit_fmnist"], "broken": 5, "outside": {**records["vit_fmnist"], "file": "../x"},
               "long": {**records["vit_fmnist"], "file": "x" * 256}}  # a fuzz finding: it raised ENAMETOOLONG
    (tmp_path / "MANIFEST.json").write_text(json.dumps(records))
    shutil.copy(REPO / "weights/vit_fmnist.safetensors", tmp_path)
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path))
    with pytest.warns(UserWarning) as caught:
        assert zoo.list_models(pretrained=True) == ["vit_fmnist"]
    messages = " ".join(str(w.message) for w in caught)
    assert "release 'broken' skipped, a int, not a record" in messages
    assert "release 'outside' skipped, its file is not a plain file name" in messages
    assert "release 'long' skipped, its file name is longer than 255 bytes" in messages


def test_one_unparsable_recipe_is_skipped_with_one_warning(tmp_path, monkeypatch, capsys):
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    (configs / "ram" / "broken.yaml").write_text("model: [\n  class_path: x\n")
    monkeypatch.setenv("ZOO_CONFIG_DIR", str(configs))
    assert cli.main(["list", "ram_*"]) == 0
    out, err = capsys.readouterr()
    assert "ram_fmnist_centered" in out and "ram_broken" not in out
    assert [line for line in err.splitlines() if line.strip()] == [
        f"UserWarning: {configs / 'ram' / 'broken.yaml'}: skipped, not valid YAML at line 3"]
    assert zoo.create_model("ram_fmnist_centered").hparams.num_glimpses > 0  # the others keep working


def test_a_5000_digit_integer_in_a_weights_config_is_one_line(tmp_path):
    state = load_file(str(REPO / "weights/vit_fmnist.safetensors"))
    save_file(state, str(tmp_path / "w.safetensors"),
              metadata={"zoo_config": '{"class_path": "zoo.models.vit.ViTClassifier", "init_args": {"depth": 1'
                                      + "0" * 5000 + "}}"})
    with pytest.raises(UserError, match="its zoo config: not valid JSON .*integer string conversion"):
        zoo.load_checkpoint(tmp_path / "w.safetensors")


def test_deep_boxes_are_one_line(tmp_path):
    from zoo.commands.boxes import read_boxes

    (tmp_path / "boxes.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="boxes.json: refused, nested too deep"):
        read_boxes(str(tmp_path / "boxes.json"), ["a.png"], [(28, 28)])


def _fit(tmp_path, *extra, config="configs/baseline/mlp_centered.yaml"):
    return ["fit", "--config", str(REPO / config), f"--trainer.default_root_dir={tmp_path / 'run'}",
            f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32",
            "--trainer.enable_model_summary=false", *extra]


def _train(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        TRAIN.main(args)
    assert exit_info.value.code == 2
    return _one_line(capsys.readouterr().err, "train.py")


def test_a_vocabulary_of_non_strings_for_init_vocab_is_one_line(tmp_path, capsys, tiny_data):
    config = json.loads((REPO / "weights/MANIFEST.json").read_text())["sat_soft_scenes"]["config"]
    config["init_args"]["vocab"] = [1, 2, None, {"x": 1}, 5.5]
    save_file(load_file(str(REPO / "weights/sat_soft_scenes.safetensors")), str(tmp_path / "w.safetensors"),
              metadata={"zoo_config": json.dumps(config)})
    line = _train(["fit", "--config", str(REPO / "configs/sat/soft_scenes.yaml"), "--init_from",
                   str(tmp_path / "w.safetensors"), "--init_vocab", "release",
                   f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    assert "vocabulary is not a list of distinct words" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


def test_another_familys_stripped_checkpoint_is_refused_before_the_run(tmp_path, capsys, tiny_data):
    """A .ckpt without its zoo config or hyperparameters (only weights and counters) says nothing of
    what it is: its weights are checked against the model before config.yaml or W&B are written."""
    torch.save({"state_dict": load_file(str(REPO / "weights/vit_fmnist.safetensors")), "global_step": 3, "epoch": 0},
               tmp_path / "stripped.ckpt")
    line = _train(_fit(tmp_path, "--ckpt_path", str(tmp_path / "stripped.ckpt")), capsys)
    assert "stripped.ckpt: weights do not fit the model" in line
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "wandb").exists()


def test_a_value_a_class_refuses_is_one_line_from_a_file_and_from_the_command_line(tmp_path, capsys, tiny_data):
    """dropout 1,000,000 (nn.Dropout's ValueError) in a weights config, or on train.py's command line."""
    from zoo.models.baselines import Classifier

    model = Classifier(arch="mlp", hidden=[8])
    config = model.zoo_config()
    config["init_args"]["dropout"] = 1e6
    torch.save({"state_dict": model.state_dict(), "zoo": config}, tmp_path / "w.ckpt")
    with pytest.raises(UserError, match=r"Classifier: bad arguments \(dropout probability has to be between 0 and 1"):
        zoo.load_checkpoint(tmp_path / "w.ckpt")
    line = _train(_fit(tmp_path, "--model.init_args.dropout", "1000000"), capsys)
    assert "Classifier: bad arguments (dropout probability" in line and not (tmp_path / "run").exists()


def test_a_5000_digit_integer_in_a_checkpoint_is_one_line(tmp_path):
    """A pickle can hold an integer Python refuses to print (4,300+ digits): the safe unpickler
    refuses it, and an error quoting one (from Python) names its size instead."""
    from zoo.limits import check_dimensions
    from zoo.models.baselines import Classifier

    model = Classifier(arch="mlp", hidden=[8])
    config = model.zoo_config()
    config["init_args"]["hidden"] = [7 * 10**4999]
    torch.save({"state_dict": model.state_dict(), "zoo": config}, tmp_path / "w.ckpt")
    with pytest.raises(UserError, match=r"w.ckpt: refused, the checkpoint holds objects"):
        zoo.load_checkpoint(tmp_path / "w.ckpt")
    with pytest.raises(UserError, match=r"x.embed_dim: <an integer of 16,610 bits> is outside the sane range"):
        check_dimensions({"embed_dim": 7 * 10**4999}, "x")


@pytest.mark.slow
def test_eval_with_an_unusable_data_folder_is_one_line(tmp_path):
    """eval.py reads or builds its data before the trainer starts, so a data folder that is a file
    is one line on stderr (not Lightning's device lines first) and exit 2."""
    (tmp_path / "a_file").write_text("not a folder")
    env = {**os.environ, "ZOO_DATA_DIR": str(tmp_path / "a_file"), "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "eval.py", "--model", "sat_soft_scenes", "--data", "num_test=8"], env=env,
                            capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "a_file" in result.stderr, result.stderr
