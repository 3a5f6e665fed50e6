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
import zoo.training.train as TRAIN
from conftest import REPO, TINY_VAL
from zoo.commands import cli
from zoo.guards.errors import UserError
from zoo.weights import hub


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
    import zoo.guards.writes

    def full(*args, **kwargs):
        raise OSError(number, "simulated", str(tmp_path / "out" / "scene_attend.png"))

    monkeypatch.setattr(zoo.guards.writes, "atomic_save_image", full)
    assert cli.main(["attend", _image(tmp_path, 28), "--model", "vit_fmnist", "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys.readouterr().err, "zoo attend")
    assert f"cannot use {tmp_path / 'out' / 'scene_attend.png'}: simulated" in line


def test_eval_reports_the_machines_oserrors_in_one_line(tmp_path, monkeypatch, capsys):
    import zoo.commands.evaluate as EVAL

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
    from zoo.guards.budget import check_dimensions
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


# ----------------------------------------------------------------------------- W&B and the hub, checked up front
@pytest.mark.parametrize("name, value, expected", [
    ("WANDB_RUN_ID", "a/b", "WANDB_RUN_ID='a/b': W&B refuses it (Run ID cannot contain the characters"),
    ("WANDB_PROJECT", "a/b:c", "WANDB_PROJECT='a/b:c': W&B refuses it (Invalid project name 'a/b:c'"),
    ("WANDB_RESUME", "sometimes", "WANDB_RESUME='sometimes': W&B refuses it (Input should be 'allow'"),
    ("WANDB_HTTP_TIMEOUT", "soon", "WANDB_HTTP_TIMEOUT='soon': W&B refuses it (Input should be a valid number"),
    ("HF_HUB_ETAG_TIMEOUT", "soon", "HF_HUB_ETAG_TIMEOUT='soon': give a whole number of seconds > 0"),
    ("HF_HUB_DOWNLOAD_TIMEOUT", "-5", "HF_HUB_DOWNLOAD_TIMEOUT='-5': give a whole number of seconds > 0"),
    ("HF_ENDPOINT", "hub.example", "HF_ENDPOINT='hub.example': give the hub's http(s) URL"),
    ("HF_HUB_OFFLINE", "maybe", "HF_HUB_OFFLINE='maybe' is not one of 1, 0, true, false, yes, no, on, off"),
])
def test_wandb_and_hub_variables_are_one_line_before_the_run_folder(tmp_path, monkeypatch, capsys, tiny_data,
                                                                   name, value, expected):
    """Before: `WANDB_RUN_ID=a/b` or `WANDB_PROJECT='a/b:c'` was a 57-line traceback once the run
    folder was claimed; a non-integer HF_HUB_ETAG_TIMEOUT a traceback wherever the hub was imported."""
    monkeypatch.setenv(name, value)
    line = _train(_fit(tmp_path), capsys)
    assert line.startswith(f"train.py: error: {expected}"), line
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()
    assert cli.main(["train", *_fit(tmp_path)]) == 2  # `zoo train`: checked before Lightning is imported
    assert _one_line(capsys.readouterr().err, "zoo train").startswith(f"zoo train: error: {expected}")
    if name.startswith("HF_"):  # the hub serves every command's downloads: checked in each
        assert cli.main(["attend", _image(tmp_path), "--model", "vit_fmnist", "--out", str(tmp_path / "out")]) == 2
        assert _one_line(capsys.readouterr().err, "zoo attend").startswith(f"zoo attend: error: {expected}")
        assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- SIGTERM and Ctrl-C, at any moment
#: run as `python -c SIGNAL_AT ARGS...`: the process sends itself a signal at a named point, the
#: `call`-th call of `module.function` (with `argument` as its first argument, when given), then runs
#: ARGS as `zoo ARGS` (or the clone's script ARGS[0]): a stop at a known moment, with no sleep or race
SIGNAL_AT = """
import importlib, json, os, signal, sys
spec = json.loads(os.environ["ZOO_TEST_SIGNAL_AT"])
owner = importlib.import_module(spec["module"])
real, calls = getattr(owner, spec["function"]), []
def patched(*args, **kwargs):
    if spec.get("argument") is None or (args and args[0] == spec["argument"]):
        calls.append(1)
        if len(calls) == spec.get("call", 1):
            os.kill(os.getpid(), getattr(signal, spec["signal"]))
    return real(*args, **kwargs)
setattr(owner, spec["function"], patched)
if sys.argv[1].endswith(".py"):
    import runpy
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    from zoo.commands.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def _stopped_at(tmp_path, point: dict, args: list[str], env: dict | None = None) -> tuple[int, str]:
    from conftest import cli_env

    env = {**cli_env(None, ZOO_CACHE_DIR=str(tmp_path / "cache")), **(env or {}),
           "ZOO_TEST_SIGNAL_AT": json.dumps(point)}
    # a test runner may start children with SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.run([sys.executable, "-c", SIGNAL_AT, *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc.returncode, proc.stderr


def _temporaries(folder: Path) -> list[Path]:
    """What a writer leaves while it writes (zoo.guards.writes.writing): `.<target>.<token>.tmp|part|old|lock`."""
    return sorted(p for p in folder.rglob(".*") if p.name.endswith((".tmp", ".part", ".old", ".lock"))) \
        if folder.exists() else []


import signal  # noqa: E402 (beside the signal tests that use it)

STOPS = {"SIGTERM": (143, "stopped by SIGTERM"), "SIGINT": (130, "stopped by Ctrl-C")}
#: what a long command says it is doing, on stderr before the stop's one line
PROGRESS = ("zoo samples: building the test data of ", "zoo export: exporting ")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("point, args, prog", [
    # start-up: while the command's module (torch, Lightning) is being imported
    ({"module": "importlib", "function": "import_module", "argument": "zoo.commands.attend"},
     ["attend", "{image}", "--model", "vit_fmnist", "--out", "{tmp}/out"], "zoo attend"),
    ({"module": "importlib", "function": "import_module", "argument": "zoo.training.train"},
     ["{repo}/train.py", "fit", "--config", "vit_fmnist", "--trainer.default_root_dir={tmp}/run"], "train.py"),
    # fit, before the trainer: while the run's memory is measured
    ({"module": "zoo.registry", "function": "check_run_memory"},
     ["train", "fit", "--config", "baseline_mlp_centered", "--trainer.default_root_dir={tmp}/run"], "zoo train"),
    # samples: between writing its third file and renaming it into place
    ({"module": "os", "function": "replace", "call": 3}, ["samples", "--out", "{tmp}/out"], "zoo samples"),
    # a card: copying the weights into its staging folder
    ({"module": "shutil", "function": "copyfile"}, ["card", "ram_fmnist_centered", "--out", "{tmp}/out"], "zoo card"),
])
def test_a_signal_at_any_moment_is_one_line_and_leaves_no_temporaries(tmp_path, sig, point, args, prog):
    """Before: Ctrl-C during start-up was a traceback, and a SIGTERM outside the few writers that
    caught it ended the process without a word. Now each is one line, exit 143 or 130, and no
    writer's temporary is left."""
    Image.new("L", (28, 28), 90).save(tmp_path / "shirt.png")
    args = [a.format(image=tmp_path / "shirt.png", tmp=tmp_path, repo=REPO) for a in args]
    code, err = _stopped_at(tmp_path, {**point, "signal": sig}, args)
    expected_code, words = STOPS[sig]
    # a training run says it itself, with what it saved
    lines = [line for line in err.strip().splitlines() if not line.startswith(PROGRESS)]
    assert code == expected_code and len(lines) == 1 and lines[0].startswith(f"{prog}: "), err[-3000:]
    assert lines[0] in (f"{prog}: {words}", f"{prog}: error: {words}: no checkpoint was saved")
    assert _temporaries(tmp_path) == []
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_export_stopped_by_ctrl_c_or_sigterm_is_one_line(tmp_path, sig):
    from conftest import cli_env

    env = cli_env(None, ZOO_TEST_KILL_EXPORT_AFTER="1", ZOO_TEST_KILL_EXPORT_SIGNAL=sig)
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.cli", "export", "--model", "sat_soft_scenes", "--out",
                           str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    code, words = STOPS[sig]
    lines = proc.stderr.strip().splitlines()
    assert lines[:-1] == ["zoo export: exporting encoder (1 of 3) to encoder.onnx"]  # the one it was exporting
    lines = lines[-1:]
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith(f"zoo export: {words}"), proc.stderr[-3000:]
    assert not (tmp_path / "out").exists() and _temporaries(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_download_is_one_line_and_leaves_no_part_file(tmp_path, sig):
    """A loopback server sends the first 64 KB of a 1 MB file and holds the rest until the test
    has stopped the download (it signals after the server has sent them: no race, no sleep).
    Before: SIGTERM there ended `zoo` with exit 143 and not a word."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from conftest import cli_env

    sent, release = threading.Event(), threading.Event()

    class Stalling(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(2**20))
            self.end_headers()
            self.wfile.write(bytes(2**16))
            self.wfile.flush()
            sent.set()
            release.wait(300)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Image.new("L", (28, 28), 90).save(tmp_path / "shirt.png")
    url = f"http://127.0.0.1:{server.server_address[1]}/w-{'0' * 16}.safetensors"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "zoo.commands.cli", "attend", str(tmp_path / "shirt.png"),
                                 "--checkpoint", url, "--out", str(tmp_path / "out")], cwd=tmp_path, text=True,
                                env=cli_env(None, ZOO_CACHE_DIR=str(tmp_path / "cache")), stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert sent.wait(300), "the download never started"
        # mid-download: the writer's lock is there (taken before the request was sent; the .part follows
        # the response's headers, so it may or may not be open yet)
        assert ".lock" in [p.suffix for p in _temporaries(tmp_path / "cache")]
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=300)
    finally:
        release.set()
        server.shutdown()
    code, words = STOPS[sig]
    assert proc.returncode == code and err.strip().splitlines() == [f"zoo attend: {words}"], err[-3000:]
    assert _temporaries(tmp_path / "cache") == [] and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the leftovers
@pytest.mark.parametrize("value", [0, -3, 2.5, True, "ten"])
def test_num_classes_is_a_positive_integer(tmp_path, capsys, value):
    """Before: num_classes=0 built a head of 0 outputs (and -3 a traceback deep in torch)."""
    with pytest.raises(UserError, match=r"num_classes=.*: give a positive integer \(the new head's classes\), or None"):
        zoo.create_model("vit_fmnist", pretrained=True, num_classes=value)
    with pytest.raises(UserError, match="give a positive integer"):
        zoo.load_checkpoint(str(REPO / "weights/vit_fmnist.safetensors"), num_classes=value)
    assert cli.main(["eval", "--model", "vit_fmnist", "--model-arg", f"num_classes={value}"]) == 2
    assert "give a positive integer" in _one_line(capsys.readouterr().err, "zoo eval")


def test_num_classes_none_keeps_the_releases_head():
    """Before: num_classes=None on vit_fmnist built the class default's 1000-class head."""
    release = zoo.create_model("vit_fmnist", pretrained=True)
    model = zoo.create_model("vit_fmnist", pretrained=True, num_classes=None)
    assert model.hparams.num_classes == 10 and model.class_names == release.class_names
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), release.state_dict().values()))
    assert zoo.create_model("vit_fmnist", num_classes=None).hparams.num_classes == 10  # the recipe's data's
    assert zoo.load_checkpoint(str(REPO / "weights/vit_fmnist.safetensors"), num_classes=None).hparams.num_classes == 10


def test_init_vocab_release_without_init_from_is_one_line(tmp_path, capsys, tiny_data):
    """Before: `--init_vocab release` without `--init_from` was silently ignored (the data's words)."""
    line = _train(["fit", "--config", str(REPO / "configs/sat/soft_scenes.yaml"), "--init_vocab", "release",
                   f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    assert line == ("train.py: error: --init_vocab release takes the vocabulary of the --init_from weights: give "
                    "--init_from NAME|PATH|URL too (or drop --init_vocab)")
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


# ----------------------------------------------------------------------------- small frictions (issue 45)
def test_caption_says_the_default_only_when_it_was_taken(tmp_path, monkeypatch, capsys):
    """Before: `--model sat_soft_scenes`, typed, was announced as "(the default)" too."""
    from zoo.commands import caption

    taken = []
    def stop(args, *_, **__):  # the model it would load, and no further work
        taken.append(args.model)
        raise UserError("stopped before loading")
    monkeypatch.setattr(caption, "resolve_model", stop)
    assert cli.main(["caption", _image(tmp_path)]) == 2
    assert f"model {caption.DEFAULT_MODEL} (the default;" in capsys.readouterr().err
    assert cli.main(["caption", _image(tmp_path), "--model", caption.DEFAULT_MODEL]) == 2
    assert "the default" not in capsys.readouterr().err
    assert taken == [caption.DEFAULT_MODEL] * 2


def _help(run, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        run()
    assert done.value.code in (0, None)
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks undone


def test_eval_help_is_whole_sentences_and_every_option_says_what_it_does(capsys):
    from zoo.commands import evaluate

    text = _help(lambda: cli.main(["eval", "--help"]), capsys)
    assert " ".join(evaluate.DESCRIPTION.split()) in text and evaluate.DESCRIPTION.endswith(".")
    assert "`zoo eval`." not in text  # the docstring's fragment it printed before
    for option in ("--split {val,test} the data's split", "--accelerator ACCELERATOR Lightning's accelerator"):
        assert option in text


def test_train_verbs_help_is_their_own_not_lightnings(capsys):
    """Before: every verb's --help said "Runs the full optimization routine." (fit's, through a shared
    parser_kwargs dict) and the list cut test's sentence at "never run on your"."""
    from zoo.training import verbs

    listing = _help(lambda: TRAIN.main(["--help"]), capsys)
    assert "Runs the full optimization routine" not in listing and "never run on your" not in listing
    assert all(line in listing for line in verbs.SHORT_HELP.values())
    for verb, text in verbs.HELP.items():
        shown = _help(lambda: TRAIN.main([verb, "--help"]), capsys)
        assert text.endswith(".") and shown.index(" ".join(text.split())) < shown.index("options:")
        assert "Runs the full optimization routine." not in shown  # (fit's own method options keep it as their title)
