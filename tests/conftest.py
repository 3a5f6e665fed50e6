"""Shared fixtures: a tiny Fashion-MNIST written by the tests, and a subprocess runner for the
entry points (train.py, eval.py, `python -m zoo.commands.cli`).

The tiny data set is "random but structured": every class draws a different shape (so a model
can learn something in a few steps) with per-example jitter and noise (so no two images are equal).
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

# One intra-op thread per process: on a small shared CI box (2 cores) OpenMP's spinning threads
# make tiny tensor ops many times slower under contention. ZOO_TEST_THREADS overrides.
os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("ZOO_TEST_THREADS", "1"))


def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ.get("ZOO_TEST_THREADS", "1")))


REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
TINY_TRAIN, TINY_TEST, TINY_VAL = 600, 200, 100


# ----------------------------------------------------------------------------- IDX writing
def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 0x00 0x00 0x08 ndim, big-endian dims, data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    path = Path(str(path) + ".gz") if gz and not str(path).endswith(".gz") else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def structured_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28], labels uint8 [n]): class c is a bar/box shape of its own,
    jittered by a few pixels, plus low noise everywhere; every image is non-zero near its border
    rows/columns too, so crops of it are never empty."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(labels)
    yy, xx = np.mgrid[0:28, 0:28]
    images = rng.integers(5, 40, size=(n, 28, 28)).astype(np.float64)
    for i, c in enumerate(labels):
        dy, dx = rng.integers(-2, 3, size=2)
        cy, cx = 14 + dy, 14 + dx
        if c < 5:  # horizontal bar at a class-dependent row
            mask = np.abs(yy - (4 + 5 * c) - dy) <= 1
        else:  # a box of class-dependent size
            r = 3 + (c - 5) * 2
            mask = (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
        images[i][mask] = rng.integers(180, 256)
    return images.astype(np.uint8), labels


def write_fashion_mnist(root: Path, n_train: int = TINY_TRAIN, n_test: int = TINY_TEST, gz: bool = False,
                        seed: int = 0) -> Path:
    """Write the four IDX files under root/fashion-mnist; returns that directory."""
    directory = Path(root) / "fashion-mnist"
    train_x, train_y = structured_images(n_train, seed)
    test_x, test_y = structured_images(n_test, seed + 1000)
    write_idx(directory / "train-images-idx3-ubyte", train_x, gz)
    write_idx(directory / "train-labels-idx1-ubyte", train_y, gz)
    write_idx(directory / "t10k-images-idx3-ubyte", test_x, gz)
    write_idx(directory / "t10k-labels-idx1-ubyte", test_y, gz)
    return directory


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A ZOO_DATA_DIR holding a tiny Fashion-MNIST (600 train / 200 test), gzipped."""
    root = tmp_path_factory.mktemp("zoo_data")
    write_fashion_mnist(root, gz=True)
    return root


@pytest.fixture
def tiny_data(tiny_data_dir, monkeypatch) -> Path:
    """The tiny data set as this process's ZOO_DATA_DIR."""
    monkeypatch.setenv("ZOO_DATA_DIR", str(tiny_data_dir))
    return tiny_data_dir


@pytest.fixture
def offline_in_tmp(tmp_path, monkeypatch):
    """This process as a user's run in tmp_path: its own download cache, W&B offline and quiet."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)


# ----------------------------------------------------------------------------- subprocesses
def cli_env(data_dir: Path | None = None, **extra: str) -> dict:
    """Environment for entry-point subprocesses: tiny data, offline W&B, one thread each,
    tests/ importable (for test-only classes named by class_path)."""
    # a W&B service an earlier in-process test started (wandb puts its address in WANDB_SERVICE)
    # belongs to this test process: a CLI run must start its own, or its offline run file is
    # written by another process's service, whenever that gets to it
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if data_dir is not None:
        env["ZOO_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: str | os.PathLike, env: dict | None = None, timeout: float = 240):
    """Run `python <args...>` (e.g. ["train.py", "fit", ...] or ["-m", "zoo.commands.cli", "list"]) with
    the venv's interpreter. A script name is resolved against the repo root. Returns
    (returncode, stdout, stderr)."""
    args = [str(a) for a in args]
    if args and args[0].endswith(".py") and not Path(args[0]).is_absolute():
        args[0] = str(REPO / args[0])
    proc = subprocess.run([sys.executable, *args], cwd=str(cwd), env=env if env is not None else cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


class _LastResort(logging.StreamHandler):
    """What a fresh process prints for a log record no handler takes (Python's `logging.lastResort`:
    its message, at WARNING and above, on stderr). In a test process pytest's handlers on the root
    logger take every record, so that a command's `zoo` warnings would never reach its stderr."""

    def __init__(self, stream):
        super().__init__(stream)
        self.setLevel(logging.WARNING)

    def filter(self, record) -> bool:
        logger = logging.getLogger(record.name)
        while logger is not logging.root:  # a handler of its own, or of a parent, takes it
            if logger.handlers or not logger.propagate:
                return False
            logger = logger.parent
        return True


def run_main(args: list[str], cwd: str | os.PathLike, env: dict | None = None):
    """What `run_cli(args, cwd, env)` runs, run in this process through the same entry points
    (train.py and eval.py are zoo.commands.cli's `script`, `-m zoo.commands.cli` its `main`): no
    interpreter start and no imports, seconds per command, for a test about what a command does
    rather than the process it runs in (its exit code on a signal, a W&B run a new process resumes:
    those stay `run_cli`'s). `env`'s variables are set while it runs (none is removed: a W&B service
    this process started stays its own), in `cwd`; stdout and stderr are captured, the log handlers
    that write to them included. An exception a command lets out is exit code 1 with its traceback
    on stderr, as Python's would be; a log record no handler of the command takes is printed on its
    stderr, as a fresh process prints it; W&B's service ends with the command, as with a process.
    Returns (returncode, stdout, stderr)."""
    import contextlib
    import io
    import traceback
    import warnings

    from zoo.commands import cli

    args = [str(a) for a in args]
    if args[:2] == ["-m", "zoo.commands.cli"]:
        command = functools.partial(cli.main, args[2:])
    elif args and args[0] in ("train.py", "eval.py"):
        command = functools.partial(cli.script, args[0].removesuffix(".py"), args[0])
    else:
        raise ValueError(f"run_main runs train.py, eval.py or -m zoo.commands.cli, not {args[:2]}")
    out, err = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    # Lightning's (and any other) log handler keeps the stream it was made with: pointed here too
    handlers = [h for lg in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
                for h in getattr(lg, "handlers", []) if type(h) is logging.StreamHandler]
    streams = [h.stream for h in handlers]
    last_resort = _LastResort(err)
    try:
        logging.root.addHandler(last_resort)
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = [str(REPO / args[0]), *args[1:]]
        for handler, stream in zip(handlers, streams):  # (not setStream: it flushes, and a stream may be closed)
            handler.stream = out if stream in (sys.stdout, sys.__stdout__) else err
        # catch_warnings: the warning filters as they were, and the "once" registries forgotten (a
        # fresh process shows a warning an earlier command in this one already showed)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            try:
                code = command()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        # a process's W&B service ends with it; one kept would hold the stream of a run that this
        # process resumes again (a copy of one run resumed by two tests) and write it nowhere
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
        logging.root.removeHandler(last_resort)
        for handler, stream in zip(handlers, streams):
            handler.stream = stream
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return int(code or 0), out.getvalue(), err.getvalue()


def load_script(path: str, name: str):
    """A script of the repository (scripts/, benchmarks/: not a package) imported from its path as `name`."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wandb_runs(folder: Path) -> list[tuple[str, Path]]:
    """(run id, folder) of each W&B offline run folder under folder/wandb, sorted. W&B names one
    `offline-run-<yyyymmdd_hhmmss>-<id>` and adds `-<n>` when a run of that id already has a folder
    of that second (a resume started within the second its run did), so the id is the fourth field."""
    return sorted((p.name.split("-")[3], p) for p in Path(folder).glob("wandb/offline-run-*"))


def tiny_fit_args(config: str, root: Path, *extra: str) -> list[str]:
    """train.py fit arguments for a quick run on the tiny data set."""
    return ["train.py", "fit", "--config", str(REPO / config),
            f"--trainer.default_root_dir={root}",
            f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32",
            "--trainer.enable_model_summary=false", *extra]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_data_dir):
    """One short training of the CNN baseline on the tiny data (1 epoch, 4 train / 2 val batches),
    shared by the training, eval and registry tests, run in this process (`run_main`). Returns a dict
    with its paths."""
    work = tmp_path_factory.mktemp("trained_run")
    root = work / "runs" / "cnn"
    rc, out, err = run_main(tiny_fit_args("configs/baseline/cnn_centered.yaml", root,
                                         "--trainer.max_epochs=1", "--trainer.limit_train_batches=4",
                                         "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1"),
                           cwd=work, env=cli_env(tiny_data_dir))
    assert rc == 0, f"training failed (rc {rc}):\n{out[-3000:]}\n{err[-5000:]}"
    checkpoints = root / "checkpoints"
    return {"work": work, "root": root, "checkpoints": checkpoints, "last": checkpoints / "last.ckpt",
            "stdout": out, "stderr": err, "steps": 4}


def release_main(argv: list[str]) -> int:
    """scripts/release.py's main(argv), run in this process (it honours ZOO_WEIGHTS_DIR)."""
    spec = importlib.util.spec_from_file_location("zoo_release_script", REPO / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


# ----------------------------------------------------------------------------- loopback HTTP
@pytest.fixture
def http_server(tmp_path):
    """A loopback HTTP server over tmp_path/served; counts the GET requests it answers."""
    served = tmp_path / "served"
    served.mkdir()
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    server.daemon_threads = True
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "dir": served, "requests": requests}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
