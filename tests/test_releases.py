"""Every release keeps its promise (the model of torchvision's `test_schema_meta_validation` and
expected-output tests): its manifest entry names one committed recipe that trains exactly these
weights with the plain command, its sha256 and metrics are those of the file and of the results
JSON it names, and its output on a fixed input is the stored one."""
from __future__ import annotations

import copy
import json

import pytest

import zoo
from conftest import REPO
from tools import release
from zoo.models.base import ZooModule

MANIFEST = json.loads((REPO / "weights" / "MANIFEST.json").read_text())


@pytest.fixture(autouse=True)
def shipped_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(REPO / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_release_is_its_recipe(name):
    assert release.check_entry(name, MANIFEST[name]) == []
    entry = MANIFEST[name]
    assert (REPO / "weights" / entry["file"]).stat().st_size < 10e6, "a release stays small enough to ship in the repository (10 MB)"
    meta = entry["metadata"]
    assert meta["remake"] == f"python scripts/release.py --remake {name}"
    assert any(k.startswith("test/") for k in meta["metrics"]) and meta["device"]
    assert {"in_chans", "size", "resize"} <= set(meta["preprocessing"])


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_release_gives_its_golden_output(name):
    model = zoo.create_model(name, pretrained=True)
    assert isinstance(model, ZooModule) and model.family == MANIFEST[name]["config"]["family"]
    expected = json.loads(release.golden_path(name).read_text())
    assert release.golden_mismatch(expected, release.golden_output(model)) is None
    # and the weights file itself knows how its input is prepared
    assert zoo.get_weights(name).transforms() == zoo.preprocessing(model)


def test_a_drifting_entry_fails_with_one_line_naming_it_and_the_field():
    name = "ram_fmnist_centered"
    cases = {
        "recipe": ({"metadata": {"recipe": "configs/ram/gone.yaml"}}, "ram_fmnist_centered: recipe: "),
        "sha256": ({"sha256": "0" * 64}, "ram_fmnist_centered: sha256: the manifest says 000000000000"),
        "metrics": ({"metadata": {"metrics": {"test/acc": 0.99}}}, "ram_fmnist_centered: metrics.test/acc: manifest 0.99"),
        "config": ({"config": {"init_args": {"optimization": {"lr": 0.5}}}},
                   "ram_fmnist_centered: model.init_args.optimization.lr: weights 0.5, recipe 0.001"),
        "command": ({"metadata": {"command": "python train.py fit --config configs/ram/fmnist_centered.yaml "
                                             "--seed_everything 0 --trainer.max_epochs 3"}},
                    "ram_fmnist_centered: command: "),
    }
    for field, (change, message) in cases.items():
        entry = copy.deepcopy(MANIFEST[name])
        for key, value in change.items():
            if isinstance(value, dict):
                for inner, v in value.items():
                    if isinstance(v, dict):
                        entry[key][inner] = {**entry[key][inner], **v}
                    else:
                        entry[key][inner] = v
            else:
                entry[key] = value
        problems = release.check_entry(name, entry)
        assert problems and any(p.startswith(message) for p in problems), (field, problems)
        assert all("\n" not in p for p in problems)


def test_recipe_drift_after_training_is_caught():
    """A trainer setting edited after a run is invisible in the weights; the recipe as it was at
    the training commit shows it (here: cluttered100_classifier's lr, changed after commit aebd42d
    and passed on that run's command line, so the run itself is the recipe's)."""
    recipe = "configs/draw/cluttered100_classifier.yaml"
    assert release.recipe_drift(recipe, "aebd42d050caa7b80da82cbca1d61a3392e17fc1") == \
        ["model.init_args.lr: 0.001 when trained, 0.0005 in the recipe now"]
    assert release.recipe_drift(recipe, "aebd42d050caa7b80da82cbca1d61a3392e17fc1",
                                ["--model.init_args.lr", "0.0005"]) == []
    assert release.override_problems(["--trainer.max_epochs", "3"], release.load_recipe(recipe)) == \
        ["trained with --trainer.max_epochs 3, which the recipe does not say"]


def test_golden_mismatch_names_what_changed():
    out = {"kind": "logits", "shape": [1, 2], "values": [0.5, 1.0]}
    assert release.golden_mismatch(out, out) is None
    assert "differ by up to 0.01" in release.golden_mismatch(out, {**out, "values": [0.5, 1.01]})
    words = {"kind": "caption", "words": [["a", "bag"]], "alpha": [[0.5, 0.5]]}
    assert "caption" in release.golden_mismatch(words, {**words, "words": [["a", "shirt"]]})


def test_a_recipes_backbone_is_compared_field_by_field():
    """A release records the resolved backbone without its pretrained source: the recipe's
    `pretrained: NAME` is not a mismatch, fields the recipe leaves out are not either, a field it
    gives that the weights contradict is."""
    recipe = release.load_recipe("configs/sat/soft_scenes.yaml")
    weights = copy.deepcopy(json.loads((REPO / "weights" / "MANIFEST.json").read_text())["sat_soft_scenes"]["config"])
    assert release.recipe_mismatches(weights, recipe) == []
    weights["init_args"]["backbone"]["channels"] = [32, 64, 128, 64]
    (problem,) = release.recipe_mismatches(weights, recipe)
    assert problem.startswith("model.init_args.backbone.channels: weights [32, 64, 128, 64], recipe [32, 64, 128, 128]")
