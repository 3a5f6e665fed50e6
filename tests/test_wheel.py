"""`pip install` brings a working zoo: the wheel carries the recipes and the release manifest (not
the weight files), and a fresh virtualenv outside the clone lists the models, downloads a release
by URL (sha256-pinned, from a loopback server standing in for the release host), resolves a recipe
with `zoo train`, and captions an image with the `zoo` command.

The fresh virtualenv reuses the test environment's installed dependencies through a .pth line
(torch is large and there is no network), but not its editable install of the zoo: `import zoo`
there must find the wheel's copy."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from conftest import REPO

RELEASES = ("ram_fmnist_centered", "sat_soft_scenes")


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name in ("zoo", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    (src / "weights").mkdir()
    shutil.copy(REPO / "weights" / "MANIFEST.json", src / "weights" / "MANIFEST.json")
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(dist), str(src)], check=True, capture_output=True, text=True, cwd=tmp_path)
    # `make setup` stays quiet: no setuptools banner taking the recipe folders for undeclared packages
    assert "would be ignored" not in built.stdout + built.stderr, built.stderr[-2000:]
    return next(dist.glob("attention_zoo-*.whl"))


@pytest.mark.slow
def test_wheel_installed_outside_the_clone_lists_downloads_and_captions(tmp_path, http_server):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    recipes = sorted(p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").glob("*/*.yaml"))
    assert sorted(n[len("zoo/recipes/"):] for n in names if n.startswith("zoo/recipes/")) == recipes
    assert "zoo/releases/MANIFEST.json" in names and "zoo/model_index.json" in names
    assert "zoo/metrics/caption_trust.json" in names  # zoo caption's calibrated trust check
    assert not any(n.endswith((".safetensors", ".ckpt")) for n in names)
    assert not any(n.startswith("tools/") or n == "zoo/release.py" for n in names)  # our tooling stays home
    assert "zoo/training/train.py" in names and "zoo/commands/evaluate.py" in names

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (torch, lightning, ...) from the test environment, as plain paths: its .pth
    # files, among them the editable install of the clone, are not processed
    (site / "deps.pth").write_text(str(Path(torch.__file__).resolve().parent.parent) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                   check=True, capture_output=True)

    for name in RELEASES:
        shutil.copy(REPO / "weights" / f"{name}.safetensors", http_server["dir"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "ZOO_"))}
    env.update(ZOO_WEIGHTS_URL=http_server["url"], ZOO_CACHE_DIR=str(tmp_path / "cache"), WANDB_MODE="disabled",
               OMP_NUM_THREADS="1", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    probe = ("import json, zoo; m = zoo.create_model('ram_fmnist_centered', pretrained=True); "
             "print(json.dumps({'file': zoo.__file__, 'models': zoo.list_models(), "
             "'pretrained': zoo.list_models(pretrained=True), 'class': type(m).__name__}))")
    result = subprocess.run([python, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(seen["file"]).is_relative_to(env_dir), seen["file"]  # the wheel's zoo, not the clone's
    # overlays (a leading "_", e.g. configs/vit/_fmnist5_imagefolder.yaml) are no registry entries
    assert len(seen["models"]) == len([r for r in recipes if not r.startswith("base/") and "/_" not in r])
    assert seen["pretrained"] == sorted(json.loads((REPO / "weights" / "MANIFEST.json").read_text()))
    assert seen["class"] == "RAM"
    assert http_server["requests"] == ["/ram_fmnist_centered.safetensors"]

    # the training and evaluation commands come with the package; a registry name is its recipe
    result = subprocess.run([env_dir / "bin" / "zoo", "train", "fit", "--config", "ram_fmnist_centered", "--print_config"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["model"]["class_path"] == "zoo.models.ram.RAM"
    assert printed["trainer"]["max_epochs"] == yaml.safe_load((REPO / "configs/ram/fmnist_centered.yaml").read_text())[
        "trainer"]["max_epochs"]
    assert printed["trainer"]["logger"]["class_path"] == "zoo.training.callbacks.ZooWandbLogger"  # the base config's
    result = subprocess.run([env_dir / "bin" / "zoo", "eval", "--help"], cwd=elsewhere, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "usage: zoo eval" in result.stdout, result.stderr[-3000:]

    # zoo info answers from the wheel's manifest and model index alone (no weights file here)
    result = subprocess.run([env_dir / "bin" / "zoo", "info", "ram_fmnist_centered", "--json"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout)
    assert record["file_size"] == (REPO / "weights" / "ram_fmnist_centered.safetensors").stat().st_size
    assert record["num_params"] > 0 and record["gmacs"] > 0 and "notes" not in record  # the index, not recomputed

    image = elsewhere / "scene.png"
    canvas = Image.new("RGB", (64, 64))
    canvas.paste((230, 40, 40), (10, 10, 38, 38))
    canvas.save(image)
    result = subprocess.run([env_dir / "bin" / "zoo", "caption", str(image), "--model", "sat_soft_scenes"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    path, caption = result.stdout.strip().split("\t")
    assert path == str(image) and len(caption.split()) >= 2
    assert http_server["requests"][-1] == "/sat_soft_scenes.safetensors"
