"""Weights on disk and on the web: fetch with sha256 verification, load safely, save for release.

Formats:
- `.safetensors` (preferred, released weights): tensors plus the model's zoo config as JSON in the
  file's metadata (key "zoo_config"); a sidecar `<name>.json` is accepted too.
- Lightning `.ckpt`: loaded with `torch.load(weights_only=True)` only, so a pickle payload that
  would run code is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import torch

from zoo.errors import UserError

CONFIG_KEY = "zoo_config"
REPO_ROOT = Path(__file__).resolve().parent.parent


def weights_dir() -> Path:
    """Where released weights and their MANIFEST.json live ($ZOO_WEIGHTS_DIR overrides)."""
    return Path(os.environ.get("ZOO_WEIGHTS_DIR", REPO_ROOT / "weights"))


def manifest() -> dict:
    """The release manifest: {name: {file, sha256, url?, config, metadata}} ({} when absent)."""
    path = weights_dir() / "MANIFEST.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def fetch_release(name: str) -> Path:
    """The verified local file of the released weights `name`: the copy in weights_dir() when
    present, else its manifest URL downloaded into the cache; sha256-checked either way."""
    record = manifest().get(name)
    if record is None:
        available = ", ".join(sorted(manifest())) or "none"
        raise UserError(f"no released weights named '{name}' (released: {available})")
    local = weights_dir() / record["file"]
    location = local if local.is_file() or not record.get("url") else record["url"]
    return fetch(location, record.get("sha256"))


def cache_dir() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attention-zoo"
    return Path(root)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_url(location: str) -> bool:
    return urlparse(str(location)).scheme in ("http", "https", "file", "ftp")


def fetch(location: str | os.PathLike, sha256: str | None = None) -> Path:
    """A local path, or a URL downloaded once into the cache. With `sha256`, the file must match it
    (a download is verified before the atomic rename into the cache; a local file on every call)."""
    if not is_url(str(location)):
        path = Path(location)
        if not path.is_file():
            raise UserError(f"{path}: no such weights file")
        if sha256 and sha256_file(path) != sha256:
            raise UserError(f"{path}: sha256 mismatch; the file was changed or corrupted "
                            f"(expected {sha256[:12]}…, got {sha256_file(path)[:12]}…)")
        return path
    name = Path(urlparse(str(location)).path).name or "weights"
    target = cache_dir() / (sha256[:16] if sha256 else "unverified") / name
    if target.is_file() and (not sha256 or sha256_file(target) == sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".part")
    os.close(fd)
    try:
        try:
            torch.hub.download_url_to_file(str(location), tmp, progress=False)
        except Exception as exc:
            raise UserError(f"could not download {location}: {exc}. Offline? Download the file "
                            "elsewhere and pass its local path instead") from None
        if sha256 and sha256_file(tmp) != sha256:
            raise UserError(f"{location}: downloaded file fails its sha256 check; refusing it")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_weights(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict | None]:
    """Return (state_dict, zoo_config or None) from a .safetensors or Lightning .ckpt file."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                state = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:
            raise UserError(f"{path}: not a valid safetensors file ({exc})") from None
        config = json.loads(metadata[CONFIG_KEY]) if CONFIG_KEY in metadata else None
        sidecar = path.with_suffix(".json")
        if config is None and sidecar.is_file():
            config = json.loads(sidecar.read_text())
        return state, config
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UserError(f"{path}: refused, the checkpoint holds objects that only an unsafe "
                        f"(code-running) load could restore: {str(exc).splitlines()[0][:160]}") from None
    except Exception as exc:
        raise UserError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{path}: not a checkpoint (no state_dict inside)")
    state = checkpoint.get("state_dict", checkpoint)
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: not a checkpoint (no state_dict inside)")
    return state, checkpoint.get("zoo")


def save_release(model: torch.nn.Module, config: dict, path: str | os.PathLike) -> str:
    """Write `model`'s weights and config as safetensors (atomically); return the file's sha256."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(state, str(tmp), metadata={CONFIG_KEY: json.dumps(config, sort_keys=True)})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return sha256_file(path)
