"""Robust image loading for the CLI: any file PIL can open, in any mode or size."""
from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from zoo.errors import UserError

# PIL's own decompression-bomb check (a warning, then an error, at ~179 megapixels) is switched
# off: large photos are legitimate input and are downscaled on load to MAX_SIDE. What guards
# memory instead is MAX_PIXELS, checked from the header before anything is decoded.
Image.MAX_IMAGE_PIXELS = None
MAX_SIDE = 4096
MAX_PIXELS = 16384 * 16384


def load_image(path: str | os.PathLike, channels: int = 3) -> Image.Image:
    """Open an image as 8-bit "RGB" (channels=3) or "L" (channels=1), EXIF-rotated.

    Handles RGBA/LA/P with transparency (composited on black, like the training canvases),
    16-bit and float grayscale (rescaled by their range), CMYK, and very large images
    (downscaled so the longer side is at most MAX_SIDE). Raises UserError for a missing file,
    a directory, a non-image or a truncated file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not an image")
    try:
        with Image.open(path) as img:
            img.draft("RGB", (MAX_SIDE, MAX_SIDE))  # JPEG: decode at reduced size when huge
            if img.width * img.height > MAX_PIXELS:
                raise UserError(f"{path}: image is {img.width}x{img.height}, too large to decode "
                                f"(more than {MAX_PIXELS // 1_000_000} megapixels)")
            img = ImageOps.exif_transpose(img)
            img.load()
            img = _to_8bit(img)
    except UserError:
        raise
    except Exception as exc:  # PIL raises many types for bad files
        raise UserError(f"{path}: not a readable image ({type(exc).__name__}: {str(exc)[:160]})") from None
    if max(img.size) > MAX_SIDE:
        img.thumbnail((MAX_SIDE, MAX_SIDE))
    return img.convert("RGB" if channels == 3 else "L")


def _to_8bit(img: Image.Image) -> Image.Image:
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        array = np.asarray(img, dtype=np.float64)
        lo, hi = float(array.min()), float(array.max())
        array = (array - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(array)
        return Image.fromarray(array.round().astype(np.uint8), mode="L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGBA", img.size, (0, 0, 0, 255))
        return Image.alpha_composite(background, img.convert("RGBA")).convert("RGB")
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    return img


def image_to_tensor(img: Image.Image, size: tuple[int, int] | None = None) -> torch.Tensor:
    """PIL image -> float tensor [C, H, W] in [0, 1], resized to size=(H, W) if given."""
    import torch

    if size is not None and (img.height, img.width) != tuple(size):
        img = img.resize((size[1], size[0]), Image.BILINEAR)
    array = np.asarray(img, dtype=np.float32) / 255.0
    if array.ndim == 2:
        array = array[None]
    else:
        array = array.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(array))


def check_writable(path: str | os.PathLike, flag: str, directory: bool = False) -> Path:
    """Fail early, before any work, when an output path cannot be written: `path` is the file (or,
    with `directory`, the folder) a command will write, named `flag` in the message. Missing parent
    folders are fine (they are created on write) when the nearest existing one is writable. The
    check really creates (and removes) a file there: permission bits say nothing to root, nor
    about read-only or pseudo file systems."""
    import tempfile

    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            raise UserError(f"{flag} {path}: exists and is not a directory")
        if not directory and path.is_dir():
            raise UserError(f"{flag} {path}: is a directory")
    folder = path if directory else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: {folder} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".zoo-write-check-"):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    return path


# ----------------------------------------------------------------------------- writing whole things
# One convention for everything written beside its target and renamed into place (files, checkpoints,
# downloads, export folders): `.<name>.<pid>.<random>.<kind>`. A process killed mid-write leaves one;
# `sweep_stale` removes those whose process is gone, whoever wrote them.
TEMP_NAME = re.compile(r"\..+\.(\d+)\.[0-9A-Za-z_]+\.(tmp|part|old)")


def temp_path(path: str | os.PathLike, kind: str = "tmp") -> Path:
    """A fresh temporary name beside `path` (kind: tmp, part for downloads, old for a replaced set)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.{kind}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and folders (`temp_path` names) in `directory` whose writing
    process is gone; returns what it removed. Never looks at file times (a pid either lives or not)."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        match = TEMP_NAME.fullmatch(entry.name)
        if not match or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_save_image(img: Image.Image, path: str | os.PathLike, **save_kwargs) -> None:
    import io

    buffer = io.BytesIO()
    fmt = save_kwargs.pop("format", None) or Path(path).suffix.lstrip(".").upper().replace("JPG", "JPEG")
    img.save(buffer, format=fmt, **save_kwargs)
    atomic_write_bytes(path, buffer.getvalue())


def check_npz(path: str | os.PathLike) -> None:
    """An .npz written by the zoo (a data cache), checked before numpy allocates an array of it: each
    member's header declares exactly the bytes the member holds, and all of them together fit the
    memory budget (zoo.limits). Raises ValueError (a cache is then rebuilt) or UserError."""
    import math
    import zipfile

    from numpy.lib import format as npy

    from zoo.limits import check_memory

    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                version = npy.read_magic(member)
                read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read_header(member, max_header_size=10_000)
                declared = math.prod(shape) * dtype.itemsize
                if dtype.hasobject or declared != info.file_size - member.tell():
                    raise ValueError(f"{info.filename} declares {shape} {dtype}, not what it holds")
            total += declared
    check_memory({f"the arrays of {path}": float(total)}, str(path))


# ----------------------------------------------------------------------------- strict JSON out
def finite(value):
    """`value` with every non-finite number (NaN, +-inf: a model's output, a diverged score) as None,
    since strict JSON (RFC 8259) has no NaN and strict parsers refuse the bare token."""
    import math

    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_text(value, **dumps_kwargs) -> str:
    """Strict JSON of `value` (non-finite numbers as null): what every --json output prints."""
    import json

    return json.dumps(finite(value), allow_nan=False, **dumps_kwargs)
