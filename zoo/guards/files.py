"""Reading files the zoo does not trust, each one way: JSON within the budget (`read_json`,
`parse_json`), a file's sha256, a plain file name a file gives (`plain_name`), a data cache's .npz,
and images (`load_image`: any mode or size, a decompression bomb refused from its header)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from zoo.guards.budget import check_memory, check_tree
from zoo.guards.errors import UserError, shorten


# PIL's decompression-bomb check is off: large photos are downscaled to MAX_SIDE on load, and
# MAX_PIXELS is checked from the header before anything is decoded
Image.MAX_IMAGE_PIXELS = None
MAX_SIDE = 4096
MAX_PIXELS = 16384 * 16384
#: the rules below in words, for the records that state them (`zoo info`, model cards)
ALPHA_RULE = "transparent pixels are composited on black"
INTERPOLATION = "bilinear"


def load_image(path: str | os.PathLike, channels: int = 3) -> Image.Image:
    """An image as 8-bit "RGB" (channels=3) or "L" (channels=1), EXIF-rotated, transparency on black,
    16-bit and float grayscale rescaled, the longer side at most MAX_SIDE; one line for a bad file."""
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
    if img.mode in ("RGBA", "LA", "PA"):  # ALPHA_RULE
        background = Image.new("RGBA", img.size, (0, 0, 0, 255))
        return Image.alpha_composite(background, img.convert("RGBA")).convert("RGB")
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    return img


def check_npz(path: str | os.PathLike) -> None:
    """A zoo .npz (a data cache), checked before numpy allocates: each member's header declares
    exactly the bytes it holds, within the memory budget. ValueError (the cache is rebuilt) or UserError."""
    from numpy.lib import format as npy

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


# ----------------------------------------------------------------------------- JSON from files
#: Python objects of parsed JSON per byte of its text, at most (a file of small numbers)
JSON_EXPANSION = 12


def parse_json(text: str | bytes, what: str, expect: type | None = None,
               max_nodes: float | None = None) -> Any:
    """JSON text from a file, one line on every failure: not JSON (a 5,000-digit number too), nested
    too deep, past `check_tree`'s limits, or not of the `expect`ed type (dict, list...)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise UserError(f"{what}: refused, nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, an integer of too many digits
        raise UserError(f"{what}: not valid JSON ({shorten(str(exc), 120)})") from None
    check_tree(value, what, max_nodes)
    if expect is not None and not isinstance(value, expect):
        kind = {"dict": "an object", "list": "a list"}.get(expect.__name__, expect.__name__)
        raise UserError(f"{what}: expected {kind}, got {'null' if value is None else type(value).__name__}")
    return value


def read_json(path: str | os.PathLike, what: str | None = None, expect: type | None = None,
              max_bytes: int = 64 * 2**20, max_nodes: float | None = None) -> Any:
    """A JSON file, its size checked first; `parse_json`'s errors, prefixed by `what` (the path)."""
    path = Path(path)
    what = what or str(path)
    try:
        if path.is_dir():
            raise UserError(f"{what}: is a directory, not a JSON file")
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(f"{what}: refused, {size:,} bytes is more than a {max_bytes:,}-byte JSON file may hold")
        check_memory({f"{what}, parsed": float(size * JSON_EXPANSION)}, what)
        text = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{what}: cannot read ({exc.strerror or exc})") from None
    return parse_json(text, what, expect, max_nodes)


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of a file in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def plain_name(name: Any) -> bool:
    """A file name a file gives is one plain name (letters, digits, `_.+-`; not "." or "..")."""
    return isinstance(name, str) and re.fullmatch(r"[\w.+-]+", name) is not None and name not in (".", "..")
