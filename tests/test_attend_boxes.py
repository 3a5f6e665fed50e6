"""`zoo attend --boxes`: keys by path, by the same file and by basename, the scene export's
references.json as it is, boxes in the original image's pixels mapped by the resize rule, a score
summary and a line on the images without boxes; bad files in one line naming the image."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.commands.cli import main
from zoo.preprocess import Preprocessing


def _white_box(h: int, w: int, box: tuple[int, int, int, int]) -> Image.Image:
    pixels = np.zeros((h, w), np.uint8)
    x0, y0, x1, y1 = box
    pixels[y0:y1, x0:x1] = 255
    return Image.fromarray(pixels)


@pytest.mark.parametrize("spec, size, box", [
    (Preprocessing(1, (28, 28), "squash"), (56, 84), (21, 14, 63, 42)),
    (Preprocessing(1, (28, 28), "exact"), (28, 28), (3, 5, 20, 9)),
    (Preprocessing(1, (32, 32), "crop", 40), (80, 120), (40, 20, 80, 60)),
    (Preprocessing(1, (32, 32), "crop", 40), (120, 80), (10, 0, 60, 70)),  # cut by the crop
])
def test_boxes_map_to_where_the_preparation_puts_their_pixels(spec, size, box):
    """The mapped box is the bounding box of the box's white pixels in the prepared image."""
    prepared = spec(_white_box(*size, box))[0]
    ys, xs = torch.nonzero(prepared > 0.5, as_tuple=True)
    seen = [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
    mapped = spec.map_boxes(torch.tensor([box], dtype=torch.float32), size)[0].tolist()
    assert all(abs(a - b) <= 1 for a, b in zip(mapped, seen)), (mapped, seen)


@pytest.fixture(scope="module")
def shirt(tmp_path_factory):
    """A 56x84 (H x W) grey image for vit_fmnist (28x28, squash): the model input is half its height
    and a third of its width."""
    folder = tmp_path_factory.mktemp("photos")
    path = folder / "shirt.png"
    _white_box(56, 84, (21, 14, 63, 42)).save(path)
    return path


def _attend(args, capsys, cwd=None):
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        code = main(["attend", "--model", "vit_fmnist", *args])
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("key", ["absolute", "dot", "basename", "as given"])
def test_keys_name_an_image_by_path_same_file_or_basename(shirt, tmp_path, capsys, key):
    keys = {"absolute": str(shirt.resolve()), "dot": "./shirt.png", "basename": "shirt.png", "as given": "shirt.png"}
    boxes = tmp_path / "boxes.json"  # not beside the image: a basename key matches by name alone
    boxes.write_text(json.dumps({keys[key]: [[21, 14, 63, 42]]}))
    given = "shirt.png" if key == "as given" else str(shirt)
    code, out, err = _attend([given, "--out", str(tmp_path / "out"), "--boxes", str(boxes), "--json"], capsys,
                             cwd=shirt.parent if key in ("dot", "as given") else tmp_path)
    assert code == 0, err
    (record,) = json.loads(out)
    targets = record["target_boxes"]
    assert targets["original"] == [[21, 14, 63, 42]]
    assert targets["input"] == [[7.0, 7.0, 21.0, 21.0]]  # x by 28/84, y by 28/56
    assert "model input pixels" in targets["frame"] and "squash" in targets["frame"]
    assert all("pointing" in step for step in record["steps"])
    (line,) = [line for line in err.splitlines() if "boxes:" in line]
    assert f"1 image(s), {len(record['steps'])} step(s): pointing" in line


def test_the_scene_exports_references_json_is_read_as_it_is(tmp_path, capsys):
    from test_scenes import make_dm

    paths = make_dm(tmp_path / "cache").export_pngs("test", tmp_path / "pngs", 2)
    references = json.loads((tmp_path / "pngs" / "references.json").read_text())
    code = main(["attend", "--model", "sat_soft_scenes", *map(str, paths), "--out", str(tmp_path / "out"),
                 "--boxes", str(tmp_path / "pngs" / "references.json"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = json.loads(captured.out)
    for path, record in zip(paths, records):
        assert record["target_boxes"]["original"] == references[path.name]["boxes"]
        assert all("mass_in_box" in step for step in record["steps"])
    assert "no boxes" not in captured.err


def test_images_without_boxes_are_counted_in_one_line(shirt, tmp_path, capsys):
    other = tmp_path / "other.png"
    Image.open(shirt).save(other)
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({"elsewhere/nothing.png": [[0, 0, 5, 5]]}))
    code, out, err = _attend([str(shirt), str(other), "--out", str(tmp_path / "out"), "--boxes", str(boxes)], capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("zoo attend: boxes")]
    assert lines == [f"zoo attend: boxes: 2 of 2 image(s) have no boxes in the file, not scored ({shirt}, {other})"]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('[["shirt.png"]]', "expected an object, got list"),
    ('{"shirt.png": {"box_words": []}}', "shirt.png: expected a list of [x0, y0, x1, y1] boxes"),
    ('{"shirt.png": [[1, 2, 3]]}', "shirt.png: a box is four numbers"),
    ('{"shirt.png": [[0, 0, 85, 10]]}', "shirt.png: box [0, 0, 85, 10] is not inside the 84x56 image"),
    ('{"shirt.png": [[10, 10, 5, 20]]}', "is not inside the 84x56 image"),
])
def test_bad_boxes_are_one_line_naming_the_image_exit_2(shirt, tmp_path, capsys, content, message):
    boxes = tmp_path / "boxes.json"
    boxes.write_text(content)
    code, out, err = _attend([str(shirt), "--out", str(tmp_path / "out"), "--boxes", str(boxes)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_basename_two_images_share_is_refused(shirt, tmp_path, capsys):
    twin = tmp_path / "twin" / "shirt.png"
    twin.parent.mkdir()
    Image.open(shirt).save(twin)
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({"shirt.png": [[0, 0, 5, 5]]}))
    code, out, err = _attend([str(shirt), str(twin), "--out", str(tmp_path / "out"), "--boxes", str(boxes)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "key 'shirt.png' names 2 images" in lines[0], lines
