"""Weights on disk and on the web: fetched with sha256 verification, loaded safely, saved for release.

Formats: `.safetensors` (the zoo config as JSON in its "zoo_config" metadata, or a sidecar `.json`)
and Lightning `.ckpt` (`weights_only=True`). A download is verified before it enters the cache; a URL
is pinned by `--sha256` or, as torch.hub does, a hash prefix ending its name (`model-1a2b3c4d.pt`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pickle
import re
import sys
import warnings
import zipfile
from pathlib import Path
from urllib.parse import urlparse

from zoo.guards.budget import NUMERIC_ENVIRONMENT, check_tree, env_number
from zoo.guards.errors import UserError, shorten, sigterm_stops
from zoo.guards.files import parse_json, plain_name, read_json, sha256_file
from zoo.guards.writes import atomic_write_bytes, discard, replacing
from zoo.hparams import current_config

#: the largest zoo config a weights file may carry (a COCO captioner's, vocabulary and all, is ~1 MB)
MAX_CONFIG_BYTES = 16 * 1024 * 1024
CONFIG_KEY = "zoo_config"
META_KEY = "zoo_meta"  # a release's preprocessing, class names or vocabulary, metrics, recipe
REPO_ROOT = Path(__file__).resolve().parents[2]
# torch.hub's convention: the file name ends in "-<first hex digits of its sha256>"
HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})(?:\.[A-Za-z0-9]+)+$")


def weights_dir() -> Path:
    """Where the release manifest lives: $ZOO_WEIGHTS_DIR, else zoo/releases, else the clone's weights/."""
    if os.environ.get("ZOO_WEIGHTS_DIR"):
        return Path(os.environ["ZOO_WEIGHTS_DIR"])
    installed = Path(__file__).resolve().parents[1] / "releases"
    return installed if installed.is_dir() else REPO_ROOT / "weights"


def manifest() -> dict:
    """The release manifest {name: {file, sha256, url?, config, metadata}} ({} when absent), in current names."""
    path = weights_dir() / "MANIFEST.json"
    if not path.exists():
        return {}
    records = read_json(path, f"the weights manifest {path}", expect=dict, max_bytes=MAX_CONFIG_BYTES)
    good = {}
    for name, record in records.items():
        if problem := _record_problem(record):
            warn_once(f"{path}: release {shorten(name, 60)!r} skipped, {problem}")
        else:
            good[name] = {**record, "config": current_config(record["config"])}
    return good


MAX_FILE_NAME = 255  # bytes: the longest file name Linux and macOS file systems take (NAME_MAX)


def _record_problem(record) -> str | None:
    """Why a manifest record is not a release (None when it is one)."""
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not a record"
    for key, kind in (("file", str), ("sha256", str), ("config", dict)):
        if not isinstance(record.get(key), kind):
            return f"its {key!r} is not a {kind.__name__}"
    if not plain_name(record["file"]):
        return "its file is not a plain file name"
    if len(record["file"].encode()) > MAX_FILE_NAME:
        return f"its file name is longer than {MAX_FILE_NAME} bytes"
    if not isinstance(record["config"].get("class_path"), str):
        return "its config names no class_path"
    for key, kind in (("metadata", dict), ("url", str)):
        if record.get(key) is not None and not isinstance(record[key], kind):
            return f"its {key!r} has the wrong type"
    return None


@functools.lru_cache(maxsize=None)
def warn_once(message: str) -> None:
    """One warning per message in a process (a skipped release or recipe, per version of its file)."""
    warnings.warn(message, UserWarning, stacklevel=3)


# the assets of the weights' GitHub release; $ZOO_WEIGHTS_URL points at a mirror instead
DEFAULT_WEIGHTS_URL = "https://github.com/attention-zoo/attention-zoo/releases/download/weights-v1"


def release_url(record: dict) -> str:
    """`$ZOO_WEIGHTS_URL/<file>` when that mirror is set, else the manifest's URL, else the default host."""
    base = os.environ.get("ZOO_WEIGHTS_URL")
    if base:
        return f"{base.rstrip('/')}/{record['file']}"
    return record.get("url") or f"{DEFAULT_WEIGHTS_URL}/{record['file']}"


def fetch_release(name: str) -> Path:
    """The sha256-checked local file of release `name`: in weights_dir(), else downloaded into the cache."""
    records = manifest()
    record = records.get(name)
    if record is None:
        available = ", ".join(sorted(records)) or "none"
        raise UserError(f"no released weights named '{name}' (released: {available})")
    local = weights_dir() / record["file"]
    return fetch(local if local.is_file() else release_url(record), record.get("sha256"))


def cache_dir() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attention-zoo"
    return Path(root)


def is_url(location: str) -> bool:
    """Anything with a scheme://, so that file:// and ftp:// are refused as URLs, not read as paths."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", str(location)) is not None


# ----------------------------------------------------------------------------- model cards
# A release as a Hugging Face hub repository (zoo.commands.card writes one), loaded as safely as a
# release; downloads go through huggingface_hub's cache ($HF_HOME, HF_ENDPOINT, HF_HUB_OFFLINE)
HUB_PREFIX = "hf-hub:"
CARD_CONFIG = "config.json"
CARD_WEIGHTS = "model.safetensors"
LIBRARY = "attention-zoo"
HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def is_hub_id(location) -> bool:
    return isinstance(location, str) and location.startswith(HUB_PREFIX)


def is_card(location) -> bool:
    """An `hf-hub:ORG/NAME` repository, or a local folder in the hub layout."""
    try:
        return is_hub_id(location) or Path(location).is_dir() and (Path(location) / CARD_CONFIG).is_file()
    except (TypeError, OSError):
        return False


def fetch_card(location, pin: str | None = None) -> Path:
    """The verified `model.safetensors` of a card, `hf-hub:ORG/NAME[@REVISION]` (a refused one leaves
    nothing in the cache) or a local folder; `pin`: a sha256 (prefix) it must also match."""
    if is_hub_id(location):
        repo_id, _, revision = location[len(HUB_PREFIX):].partition("@")
        if not HUB_REPO_ID.fullmatch(repo_id):
            raise UserError(f"{shorten(location)}: give a hub repository as hf-hub:ORG/NAME")
        fetched = []
        try:
            config_path = _download_from_hub(location, repo_id, CARD_CONFIG, revision or None, fetched)
            config = read_card_config(config_path, location)
            weights = _download_from_hub(location, repo_id, CARD_WEIGHTS, revision or None, fetched)
            _verify_card(weights, config, pin, location)
        except UserError:
            for path in fetched:  # a refused repository leaves nothing in the cache: link and blob
                blob = path.resolve()
                discard(path)
                discard(blob)
            raise
        return weights
    folder = Path(location)
    config = read_card_config(folder / CARD_CONFIG, str(folder))
    weights = folder / CARD_WEIGHTS
    if not weights.is_file():
        raise UserError(f"{folder}: no {CARD_WEIGHTS} beside its {CARD_CONFIG}")
    _verify_card(weights, config, pin, str(folder))
    return weights


def read_card_config(path: Path, source: str) -> dict:
    """A card's config.json, checked: a zoo card whose model (and data) classes are the zoo's own."""
    from zoo.classes import check_allowed

    if not path.is_file():
        raise UserError(f"{source}: no {CARD_CONFIG}")
    config = read_json(path, f"{source}: its {CARD_CONFIG}", max_bytes=MAX_CONFIG_BYTES)
    zoo_config = config.get("zoo_config") if isinstance(config, dict) else None
    if not isinstance(zoo_config, dict) or config.get("library_name") != LIBRARY:
        raise UserError(f"{source}: its {CARD_CONFIG} is not an {LIBRARY} card (no zoo_config)")
    try:  # before anything else is downloaded or imported
        check_allowed(zoo_config.get("class_path"), "model")
        if isinstance(zoo_config.get("data"), dict):
            check_allowed(zoo_config["data"].get("class_path"), "data")
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    files = config.get("files")
    pinned = files.get(CARD_WEIGHTS) if isinstance(files, dict) else None
    digest = pinned.get("sha256") if isinstance(pinned, dict) else None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise UserError(f"{source}: its {CARD_CONFIG} records no sha256 of {CARD_WEIGHTS}; refusing unverifiable weights")
    return config


def _verify_card(weights: Path, config: dict, pin: str | None, source: str) -> None:
    digest = sha256_file(weights)
    expected = config["files"][CARD_WEIGHTS]["sha256"]
    if digest != expected:
        raise UserError(f"{source}: {CARD_WEIGHTS} fails its sha256 check (config.json says {expected[:12]}…, "
                        f"the file is {digest[:12]}…); refusing it")
    if pin and not digest.startswith(pin):
        raise UserError(f"{source}: {CARD_WEIGHTS} is not the pinned file (--sha256 {pin[:12]}…, the file is {digest[:12]}…)")
    try:
        embedded = json.loads(safetensors_metadata(weights, source).get(CONFIG_KEY) or "null")
    except ValueError:
        embedded = None
    if not isinstance(embedded, dict) or current_config(embedded) != current_config(config["zoo_config"]):
        raise UserError(f"{source}: {CARD_CONFIG} does not describe the model in {CARD_WEIGHTS} (their zoo configs differ)")


def safetensors_metadata(path: Path, source: str) -> dict:
    """The `__metadata__` of a safetensors file's header, read without torch."""
    header = _safetensors_header(path)[2]
    if header is None:
        raise UserError(f"{source}: {CARD_WEIGHTS} is not a safetensors file")
    try:
        header = json.loads(header)
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{source}: {CARD_WEIGHTS} has an unreadable header") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _download_from_hub(location: str, repo_id: str, filename: str, revision: str | None, fetched: list) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    # the hub's settings as they are now, not when huggingface_hub was imported (timm imports it early)
    home = os.environ.get("HF_HOME")
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else None)
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    endpoint = os.environ.get("HF_ENDPOINT")
    unreachable = None if offline else _hub_unreachable(repo_id, filename, revision, endpoint)
    try:
        path = Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache,
                                    local_files_only=offline or unreachable is not None, endpoint=endpoint))
    except LocalEntryNotFoundError:
        why = f"cannot reach the hub ({unreachable})" if unreachable else "cannot reach the hub (HF_HUB_OFFLINE is set)" \
            if offline else "cannot reach the hub"
        raise UserError(f"{location}: {why} for {filename}, and it is not in the cache "
                        "(offline? HF_ENDPOINT points elsewhere?)") from None
    except EntryNotFoundError:
        raise UserError(f"{location}: the repository has no {filename}") from None
    except RevisionNotFoundError:
        raise UserError(f"{location}: no such revision") from None
    except RepositoryNotFoundError:
        raise UserError(f"{location}: no such repository on the hub (or it is private)") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{location}: could not download {filename} ({shorten(reason, 120)})") from None
    fetched.append(path)
    return path


def _hub_unreachable(repo_id: str, filename: str, revision: str | None, endpoint: str | None) -> str | None:
    """Why the hub cannot be reached (None when it answers at all), asked once: hf_hub_download retries
    a network error with backoff (~23 s, 5 tries) when the file is not cached, where an offline user
    wants one line at once. One HEAD, no retries, within $HF_HUB_ETAG_TIMEOUT (the hub's own setting);
    an HTTP error is an answer, left to hf_hub_download to name."""
    import httpx2
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    timeout = env_number("HF_HUB_ETAG_TIMEOUT", constants.DEFAULT_ETAG_TIMEOUT)
    try:
        get_hf_file_metadata(url, timeout=timeout, retry_on_errors=False)
    except HfHubHTTPError:
        return None
    except (httpx2.TransportError, OSError) as exc:  # refused, no route, no DNS, timed out
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return shorten(reason, 100)
    return None


def fetch(location: str | os.PathLike, sha256: str | None = None) -> Path:
    """A local path, a URL downloaded once into the cache, or a model card's model.safetensors;
    `sha256`: the file's sha256 in hex, or a prefix of at least 8 digits, checked on every call."""
    pin = None if sha256 is None else str(sha256).strip().lower()
    if pin is not None and not re.fullmatch(r"[0-9a-f]{8,64}", pin):
        raise UserError(f"--sha256 {sha256!r}: give the file's sha256 in hex (at least its first 8 digits)")
    if is_card(location):
        return fetch_card(location, pin)
    if not is_url(str(location)):
        path = Path(location)
        if not path.is_file():
            raise UserError(f"{path}: no such weights file")
        if pin and not sha256_file(path).startswith(pin):
            raise UserError(f"{path}: sha256 mismatch; the file was changed or corrupted "
                            f"(expected {pin[:12]}…, got {sha256_file(path)[:12]}…)")
        return path
    url = str(location)
    parsed = urlparse(url)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.netloc:  # file://, ftp://: never opened
        raise UserError(f"{shorten(url)}: refused, weights are downloaded over http(s) only")
    name = Path(parsed.path).name
    if not plain_name(name):
        name = "weights"  # a URL ending in /, /.. or an odd name: the cache names the file itself
    if pin is None:
        in_name = HASH_IN_NAME.search(name)
        pin = in_name.group(1) if in_name else None
    def served(path: Path) -> Path:  # said when unverified content is handed over, not before a refusal
        if pin is None:
            warnings.warn(f"{url} is not pinned to a sha256, so its content is not verified; pin it with "
                          "--sha256 HASH (or a file name ending in -<hash prefix>)", UserWarning, stacklevel=3)
        return path

    # One cache folder per pin (a content address) or, unpinned, per URL.
    key = pin[:16] if pin else "url-" + hashlib.sha256(url.encode()).hexdigest()[:16]
    target = cache_dir() / key / name
    if target.is_symlink():
        discard(target)  # the cache holds files it wrote itself, never a link to elsewhere
    if target.is_file():
        try:
            if pin is not None and sha256_file(target).startswith(pin):
                return target  # the pin vouches for every byte
            if pin is None:
                check_whole(target, url, crc=False)  # an unpinned entry: whole, or evicted
                return served(target)
        except UserError:
            pass
        discard(target)  # a cached file that is damaged or no longer matches its pin is not served again
    try:
        # SIGTERM or Ctrl-C mid-download: the .part and its lock go on the way out (a SIGKILL'd one's: swept next time)
        with sigterm_stops(), replacing(target, "part") as part:
            _download(url, part)
            if pin is None:
                check_whole(part, url)  # unpinned: opened the way it will be loaded before it enters the cache
            elif not sha256_file(part).startswith(pin):
                raise UserError(f"{url}: the downloaded file fails its sha256 check (expected {pin[:12]}…, "
                                f"got {sha256_file(part)[:12]}…); refusing it, nothing was cached")
    except OSError as exc:  # the cache folder: a file, read-only or full
        raise UserError(f"the download cache {cache_dir()}: cannot write there ({exc.strerror or exc}); set "
                        "ZOO_CACHE_DIR to a writable folder") from None
    return served(target)


def _download(url: str, dest: Path) -> None:
    """Stream `url` into `dest` with a progress bar; one line for a network failure, a stall
    ($ZOO_DOWNLOAD_TIMEOUT), a body cut short or past $ZOO_MAX_DOWNLOAD_MB."""
    import socket
    import urllib.error
    import urllib.request

    from tqdm import tqdm

    timeout = env_number("ZOO_DOWNLOAD_TIMEOUT", NUMERIC_ENVIRONMENT["ZOO_DOWNLOAD_TIMEOUT"])
    try:
        response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 (http/https/file/ftp only)
    except urllib.error.HTTPError as exc:
        raise UserError(f"could not download {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"could not download {url}: {reason}. Offline? Download the file elsewhere and "
                        "pass its local path instead") from None
    expected = response.headers.get("Content-Length")
    expected = int(expected) if expected and expected.isdigit() else None
    cap = int(env_number("ZOO_MAX_DOWNLOAD_MB", NUMERIC_ENVIRONMENT["ZOO_MAX_DOWNLOAD_MB"]) * 2**20)
    if expected is not None and expected > cap:
        response.close()
        raise UserError(f"{url}: refused, {expected:,} bytes is more than the {cap // 2**20:,} MB limit "
                        "(ZOO_MAX_DOWNLOAD_MB raises it); nothing was downloaded")
    received = 0
    try:
        with response, open(dest, "wb") as out, tqdm(total=expected, unit="B", unit_scale=True, leave=False,
                                                    desc=Path(dest).name.split(".")[1], disable=None,
                                                    file=sys.stderr) as bar:
            while True:
                block = response.read(1 << 16)
                if not block:
                    break
                received += len(block)
                if received > cap:
                    raise UserError(f"{url}: refused, the body passed the {cap // 2**20:,} MB limit "
                                    "(ZOO_MAX_DOWNLOAD_MB raises it); nothing was cached")
                out.write(block)
                bar.update(len(block))
    except (socket.timeout, TimeoutError):
        raise UserError(f"download of {url} stalled: no data for {timeout:g} s after {received} bytes; "
                        "try again later ($ZOO_DOWNLOAD_TIMEOUT sets the limit)") from None
    except OSError as exc:  # connection reset, IncompleteRead, full disk
        raise UserError(f"download of {url} failed after {received} bytes: {exc}") from None
    if expected is not None and received != expected:
        raise UserError(f"download of {url} was cut short: {received} of {expected} bytes; nothing was cached")


def check_whole(path: Path, url: str, crc: bool = True) -> None:
    """An unpinned download is a whole weights file, opened the way it will be loaded: a safetensors
    file whose tensors cover its data exactly, or a zip checkpoint whose directory (and, with `crc`,
    members' CRCs) check. An HTML error page or a cut or damaged file is refused naming the URL."""
    size, length, header = _safetensors_header(path)
    if header is not None and header.startswith(b"{"):
        problem = _safetensors_problem(size, length, header)
        if problem is None:
            return
        raise UserError(f"{url}: the download is not a whole safetensors file ({problem}); refusing it")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip() if crc else None  # the central directory reads, at least
        except (zipfile.BadZipFile, OSError, RuntimeError) as exc:
            raise UserError(f"{url}: the download is a damaged checkpoint ({shorten(exc)}); refusing it") from None
        if bad is None:
            return
        raise UserError(f"{url}: the download is a damaged checkpoint (member {shorten(bad)} fails its CRC); refusing it")
    with open(path, "rb") as f:
        start = f.read(16)
    looks = "an HTML page" if start.lstrip().lower().startswith((b"<!doc", b"<html", b"<?xml", b"<head")) else \
        "not a whole .safetensors or zip-format .ckpt file"
    raise UserError(f"{url}: the download is {looks}; refusing it, nothing was cached")


#: bytes per element of each safetensors dtype
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
               "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
#: the largest safetensors header (the format's own limit)
MAX_HEADER_BYTES = 100 * 2**20


def _safetensors_header(path: Path) -> tuple[int, int, bytes | None]:
    """(the file's size, the header length its first 8 bytes declare, the header: None unless that
    length lies inside the file and the format's limit)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        return size, length, f.read(length) if 2 <= length <= min(size - 8, MAX_HEADER_BYTES) else None


def check_safetensors(path: Path) -> None:
    """A safetensors header checked against the file before the library maps a tensor: its length,
    and every tensor's dtype x shape filling exactly its byte range inside the file."""
    try:
        problem = _safetensors_problem(*_safetensors_header(path))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if problem:
        raise UserError(f"{path}: not a valid safetensors file ({problem})")


def _safetensors_problem(size: int, length: int, header: bytes | None) -> str | None:
    """What is wrong with a safetensors file of `size` bytes, from `_safetensors_header`; None if nothing."""
    if header is None:
        return f"its header declares {length:,} bytes of a {size:,}-byte file"
    data_size = size - 8 - length
    try:
        table = json.loads(header)
    except (ValueError, RecursionError):
        return "its header is not JSON"
    if not isinstance(table, dict):
        return "its header is not a table"
    spans = []
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            return f"tensor {shorten(name, 60)} lies outside the file's {data_size:,} data bytes"
        dtype = entry.get("dtype")
        shape, width = entry.get("shape"), DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if (width is None or not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            return f"tensor {shorten(name, 60)} has no valid dtype and shape"
        if math.prod(shape) * width != offsets[1] - offsets[0]:
            return (f"tensor {shorten(name, 60)} declares {shorten(shape, 60)} {entry['dtype']} in "
                    f"{offsets[1] - offsets[0]:,} bytes")
        spans.append(tuple(offsets))
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            return "its tensors do not cover the data bytes"
        covered = end
    if covered != data_size:
        return f"its tensors end at byte {covered:,} of {data_size:,}"
    return None


def read_checkpoint(path: str | os.PathLike) -> dict:
    """A Lightning .ckpt as a dict, loaded with `weights_only=True`; one line for what does not load."""
    import torch

    path = Path(path)
    check_zip_records(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"it names {named.group(1)}" if named else str(exc).strip().splitlines()[-1][:160]
        raise UserError(f"{path}: refused, the checkpoint holds objects that only an unsafe (code-running) "
                        f"load could restore ({what})") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = re.split(r"(?<=\.)\s", first, maxsplit=1)[0]  # its first sentence, whole
        raise UserError(f"{path}: not a readable checkpoint (truncated or damaged? {shorten(reason, 200)})") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{path}: not a checkpoint (no state_dict inside)")
    check_tree(checkpoint, str(path))  # before anything reads, formats or builds from it
    return checkpoint


def check_zip_records(path: Path) -> None:
    """A zip checkpoint's records, checked before torch reads one: each declared size lies inside the
    file (torch writes them uncompressed), so 3 KB cannot declare gigabytes. Not a zip: torch says."""
    try:
        size = path.stat().st_size
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise UserError(f"{path}: not a readable checkpoint ({shorten(str(exc), 120)})") from None
    for info in records:
        stored = info.compress_type == zipfile.ZIP_STORED
        if (info.header_offset + info.compress_size > size or (stored and info.file_size != info.compress_size)
                or info.file_size > MAX_CHECKPOINT_RATIO * max(info.compress_size, 1)):
            raise UserError(f"{path}: refused, its record {shorten(info.filename, 80)} declares "
                            f"{info.file_size:,} bytes that the {size:,}-byte file does not hold (damaged or forged)")


#: the most a compressed checkpoint record may expand (torch writes uncompressed records)
MAX_CHECKPOINT_RATIO = 100


def load_weights(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict | None]:
    """(state_dict, zoo_config in current names or None) of a .safetensors or Lightning .ckpt file."""
    import torch

    path = Path(path)
    if path.suffix != ".safetensors":
        checkpoint = read_checkpoint(path)
        state, config = checkpoint.get("state_dict", checkpoint), checkpoint.get("zoo")
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{path}: not a checkpoint (no state_dict inside)")
    else:
        from safetensors import safe_open

        check_safetensors(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                text = (f.metadata() or {}).get(CONFIG_KEY)
                state = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:
            raise UserError(f"{path}: not a valid safetensors file ({shorten(str(exc), 160)})") from None
        what, sidecar = f"{path}: its zoo config", path.with_suffix(".json")
        if text is not None and len(text) > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: refused, its zoo config is more than {MAX_CONFIG_BYTES:,} characters")
        if text is not None:
            config = parse_json(text, what)
        else:
            config = read_json(sidecar, what, max_bytes=MAX_CONFIG_BYTES) if sidecar.is_file() else None
    # weights holding NaN or infinity (a diverged run, or a forged file) make every output NaN
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(f"{path}: refused, tensor {shorten(name, 80)} holds NaN or infinite values "
                            "(a diverged run or a damaged file)")
    return state, current_config(config) if isinstance(config, dict) or config is None else {"class_path": config}


def load_fetched(location: str | os.PathLike, sha256: str | None = None) -> tuple[dict[str, torch.Tensor], dict | None]:
    """`load_weights(fetch(location, sha256))`; a cached download that does not load is evicted."""
    path = fetch(location, sha256)
    try:
        return load_weights(path)
    except UserError as exc:
        if not is_url(str(location)):
            raise
        discard(path)
        raise UserError(f"{shorten(location)}: the download does not load ({str(exc).split(': ', 1)[-1]}); "
                        "it was removed from the cache") from None


def save_release(model: torch.nn.Module, config: dict, path: str | os.PathLike, meta: dict | None = None) -> str:
    """Write `model`'s weights, config and `meta` as safetensors (atomically); return the file's sha256."""
    data = release_bytes(model, config, meta)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def release_bytes(model: torch.nn.Module, config: dict, meta: dict | None = None) -> bytes:
    """`model`'s weights, config and `meta` as the bytes of a safetensors file."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {CONFIG_KEY: json.dumps(config, sort_keys=True)}
    if meta:
        metadata[META_KEY] = json.dumps(meta, sort_keys=True)
    return save(state, metadata=metadata)
