"""Sets of files written as sets: an export, and a release (weights, golden output, manifest). A kill
-9 at any moment leaves the old set or the new one, whole; temporaries are swept by the one sweeper."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, cli_env
from zoo.guards.errors import UserError
from zoo.weights.export import export, load_export

EXPORT = """
import sys, torch
from test_sets import captioner
from zoo.weights.export import export
export(captioner(int(sys.argv[2])), sys.argv[1])
"""


def captioner(seed: int):
    """A tiny captioner: its export is a set of three programs."""
    from zoo.data.vocab import SPECIALS
    from zoo.models.captioner import Captioner

    torch.manual_seed(seed)
    return Captioner(vocab=[*SPECIALS, "a", "red", "shirt"], image_size=[32, 32],
                     decoder=dict(embed_dim=8, hidden_dim=16, attention_dim=8),
                     backbone={"kind": "stem", "in_chans": 3, "channels": [8], "strides": [8]}, decode_max_len=4).eval()


def _export(target, seed: int, kill_after: int | None = None) -> int:
    """An export in a process of its own (a user's next command), killed (-9) after its `kill_after`-th file."""
    env = cli_env(None, **({"ZOO_TEST_KILL_EXPORT_AFTER": str(kill_after)} if kill_after else {}))
    return subprocess.run([sys.executable, "-c", EXPORT, str(target), str(seed)], env=env, cwd=target.parent,
                          capture_output=True, timeout=300).returncode


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [1, 3])  # after the first program; after the last, before the swap
def test_a_killed_export_leaves_the_earlier_set_whole(tmp_path, kill_after):
    target = tmp_path / "exported"
    export(captioner(0), target)  # the earlier set, written in this process
    before = load_export(target)
    assert sorted(before["files"]) == ["decoder_step.onnx", "encoder.onnx", "greedy.onnx"]
    assert before["vocabulary"][:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert before["special_tokens"] == {"pad": 0, "start": 1, "end": 2, "unk": 3}
    assert before["preprocessing"]["size"] == [32, 32]
    assert _export(target, seed=1, kill_after=kill_after) == -9  # killed after writing `kill_after` files
    assert load_export(target)["files"] == before["files"]  # the old set, every file of it
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".exported.")]
    assert stale  # the killed writer's half set, under a temporary name
    assert _export(target, seed=1) == 0  # the next export sweeps it and swaps the new set in
    after = load_export(target)
    assert after["files"] != before["files"]
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]


def test_a_mixed_set_is_refused(tmp_path):
    from zoo.models.baselines import Classifier

    target = tmp_path / "out"
    export(Classifier(arch="mlp", hidden=[4]).eval(), target)
    manifest = load_export(target)
    assert manifest["class_names"] is None and manifest["family"] == "baseline"
    import onnx

    props = {p.key: p.value for p in onnx.load(str(target / "model.onnx")).metadata_props}
    assert json.loads(props["attention_zoo"])["preprocessing"]["size"] == [28, 28]
    torch.manual_seed(1)
    other = tmp_path / "other"
    export(Classifier(arch="mlp", hidden=[4]).eval(), other)
    (target / "model.onnx").write_bytes((other / "model.onnx").read_bytes())  # one file from another export
    with pytest.raises(UserError, match="model.onnx is not the file this export's export.json names"):
        load_export(target)


def test_an_export_into_someone_elses_folder_is_refused_before_any_work(tmp_path, capsys):
    from zoo.commands.cli import main

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"mine")
    code = main(["export", "--model", "vit_fmnist", "--out", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "holds other files (not an earlier export)" in err[0]
    assert sorted(p.name for p in folder.iterdir()) == ["holiday.jpg"]
    (tmp_path / "file").write_text("")
    assert main(["export", "--model", "vit_fmnist", "--out", str(tmp_path / "file")]) == 2


def test_an_earlier_export_is_replaced_as_a_whole(tmp_path):
    from zoo.models.baselines import Classifier

    target = tmp_path / "out"
    export(Classifier(arch="mlp", hidden=[4]).eval(), target)
    first = load_export(target)["files"]
    torch.manual_seed(3)
    export(Classifier(arch="mlp", hidden=[4]).eval(), target)
    assert load_export(target)["files"] != first
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no old set or temporary left behind


# ----------------------------------------------------------------------------- releases
RELEASE = """
import sys
sys.argv = ["release.py", *sys.argv[1:]]
import runpy
runpy.run_path(sys.argv.pop(1), run_name="__main__")
"""
RELEASE = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("release_script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
from zoo.models.baselines import Classifier
torch.manual_seed(int(sys.argv[2]))
model = Classifier(arch="mlp", hidden=[8])
probe = {"config": model.zoo_config(), "metadata": {"recipe": "configs/baseline/mlp_centered.yaml", "seed": 0}}
script.write_release("baseline_mlp_centered", model, probe)
"""


def _release(weights, seed: int, kill_at: str | None = None) -> int:
    env = cli_env(None, ZOO_WEIGHTS_DIR=str(weights), **({"ZOO_TEST_KILL_RELEASE_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, "-c", RELEASE, str(REPO / "scripts" / "release.py"), str(seed)],
                          env=env, capture_output=True, timeout=300).returncode


def _usable(weights, monkeypatch) -> dict:
    """The release loads (its sha256 checks) and gives its own golden output; returns its entry."""
    import zoo
    from tools import release
    from zoo.weights import hub

    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(weights))
    model = zoo.create_model("baseline_mlp_centered", pretrained=True)
    expected = json.loads(release.golden_path("baseline_mlp_centered").read_text())
    assert release.golden_mismatch(expected, release.golden_output(model)) is None
    return hub.manifest()["baseline_mlp_centered"]


@pytest.mark.slow
def test_a_release_killed_at_any_step_leaves_a_usable_release(tmp_path, monkeypatch):
    weights = tmp_path / "weights"
    (weights / "golden").mkdir(parents=True)
    (weights / "MANIFEST.json").write_text("{}")
    assert _release(weights, seed=0) == 0
    first = _usable(weights, monkeypatch)
    assert _release(weights, seed=1, kill_at="staged") == -9  # new files written, manifest not yet
    assert _usable(weights, monkeypatch) == first
    assert _release(weights, seed=2, kill_at="committed") == -9  # manifest switched, old files not yet removed
    third = _usable(weights, monkeypatch)
    assert third["sha256"] != first["sha256"]
    assert _release(weights, seed=3) == 0  # sweeps what the killed runs left
    fourth = _usable(weights, monkeypatch)
    assert sorted(p.name for p in weights.iterdir()) == sorted([".release.lock", "MANIFEST.json", "golden",
                                                               fourth["file"]])
    assert sorted(p.name for p in (weights / "golden").iterdir()) == [fourth["file"].replace(".safetensors", ".json")]
