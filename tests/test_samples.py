"""`zoo samples --out DIR`: example inputs for every family, from the data its releases (or, without
one, its first recipe) were trained on: the first test images at the model's input size, which
`zoo attend` / `zoo caption` take as they are, with boxes.json in the form `zoo attend --boxes`
reads. Bad input is one line and exit 2, and nothing is written."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import zoo
from zoo import registry
from zoo.commands import cli, samples
from zoo.models.card import families


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("samples") / "samples"
    assert cli.main(["samples", "--out", str(out), "--n", "2"]) == 0
    return out


def test_every_family_gets_test_images_of_its_model_input_size_and_their_boxes(written, capsys):
    chosen = samples.folders()
    entries = registry.find_entries()
    with_entries = {registry.family_of(e) for e in entries.values()} & set(families())
    assert {family for family, _ in chosen.values()} == with_entries  # every family that has a recipe
    assert set(zoo.list_models(pretrained=True)) <= set(chosen)  # every release
    assert sorted(p.name for p in written.iterdir()) == sorted(chosen)
    for name, (family, data) in chosen.items():
        folder = written / name
        boxes = json.loads((folder / "boxes.json").read_text())
        assert sorted(boxes) == ["test_00000.png", "test_00001.png"] == sorted(p.name for p in folder.glob("*.png"))
        if entries[name].weights:  # what the release's own preprocessing takes, unresized
            spec = zoo.get_weights(name).meta["preprocessing"]
            size, chans = tuple(spec["size"]), spec["in_chans"]
        else:
            cls = registry.resolve_class(data["class_path"], "data")
            size, chans = cls.image_size_for(**cls.arguments(**(data.get("init_args") or {}))), cls.image_chans
        for file, entry in boxes.items():
            image = Image.open(folder / file)
            assert (image.height, image.width) == size and len(image.getbands()) == chans, (name, file)
            assert entry["boxes"], (name, file)
            for x0, y0, x1, y1 in entry["boxes"]:
                assert 0 <= x0 < x1 <= size[1] and 0 <= y0 < y1 <= size[0], (name, file)
            assert len(entry.get("box_words", entry["boxes"])) == len(entry["boxes"])


@pytest.mark.parametrize("name", ["ram_fmnist_centered", "backbone_fmnist_stem"])
def test_the_few_examples_are_the_test_split_the_release_was_scored_on(written, name):
    """`few_examples` builds little else, and leaves the first test examples as they are."""
    full = registry.build_datamodule(zoo.create_model(name)).boxed_examples("test", 2)
    for i in range(2):
        pixels = np.asarray(Image.open(written / name / f"test_{i:05d}.png"), dtype=np.float32) / 255
        expected = full["images"][i].permute(1, 2, 0).squeeze(-1).numpy()
        assert np.array_equal(pixels, expected)
        kept = [box for box in full["targets"][i].tolist() if box[0] >= 0]
        assert json.loads((written / name / "boxes.json").read_text())[f"test_{i:05d}.png"]["boxes"] == kept


def test_zoo_attend_scores_the_samples_with_their_boxes(written, tmp_path, capsys):
    folder = written / "ram_fmnist_cluttered60"
    images = sorted(str(p) for p in folder.glob("*.png"))
    assert cli.main(["attend", "--model", "ram_fmnist_cluttered60", *images, "--out", str(tmp_path / "attend"),
                     "--boxes", str(folder / "boxes.json")]) == 0
    captured = capsys.readouterr()
    assert "boxes: 2 image(s), 16 step(s)" in captured.out and "resized" not in captured.err


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_folder_that_is_not_empty_is_refused_unless_overwrite(tmp_path, monkeypatch, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert cli.main(["samples", "--out", str(out)]) == 2
    assert _one_line_error(capsys) == f"zoo samples: error: --out {out}: not empty; give --overwrite to write into it, or name a new folder"
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    one = {"ram_fmnist_centered": samples.folders()["ram_fmnist_centered"]}
    monkeypatch.setattr(samples, "folders", lambda: one)
    assert cli.main(["samples", "--out", str(out), "--n", "1", "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "ram_fmnist_centered" / "test_00000.png").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--n", "0"], "--n must be 1 to 100, got 0"),
    (["--n", "101"], "--n must be 1 to 100, got 101"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    assert cli.main(["samples", "--out", str(tmp_path / "s"), *argv]) == 2
    assert _one_line_error(capsys) == f"zoo samples: error: {message}"
    assert not (tmp_path / "s").exists()


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert cli.main(["samples", "--out", str(tmp_path / "file")]) == 2
    assert _one_line_error(capsys) == f"zoo samples: error: --out {tmp_path / 'file'}: exists and is not a directory"


def test_without_fashion_mnist_it_says_where_it_looked(tmp_path, monkeypatch, capsys):
    import torchvision.datasets

    from zoo.data import fashion_mnist

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "no-debian")

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    assert cli.main(["samples", "--out", "samples"]) == 2
    progress, err = capsys.readouterr().err.strip().splitlines()  # what it was doing, then the error's one line
    assert progress.startswith("zoo samples: building the test data of ")
    assert err.startswith("zoo samples: error: Fashion-MNIST not found (looked in ") and str(tmp_path / "empty") in err
    assert not list(tmp_path.glob("samples/*/*.png"))


def test_help_tells_samples_from_sample(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "write example inputs per family" in listed and "not zoo sample" in listed
    assert "from DRAW (inputs to try: zoo samples)" in listed


def test_model_writes_only_that_release_or_recipes_folder(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli.main(["samples", "--out", str(out), "--model", "ram_fmnist_centered", "--n", "1"]) == 0
    assert [p.relative_to(out).as_posix() for p in sorted(out.rglob("*"))] == [
        "ram_fmnist_centered", "ram_fmnist_centered/boxes.json", "ram_fmnist_centered/test_00000.png"]
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{out / 'ram_fmnist_centered'}: 1 test images")
    # before the seconds of imports and data building: a line on stderr (then one per folder on stdout)
    assert captured.err.splitlines() == ["zoo samples: building the test data of 1 model(s), a line per folder as "
                                         "it is written"]


def test_an_unknown_model_is_one_line_with_the_names_it_may_mean(tmp_path, capsys):
    assert cli.main(["samples", "--out", str(tmp_path / "s"), "--model", "ram_fmnist_centred"]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("zoo samples: error: unknown model 'ram_fmnist_centred'; did you mean ram_fmnist_centered")
    assert not (tmp_path / "s").exists()
