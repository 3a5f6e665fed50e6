"""The fuzz harness of the zoo's untrusted inputs (tests/test_fuzz.py runs it; `make fuzz` runs it for
as long as asked, through tools/fuzz.py).

Ten kinds of input reach the zoo from files it did not write. For each, a generator starts from a
real file (one the zoo writes, or a standard one: a PNG, a COCO captions file) and mutates it the
way damage and forgery do: truncation, flipped bytes, changed declared lengths, counts, shapes,
dtypes and offsets, nesting, repetition, swapped types, huge or non-finite values, a class_path
that names code. Each input is then read the way the zoo reads it, and must give

    a correct result, or one line of UserError;

never another exception (a traceback), a hang past TIME_CAP_S, memory past the budget (the
address space is capped while a case runs), a file written outside the case's output folder, or
code run (a class_path naming os.system would touch MARKER).

A failing input is kept (`FAILURES`) so the runner can save it under tests/fuzz_corpus/<kind>/, and
every saved input is replayed by the tests (`replay`).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import signal
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from zoo.guards.errors import UserError

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CORPUS = TESTS / "fuzz_corpus"
TIME_CAP_S = 60.0  # a case is milliseconds of work; a minute is a hang, even on a loaded machine
ADDRESS_SLACK = 2 * 2**30  # address space a case may map beyond the memory budget (threads, mmaps)
MAX_MESSAGE = 1000  # characters of a UserError: one line, file-supplied values shortened
#: the last failing input of each kind (the runner saves it to the corpus)
FAILURES: dict[str, bytes] = {}


class Hang(Exception):
    """A case ran past TIME_CAP_S."""


# ----------------------------------------------------------------------------- the property
@dataclass
class Sandbox:
    """Where a case runs: `root` holds its input files and is its output folder; anything written
    elsewhere under `watched` is a violation; MARKER appearing means code ran."""

    root: Path
    watched: Path

    @property
    def marker(self) -> Path:
        return self.watched / "MARKER"


def _listing(folder: Path) -> set[str]:
    return {str(p) for p in folder.rglob("*")} if folder.exists() else set()


def _nearby() -> set[str]:
    """What lies directly in the working directory and the clone's root (a stray run folder, cache
    or log would appear there)."""
    return {str(folder / name) for folder in {Path.cwd(), REPO} for name in os.listdir(folder)}


@contextlib.contextmanager
def _time_cap(seconds: float):
    """SIGALRM raises Hang after `seconds` (the main thread only; pytest-timeout's own alarm, if
    any, is put back afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise Hang(f"ran past {seconds:g} s")

    previous_handler = signal.signal(signal.SIGALRM, alarm)
    previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            signal.setitimer(signal.ITIMER_REAL, previous_delay)


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


@contextlib.contextmanager
def _memory_cap():
    """While a case runs, the process may map at most what it maps now, plus the memory budget
    (zoo.guards.budget) and ADDRESS_SLACK: an allocation past that fails (MemoryError, torch's
    RuntimeError), which the property reports, instead of taking the machine's memory."""
    from zoo.guards.budget import limit

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _mapped_bytes() + int(limit("memory_mb") * 2**20) + ADDRESS_SLACK
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def holds(kind: str, data: bytes, sandbox: Sandbox, read: Callable[[], object],
          check: Callable[[object], None] | None = None) -> str:
    """Run `read()` (the zoo reading this input) under the caps and check the property; returns
    "ok" or "refused". A violation raises (Hypothesis then shrinks the input), after the input is
    kept in FAILURES[kind]."""
    before = (_listing(sandbox.watched) - _listing(sandbox.root)) | _nearby()
    try:
        try:
            with _time_cap(TIME_CAP_S), _memory_cap():
                result = read()
            outcome = "ok"
        except UserError as exc:
            message = str(exc)
            assert message and len(message) <= MAX_MESSAGE, f"not one short line: {message[:300]!r}..."
            outcome, result = "refused", None
        if outcome == "ok" and check is not None:
            check(result)
        assert not sandbox.marker.exists(), "code named by the input ran"
        after = (_listing(sandbox.watched) - _listing(sandbox.root)) | _nearby()
        assert after <= before, f"written outside the case's folder: {sorted(after - before)[:3]}"
        return outcome
    except BaseException:
        FAILURES[kind] = data
        raise


# ----------------------------------------------------------------------------- byte mutations
def _flip(data: bytes, draw) -> bytes:
    if not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]


def _truncate(data: bytes, draw) -> bytes:
    return data[:draw(st.integers(0, max(len(data) - 1, 0)))]


def _splice(data: bytes, draw) -> bytes:
    at = draw(st.integers(0, len(data)))
    return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]


def _repeat(data: bytes, draw) -> bytes:
    if not data:
        return data
    start = draw(st.integers(0, len(data) - 1))
    piece = data[start:start + draw(st.integers(1, 256))]
    return data[:start] + piece * draw(st.integers(2, 64)) + data[start:]


def _int_field(data: bytes, draw) -> bytes:
    """Overwrite an aligned 4- or 8-byte field (a declared length, count or offset) with an
    extreme value."""
    width = draw(st.sampled_from([4, 8]))
    if len(data) < width:
        return data
    at = draw(st.integers(0, (len(data) - width) // width)) * width
    value = draw(st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, len(data), len(data) + 1]))
    return data[:at] + (value % 2**(8 * width)).to_bytes(width, "little") + data[at + width:]


BYTE_MUTATIONS = [_flip, _truncate, _splice, _repeat, _int_field]


@st.composite
def mutated_bytes(draw, seed: bytes, rounds: int = 3) -> bytes:
    data = seed
    for _ in range(draw(st.integers(1, rounds))):
        data = draw(st.sampled_from(BYTE_MUTATIONS))(data, draw)
    return data


# ----------------------------------------------------------------------------- structure mutations
BIG_INT = "__a 5000-digit integer__"  # json.dumps cannot write one (Python's int limit); `dumps` does
HUGE = [10**6, 10**9, 2**63, -1, -(10**9), BIG_INT, 1e308, float("inf"), float("-inf"), float("nan")]


def evil_class(marker: Path) -> dict:
    return {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}


@st.composite
def mutated_tree(draw, tree, marker: Path, rounds: int = 3):
    """A JSON-like tree (a config, a manifest, a caption file) changed at a few places: a value
    replaced by a huge, non-finite, negative or wrong-typed one, a key dropped or added, a branch
    nested deep or repeated, a class_path naming code."""
    tree = json.loads(json.dumps(tree))
    for _ in range(draw(st.integers(1, rounds))):
        tree = _mutate_at(draw, tree, marker, depth=0)
    return tree


def _replacement(draw, value, marker: Path):
    choices = [
        lambda: draw(st.sampled_from(HUGE)),
        lambda: draw(st.sampled_from([None, True, "", "x" * draw(st.integers(1, 300_000)), [], {}, 0, 0.5])),
        lambda: [value] * draw(st.integers(2, 50)),
        lambda: _nest(value, draw(st.integers(30, 3000))),
        lambda: evil_class(marker),
        lambda: _text_of(value),
        lambda: draw(st.text(max_size=20)),
        lambda: draw(st.sampled_from(["<!--<script>", "\x1b[31m\x1b]0;x\x07", "../../../etc/passwd", "/abs/path",
                                      "zoo.models.ram.RAM", "torch.nn.Linear", "builtins.eval"])),
    ]
    return draw(st.sampled_from(choices))()


def _text_of(value) -> str:
    try:
        return str(value)[:1000]
    except RecursionError:  # a branch this fuzzer nested
        return "deep"


def _nest(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


def _mutate_at(draw, node, marker: Path, depth: int):
    if isinstance(node, dict) and node and depth < 12 and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node, key=str)))
        action = draw(st.sampled_from(["descend", "replace", "drop", "add"]))
        node = dict(node)
        if action == "descend":
            node[key] = _mutate_at(draw, node[key], marker, depth + 1)
        elif action == "replace":
            node[key] = _replacement(draw, node[key], marker)
        elif action == "drop":
            del node[key]
        else:
            node[draw(st.text(min_size=1, max_size=12))] = _replacement(draw, node[key], marker)
        return node
    if isinstance(node, list) and node and depth < 12 and draw(st.booleans()):
        at = draw(st.integers(0, len(node) - 1))
        node = list(node)
        node[at] = _mutate_at(draw, node[at], marker, depth + 1) if draw(st.booleans()) \
            else _replacement(draw, node[at], marker)
        return node
    return _replacement(draw, node, marker)


def with_big_ints(tree):
    """The tree with BIG_INT markers as real 5,000-digit integers (made by arithmetic: Python refuses
    to convert so many digits from text); a tree nested past Python's recursion limit as it is."""
    try:
        return _big_ints(tree)
    except RecursionError:
        return tree


def _big_ints(tree):
    if tree == BIG_INT:
        return 7 * 10**4999
    if isinstance(tree, dict):
        return {key: _big_ints(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_big_ints(value) for value in tree]
    return tree


def dumps(tree) -> bytes:
    """JSON text of a mutated tree (NaN and Infinity as Python writes them: what a sloppy writer makes)."""
    try:
        text = json.dumps(tree)
    except (ValueError, RecursionError):
        return b"[" * 5000 + b"]" * 5000
    return text.replace(json.dumps(BIG_INT), "7" * 5000).encode()


# ----------------------------------------------------------------------------- format-aware edits
def png_with_size(width: int, height: int) -> bytes:
    """A real PNG whose IHDR declares width x height (its CRC fixed up) over one tiny row of data:
    the header promises an image the data does not hold."""
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("L", (4, 4), 128).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    struct.pack_into(">II", data, ihdr + 4, width, height)
    struct.pack_into(">I", data, ihdr + 17, zlib.crc32(bytes(data[ihdr:ihdr + 17])))
    return bytes(data)


def safetensors_bytes(header: dict, payload: bytes) -> bytes:
    text = dumps(header)
    return len(text).to_bytes(8, "little") + text + payload


def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + length]), data[8 + length:]


def zip_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def rezip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


# ----------------------------------------------------------------------------- the corpus
def save_failure(kind: str, data: bytes) -> Path:
    """Keep a failing input as a regression case: tests/fuzz_corpus/<kind>/<sha256 prefix>.bin."""
    folder = CORPUS / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


def corpus_cases() -> list[tuple[str, Path]]:
    return sorted((path.parent.name, path) for path in CORPUS.glob("*/*.bin"))


def random_array(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def make_export_seed(folder: Path) -> None:
    """Write the export-set seed (tests/fuzz_seeds/export_set): a tiny captioner's `zoo export`, its
    greedy program unrolled two words. Run again when the export format changes:
    python -c "import sys; sys.path.insert(0, 'tests'); import fuzzing; fuzzing.make_export_seed(fuzzing.TESTS / 'fuzz_seeds' / 'export_set')"
    """
    import torch

    from zoo.data.vocab import SPECIALS
    from zoo.models.captioner import Captioner
    from zoo.weights.export import export

    torch.manual_seed(0)
    model = Captioner(vocab=[*SPECIALS, "a", "red", "shirt"], image_size=[16, 16],
                      decoder=dict(embed_dim=4, hidden_dim=8, attention_dim=4), backbone={"kind": "stem", "in_chans": 3, "channels": [4], "strides": [8]},
                      decode_max_len=2).eval()
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    export(model, folder, "onnx")
