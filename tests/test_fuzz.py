"""Fuzzing the zoo's ten kinds of untrusted input (tests/fuzzing.py has the property and the
mutations): each test starts from a real file, mutates it, reads it the way the zoo does, and checks
that the result is correct or one line of UserError, within the time cap, the memory budget and the
case's folder, with no code run.

`make test` runs a short seeded run (ZOO_FUZZ_EXAMPLES per kind, default 40: 400 cases in
about a minute on 2 cores) and replays every input saved in tests/fuzz_corpus/. `make fuzz`
(tools/fuzz.py) runs the same tests with fresh seeds for FUZZ_SECONDS and saves what fails.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing
from fuzzing import Sandbox, dumps, holds, mutated_bytes, mutated_tree

EXAMPLES = int(os.environ.get("ZOO_FUZZ_EXAMPLES", "40"))
#: seeded (derandomized) in `make test`; tools/fuzz.py sets ZOO_FUZZ_RANDOM=1 for fresh draws
RANDOM = os.environ.get("ZOO_FUZZ_RANDOM") == "1"
FUZZ = settings(max_examples=EXAMPLES, derandomize=not RANDOM, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SEEDS = fuzzing.TESTS / "fuzz_seeds"


@contextlib.contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_world(root: Path) -> dict:
    """The real files every kind starts from (written under `root`), and a counter of cases."""
    from zoo.data.scene_generation import generate_scenes
    from zoo.models.baselines import Classifier
    from zoo.weights import hub

    torch.manual_seed(0)
    model = Classifier(arch="mlp", hidden=[8])
    config = {**model.zoo_config(), "data": {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
                                             "init_args": {"variant": "centered", "batch_size": 8}}}
    hub.save_release(model, config, root / "tiny.safetensors", meta={"preprocessing": {"size": [28, 28]}})
    torch.save({"state_dict": model.state_dict(), "zoo": config, "epoch": 0, "global_step": 3,
                "hyper_parameters": dict(model.hparams)}, root / "tiny.ckpt")
    rng = np.random.default_rng(0)
    items = (rng.random((30, 28, 28)) * 255).astype(np.uint8)
    scenes = generate_scenes(items, np.arange(30) % 10, np.arange(30), 8, seed=0, split="train")
    (root / "scenes.npz").write_bytes(scenes.to_bytes())
    return {"root": root, "config": config, "safetensors": (root / "tiny.safetensors").read_bytes(),
            "ckpt": (root / "tiny.ckpt").read_bytes(), "scenes": (root / "scenes.npz").read_bytes(),
            "items": items, "count": [0]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("fuzz"))


def sandbox(world) -> Sandbox:
    """A fresh folder for the next case (the previous case's is removed: its checks are done)."""
    cases = world["root"] / "cases"
    if cases.exists():
        shutil.rmtree(cases)
    world["count"][0] += 1
    case = cases / f"{world['count'][0]:05d}"
    case.mkdir(parents=True)
    return Sandbox(case, world["root"])


def _model_is_whole(model) -> None:
    from zoo.models.base import ZooModule

    assert isinstance(model, ZooModule)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ----------------------------------------------------------------------------- 1. .safetensors
@st.composite
def safetensors_inputs(draw, world):
    seed = world["safetensors"]
    if draw(st.booleans()):
        return draw(mutated_bytes(seed))
    header, payload = fuzzing.split_safetensors(seed)  # the header's shapes, dtypes, offsets
    return fuzzing.safetensors_bytes(draw(mutated_tree(header, world["root"] / "MARKER")), payload)


def check_safetensors(world, data: bytes) -> str:
    import zoo

    box = sandbox(world)
    path = box.root / "w.safetensors"
    path.write_bytes(data)
    return holds("safetensors", data, box, lambda: zoo.load_checkpoint(path), _model_is_whole)



# ----------------------------------------------------------------------------- 2. Lightning .ckpt
@st.composite
def ckpt_inputs(draw, world):
    seed = world["ckpt"]
    how = draw(st.sampled_from(["bytes", "members", "content"]))
    if how == "bytes":
        return draw(mutated_bytes(seed))
    if how == "members":  # one record's bytes changed, dropped or repeated, the zip rewritten whole
        members = fuzzing.zip_members(seed)
        name = draw(st.sampled_from(sorted(members)))
        action = draw(st.sampled_from(["mutate", "drop", "grow"]))
        if action == "mutate":
            members[name] = draw(mutated_bytes(members[name]))
        elif action == "drop":
            del members[name]
        else:
            members[name] = members[name] * draw(st.integers(2, 100))
        return fuzzing.rezip(members)
    checkpoint = torch.load(io.BytesIO(seed), weights_only=True)
    for key in ("zoo", "hyper_parameters"):  # a pickle holds what JSON cannot: a 5,000-digit integer
        checkpoint[key] = fuzzing.with_big_ints(draw(mutated_tree(checkpoint[key], world["root"] / "MARKER")))
    buffer = io.BytesIO()
    try:
        torch.save(checkpoint, buffer)
    except (ValueError, RecursionError, OverflowError):
        return seed
    return buffer.getvalue()


def check_ckpt(world, data: bytes) -> str:
    import zoo

    box = sandbox(world)
    path = box.root / "w.ckpt"
    path.write_bytes(data)
    return holds("ckpt", data, box, lambda: zoo.load_checkpoint(path), _model_is_whole)



# ----------------------------------------------------------------------------- 3. YAML recipes
RECIPE = fuzzing.REPO / "configs" / "baseline" / "mlp_centered.yaml"


@st.composite
def recipe_inputs(draw, world):
    seed = RECIPE.read_bytes()
    how = draw(st.sampled_from(["bytes", "tree", "anchors"]))
    if how == "bytes":
        return draw(mutated_bytes(seed))
    tree = draw(mutated_tree(yaml.safe_load(seed), world["root"] / "MARKER"))
    try:
        text = yaml.safe_dump(tree)
    except (yaml.YAMLError, RecursionError):
        return seed
    if how == "anchors":  # a billion-leaf alias tree under some key
        lines = ["z: ", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, draw(st.integers(2, 12)))]
        text = "\n".join(lines) + "\n" + text
    return text.encode()


def check_recipe(world, data: bytes) -> str:
    from zoo import registry
    from zoo.training.recipe_args import check_config_files

    box = sandbox(world)
    configs = box.root / "configs"
    (configs / "fuzz").mkdir(parents=True)
    (configs / "fuzz" / "recipe.yaml").write_bytes(data)

    def read():
        check_config_files(["--config", str(configs / "fuzz" / "recipe.yaml")])
        with env(ZOO_CONFIG_DIR=configs):
            if "fuzz_recipe" not in registry.list_models():
                raise fuzzing.UserError("not a registry entry")  # skipped with a warning: a correct result
            model = registry.create_model("fuzz_recipe")
            registry.build_datamodule(model)
            return model

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return holds("recipe", data, box, read, _model_is_whole)



# ----------------------------------------------------------------------------- 4. JSON in weights files
@st.composite
def weights_config_inputs(draw, world):
    return dumps(draw(mutated_tree(world["config"], world["root"] / "MARKER")))


def check_weights_config(world, data: bytes) -> str:
    import zoo
    from safetensors.torch import save_file

    header, _ = fuzzing.split_safetensors(world["safetensors"])
    state = zoo.weights.hub.load_weights(world["root"] / "tiny.safetensors")[0]
    box = sandbox(world)
    path = box.root / "w.safetensors"
    save_file(state, str(path), metadata={"zoo_config": data.decode("utf-8", "replace")})

    def read():
        model = zoo.load_checkpoint(path)
        if getattr(model, "_zoo_data_config", None):
            zoo.build_datamodule(model)
        return model

    return holds("weights_config", data, box, read, _model_is_whole)



# ----------------------------------------------------------------------------- 5. caption files
COCO = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "caption": "A red shirt."},
                        {"id": 2, "image_id": 2, "caption": "two bags"}]}
KARPATHY = {"images": [{"filepath": "val2014", "filename": "a.jpg", "split": "train", "cocoid": 1,
                        "sentences": [{"tokens": ["a", "red", "shirt"], "raw": "A red shirt."}]},
                       {"filename": "b.jpg", "split": "restval", "imgid": 2, "sentences": [{"raw": "two bags"}]}]}


@st.composite
def caption_inputs(draw, world):
    fmt = draw(st.sampled_from([b"c", b"k"]))
    seed = COCO if fmt == b"c" else KARPATHY
    if draw(st.booleans()):
        return fmt + draw(mutated_bytes(json.dumps(seed).encode()))
    return fmt + dumps(draw(mutated_tree(seed, world["root"] / "MARKER")))


def check_captions(world, data: bytes) -> str:
    from zoo.data.captions import CaptionedImage, read_coco_captions, read_karpathy

    box = sandbox(world)
    path = box.root / "captions.json"
    path.write_bytes(data[1:])

    def read():
        if data[:1] == b"c":
            return read_coco_captions(path, box.root)
        return [r for split in read_karpathy(path, box.root).values() for r in split]

    def check(records):
        for record in records:
            assert isinstance(record, CaptionedImage) and isinstance(record.path, Path)
            assert all(isinstance(r, str) for r in record.references)
            assert all(isinstance(w, str) for t in record.tokens for w in t)

    return holds("captions", data, box, read, check)



# ----------------------------------------------------------------------------- 6. --boxes JSON
BOXES = {"img.png": [[1, 2, 10, 12], [0, 0, 28, 28]], "other.png": [[3, 3, 4, 4]]}


@st.composite
def boxes_inputs(draw, world):
    if draw(st.booleans()):
        return draw(mutated_bytes(json.dumps(BOXES).encode()))
    return dumps(draw(mutated_tree(BOXES, world["root"] / "MARKER")))


def check_boxes(world, data: bytes) -> str:
    from zoo.commands.boxes import read_boxes
    from zoo.metrics.attention import mass_in_box, pointing_game

    box = sandbox(world)
    path = box.root / "boxes.json"
    path.write_bytes(data)
    maps = torch.from_numpy(fuzzing.random_array((3, 28, 28)))

    def read():
        boxes = read_boxes(str(path), ["img.png", "other.png"], [(28, 28), (28, 28)])
        for targets in boxes.values():  # [K, 4] in the image's pixels
            if len(targets):
                t = targets[None].expand(3, -1, -1)
                pointing_game(maps, t), mass_in_box(maps, t)
        return boxes

    def check(boxes):
        for targets in boxes.values():
            assert all(len(b) == 4 and 0 <= b[0] < b[2] <= 28 and 0 <= b[1] < b[3] <= 28 for b in targets.tolist())

    return holds("boxes", data, box, read, check)



# ----------------------------------------------------------------------------- 7. export sets
EXPORT_SEED = SEEDS / "export_set"  # a tiny captioner's `zoo export` (fuzzing.make_export_seed)


def _pack(files: dict[str, bytes]) -> bytes:
    return fuzzing.rezip(files)


@st.composite
def export_inputs(draw, world):
    files = {p.name: p.read_bytes() for p in sorted(EXPORT_SEED.iterdir())}
    manifest = json.loads(files["export.json"])
    how = draw(st.sampled_from(["manifest", "manifest_bytes", "program", "program_rehashed", "files"]))
    if how == "manifest":
        files["export.json"] = dumps(draw(mutated_tree(manifest, world["root"] / "MARKER")))
    elif how == "manifest_bytes":
        files["export.json"] = draw(mutated_bytes(files["export.json"]))
    elif how.startswith("program"):
        name = draw(st.sampled_from(sorted(manifest["files"])))
        files[name] = draw(mutated_bytes(files[name]))
        if how == "program_rehashed":  # a forged set: its manifest names the damaged file's hash
            import hashlib

            manifest["files"][name] = hashlib.sha256(files[name]).hexdigest()
            files["export.json"] = json.dumps(manifest).encode()
    else:
        name = draw(st.sampled_from(sorted(files)))
        action = draw(st.sampled_from(["drop", "swap", "extra"]))
        if action == "drop":
            del files[name]
        elif action == "swap":
            other = draw(st.sampled_from(sorted(files)))
            files[name], files[other] = files[other], files[name]
        else:
            files[draw(st.sampled_from(["notes.txt", "model.onnx", "encoder.pt2"]))] = b"x"
    return _pack(files)


def check_export(world, data: bytes) -> str:
    from zoo.weights.export_set import check_set

    box = sandbox(world)
    folder = box.root / "exported"
    folder.mkdir()
    for name, content in fuzzing.zip_members(data).items():
        (folder / name).write_bytes(content)

    def check(manifest):
        assert isinstance(manifest["vocabulary"], list) and len(manifest["preprocessing"]["size"]) == 2

    return holds("export_set", data, box, lambda: check_set(folder), check)



# ----------------------------------------------------------------------------- 8. weights manifests
@st.composite
def manifest_inputs(draw, world):
    from zoo.weights import hub

    seed = {"tiny": {"file": "tiny.safetensors", "sha256": hub.sha256_file(world["root"] / "tiny.safetensors"),
                     "config": world["config"], "metadata": {"metrics": {"test/acc": 0.5}, "recipe": "x"}}}
    if draw(st.booleans()):
        return draw(mutated_bytes(json.dumps(seed).encode()))
    return dumps(draw(mutated_tree(seed, world["root"] / "MARKER")))


def check_manifest(world, data: bytes) -> str:
    import zoo
    from zoo import registry
    from zoo.weights import hub

    box = sandbox(world)
    (box.root / "MANIFEST.json").write_bytes(data)
    shutil.copy(world["root"] / "tiny.safetensors", box.root / "tiny.safetensors")

    def read():
        with env(ZOO_WEIGHTS_DIR=box.root):
            records = hub.manifest()
            for name in registry.list_models(pretrained=True):
                zoo.get_weights(name)
                zoo.create_model(name, pretrained=True)
            return records

    def check(records):
        assert isinstance(records, dict) and all(isinstance(r.get("config"), dict) for r in records.values())

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return holds("manifest", data, box, read, check)



# ----------------------------------------------------------------------------- 9. cached downloads, generated data
UNREACHABLE = "http://127.0.0.1:9/w.safetensors"  # the discard port: nothing listens, nothing is fetched


@st.composite
def cached_inputs(draw, world):
    what = draw(st.sampled_from([b"d", b"s", b"i"]))
    if what == b"d":  # a download cache entry
        return what + draw(mutated_bytes(world["safetensors"]))
    if what == b"s":  # a generated scenes cache
        if draw(st.booleans()):
            return what + draw(mutated_bytes(world["scenes"]))
        members = fuzzing.zip_members(world["scenes"])
        name = draw(st.sampled_from(sorted(members)))
        members[name] = draw(mutated_bytes(members[name]))
        return what + fuzzing.rezip(members)
    from conftest import idx_bytes

    seed = idx_bytes(world["items"][:4])
    data = draw(mutated_bytes(seed))
    return what + (gzip.compress(data) if draw(st.booleans()) else data)


def check_cached(world, data: bytes) -> str:
    import hashlib

    from zoo.weights import hub

    box = sandbox(world)
    what, payload = data[:1], data[1:]
    if what == b"d":
        key = "url-" + hashlib.sha256(UNREACHABLE.encode()).hexdigest()[:16]
        (box.root / "cache" / key).mkdir(parents=True)
        (box.root / "cache" / key / "w.safetensors").write_bytes(payload)

        def read():
            with env(ZOO_CACHE_DIR=box.root / "cache", ZOO_DOWNLOAD_TIMEOUT=2):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return hub.load_fetched(UNREACHABLE)

        return holds("cached", data, box, read, lambda out: _model_state_ok(out[0]))
    if what == b"s":
        from zoo.data.scenes import FashionScenesDataModule

        items = world["items"]
        dm = FashionScenesDataModule(num_train=8, num_val=2, num_test=2, cache_dir=str(box.root),
                                     item_loader=lambda split: (items, np.arange(len(items)) % 10))
        dm.cache_path("train").write_bytes(payload)

        def check(scenes):
            assert len(scenes) == 8 and scenes.images.shape == (8, 3, 64, 64) and len(scenes.captions) == 8

        return holds("cached", data, box, lambda: dm.build_split("train"), check)
    from zoo.data.fashion_mnist import read_idx

    path = box.root / ("items.gz" if payload[:2] == b"\x1f\x8b" else "items")
    path.write_bytes(payload)
    return holds("cached", data, box, lambda: read_idx(path), lambda array: array.dtype == np.uint8)


def _model_state_ok(state) -> None:
    assert all(isinstance(v, torch.Tensor) for v in state.values())



# ----------------------------------------------------------------------------- 10. images
def _image_seeds() -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    pictures = [Image.fromarray((rng.random((12, 10, 3)) * 255).astype(np.uint8)),
                Image.fromarray((rng.random((9, 7)) * 65535).astype(np.uint16)),
                Image.fromarray((rng.random((8, 8, 4)) * 255).astype(np.uint8), "RGBA"),
                Image.fromarray((rng.random((8, 8)) * 255).astype(np.uint8)).convert("P")]
    seeds = []
    for picture, fmt in zip(pictures * 2, ["PNG", "PNG", "PNG", "GIF", "JPEG", "TIFF", "WEBP", "BMP"]):
        if fmt in ("JPEG", "BMP") and picture.mode not in ("RGB", "L"):
            picture = picture.convert("RGB")
        buffer = io.BytesIO()
        picture.save(buffer, format=fmt)
        seeds.append(buffer.getvalue())
    return seeds


IMAGE_SEEDS = _image_seeds()


@st.composite
def image_inputs(draw, world):
    if draw(st.integers(0, 5)) == 0:  # a header that declares what the data does not hold
        return fuzzing.png_with_size(draw(st.sampled_from([0, 1, 5000, 70000, 2**31 - 1])),
                                     draw(st.sampled_from([0, 1, 5000, 70000, 2**31 - 1])))
    return draw(mutated_bytes(draw(st.sampled_from(IMAGE_SEEDS))))


def check_image(world, data: bytes) -> str:
    from zoo.guards.files import MAX_SIDE
    from zoo.preprocess import Preprocessing, load_batch

    box = sandbox(world)
    path = box.root / "picture.img"
    path.write_bytes(data)

    def read():
        batch, good, errors = load_batch([str(path)], Preprocessing(3, (32, 32)))
        if errors:
            raise fuzzing.UserError(errors[0])
        return batch

    def check(batch):
        assert batch.shape == (1, 3, 32, 32) and bool(torch.isfinite(batch).all())
        assert MAX_SIDE >= 32

    return holds("images", data, box, read, check)



# ----------------------------------------------------------------------------- the corpus
STRATEGIES = {"safetensors": safetensors_inputs, "ckpt": ckpt_inputs, "recipe": recipe_inputs,
              "weights_config": weights_config_inputs, "captions": caption_inputs, "boxes": boxes_inputs,
              "export_set": export_inputs, "manifest": manifest_inputs, "cached": cached_inputs, "images": image_inputs}
CHECKS = {"safetensors": check_safetensors, "ckpt": check_ckpt, "recipe": check_recipe,
          "weights_config": check_weights_config, "captions": check_captions, "boxes": check_boxes,
          "export_set": check_export, "manifest": check_manifest, "cached": check_cached, "images": check_image}


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", list(CHECKS))
def test_fuzz(world, kind):
    """A seeded run of one kind: every mutated input gives a correct result or one line."""
    assert len(CHECKS) == 10 and set(CHECKS) == set(STRATEGIES)  # the ten kinds of untrusted input

    @FUZZ
    @given(STRATEGIES[kind](world))
    def run(data):
        CHECKS[kind](world, data)

    run()


@pytest.mark.parametrize("kind, path", fuzzing.corpus_cases() or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="the corpus is empty"))], ids=lambda v: getattr(v, "name", v))
def test_the_fuzz_corpus_replays(world, kind, path):
    """Every input the fuzzer ever failed on (tests/fuzz_corpus/<kind>/) now holds the property."""
    CHECKS[kind](world, path.read_bytes())
