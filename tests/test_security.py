"""Issue 15: no file the zoo loads can name code to run; every entry point reports a user mistake
as one line and exit code 2; downloads never poison the cache; runs never lose work silently.

Each "names code" case writes a config whose class_path is `os.system` with a command that would
create a marker file: the marker must never appear."""
from __future__ import annotations

import fcntl
import hashlib
import http.server
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

import zoo
from conftest import REPO, TINY_VAL, cli_env, wandb_runs
from zoo.commands import cli
from zoo.guards.errors import UserError
from zoo.models.baselines import Classifier
from zoo.training.callbacks import AtomicCheckpointIO
from zoo.weights import hub


import zoo.commands.evaluate as EVAL  # noqa: E402
import zoo.training.train as TRAIN  # noqa: E402


def _evil(marker: Path) -> dict:
    return {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}


class _Payload:
    """Unpickling this runs `touch marker` (the classic pickle payload)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


pytestmark = pytest.mark.usefixtures("offline_in_tmp")


def _one_error_line(err: str, prog: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith(f"{prog}: error:"), lines[0]
    return lines[0]


def _image(tmp_path) -> Path:
    path = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(path)
    return path


# ----------------------------------------------------------------------------- files naming code
def _evil_safetensors(tmp_path, marker) -> Path:
    from safetensors.torch import save_file

    path = tmp_path / "evil.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata={"zoo_config": json.dumps(_evil(marker))})
    return path


def _evil_ckpt(tmp_path, marker) -> Path:
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "zoo": _evil(marker)}, path)
    return path


@pytest.mark.parametrize("make", [_evil_safetensors, _evil_ckpt], ids=["safetensors", "ckpt"])
def test_model_config_naming_os_system_is_refused_everywhere(make, tmp_path, capsys):
    marker = tmp_path / "MARKER"
    path = make(tmp_path, marker)
    with pytest.raises(UserError, match="refused: the file names model class 'os.system'"):
        zoo.load_checkpoint(path)
    assert cli.main(["caption", str(_image(tmp_path)), "--checkpoint", str(path)]) == 2
    assert "os.system" in _one_error_line(capsys.readouterr().err, "zoo caption")
    assert EVAL.main(["--checkpoint", str(path)]) == 2
    assert "os.system" in _one_error_line(capsys.readouterr().err, "eval.py")
    assert not marker.exists()


def test_data_config_naming_os_system_is_refused(tmp_path, capsys):
    marker = tmp_path / "MARKER"
    model = Classifier(arch="mlp", hidden=[8])
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": model.state_dict(), "zoo": {**model.zoo_config(), "data": _evil(marker)}}, path)
    loaded = zoo.load_checkpoint(path)  # the weights are fine; the data config is only data
    with pytest.raises(UserError, match="refused: the file names data class 'os.system'"):
        zoo.build_datamodule(loaded)
    assert EVAL.main(["--checkpoint", str(path)]) == 2
    assert "os.system" in _one_error_line(capsys.readouterr().err, "eval.py")
    assert not marker.exists()


def test_a_model_class_is_not_a_data_class(tmp_path):
    """The allow-lists are per kind: a data config naming a model family is refused too."""
    model = Classifier(arch="mlp", hidden=[8])
    path = tmp_path / "model.ckpt"
    data = {"class_path": "zoo.models.baselines.Classifier", "init_args": {}}
    torch.save({"state_dict": model.state_dict(), "zoo": {**model.zoo_config(), "data": data}}, path)
    with pytest.raises(UserError, match="not one of the zoo's data classes"):
        zoo.build_datamodule(zoo.load_checkpoint(path))


def test_own_classes_can_be_allowed_from_code(tmp_path, monkeypatch):
    from helpers import OtherModel
    from zoo import registry

    other = OtherModel(width=3)
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": other.state_dict(), "zoo": other.zoo_config()}, path)
    with pytest.raises(UserError, match="helpers.OtherModel"):
        zoo.load_checkpoint(path)
    monkeypatch.setitem(registry.ALLOWED_CLASSES, "model", set(registry.ALLOWED_CLASSES["model"]))
    registry.allow_class(OtherModel)
    assert isinstance(zoo.load_checkpoint(path), OtherModel)


# ----------------------------------------------------------------------------- train.py
def _train(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        TRAIN.main(args)
    return exit_info.value.code, capsys.readouterr().err


def _fit(tmp_path, *extra: str, config: str = "configs/baseline/mlp_centered.yaml") -> list[str]:
    return ["fit", "--config", str(REPO / config), f"--trainer.default_root_dir={tmp_path / 'run'}",
            f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32",
            "--trainer.enable_model_summary=false", *extra]


def _files(tmp_path) -> dict[str, Path]:
    C = REPO / "configs/baseline/mlp_centered.yaml"
    files = {"empty": "", "list": "- a\n", "scalar": "3\n", "invalid": "model: [\n",
             "lots": C.read_text().replace("  class_path: zoo.data.fashion_mnist.FashionMNISTDataModule",
                                           "  class_path: zoo.data.fashion_mnist.FashionMNISTDataModule\n"
                                           "  init_args:\n    batch_size: lots"),
             "typo_class": C.read_text().replace("baselines.Classifier", "baselines.Clasifier")}
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


CONFIG_MISTAKES = {
    "typo'd key": (["--trainer.max_epoch", "1"], "unrecognized arguments: --trainer.max_epoch"),
    "missing config": (["--config", "{tmp}/nope.yaml"], "nope.yaml: no such file"),
    "wrong type": (["--config", "{lots}"], "data.batch_size (FashionMNISTDataModule): Expected a <class 'int'>. Got value: lots"),
    "unknown class": (["--config", "{typo_class}"], "did you mean zoo.models.baselines.Classifier"),
    "empty yaml": (["--config", "{empty}"], "the file is empty"),
    "list yaml": (["--config", "{list}"], "got a list"),
    "scalar yaml": (["--config", "{scalar}"], "got a int"),
    "invalid yaml": (["--config", "{invalid}"], "not valid YAML at line 2"),
    "negative batch": (["--data.init_args.batch_size", "-5"], "data.init_args.batch_size: -5 is outside the sane range"),
    "zero batch": (["--data.init_args.batch_size", "0"], "batch_size must be a positive integer, got 0"),
    "unwritable root": (["--trainer.default_root_dir", "/sys/zoo-run"], "cannot write in /sys"),
    "bad devices": (["--trainer.devices", "-3"], "devices"),
    "not an option": (["--model.init_args.bogus", "3"], "model (Classifier): Option 'bogus' is not accepted"),
}


@pytest.mark.parametrize("case", list(CONFIG_MISTAKES))
def test_train_config_mistakes_are_one_line_exit_2(case, tmp_path, tiny_data, capsys):
    extra, expected = CONFIG_MISTAKES[case]
    files = _files(tmp_path)
    extra = [a.format(tmp=tmp_path, **files) for a in extra]
    code, err = _train(_fit(tmp_path, *extra), capsys)
    assert code == 2
    assert expected in _one_error_line(err, "train.py")
    assert not (tmp_path / "wandb").exists()  # refused before any run started


def test_flags_that_contradict_the_base_config_work(tmp_path, tiny_data, capsys):
    """The base config has a progress bar, a W&B logger with an LR monitor and checkpointing; a
    user switching each off on the command line gets a run, not a MisconfigurationException."""
    TRAIN.main(_fit(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                    "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
                    "--trainer.logger=false", "--trainer.enable_checkpointing=false"))
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_pickle_payload_at_a_url_given_to_fit_never_runs(tmp_path, tiny_data, capsys, http_server):
    marker = tmp_path / "MARKER"
    torch.save({"state_dict": {}, "epoch": _Payload(marker)}, http_server["dir"] / "evil.ckpt")
    code, err = _train(_fit(tmp_path, "--ckpt_path", f"{http_server['url']}/evil.ckpt"), capsys)
    warning, error = err.strip().splitlines()  # an unpinned URL is fetched with a one-line warning
    assert warning.startswith("UserWarning:") and "not pinned" in warning
    assert code == 2 and "refused" in error and "posix.system" in _one_error_line(error, "train.py")
    assert not marker.exists()
    # and a local one: one line, not torch's 15
    code, err = _train(_fit(tmp_path, "--ckpt_path", str(http_server["dir"] / "evil.ckpt")), capsys)
    assert code == 2 and "refused" in _one_error_line(err, "train.py")
    assert not marker.exists()
    # the payload is live: a plain unpickle of it does write the marker
    import pickle

    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


def test_weights_only_cannot_be_switched_off(tmp_path, tiny_data, capsys):
    code, err = _train(_fit(tmp_path, "--weights_only", "false"), capsys)
    assert code == 2 and "run code" in _one_error_line(err, "train.py")


def test_released_weights_are_not_a_resume_point(tmp_path, tiny_data, capsys):
    code, err = _train(_fit(tmp_path, "--ckpt_path", str(REPO / "weights/vit_fmnist.safetensors")), capsys)
    assert code == 2 and "--init_from" in _one_error_line(err, "train.py")


def test_a_run_directory_in_use_is_refused(tmp_path, tiny_data, capsys):
    root = tmp_path / "run"
    root.mkdir()
    with open(root / ".run.lock", "w") as held:  # another process's run holds this lock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        code, err = _train(_fit(tmp_path), capsys)
    assert code == 2 and "in use by another training run (pid 4242)" in _one_error_line(err, "train.py")


def test_an_earlier_runs_checkpoints_are_not_overwritten(tmp_path, tiny_data, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run")
    code, err = _train(_fit(tmp_path), capsys)
    assert code == 2 and "--ckpt_path last" in _one_error_line(err, "train.py")
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").read_bytes() == b"an earlier run"


# ----------------------------------------------------------------------------- crash-safe checkpoints
def test_a_failed_checkpoint_write_leaves_the_old_one_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"epoch": 1}, path)
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)  # a partial write, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError):
        io.save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no temporary left


@pytest.mark.slow
def test_a_killed_writers_temporary_is_swept(tmp_path):
    """A save killed mid-write leaves its temporary and the lock it held; the next save of that
    checkpoint removes both (zoo.guards.writes.writing). A name that only looks temporary stays."""
    path = tmp_path / "last.ckpt"
    killed = ("import os, signal, sys, torch\nfrom zoo.training.callbacks import AtomicCheckpointIO\n"
              "torch.save = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)\n"
              "AtomicCheckpointIO().save_checkpoint({'epoch': 0}, sys.argv[1])")
    assert subprocess.run([sys.executable, "-c", killed, str(path)], env=cli_env(None)).returncode == -9
    left = sorted(p.name.rsplit(".", 1)[1] for p in tmp_path.iterdir())
    assert left == ["lock", "tmp"]
    lookalike = tmp_path / f".last.ckpt.{os.getpid() + 1}.abc123.tmp"  # not provably the zoo's: kept
    lookalike.write_bytes(b"someone's")
    AtomicCheckpointIO().save_checkpoint({"epoch": 1}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", lookalike.name])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
def test_sigterm_saves_where_the_run_is_and_resume_continues_the_wandb_run(tmp_path, tiny_data_dir):
    root = tmp_path / "run"
    args = [sys.executable, str(REPO / "train.py"), *_fit(tmp_path, "--trainer.max_epochs=500",
                                                        "--data.init_args.batch_size=8",
                                                        "--trainer.limit_val_batches=1",
                                                        "--trainer.enable_progress_bar=false")]
    env = cli_env(tiny_data_dir)
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (root / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:  # an epoch has run
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"train.py: error: stopped by SIGTERM: saved {root}/checkpoints/last.ckpt; "
                                            "resume with --ckpt_path last")
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["zoo_run"]["interrupted"] == "SIGTERMException"  # written on SIGTERM, where the run was
    run_id = saved["zoo_run"]["wandb_id"]
    # Two more epochs than the one it stopped in: a SIGTERM that lands after an epoch's last
    # training batch (during its validation, under load) leaves nothing to train in that epoch.
    resumed = subprocess.run([*args[:-3], f"--trainer.max_epochs={saved['epoch'] + 2}",
                              "--trainer.enable_progress_bar=false", "--ckpt_path", "last"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert after["global_step"] > saved["global_step"]
    assert [found for found, _ in wandb_runs(tmp_path)] == [run_id, run_id]  # one W&B run, continued


def test_resume_refuses_changed_hyperparameters_and_names_a_readable_checkpoint(trained_run, tmp_path, capsys,
                                                                                 tiny_data):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    good = trained_run["last"].read_bytes()
    (run / "checkpoints" / "best-epoch=000.ckpt").write_bytes(good)
    (run / "checkpoints" / "last.ckpt").write_bytes(good)
    config = "configs/baseline/cnn_centered.yaml"
    code, err = _train(_fit(tmp_path, "--ckpt_path", "last", "--model.init_args.lr", "0.5", config=config), capsys)
    assert code == 2
    line = _one_error_line(err, "train.py")
    assert "model.init_args.lr differs (0.5 here, 0.001 in the checkpoint)" in line and "--init_from" in line
    (run / "checkpoints" / "last.ckpt").write_bytes(good[: len(good) // 2])  # killed mid-write, old-style
    code, err = _train(_fit(tmp_path, "--ckpt_path", "last", config=config), capsys)
    line = _one_error_line(err, "train.py")
    assert code == 2 and "not a readable checkpoint" in line and "best-epoch=000.ckpt" in line


# ----------------------------------------------------------------------------- output paths
def test_unwritable_outputs_are_refused_before_the_work(trained_run, tmp_path, capsys, tiny_data):
    assert EVAL.main(["--checkpoint", str(trained_run["last"]), "--json", "/sys/zoo/out.json"]) == 2
    assert "--json /sys/zoo/out.json: cannot write" in _one_error_line(capsys.readouterr().err, "eval.py")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert cli.main(["caption", str(_image(tmp_path)), "--model", "sat_soft_scenes",
                     "--attention-dir", str(blocker / "overlays")]) == 2
    assert "is not a directory" in _one_error_line(capsys.readouterr().err, "zoo caption")


# ----------------------------------------------------------------------------- downloads
class _Server:
    """A loopback server with misbehaving routes: /html (an error page with status 200),
    /short/<f> (Content-Length larger than the body), /stall/<f> (half the body, then silence),
    /<f> (the file)."""

    def __init__(self, root: Path):
        self.root, self.requests = root, []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append(self.path)
                name = self.path.rsplit("/", 1)[-1]
                body = (owner.root / name).read_bytes() if (owner.root / name).is_file() else b""
                if self.path.startswith("/html"):
                    body = b"<!DOCTYPE html><html><body>Sign in to download</body></html>"
                if not body:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) + (100 if self.path.startswith("/short") else 0)))
                self.end_headers()
                if self.path.startswith("/stall"):
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    time.sleep(20)
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bad_server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    server = _Server(root)
    yield server
    server.close()


def _release(tmp_path, name="w.safetensors", width=4) -> tuple[Path, bytes]:
    model = Classifier(arch="mlp", hidden=[width])
    path = tmp_path / name
    hub.save_release(model, model.zoo_config(), path)
    return path, path.read_bytes()


def _cache_files(tmp_path) -> list[Path]:
    cache = tmp_path / "cache"
    return sorted(p for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_failed_downloads_are_never_cached_and_the_right_file_then_loads(bad_server, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_DOWNLOAD_TIMEOUT", "1")
    path, data = _release(tmp_path)
    (bad_server.root / "w.safetensors").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused: one line, no "not pinned" warning before it
        with pytest.raises(UserError, match="an HTML page"):
            hub.fetch(f"{bad_server.url}/html/w.safetensors")
    with pytest.raises(UserError, match="sha256"):
        hub.fetch(f"{bad_server.url}/html/w.safetensors", sha)
    with pytest.raises(UserError, match="cut short"):
        hub.fetch(f"{bad_server.url}/short/w.safetensors", sha)
    with pytest.raises(UserError, match="stalled"):  # after ZOO_DOWNLOAD_TIMEOUT, not the server's 20 s
        hub.fetch(f"{bad_server.url}/stall/w.safetensors", sha)
    assert _cache_files(tmp_path) == []  # nothing failed was kept, not even a .part file
    # the same file name from a good URL downloads, verifies and loads
    model = zoo.load_checkpoint(f"{bad_server.url}/w.safetensors", sha256=sha[:12])
    assert isinstance(model, Classifier)
    assert [p.read_bytes() for p in _cache_files(tmp_path)] == [data]


def test_pins_refuse_a_flipped_byte_and_another_models_file(bad_server, tmp_path):
    path, data = _release(tmp_path)
    sha = hashlib.sha256(data).hexdigest()
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF
    (bad_server.root / "flipped.safetensors").write_bytes(bytes(flipped))
    _, other = _release(tmp_path, "other.safetensors", width=6)
    (bad_server.root / "other.safetensors").write_bytes(other)
    for name in ("flipped.safetensors", "other.safetensors"):
        with pytest.raises(UserError, match="fails its sha256 check"):
            zoo.load_checkpoint(f"{bad_server.url}/{name}", sha256=sha)
    # a hash prefix in the file name pins the URL as torch.hub does
    (bad_server.root / f"w-{sha[:8]}.safetensors").write_bytes(bytes(flipped))
    with pytest.raises(UserError, match="fails its sha256 check"):
        hub.fetch(f"{bad_server.url}/w-{sha[:8]}.safetensors")
    assert _cache_files(tmp_path) == []
    with pytest.raises(UserError, match="--sha256"):
        hub.fetch(f"{bad_server.url}/w.safetensors", "not-hex")


@pytest.mark.slow
def test_sigterm_during_a_download_leaves_no_partial_file(bad_server, tmp_path):
    path, data = _release(tmp_path)
    (bad_server.root / "w.safetensors").write_bytes(data)
    env = cli_env(None, ZOO_CACHE_DIR=str(tmp_path / "cache"))
    fetch = f"hub.fetch('{bad_server.url}/stall/w.safetensors', '{hashlib.sha256(data).hexdigest()}')"
    proc = subprocess.Popen([sys.executable, "-c", f"from zoo.weights import hub; {fetch}"], env=env, cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not any(p.name.endswith(".part") for p in _cache_files(tmp_path)) and time.time() < deadline:
        time.sleep(0.05)
    assert any(p.name.endswith(".part") for p in _cache_files(tmp_path)), "the download never started"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 143
    assert _cache_files(tmp_path) == []


def test_a_truncated_checkpoint_is_one_whole_sentence(trained_run, tmp_path):
    from zoo.weights.hub import read_checkpoint

    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(trained_run["last"].read_bytes()[:4096])
    with pytest.raises(UserError) as info:
        read_checkpoint(cut)
    message = str(info.value)
    assert message.startswith(f"{cut}: not a readable checkpoint (truncated or damaged? ") and "\n" not in message
    assert message.endswith(".)") and "If you are seeing this error" not in message  # torch's advice cut mid-way
