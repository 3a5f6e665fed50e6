"""The `zoo` command's dispatcher and exit codes, and zoo.guards.writes's robust image loading on files
written here: RGBA, palette, grayscale, 16-bit, CMYK, EXIF-rotated, huge, truncated, non-images,
directories and missing files."""
from __future__ import annotations

import json
import struct
import sys
import types
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import cli_env, run_cli
from zoo.commands import cli
from zoo.commands.common import exit_code
from zoo.guards.errors import UserError
from zoo.guards.files import MAX_SIDE, load_image
from zoo.guards.writes import atomic_write_bytes
from zoo.preprocess import Preprocessing, image_to_tensor, load_batch


# ----------------------------------------------------------------------------- the zoo command
@pytest.mark.slow
def test_zoo_list_subprocess(tmp_path):
    rc, out, err = run_cli(["-m", "zoo.commands.cli", "list", "baseline_*"], cwd=tmp_path, env=cli_env())
    assert rc == 0, err
    names = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]  # after the header
    assert "baseline_mlp_centered" in names and all(n.startswith("baseline_") for n in names)
    rc, out, err = run_cli(["-m", "zoo.commands.cli"], cwd=tmp_path, env=cli_env())
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "error" in err


def test_zoo_train_and_eval_hand_their_arguments_over(capsys, tmp_path, monkeypatch):
    """`zoo train` is zoo/training/train.py's LightningCLI and `zoo eval` zoo/commands/evaluate.py, under
    their own names."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", "fit", "--config", "nope.yaml"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == "zoo train: error: --config nope.yaml: no such file"
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", "fit", "--config", "baseline_mlp_centred"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().endswith("no such file; did you mean baseline_mlp_centered?")
    assert cli.main(["eval", "--model", "nope"]) == 2
    assert capsys.readouterr().err.strip().startswith("zoo eval: error: unknown model 'nope'")
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--help"])
    assert stopped.value.code == 0
    listed = capsys.readouterr().out
    assert "train from a recipe" in listed and "evaluate a checkpoint" in listed


def test_a_registry_name_as_config_is_its_recipe(tmp_path, monkeypatch):
    from zoo import registry
    from zoo.training.recipe_args import with_recipe_paths

    monkeypatch.chdir(tmp_path)
    recipe = str(registry.get_entry("ram_fmnist_centered").recipe)
    assert with_recipe_paths(["fit", "--config", "ram_fmnist_centered", "--seed_everything", "3"]) == [
        "fit", "--config", recipe, "--seed_everything", "3"]
    assert with_recipe_paths(["fit", "--config=ram_fmnist_centered"]) == ["fit", f"--config={recipe}"]
    assert with_recipe_paths(["fit", "-c", "nope"]) == ["fit", "-c", "nope"]
    (tmp_path / "ram_fmnist_centered").write_text("model: {}\n")  # a file of that name here wins
    assert with_recipe_paths(["fit", "--config", "ram_fmnist_centered"]) == ["fit", "--config", "ram_fmnist_centered"]


def test_zoo_list_json(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path))
    assert cli.main(["list", "baseline_mlp_*", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "baseline_mlp_centered" in listing
    entry = listing["baseline_mlp_centered"]
    assert entry["pretrained"] is False
    assert entry["recipe"] == "python train.py fit --config configs/baseline/mlp_centered.yaml"
    assert cli.main(["list", "--pretrained"]) == 0
    assert capsys.readouterr().out.strip() == ""  # nothing released in an empty weights dir


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["list", "--no-such-flag"]])
def test_usage_errors_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("zoo") and "error" in err


def test_user_error_in_a_subcommand_is_exit_2(monkeypatch, capsys):
    module = types.ModuleType("zoo_test_boom")
    module.add_arguments = lambda parser: parser.add_argument("what")

    def run(args):
        raise UserError(f"cannot {args.what}")

    module.run = run
    monkeypatch.setitem(sys.modules, "zoo_test_boom", module)
    monkeypatch.setitem(cli.SUBCOMMANDS, "boom", ("zoo_test_boom", "always fails"))
    assert cli.main(["boom", "fly"]) == 2
    assert capsys.readouterr().err.strip() == "zoo boom: error: cannot fly"


def test_exit_code_for_partly_bad_batches():
    assert exit_code(3, []) == 0
    assert exit_code(2, ["bad"]) == 1
    assert exit_code(0, ["bad"]) == 2


# ----------------------------------------------------------------------------- images
def test_rgba_composited_on_black(tmp_path):
    rgba = np.zeros((10, 12, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, :4, 3] = 0  # transparent
    rgba[:, 4:8, 3] = 255  # opaque
    rgba[:, 8:, 3] = 128  # half
    path = tmp_path / "a.png"
    Image.fromarray(rgba, "RGBA").save(path)
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (12, 10)
    a = np.asarray(img)
    assert (a[:, :4] == 0).all()
    assert (a[:, 4:8, 0] == 200).all() and (a[:, 4:8, 1:] == 0).all()
    assert (np.abs(a[:, 8:, 0].astype(int) - 100) <= 1).all()
    gray = load_image(path, channels=1)
    assert gray.mode == "L" and gray.size == (12, 10)


def test_palette_with_transparency(tmp_path):
    img = Image.new("P", (8, 8), 1)
    img.putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    img.info["transparency"] = 1
    path = tmp_path / "p.png"
    img.save(path, transparency=1)
    assert (np.asarray(load_image(path)) == 0).all()  # fully transparent white -> black


def test_grayscale_to_rgb_and_l(tmp_path):
    values = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    path = tmp_path / "g.png"
    Image.fromarray(values, "L").save(path)
    rgb = np.asarray(load_image(path))
    assert rgb.shape == (8, 8, 3)
    for c in range(3):
        np.testing.assert_array_equal(rgb[..., c], values)
    np.testing.assert_array_equal(np.asarray(load_image(path, channels=1)), values)


def test_16bit_rescaled_by_range(tmp_path):
    values = np.linspace(1000, 3000, 100).reshape(10, 10).astype(np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode.startswith("I")
    loaded = np.asarray(load_image(path, channels=1)).astype(int)
    expected = np.round((values.astype(float) - 1000) / 2000 * 255).astype(int)
    assert np.abs(loaded - expected).max() <= 1
    assert loaded.min() == 0 and loaded.max() == 255


def test_constant_16bit_is_black(tmp_path):
    path = tmp_path / "flat.png"
    Image.fromarray(np.full((4, 4), 4242, np.uint16)).save(path)
    assert (np.asarray(load_image(path, channels=1)) == 0).all()


def test_cmyk_jpeg(tmp_path):
    path = tmp_path / "c.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(path)  # red in CMYK
    a = np.asarray(load_image(path)).astype(int)
    assert a.shape == (16, 16, 3) and a[..., 0].mean() > 200 and a[..., 1:].mean() < 60


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_exif_orientation_applied(tmp_path, fmt):
    # a 40 wide x 20 high image, white block at the top-left, stored with orientation 6
    # ("rotate 90 degrees clockwise to display"): shown, it is 20 wide x 40 high, block top-right
    a = np.zeros((20, 40, 3), np.uint8)
    a[:10, :10] = 255
    img = Image.fromarray(a)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / f"r.{fmt.lower()}"
    img.save(path, format=fmt, exif=exif.tobytes(), **({"quality": 95} if fmt == "JPEG" else {}))
    loaded = load_image(path)
    assert loaded.size == (20, 40)
    b = np.asarray(loaded.convert("L")).astype(int)
    assert b[:10, 10:].mean() > 200  # top-right: the block
    assert b[:10, :10].mean() < 50 and b[30:, :].mean() < 50


def test_huge_image_downscaled(tmp_path):
    path = tmp_path / "wide.png"
    Image.new("L", (MAX_SIDE * 2 + 100, 50), 128).save(path)
    img = load_image(path)
    assert max(img.size) == MAX_SIDE
    assert img.size[1] == pytest.approx(50 * MAX_SIDE / (MAX_SIDE * 2 + 100), abs=1)


def _png_header_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 100)) + chunk(b"IEND", b""))


def test_decompression_bomb_refused_before_decoding(tmp_path):
    # a few hundred bytes claiming 20000 x 15000 pixels (300 MB decoded, more as RGB)
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header_claiming(20000, 15000))
    with pytest.raises(UserError, match="too large"):
        load_image(path)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image(tmp_path, fmt):
    rng = np.random.default_rng(0)
    path = tmp_path / f"t.{fmt.lower()}"
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path, format=fmt)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=f"{path.name}: not a readable image"):
        load_image(path)


@pytest.mark.parametrize("content", [b"hello, not an image\n", b"", b"\x89PNG\r\n\x1a\nrest is junk"])
def test_non_image_file(tmp_path, content):
    path = tmp_path / "notes.png"
    path.write_bytes(content)
    with pytest.raises(UserError, match="notes.png: not a readable image"):
        load_image(path)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        load_image(tmp_path)
    with pytest.raises(UserError, match="no such file"):
        load_image(tmp_path / "missing.png")


def test_load_batch_keeps_the_good_ones(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (30, 20), (255, 0, 0)).save(good)
    other = tmp_path / "other.png"
    Image.new("RGB", (28, 28), (0, 255, 0)).save(other)
    grey = tmp_path / "grey.png"
    Image.new("RGB", (28, 28), (90, 90, 90)).save(grey)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"junk")
    batch, paths, errors = load_batch([good, bad, other, tmp_path / "gone.png"], Preprocessing(3, (28, 28)))
    assert batch.shape == (2, 3, 28, 28) and batch.dtype == torch.float32
    assert paths == [str(good), str(other)]
    assert len(errors) == 2 and "bad.png" in errors[0] and "gone.png" in errors[1]
    assert torch.allclose(batch[0, 0], torch.ones(28, 28)) and batch[0, 1:].abs().max() == 0
    # "exact": the size must match, and a 1-channel model takes grey (even stored as RGB), not colour
    _, paths, errors = load_batch([good, other, grey], Preprocessing(1, (28, 28), "exact"))
    assert paths == [str(grey)] and "30x20" in errors[0] and "colour image" in errors[1]
    empty, paths, errors = load_batch([bad], Preprocessing(1, (28, 28)))
    assert empty.shape == (0, 1, 28, 28) and paths == [] and len(errors) == 1


def test_crop_rule_is_torchvisions_evaluation_transform(tmp_path):
    from torchvision import transforms as T

    path = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
    spec = Preprocessing(3, (16, 16), "crop", 20)
    reference = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])(Image.open(path).convert("RGB"))
    assert torch.equal(spec(load_image(path)), reference)
    assert Preprocessing.from_dict(spec.as_dict()) == spec


def test_image_to_tensor_range_and_layout():
    img = Image.fromarray(np.array([[0, 255], [51, 102]], np.uint8), "L")
    t = image_to_tensor(img)
    assert t.shape == (1, 2, 2)
    assert torch.allclose(t[0], torch.tensor([[0.0, 1.0], [0.2, 0.4]]))
    rgb = image_to_tensor(img.convert("RGB"), size=(4, 6))
    assert rgb.shape == (3, 4, 6)


def test_atomic_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "out.json"
    atomic_write_bytes(target, b"{}")
    atomic_write_bytes(target, b'{"a": 1}')
    assert target.read_bytes() == b'{"a": 1}'
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_a_command_says_when_it_resized_or_greyed_the_images(tmp_path, capsys):
    """The squash rule prepares a 640x480 colour photo for the 28x28 grey ViT, and says so in one
    line on stderr; an image that already fits gets no note."""
    photo, fits = tmp_path / "photo.png", tmp_path / "fits.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(photo)
    Image.fromarray(np.full((28, 28), 128, dtype=np.uint8)).save(fits)
    assert cli.main(["attend", "--model", "vit_fmnist", str(photo), str(fits), "--out", str(tmp_path / "maps")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == ["zoo attend: note: images 1 of 2 resized to 28x28 px (squash); 1 of 2 made grey, "
                     "by the model's input rule (README, 'Image sizes')"]
    assert cli.main(["attend", "--model", "vit_fmnist", str(fits), "--out", str(tmp_path / "maps2")]) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.slow
def test_zoo_list_and_import_zoo_leave_torch_unloaded(tmp_path):
    """`zoo list` reads recipes and the manifest only: no torch import (seconds), so it answers at
    once; `import zoo` is as light, and its public names load on first use."""
    probe = ("import sys; from zoo.commands.cli import main; code = main(['list', 'ram_*']); "
             "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', code)")
    rc, out, err = run_cli(["-c", probe], cwd=tmp_path, env=cli_env())
    assert rc == 0, err[-2000:]
    assert out.strip().splitlines()[-1] == "NO TORCH 0" and "ram_fmnist_centered" in out
    probe = ("import sys, zoo; light = 'torch' not in sys.modules; model = zoo.create_model('baseline_mlp_centered'); "
             "print(light, type(model).__name__, zoo.registry.data_config is zoo.data_config)")
    rc, out, err = run_cli(["-c", probe], cwd=tmp_path, env=cli_env())
    assert rc == 0 and out.strip().splitlines()[-1] == "True Classifier True", err[-2000:]


# ----------------------------------------------------------------------------- folders of images
def _folder_of_images(root):
    """root/b.png, root/a.PNG, root/notes.txt, root/deeper/c.png: two images here, one deeper."""
    root.mkdir()
    for name in ("b.png", "a.PNG", "deeper/c.png"):
        (root / name).parent.mkdir(exist_ok=True)
        Image.fromarray(np.full((28, 28), 90, dtype=np.uint8)).save(root / name, format="PNG")
    (root / "notes.txt").write_text("not an image\n")
    return root


@pytest.mark.parametrize("command", [
    ["attend", "--model", "vit_fmnist", "--out", "{out}"],
    ["caption", "--model", "sat_soft_scenes", "--max-len", "2"],
])
def test_caption_and_attend_read_a_folder_its_images_sorted_by_path(tmp_path, capsys, command):
    folder = _folder_of_images(tmp_path / "pics")
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    for extra, expected in (([], ["a.PNG", "b.png"]), (["--recursive"], ["a.PNG", "b.png", "deeper/c.png"])):
        assert cli.main([*argv, str(folder), *extra, "--overwrite"]) == 0
        captured = capsys.readouterr()
        read = [line.split(":" if command[0] == "attend" else "\t")[0] for line in captured.out.splitlines()]
        assert read == [str(folder / name) for name in expected]
        skipped = [line for line in captured.err.splitlines() if "skipped" in line]
        assert skipped == [f"zoo {command[0]}: skipped 1 file(s) in the folder(s) given that are not images by "
                           "their suffix"]
    # the count is a note: a mistake that refuses the command is still its one line
    assert cli.main([*[a.replace("sat_soft_scenes", "nothing").replace("vit_fmnist", "nothing") for a in argv],
                     str(folder), "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"zoo {command[0]}: error: unknown model 'nothing'; "
                                                            "`zoo list` shows them all"]


@pytest.mark.parametrize("command", [
    ["attend", "--model", "vit_fmnist", "--out", "{out}"],
    ["caption", "--model", "sat_soft_scenes"],
    ["sample", "--model", "draw_fmnist_t16", "--out", "{out}.png", "--reconstruct"],
])
def test_a_folder_without_images_is_one_line_and_exit_2(tmp_path, capsys, command):
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    empty, texts = tmp_path / "empty", tmp_path / "texts"
    empty.mkdir()
    (texts / "deeper").mkdir(parents=True)
    (texts / "notes.txt").write_text("x")
    for folder, message in ((empty, "no image files in this folder (0 other file(s))"),
                            (texts, "no image files in this folder (1 other file(s); --recursive reads its "
                                    "subfolders)")):
        assert cli.main([*argv, str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"zoo {command[0]}: error: {folder}: {message}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.png").exists()
