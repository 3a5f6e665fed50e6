"""Issue 34, item 5: deployment parity. export.json states how a file becomes pixels (alpha, colour,
orientation), and the torch-free example (docs/examples/onnx_caption.py) follows it: its pixels are
zoo's, pixel for pixel, on opaque images and on transparent ones whose hidden pixels are black or
white, for the preprocessing of every exporting family and an ImageNet-style crop."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO
from zoo.guards.errors import UserError
from zoo.guards.files import load_image
from zoo.models.card import families
from zoo.preprocess import Preprocessing
from zoo.weights.export import describe, preprocessing_record


def _example():
    spec = importlib.util.spec_from_file_location("onnx_caption", REPO / "docs/examples/onnx_caption.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records() -> dict[str, dict]:
    """export.json's preprocessing of each family that exports, and of a centre-crop model."""
    records = {}
    for name, cls in families().items():
        if cls.card.output == "sample" or not cls.card.tiny:
            continue
        torch.manual_seed(0)
        records[name] = describe(cls(**next(iter(cls.card.tiny.values()))).eval(), "onnx")["preprocessing"]
    records["crop"] = preprocessing_record(Preprocessing(3, (24, 24), "crop", 28))
    return records


RECORDS = _records()


def _images(size: tuple[int, int], tmp_path, grey: bool = False) -> dict:
    """Opaque, and transparent with hidden black or white pixels (half see-through, a quarter
    fully), as RGBA, LA and palette PNGs; `grey`: R = G = B (what a 1-channel model of the
    "exact" rule takes: zoo refuses colour there)."""
    rng = np.random.default_rng(0)
    h, w = size
    colour = rng.integers(0, 256, (h, w, 1 if grey else 3), dtype=np.uint8).repeat(3 if grey else 1, -1)
    alpha = np.full((h, w), 255, np.uint8)
    alpha[: h // 2] = 128
    alpha[:, : w // 4] = 0
    paths = {"opaque": Image.fromarray(colour, "RGB")}
    for hidden, value in (("black", 0), ("white", 255)):
        pixels = np.where(alpha[..., None] == 0, np.uint8(value), colour)
        paths[f"transparent-{hidden}"] = Image.fromarray(np.dstack([pixels, alpha]), "RGBA")
        grey = np.where(alpha == 0, np.uint8(value), colour[..., 0])
        paths[f"transparent-{hidden}-grey"] = Image.fromarray(np.dstack([grey, alpha]), "LA")
    palette = Image.fromarray(colour, "RGB").quantize(16)
    palette.info["transparency"] = 0
    paths["palette-transparent"] = palette
    for name, image in list(paths.items()):
        paths[name] = tmp_path / f"{name}.png"
        image.save(paths[name])
    return paths


def test_export_json_states_the_alpha_and_colour_rules():
    for name, record in RECORDS.items():
        assert record["alpha"] == "composite on black", name
        assert record["colour"].startswith("RGB" if record["in_chans"] == 3 else "L"), name
        assert Preprocessing.from_dict(record).size == tuple(record["size"])


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_the_torch_free_example_prepares_images_as_zoo_does(name, tmp_path):
    record, example = RECORDS[name], _example()
    size = tuple(record["size"]) if record["resize"] == "exact" else (37, 53)
    spec = Preprocessing.from_dict(record)
    for kind, path in _images(size, tmp_path, grey=record["in_chans"] == 1).items():
        ours = example.prepare(str(path), record)[0]
        theirs = spec(load_image(path)).numpy()
        assert ours.shape == theirs.shape, kind
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{name}: {kind}")
    # the transparent images' hidden colour makes no difference to either
    white = example.prepare(str(tmp_path / "transparent-white.png"), record)
    assert np.array_equal(white, example.prepare(str(tmp_path / "transparent-black.png"), record))


def test_the_example_refuses_an_alpha_rule_it_does_not_follow(tmp_path):
    record = {**RECORDS["crop"], "alpha": "composite on white"}
    path = _images((8, 8), tmp_path)["opaque"]
    with pytest.raises(UserError, match="preprocessing.alpha 'composite on white' is not a rule this example follows"):
        _example().prepare(str(path), record)
