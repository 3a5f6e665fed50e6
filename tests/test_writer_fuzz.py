"""Fuzzing the writers (issue 42, item 8): a stateful Hypothesis test runs random sequences of the
commands that write files (`export`, `card`, `samples`, `attend --out/--html`, `caption
--attention-dir`, `sample --out [--gif]`, `eval --json`, `train predict --predictions`, a release
(scripts/release.py, killed at its steps or not), `train fit` and its resume) into folders seeded with
random user files (names included that look like the zoo's: model.onnx, export.json, config.yaml,
last.ckpt, <release>-<8 chars>.safetensors, a temporary's name), symbolic links (to files and
folders outside, dangling ones) and the earlier commands' outputs, some of them then replaced by the
user. Commands run in this process (zoo.commands.cli.main with argv), so a step costs milliseconds when it is
refused and about a second when it trains.

The property, after every step:
- no file or link the test made (outside or inside any output folder) changes or disappears, except
  the very files a command was told to replace (`--overwrite` and that file's name);
- nothing appears outside the sandbox's output area, except under the folder or file a command was
  pointed at (a link given as --out is followed: that is where the user pointed it);
- no temporary of the zoo's is left behind;
- the command succeeded (exit 0) or printed exactly one line on stderr (no traceback).

`make test` runs a short seeded run (ZOO_WRITER_FUZZ_EXAMPLES sequences of ZOO_WRITER_FUZZ_STEPS
steps) and replays every failing sequence kept in tests/fuzz_corpus/writers/ (JSON: the steps, in
order); `make fuzz` (tools/fuzz.py) runs the machine with fresh draws and keeps what fails there.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CORPUS = TESTS / "fuzz_corpus" / "writers"
EXAMPLES = int(os.environ.get("ZOO_WRITER_FUZZ_EXAMPLES", "6"))
STEPS = int(os.environ.get("ZOO_WRITER_FUZZ_STEPS", "14"))
#: seeded (derandomized) in `make test`; tools/fuzz.py sets ZOO_FUZZ_RANDOM=1 for fresh draws
RANDOM = os.environ.get("ZOO_FUZZ_RANDOM") == "1"
RECIPE = REPO / "configs" / "baseline" / "mlp_centered.yaml"
RELEASE = "tiny_release"  # the release the release steps write (into the sandbox's weights folder)
#: the fit steps' run folders: run 0 trains in a folder of its own, run 1 in the seeded output folders,
#: among the user's files and other commands' outputs (the run-folder claim of issue 42, item 2,
#: refuses a folder of someone else's files); ZOO_WRITER_FUZZ_FIT=own keeps both in folders of their own
FIT_SHARED = os.environ.get("ZOO_WRITER_FUZZ_FIT", "shared") == "shared"

# ----------------------------------------------------------------------------- the sandbox's names
# Few names, so that steps meet: a user's file where a command writes, a command where another wrote.
FOLDERS = ["work/a", "work/b", "work/a/sub"]  # where commands write, and users keep files
FILE_FOLDERS = ["work", *FOLDERS]
OUTPUT_FILES = ["r.json", "model.onnx", "config.yaml"]  # eval --json, predict --predictions, attend --html
IMAGE_FILES = ["s.png", "img.png"]  # sample --out (and its .gif)
SAMPLES_FOLDER = "baseline_cnn_centered"  # `zoo samples` builds this one folder here (all of them take 20 s)
#: every file a command here may write (and a user may keep there): the collisions worth drawing
IN_FOLDERS = ["img_attend.png", "img.png", "model.pt2", "export.json", "README.md", "config.json", "model.safetensors",
              SAMPLES_FOLDER, f"{SAMPLES_FOLDER}/test_00000.png", f"{SAMPLES_FOLDER}/boxes.json"]
WRITTEN = sorted({f"{folder}/{name}" for folder in FILE_FOLDERS for name in [*OUTPUT_FILES, *IMAGE_FILES, "s.gif"]}
                 | {f"{folder}/{name}" for folder in FOLDERS for name in IN_FOLDERS})
USER_NAMES = ["last.ckpt", "notes.txt", "sub", ".hidden", ".r.json.0123456789abcdef.tmp",
              ".r.json.0123456789abcdef.lock", "a.previous-0123abcd"]
#: what a link seeded in the output area points at: the outside's files and folders, a dangling
#: name, and folders of the output area itself
LINK_TARGETS = ["outside/secret.txt", "outside/folder", "outside/empty", "outside/nowhere", "work/b", "work/a/sub"]
TEMPORARY = re.compile(r"\..+\.[0-9a-f]{16}\.(tmp|part|old|lock)|\.zoo-write-check-.*")

other_names = st.sampled_from(USER_NAMES) | st.text(st.sampled_from("abcXYZ019-_. é"), min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..") and "/" not in n)
#: where the user puts a file or a link: mostly where a command writes
places = st.sampled_from(WRITTEN) | st.tuples(st.sampled_from(FILE_FOLDERS), other_names).map("/".join)
contents = st.binary(max_size=64)
flags = st.booleans()


# ----------------------------------------------------------------------------- the world (once per process)
@functools.lru_cache(maxsize=1)
def world() -> dict:
    """What every sequence starts from: a tiny release file (export, eval), a tiny Fashion-MNIST
    (eval, predict, fit, samples) and an image (attend, caption), outside any sandbox."""
    import torch
    from PIL import Image

    from conftest import write_fashion_mnist
    from zoo.models.baselines import Classifier
    from zoo.weights import hub

    root = Path(tempfile.mkdtemp(prefix="zoo-writer-fuzz-world-"))
    atexit.register(shutil.rmtree, root, True)
    write_fashion_mnist(root / "data", n_train=200, n_test=40, gz=True)
    torch.manual_seed(0)
    model = Classifier(arch="mlp", hidden=[4])
    config = {**model.zoo_config(), "data": {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
                                             "init_args": {"variant": "centered", "batch_size": 8}}}
    hub.save_release(model, config, root / "tiny.safetensors")
    Image.new("L", (28, 28), 90).save(root / "img.png")
    spec = __import__("importlib.util").util.spec_from_file_location("release_script", REPO / "scripts" / "release.py")
    release_script = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(release_script)
    return {"root": root, "data": root / "data", "weights": root / "tiny.safetensors", "image": root / "img.png",
            "release": release_script}


@contextlib.contextmanager
def environment():
    """The process as a user's, for the machine's whole run: the tiny data, W&B offline, no
    network; restored afterwards (the tests that share this process see their own)."""
    values = {"ZOO_DATA_DIR": str(world()["data"]), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
              "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true"}
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


@contextlib.contextmanager
def captured():
    """stdout and stderr of an in-process command, at the file descriptors too (what Lightning
    and C libraries print): yields a dict that holds {"err": text} afterwards."""
    result = {}
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        saved = os.dup(1), os.dup(2)
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield result
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            err_file.seek(0)
            result["err"] = err.getvalue() + err_file.read().decode(errors="replace")
            out_file.seek(0)
            result["out"] = out.getvalue() + out_file.read().decode(errors="replace")


def _state(path: Path):
    """What is at `path` now: ("link", target), ("file", sha256), ("folder",) or None."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_file():
        return ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return ("folder",) if path.is_dir() else None


def _listing(root: Path) -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(root):  # links are not followed into
        found |= {os.path.relpath(os.path.join(folder, name), root) for name in dirs + files}
    return found


def _plain(value):
    return {"hex": value.hex()} if isinstance(value, bytes) else value


def _unplain(value):
    return bytes.fromhex(value["hex"]) if isinstance(value, dict) and "hex" in value else value


def recorded(method):
    """Record each step (its rule and arguments) so that a failing sequence can be kept and replayed."""
    @functools.wraps(method)
    def step(self, **kwargs):
        self.steps.append({"rule": method.__name__, "args": {k: _plain(v) for k, v in kwargs.items()}})
        return method(self, **kwargs)

    return step


class Killed(Exception):
    """A release stopped at one of its test hooks (a kill -9 there, in the subprocess tests)."""


#: the last sequence run (the shrunk one, when Hypothesis replays a failure last): kept by tools/fuzz.py
LAST_STEPS: list[dict] = []
#: every sequence that failed, as it stood when it failed (before Hypothesis shrinks or replays it: a
#: failure that does not come back on the replay is still kept), with its one-line error
FAILED: list[tuple[list[dict], str]] = []
#: what ran: sequences, command steps, and of those the ones that succeeded or were refused in one line
COUNTS = {"sequences": 0, "steps": 0, "ok": 0, "refused": 0}


class WriterMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="zoo-writer-fuzz-"))
        for folder in ("outside/folder", "outside/empty", "work", "weights/golden", "cwd"):
            (self.root / folder).mkdir(parents=True)
        (self.root / "outside/secret.txt").write_bytes(b"secret")
        (self.root / "outside/folder/inner.txt").write_bytes(b"inner")
        (self.root / "weights/MANIFEST.json").write_text("{}")
        self.tracked = {p: _state(self.root / p) for p in ("outside/secret.txt", "outside/folder/inner.txt")}
        self.outside = _listing(self.root / "outside")
        self.cwd = os.getcwd()
        os.chdir(self.root / "cwd")  # what commands write beside themselves (W&B, Lightning) lands here
        self.steps = []
        self.runs = 0
        LAST_STEPS[:] = []
        self.steps = LAST_STEPS
        COUNTS["sequences"] += 1

    def teardown(self):
        os.chdir(self.cwd)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------------- the user's files
    def _free(self, relative: str) -> bool:
        """Whether the user may put a file at `relative`: no link or file on the way, no folder there."""
        path = self.root
        parts = relative.split("/")
        for i, part in enumerate(parts):
            path = path / part
            last = i == len(parts) - 1
            if path.is_symlink() or (path.exists() and path.is_dir() == last):
                return False
        return True

    @rule(relative=places, data=contents)
    @recorded
    def seed_file(self, relative, data):
        if self._free(relative):
            (self.root / relative).parent.mkdir(parents=True, exist_ok=True)
            (self.root / relative).write_bytes(data)
            self.tracked[relative] = _state(self.root / relative)

    @rule(relative=places, points=st.sampled_from(LINK_TARGETS))
    @recorded
    def seed_link(self, relative, points):
        if self._free(relative) and not (self.root / relative).exists():
            (self.root / relative).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(self.root / points, (self.root / relative).parent), self.root / relative)
            self.tracked[relative] = _state(self.root / relative)

    @rule(suffix=st.sampled_from(["0123abcd", "backup01", "0123ABCD", "deadbeef0"]) |
          st.text(st.sampled_from("0123456789abcdefABxz"), min_size=7, max_size=9), golden=flags, data=contents)
    @recorded
    def seed_release_lookalike(self, suffix, golden, data):
        """A file of the user's named like a release file (or its golden output) in the weights folder."""
        relative = f"weights/golden/{RELEASE}-{suffix}.json" if golden else f"weights/{RELEASE}-{suffix}.safetensors"
        if self._free(relative) and not (self.root / relative).exists():
            (self.root / relative).write_bytes(data)
            self.tracked[relative] = _state(self.root / relative)

    @rule(pick=st.integers(0, 10**6), data=contents)
    @recorded
    def replace_a_zoo_file(self, pick, data):
        """The user replaces a file a command wrote (a quantised model.onnx, the weights of a release)."""
        candidates = sorted(str(p.relative_to(self.root)) for area in ("work", "weights") for p in
                            (self.root / area).rglob("*") if p.is_file() and not p.is_symlink()
                            and str(p.relative_to(self.root)) not in self.tracked and not TEMPORARY.fullmatch(p.name)
                            and p.name not in (".release.lock", ".release.pending.json", "MANIFEST.json"))
        if candidates:
            relative = candidates[pick % len(candidates)]
            (self.root / relative).write_bytes(data)
            self.tracked[relative] = _state(self.root / relative)

    # ------------------------------------------------------------------------- the commands
    def _command(self, argv: list[str], replaces=(), points_at=(), call=None) -> int:
        """Run one command in this process and check the property. `replaces`: the files it may
        replace (it was given --overwrite); `points_at`: the folders and files it was pointed at
        (new entries outside the output area are fine only under those, links given followed)."""
        from zoo.commands.cli import main

        try:
            with captured() as output:
                try:
                    code = call() if call is not None else main(argv)
                except SystemExit as exc:
                    code = exc.code
            code = 0 if code is None else code
            lines = output["err"].strip().splitlines()
            assert code == 0 or (len(lines) == 1 and "Traceback" not in lines[0]), \
                f"{' '.join(argv)}: exit {code} with {len(lines)} lines on stderr: {lines[-5:]}"
            self._check(set(replaces), points_at)
        except Exception as exc:
            FAILED.append((list(self.steps), format_failure(exc)[0]))
            raise
        COUNTS["steps"] += 1
        COUNTS["ok" if code == 0 else "refused"] += 1
        return code

    def _check(self, replaces: set[str], points_at) -> None:
        for relative, before in list(self.tracked.items()):
            now = _state(self.root / relative)
            if relative in replaces and before[0] == "file" and now is not None and now[0] == "file":
                del self.tracked[relative]  # replaced as asked: the command's file now
                continue
            assert now == before, f"{relative}: was {before}, now {now}"
        allowed = [os.path.realpath(self.root / p) for p in points_at]
        for new in _listing(self.root / "outside") - self.outside:
            where = os.path.realpath(self.root / "outside" / new)
            assert any(where == a or where.startswith(a + os.sep) for a in allowed), f"outside/{new} appeared"
        self.outside = _listing(self.root / "outside")
        left = [p for p in _listing(self.root) if TEMPORARY.fullmatch(Path(p).name) and p not in self.tracked
                and not p.startswith("cwd/")]
        assert not left, f"temporaries left behind: {left}"

    @staticmethod
    def _given(replaces: list[str], overwrite: bool) -> list[str]:
        return replaces if overwrite else []

    @rule(out=st.sampled_from(FOLDERS), fmt=st.sampled_from(["torch", "onnx"] if RANDOM else ["torch"]),
          overwrite=flags)
    @recorded
    def export(self, out, fmt, overwrite):
        self._command(["export", "--checkpoint", str(world()["weights"]), "--out", str(self.root / out),
                       "--format", fmt, *(["--overwrite"] if overwrite else [])], points_at=[out])

    @rule(out=st.sampled_from(FOLDERS), overwrite=flags)
    @recorded
    def card(self, out, overwrite):
        self._command(["card", "ram_fmnist_centered", "--out", str(self.root / out),
                       *(["--overwrite"] if overwrite else [])], points_at=[out])

    @rule(out=st.sampled_from(FOLDERS), overwrite=flags)
    @recorded
    def samples(self, out, overwrite):
        import zoo.commands.samples as command

        everything = command.folders
        files = [f"{out}/{SAMPLES_FOLDER}/{name}" for name in ("test_00000.png", "boxes.json")]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(command, "folders", lambda: {SAMPLES_FOLDER: everything()[SAMPLES_FOLDER]})
            self._command(["samples", "--out", str(self.root / out), "--n", "1",
                           *(["--overwrite"] if overwrite else [])],
                          replaces=self._given(files, overwrite), points_at=[out])

    @rule(out=st.sampled_from(FOLDERS), html=st.none() | st.sampled_from(FILE_FOLDERS).flatmap(
        lambda folder: st.sampled_from(OUTPUT_FILES).map(lambda name: f"{folder}/{name}")), overwrite=flags)
    @recorded
    def attend(self, out, html, overwrite):
        replaces = [f"{out}/img_attend.png", *([html] if html else [])]
        self._command(["attend", "--model", "ram_fmnist_centered", str(world()["image"]), "--out", str(self.root / out),
                       *(["--html", str(self.root / html)] if html else []), *(["--overwrite"] if overwrite else [])],
                      replaces=self._given(replaces, overwrite), points_at=[out, *([html] if html else [])])

    @rule(out=st.sampled_from(FOLDERS), overwrite=flags)
    @recorded
    def caption(self, out, overwrite):
        self._command(["caption", "--model", "sat_soft_scenes", str(world()["image"]), "--beam-size", "1",
                       "--attention-dir", str(self.root / out), *(["--overwrite"] if overwrite else [])],
                      replaces=self._given([f"{out}/img.png"], overwrite), points_at=[out])

    @rule(folder=st.sampled_from(FILE_FOLDERS), name=st.sampled_from(IMAGE_FILES), gif=flags, overwrite=flags)
    @recorded
    def sample(self, folder, name, gif, overwrite):
        out = f"{folder}/{name}"
        replaces = [out, *([str(Path(out).with_suffix(".gif"))] if gif else [])]
        self._command(["sample", "--model", "draw_fmnist_t16", "--n", "1", "--out", str(self.root / out),
                       *(["--gif"] if gif else []), *(["--overwrite"] if overwrite else [])],
                      replaces=self._given(replaces, overwrite), points_at=replaces)

    @rule(folder=st.sampled_from(FILE_FOLDERS), name=st.sampled_from(OUTPUT_FILES), overwrite=flags)
    @recorded
    def eval_json(self, folder, name, overwrite):
        out = f"{folder}/{name}"
        self._command(["eval", "--checkpoint", str(world()["weights"]), "--limit", "8", "--accelerator", "cpu",
                       "--json", str(self.root / out), *(["--overwrite"] if overwrite else [])],
                      replaces=self._given([out], overwrite), points_at=[out])

    @rule(folder=st.sampled_from(FILE_FOLDERS), name=st.sampled_from(OUTPUT_FILES), overwrite=flags)
    @recorded
    def predict(self, folder, name, overwrite):
        out = f"{folder}/{name}"
        self._command(["train", "predict", "--config", str(RECIPE), "--predictions", str(self.root / out),
                       "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu",
                       *(["--overwrite"] if overwrite else [])],
                      replaces=self._given([out], overwrite), points_at=[out])

    @rule(seed=st.integers(0, 3), kill_at=st.sampled_from([None, "staged", "committed"]))
    @recorded
    def release(self, seed, kill_at):
        import torch

        from zoo.models.baselines import Classifier

        script = world()["release"]

        def hook(point):
            if point == kill_at:
                raise Killed(point)

        def write():
            torch.manual_seed(seed)
            model = Classifier(arch="mlp", hidden=[4])
            probe = {"config": model.zoo_config(), "metadata": {"recipe": str(RECIPE.relative_to(REPO)), "seed": 0}}
            try:
                script.write_release(RELEASE, model, probe)
            except Killed:
                pass  # as a kill -9 there would: its files are the next release's to sweep (checked then)
            return 0

        def call():  # as scripts/release.py's main runs it
            from zoo.guards.errors import report_user_errors

            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("ZOO_WEIGHTS_DIR", str(self.root / "weights"))
                patch.setattr(script, "_test_hook", hook)
                return report_user_errors("release.py", write)

        self._command(["release.py", RELEASE, f"seed {seed}", f"killed at {kill_at}"], call=call)

    @rule(run=st.integers(0, 1), folder=st.sampled_from(FOLDERS), resume=flags)
    @recorded
    def fit(self, run, folder, resume):
        root = folder if FIT_SHARED and run == 1 else f"runs/r{run}"
        self._command(["train", "fit", "--config", str(RECIPE), f"--trainer.default_root_dir={self.root / root}",
                       "--data.init_args.val_size=40", "--data.init_args.batch_size=16",
                       f"--trainer.max_epochs={self.runs + 1}", "--trainer.limit_train_batches=1",
                       "--trainer.limit_val_batches=1", "--trainer.enable_model_summary=false",
                       "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu",
                       *(["--ckpt_path", "last"] if resume else [])], points_at=[root])
        self.runs += 1


def replay(steps: list[dict]) -> None:
    """Run a kept sequence step by step (its checks included) in a fresh machine."""
    machine = WriterMachine()
    try:
        for step in steps:
            getattr(machine, step["rule"])(**{k: _unplain(v) for k, v in step["args"].items()})
    finally:
        machine.teardown()


def run_machine(examples: int, steps: int, derandomize: bool) -> None:
    run_state_machine_as_test(WriterMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, derandomize=derandomize, database=None, deadline=None,
        print_blob=False, suppress_health_check=list(HealthCheck)))


def save_failure(steps: list[dict]) -> Path:
    """Keep a failing sequence under tests/fuzz_corpus/writers/ (named by its content), where `make test` replays it."""
    text = json.dumps(steps, indent=1) + "\n"
    CORPUS.mkdir(parents=True, exist_ok=True)
    path = CORPUS / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path.write_text(text)
    return path


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []


@pytest.mark.slow
@pytest.mark.fuzz
def test_the_writers_keep_every_file_they_did_not_write():
    """A seeded run: random sequences of the writing commands over seeded user files and links."""
    with environment():
        run_machine(EXAMPLES, STEPS, derandomize=not RANDOM)


@pytest.mark.parametrize("path", corpus() or [pytest.param(None, marks=pytest.mark.skip(
    reason="the writer corpus is empty"))], ids=lambda p: getattr(p, "stem", p))
def test_the_writer_corpus_replays(path):
    """Every sequence the writer fuzz ever failed on (tests/fuzz_corpus/writers/) now holds the property."""
    with environment():
        replay(json.loads(path.read_text()))


def format_failure(exc: BaseException) -> tuple[str, str]:
    """(one line for the report, where it was raised) of a failure."""
    line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return line, f"{Path(where.filename).name}:{where.lineno}"
