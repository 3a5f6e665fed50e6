"""Issue 35: the zoo deletes or replaces only what it can prove it wrote.

- An export replaces a folder only when it is an earlier export (a zoo manifest naming exactly the
  folder's files); a folder of the user's, or an earlier export with the user's files added, is
  refused with everything kept, and nothing beside --out is ever touched.
- Temporaries carry a lock file their writer holds (zoo.guards.writes.writing): a sweep removes a writer's
  files only when it can take that lock, so a live writer in another PID namespace keeps its
  files, and a killed one's are removed the next time its target is written.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from conftest import cli_env
from zoo.commands.cli import main as zoo_main
from zoo.guards.errors import UserError
from zoo.guards.writes import atomic_write_bytes, companion, sweep_stale, writing
from zoo.models.baselines import Classifier
from zoo.weights.export import export, load_export


def _small_export(target, seed: int = 0):
    torch.manual_seed(seed)
    return export(Classifier(arch="mlp", hidden=[4]).eval(), target)


def _tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _refused_before_the_model_loads(monkeypatch, capsys, out, cwd=None) -> str:
    """`zoo export --out OUT` with a model that must never be loaded: returns its one error line."""
    import zoo.commands.export as command

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(command, "resolve_model", never)
    if cwd is not None:
        monkeypatch.chdir(cwd)
    code = zoo_main(["export", "--model", "vit_fmnist", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("zoo export: error: --out"), err
    return err[0]


# ----------------------------------------------------------------------------- what an export replaces
def test_a_folder_with_a_foreign_export_json_is_refused_with_nothing_deleted(tmp_path, monkeypatch, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "export.json").write_text('{"name": "my project", "files": {"README.md": "x"}}\n')
    (project / "README.md").write_text("mine\n")
    (project / "src" / "main.py").write_text("print('mine')\n")
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    line = _refused_before_the_model_loads(monkeypatch, capsys, project)
    assert "not an earlier export" in line and "not a zoo export manifest" in line
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    with pytest.raises(UserError, match="not an earlier export"):  # the Python API checks the same
        _small_export(project)
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_an_earlier_export_with_files_added_is_refused_and_kept_whole(tmp_path, monkeypatch, capsys):
    target = tmp_path / "exported"
    _small_export(target)
    (target / "notes.txt").write_text("mine\n")
    (target / "mydata").mkdir()
    (target / "mydata" / "keep.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    line = _refused_before_the_model_loads(monkeypatch, capsys, target)
    assert "mydata, notes.txt, which its export.json does not name" in line
    with pytest.raises(UserError, match="notes.txt"):
        _small_export(target, seed=1)
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]


def test_a_manifest_naming_a_folder_does_not_make_it_part_of_the_set(tmp_path, monkeypatch, capsys):
    target = tmp_path / "exported"
    _small_export(target)
    manifest = json.loads((target / "export.json").read_text())
    (target / "mydata").mkdir()
    (target / "mydata" / "keep.txt").write_text("mine\n")
    manifest["files"]["mydata"] = "0" * 64  # an edited manifest must not buy an rmtree of mydata/
    (target / "export.json").write_text(json.dumps(manifest))
    assert "names 'mydata', which is not a file there" in _refused_before_the_model_loads(monkeypatch, capsys, target)
    assert (target / "mydata" / "keep.txt").read_text() == "mine\n"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_nothing_beside_out_is_removed(tmp_path, monkeypatch, exchange):
    import zoo.guards.writes

    if not exchange:  # a kernel or file system without RENAME_EXCHANGE
        monkeypatch.setattr(zoo.guards.writes, "_exchange", lambda a, b: False)
    (tmp_path / ".photos.2019.summer.old").mkdir()
    (tmp_path / ".photos.2019.summer.old" / "beach.jpg").write_bytes(b"jpg")
    (tmp_path / ".thesis.2024.v2.tmp").write_text("chapter 1\n")
    # names of the target's own temporaries, but without a zoo lock beside them: not provably ours
    (tmp_path / ".exported.4242.abcd1234.tmp").mkdir()  # the naming of zoo versions before issue 35
    (tmp_path / ".exported.0123456789abcdef.old").write_text("no lock, so not swept\n")
    beside = _tree(tmp_path)
    _small_export(tmp_path / "exported")
    first = load_export(tmp_path / "exported")["files"]
    _small_export(tmp_path / "exported", seed=1)  # replaces the earlier export: the swap and its clean-up
    assert load_export(tmp_path / "exported")["files"] != first
    assert _tree(tmp_path) == sorted(beside + ["exported", "exported/export.json", "exported/model.onnx"])


def test_files_written_into_the_old_set_during_the_swap_are_kept(tmp_path):
    """The target is checked again just before the swap; a file that lands in the old set after
    that is not removed with it: the old folder is kept beside the target, with one warning."""
    from zoo.guards.writes import _remove_set
    from zoo.weights.export import earlier_export_problem

    old, target = tmp_path / ".exported.0123456789abcdef.tmp", tmp_path / "exported"
    _small_export(old.with_name("first"))
    (tmp_path / "first").rename(old)
    (old / "late.txt").write_text("mine\n")
    with pytest.warns(UserWarning, match="kept what was in .*exported before as .*exported.previous-"):
        _remove_set(old, target, earlier_export_problem)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("exported.previous-")]
    assert len(kept) == 1 and (kept[0] / "late.txt").read_text() == "mine\n" and not old.exists()


def test_out_as_a_symlink_writes_the_folder_it_names(tmp_path, monkeypatch, capsys):
    real = tmp_path / "real"
    _small_export(real)
    first = load_export(real)["files"]
    (tmp_path / "link").symlink_to("real")
    _small_export(tmp_path / "link", seed=1)
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "real"
    assert load_export(real)["files"] != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
    (tmp_path / "dangling").symlink_to("nowhere")
    assert "a symlink to nowhere, which does not exist" in _refused_before_the_model_loads(
        monkeypatch, capsys, tmp_path / "dangling")


def test_odd_targets_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "is the current folder" in _refused_before_the_model_loads(monkeypatch, capsys, ".", cwd=empty)
    assert "is the current folder (or holds it)" in _refused_before_the_model_loads(monkeypatch, capsys, "..")
    assert "mount point" in _refused_before_the_model_loads(monkeypatch, capsys, "/")
    (tmp_path / "file").write_text("")
    assert "not a directory" in _refused_before_the_model_loads(monkeypatch, capsys, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file"] and not any(empty.iterdir())


@pytest.mark.slow
def test_sigterm_during_an_export_removes_its_staging_and_keeps_the_earlier_set(tmp_path):
    from zoo.weights import hub

    weights = tmp_path / "model.safetensors"
    model = Classifier(arch="mlp", hidden=[4])
    hub.save_release(model, model.zoo_config(), weights)
    target = tmp_path / "exported"
    _small_export(target)
    before = load_export(target)["files"]
    env = cli_env(None, ZOO_TEST_KILL_EXPORT_AFTER="1", ZOO_TEST_KILL_EXPORT_SIGNAL="SIGTERM")
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.cli", "export", "--checkpoint", str(weights), "--out",
                           str(target), "--overwrite"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"zoo export: stopped by SIGTERM: --out {target} is as it was"
    assert load_export(target)["files"] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "model.safetensors"]


# ----------------------------------------------------------------------------- temporaries and sweeps
HOLD = """
import os, signal, sys
from zoo.guards.writes import writing
target = sys.argv[1]
with writing(target, sys.argv[2]) as temp:
    temp.write_bytes(b"being written")
    print("writing", os.getpid(), flush=True)
    if sys.stdin.readline().strip() == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(temp, target)
"""


def _writer(target, kind="tmp", prefix=(), env=None):
    proc = subprocess.Popen([*prefix, sys.executable, "-c", HOLD, str(target), kind], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or cli_env(None))
    line = proc.stdout.readline()
    assert line.startswith("writing"), proc.stderr.read()
    return proc


def _finish(proc, how: str = "") -> int:
    proc.stdin.write(how + "\n")
    proc.stdin.close()
    return proc.wait(timeout=60)


def _temporaries(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.slow
def test_a_sweep_removes_a_dead_writers_files_and_only_those(tmp_path):
    target = tmp_path / "result.json"
    killed = _writer(target)
    assert _finish(killed, "die") == -signal.SIGKILL
    dead = _temporaries(tmp_path)
    assert [name.rsplit(".", 1)[1] for name in dead] == ["lock", "tmp"]
    live = _writer(target)
    assert not set(dead) & set(_temporaries(tmp_path))  # the new writer swept the killed one's files
    alive = _temporaries(tmp_path)
    lookalikes = [f".result.json.{os.getpid()}.deadbeef.tmp", ".result.json.0123456789abcdef.tmp"]
    for name in lookalikes:
        (tmp_path / name).write_text("not provably the zoo's")
    (tmp_path / ".result.json.fedcba9876543210.lock").write_text("a lock file the zoo did not write")
    (tmp_path / ".result.json.fedcba9876543210.tmp").write_text("beside it")
    assert sweep_stale(target) == []  # a live writer's (another process) and unproven files stay
    atomic_write_bytes(target, b"{}")  # a second writer of the same target, at the same time
    assert set(alive) <= set(_temporaries(tmp_path))
    assert _finish(live) == 0 and target.read_bytes() == b"being written"
    assert _temporaries(tmp_path) == sorted([*lookalikes, ".result.json.fedcba9876543210.lock",
                                             ".result.json.fedcba9876543210.tmp"])


def test_a_writer_killed_between_the_two_renames_of_a_swap_gets_its_old_set_back(tmp_path):
    target = tmp_path / "exported"
    target.mkdir()
    (target / "a.onnx").write_text("the old set")
    with pytest.raises(KeyboardInterrupt):
        with writing(target) as staging:
            staging.mkdir()
            os.rename(target, companion(staging, "old"))  # the old set moved aside ...
            raise KeyboardInterrupt  # ... and stopped before the new one went in
    assert (target / "a.onnx").read_text() == "the old set"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True).returncode == 0


# In the new namespace the writer would be pid 1, alive everywhere: it burns pids and writes from a
# child with a larger one, as a download in a container would, whose pid means nothing out here.
BURN_PIDS = """
import os
for _ in range(300):
    pid = os.fork()
    os._exit(0) if pid == 0 else os.waitpid(pid, 0)
if os.fork():
    _, status = os.wait()
    os._exit(os.waitstatus_to_exitcode(status) % 256)
"""


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="unshare -p (a new PID namespace) is not permitted here "
                                                 "(needs root or user namespaces)")
def test_a_live_writer_in_another_pid_namespace_keeps_its_files(tmp_path):
    """A download in a container (here: a new PID namespace) writes a .part; a sweep out here can
    see neither its pid nor its process, and must still leave it alone."""
    target = tmp_path / "w.safetensors"
    prefix = ["unshare", "-p", "-f", "--mount-proc"]
    env = cli_env(None)
    proc = subprocess.Popen([*prefix, sys.executable, "-c", BURN_PIDS + HOLD, str(target), "part"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("writing"), proc.stderr.read()
    assert int(line.split()[1]) > 300  # its pid in its namespace: one that is (most likely) no live pid here
    part = [name for name in _temporaries(tmp_path) if name.endswith(".part")]
    assert len(part) == 1
    assert sweep_stale(target) == []
    atomic_write_bytes(target, b"another writer here")  # sweeps too, then writes
    assert (tmp_path / part[0]).read_bytes() == b"being written"
    assert _finish(proc) == 0 and target.read_bytes() == b"being written"  # its rename found its file
    assert _temporaries(tmp_path) == []
    killed = subprocess.Popen([*prefix, sys.executable, "-c", BURN_PIDS + HOLD, str(target), "part"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert killed.stdout.readline().startswith("writing")
    assert _finish(killed, "die") != 0  # killed in its namespace: its lock is free
    assert len(_temporaries(tmp_path)) == 2
    assert len(sweep_stale(target)) == 2 and _temporaries(tmp_path) == []


# ----------------------------------------------------------------------------- every command's output files
# Issue 42: every command that writes a file treats one that exists the same way (refused without
# --overwrite, one line, exit 2, before any work) and writes through no symbolic link. Before,
# `eval --json`, `attend --html`, `attend`'s figures, `caption --attention-dir` and `sample --out`
# replaced existing files with exit code 0.
def _run(argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = zoo_main(argv)
    except SystemExit as exc:  # `zoo train` exits through LightningCLI
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


def _files(root) -> dict:
    """Every entry under root: a file's bytes, a link's target, a folder."""
    return {str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                       p.read_bytes() if p.is_file() else "folder") for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_model(monkeypatch):
    """Commands refused here must be refused before any model is built or loaded."""
    import zoo

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    for name in ("create_model", "load_checkpoint"):
        monkeypatch.setattr(zoo, name, never)


def _image(tmp_path):
    from PIL import Image

    Image.new("L", (28, 28), 100).save(tmp_path / "img.png")
    return tmp_path / "img.png"


#: (command line, the output file that exists): {t} is the test's folder, {img} an image in it
EXISTING_OUTPUTS = {
    "eval --json": (["eval", "--model", "ram_fmnist_centered", "--json", "{t}/r.json"], "r.json"),
    "attend --html": (["attend", "--model", "ram_fmnist_centered", "{img}", "--out", "{t}/fig", "--html",
                       "{t}/report.html"], "report.html"),
    "attend figure": (["attend", "--model", "ram_fmnist_centered", "{img}", "--out", "{t}/fig"], "fig/img_attend.png"),
    "caption --attention-dir": (["caption", "--model", "sat_soft_scenes", "{img}", "--attention-dir", "{t}/fig"],
                                "fig/img.png"),
    "sample --out": (["sample", "--model", "draw_fmnist_t16", "--out", "{t}/s.png"], "s.png"),
    "sample --gif": (["sample", "--model", "draw_fmnist_t16", "--out", "{t}/s.png", "--gif"], "s.gif"),
    "samples --out": (["samples", "--out", "{t}/fig"], "fig/vit_fmnist/test_00000.png"),  # refused: not empty
}


@pytest.mark.parametrize("case", sorted(EXISTING_OUTPUTS))
def test_an_existing_output_file_is_refused_without_overwrite(case, tmp_path, no_model, capsys):
    argv, existing = EXISTING_OUTPUTS[case]
    image = _image(tmp_path)
    (tmp_path / existing).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / existing).write_bytes(b"mine")
    before = _files(tmp_path)
    code, err = _run([a.format(t=tmp_path, img=image) for a in argv], capsys)
    assert code == 2 and len(err) == 1, err
    assert ("exists;" in err[0] or "not empty;" in err[0]) and "--overwrite" in err[0], err
    assert _files(tmp_path) == before


def test_predict_refuses_an_existing_file_or_a_link_in_one_line(tmp_path, capsys, monkeypatch):
    from conftest import REPO

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outside.jsonl").write_bytes(b"mine")
    (tmp_path / "preds.jsonl").symlink_to(tmp_path / "outside.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    before = _files(tmp_path)
    recipe = str(REPO / "configs/baseline/mlp_centered.yaml")
    for name, hint in [("outside.jsonl", "the file exists; --overwrite replaces it"),
                       ("preds.jsonl", "is a symbolic link"), ("dangling.jsonl", "is a symbolic link")]:
        code, err = _run(["train", "predict", "--config", recipe, "--predictions", name,
                          *([] if name == "outside.jsonl" else ["--overwrite"])], capsys)
        assert code == 2 and len(err) == 1 and hint in err[0], err
    assert _files(tmp_path) == before


def test_overwrite_replaces_the_named_outputs_and_nothing_else(tmp_path, capsys):
    image = _image(tmp_path)
    (tmp_path / "fig").mkdir()
    for name in ("fig/img_attend.png", "report.html", "fig/notes.txt"):
        (tmp_path / name).write_bytes(b"mine")
    code, err = _run(["attend", "--model", "ram_fmnist_centered", str(image), "--out", str(tmp_path / "fig"),
                      "--html", str(tmp_path / "report.html"), "--overwrite"], capsys)
    assert code == 0, err
    assert (tmp_path / "fig/img_attend.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "report.html").read_bytes().startswith(b"<!")
    assert (tmp_path / "fig/notes.txt").read_bytes() == b"mine"


#: (command line with --overwrite, the link it meets below or at its output): links are neither
#: written through nor replaced, whatever --overwrite says, and whatever they point at is untouched
LINKED_OUTPUTS = {
    **{name: case for name, case in EXISTING_OUTPUTS.items() if not name.startswith("samples")},
    "samples: a release's folder": (["samples", "--out", "{t}/fig"], "fig/ram_fmnist_centered"),
    "samples: a file": (["samples", "--out", "{t}/fig"], "fig/vit_fmnist/boxes.json"),
}


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file-outside", "dangling"])
@pytest.mark.parametrize("case", sorted(LINKED_OUTPUTS))
def test_no_writer_follows_or_replaces_a_link_in_its_output(case, dangling, tmp_path, no_model, capsys):
    argv, link = LINKED_OUTPUTS[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"mine")
    target = outside / "nowhere" if dangling else outside if "folder" in case else outside / "secret.txt"
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(target)
    image = _image(tmp_path)
    before = _files(tmp_path)
    code, err = _run([a.format(t=tmp_path, img=image) for a in argv] + ["--overwrite"], capsys)
    assert code == 2 and len(err) == 1 and "is a symbolic link" in err[0], err
    assert _files(tmp_path) == before


def test_card_out_as_a_link_replaces_the_card_it_names_and_keeps_the_link(tmp_path, capsys):
    """Before: the swap renamed the link itself, emptied the folder it named and exited 2 with
    `cannot use .link.<token>.tmp: Not a directory`."""
    real, link = tmp_path / "real", tmp_path / "link"
    assert _run(["card", "ram_fmnist_centered", "--out", str(real)], capsys)[0] == 0
    link.symlink_to("real")
    first = _files(real)
    code, err = _run(["card", "vit_fmnist", "--out", str(link)], capsys)  # an earlier card needs --overwrite
    assert code == 2 and len(err) == 1 and "holds an earlier card; --overwrite replaces it" in err[0], err
    assert _files(real) == first
    assert _run(["card", "vit_fmnist", "--out", str(link), "--overwrite"], capsys)[0] == 0
    assert link.is_symlink() and os.readlink(link) == "real"
    assert json.loads((real / "config.json").read_text())["name"] == "vit_fmnist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
    kept = (real / "README.md").read_bytes()
    for name, data in [("README.md", kept + b"\nMy notes on this model.\n"), ("model.safetensors", b"my weights")]:
        (real / name).write_bytes(data)  # not the card's file any more
        before = _files(tmp_path)
        code, err = _run(["card", "vit_fmnist", "--out", str(link), "--overwrite"], capsys)
        assert code == 2 and len(err) == 1 and f"{name} is not the file the earlier card wrote" in err[0], err
        assert _files(tmp_path) == before


def test_a_set_is_never_swapped_in_through_a_link(tmp_path):
    from zoo.guards.writes import swap_in_folder

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "mine.txt").write_text("mine")
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "staging").mkdir()
    with pytest.raises(UserError, match="is a symbolic link"):
        swap_in_folder(tmp_path / "staging", tmp_path / "link", lambda folder: None)
    assert os.readlink(tmp_path / "link") == "real" and (tmp_path / "real" / "mine.txt").read_text() == "mine"


# ----------------------------------------------------------------------------- an export's files, by content
def test_an_earlier_export_with_a_replaced_file_is_refused_naming_it(tmp_path, capsys):
    """Issue 42: a user replaced model.onnx of an earlier export (a quantised one, say); before, a
    re-export deleted it with exit code 0, since the files' sha256 values were never compared."""
    from zoo.weights import hub

    weights = tmp_path / "w.safetensors"
    model = Classifier(arch="mlp", hidden=[4])
    hub.save_release(model, model.zoo_config(), weights)
    target = tmp_path / "exported"
    assert _run(["export", "--checkpoint", str(weights), "--out", str(target)], capsys)[0] == 0
    code, err = _run(["export", "--checkpoint", str(weights), "--out", str(target)], capsys)
    assert code == 2 and len(err) == 1 and "holds an earlier export; --overwrite replaces it" in err[0], err
    assert _run(["export", "--checkpoint", str(weights), "--out", str(target), "--overwrite"], capsys)[0] == 0
    (target / "model.onnx").write_bytes(b"my quantised model")
    before = _files(tmp_path)
    for overwrite in ([], ["--overwrite"]):
        code, err = _run(["export", "--checkpoint", str(weights), "--out", str(target), *overwrite], capsys)
        assert code == 2 and len(err) == 1, err
        assert "model.onnx is not the file the earlier export wrote (its sha256 is not the one export.json " \
               "records" in err[0], err
        assert _files(tmp_path) == before
    with pytest.raises(UserError, match="model.onnx is not the file the earlier export wrote"):
        _small_export(target)  # the Python API proves the same
    assert _files(tmp_path) == before


def test_an_earlier_export_whose_manifest_was_edited_is_refused(tmp_path, capsys):
    """export.json records a digest of itself: class names edited for a deployment are not the
    zoo's manifest any more, and a re-export does not replace them."""
    target = tmp_path / "exported"
    _small_export(target)
    manifest = json.loads((target / "export.json").read_text())
    manifest["class_names"] = ["mine"] * 10
    (target / "export.json").write_text(json.dumps(manifest, indent=2))
    before = _files(tmp_path)
    with pytest.raises(UserError, match="export.json is not the one the earlier export wrote"):
        _small_export(target, seed=1)
    assert _files(tmp_path) == before
