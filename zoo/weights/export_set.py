"""An export set (`export.json` and the programs it names), checked without torch wherever it is read
(`zoo.load_export`, docs/examples/onnx_caption.py): `check_set` refuses in one line anything but
exactly its family's programs, each with its sha256, sane sizes and an ONNX description of this model.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from zoo.guards.budget import check_memory, limit
from zoo.guards.errors import UserError, shorten
from zoo.guards.files import parse_json, plain_name, read_json, sha256_file

MANIFEST = "export.json"
MANIFEST_DIGEST = "manifest_sha256"  # export.json's digest of itself (manifest_digest)
#: the programs a family's export holds: a captioner's three, a classifier's one
CAPTION_PROGRAMS = ("encoder", "decoder_step", "greedy")
CLASSIFIER_PROGRAMS = ("model",)
SUFFIXES = {"onnx": ".onnx", "torch": ".pt2"}
#: the key of a program's ONNX metadata that holds the description export.json holds too
METADATA_KEY = "attention_zoo"
SPECIAL_TOKENS = ("pad", "start", "end", "unk")


def manifest_digest(manifest: dict) -> str:
    """The sha256 an export.json records of itself (MANIFEST_DIGEST): of its canonical JSON without
    that key, so that a manifest edited since is not taken for the zoo's."""
    body = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def programs_of(manifest: dict) -> tuple[str, ...]:
    """The program names an export of this family holds."""
    return CAPTION_PROGRAMS if manifest.get("vocabulary") is not None else CLASSIFIER_PROGRAMS


def check_set(folder: str | os.PathLike) -> dict:
    """The export's manifest, once the folder is shown to hold exactly the set it describes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (give the folder `zoo export --out` wrote)")
    manifest = read_json(folder / MANIFEST, f"{folder}: {MANIFEST}", expect=dict)
    where = f"{folder}: {MANIFEST}"
    fmt = manifest.get("format")
    if not isinstance(fmt, str) or fmt not in SUFFIXES:
        raise UserError(f"{where}: format {shorten(fmt, 40)!r} is not one of {', '.join(SUFFIXES)}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise UserError(f"{where}: names no files (not a zoo export, or an empty set)")
    expected = {f"{name}{SUFFIXES[fmt]}" for name in programs_of(manifest)}
    for name, digest in files.items():
        if not plain_name(name):
            raise UserError(f"{where}: refused, {shorten(name, 80)!r} is not a plain file name inside the folder")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise UserError(f"{where}: the sha256 of {shorten(name, 80)} is not 64 hex digits")
    if set(files) != expected:
        raise UserError(f"{where}: names {', '.join(sorted(map(shorten, files)))}; a {manifest.get('family', '?')} "
                        f"export is exactly {', '.join(sorted(expected))}")
    _check_description(manifest, where)
    root = folder.resolve()
    for name, digest in files.items():
        path = folder / name
        if not path.is_file() or path.resolve().parent != root:
            raise UserError(f"{folder}: {name} is missing, or not a file of this folder; export again")
        if sha256_file(path) != digest:
            raise UserError(f"{folder}: {name} is not the file this export's {MANIFEST} names "
                            "(a mixed or damaged set); export again")
    if fmt == "onnx":
        _check_programs(folder, manifest)
    return manifest


def _int_in(value: Any, low: float, high: float) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_description(manifest: dict, where: str) -> None:
    """What a reader allocates from: the input, the labels, and a captioner's decoding."""
    spec = manifest.get("preprocessing")
    if not isinstance(spec, dict):
        raise UserError(f"{where}: no preprocessing")
    size, top = spec.get("size"), limit("image_size")
    if not (isinstance(size, list) and len(size) == 2 and all(_int_in(s, 1, top) for s in size)):
        raise UserError(f"{where}: preprocessing size {shorten(size, 40)} is not [H, W] within 1..{top:,.0f} px "
                        "(ZOO_LIMITS=image_size=N raises it)")
    if spec.get("in_chans") not in (1, 3) or not isinstance(spec.get("resize"), str):
        raise UserError(f"{where}: preprocessing wants in_chans 1 or 3 and a resize rule")
    if spec.get("resize_size") is not None and not _int_in(spec["resize_size"], 1, top):
        raise UserError(f"{where}: preprocessing resize_size {shorten(spec['resize_size'], 40)} is out of range")
    names = manifest.get("class_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise UserError(f"{where}: class_names is not a list of names")
    if programs_of(manifest) != CAPTION_PROGRAMS:
        return
    vocabulary, special, decoding = (manifest.get(k) for k in ("vocabulary", "special_tokens", "decoding"))
    if not (isinstance(vocabulary, list) and len(SPECIAL_TOKENS) < len(vocabulary) <= limit("max_vocab")
            and all(isinstance(w, str) for w in vocabulary)):
        raise UserError(f"{where}: vocabulary is not a list of words")
    if not (isinstance(special, dict) and all(_int_in(special.get(k), 0, len(vocabulary) - 1) for k in SPECIAL_TOKENS)):
        raise UserError(f"{where}: special_tokens must give pad, start, end and unk as ids of the vocabulary")
    if not isinstance(decoding, dict):
        raise UserError(f"{where}: no decoding settings")
    for key in ("beam_size", "decode_max_len"):
        if not _int_in(decoding.get(key), 1, limit(key)):
            raise UserError(f"{where}: decoding {key} {shorten(decoding.get(key), 40)} is outside "
                            f"1..{limit(key):,.0f}")
    penalty = decoding.get("length_penalty")
    if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or not math.isfinite(penalty):
        raise UserError(f"{where}: decoding length_penalty is not a finite number")


def _check_programs(folder: Path, manifest: dict) -> None:
    """Inside the ONNX programs: a captioner's decoder scores exactly the manifest's vocabulary, and
    each program describes the model export.json describes (its embedded copy)."""
    read = {}
    for name in programs_of(manifest):
        path = folder / f"{name}.onnx"
        check_memory({f"{name}.onnx": float(path.stat().st_size)}, f"{folder}: {name}.onnx")
        read[name] = _read_onnx(path)
    width = read.get("decoder_step", (None, {}))[1].get("log_probs")
    if width is not None and width != len(manifest["vocabulary"]):
        raise UserError(f"{folder}: decoder_step.onnx scores {width:,} words but {MANIFEST}'s vocabulary has "
                        f"{len(manifest['vocabulary']):,}; export again")
    description = {k: v for k, v in manifest.items() if k not in ("files", MANIFEST_DIGEST)}
    for name, (embedded, _) in read.items():
        if embedded is not None and embedded != description:
            raise UserError(f"{folder}: {name}.onnx was exported from another model than {MANIFEST} describes "
                            "(a mixed set); export again")


def _read_onnx(path: Path) -> tuple[dict | None, dict[str, int]]:
    """(embedded description or None, {output: last dimension}) of an ONNX file (onnx, else onnxruntime)."""
    try:
        try:
            import onnx
        except ImportError:
            onnx = None
        if onnx is not None:
            proto = onnx.load(str(path), load_external_data=False)
            metadata = {p.key: p.value for p in proto.metadata_props}
            widths = {o.name: o.type.tensor_type.shape.dim[-1].dim_value for o in proto.graph.output
                      if o.type.tensor_type.shape.dim and o.type.tensor_type.shape.dim[-1].HasField("dim_value")}
        else:
            import onnxruntime

            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            metadata = dict(session.get_modelmeta().custom_metadata_map)
            widths = {o.name: o.shape[-1] for o in session.get_outputs() if o.shape and isinstance(o.shape[-1], int)}
    except Exception as exc:  # a damaged protobuf: many types
        raise UserError(f"{path}: not a readable ONNX program ({type(exc).__name__}: {shorten(str(exc), 120)})") from None
    embedded = metadata.get(METADATA_KEY)
    return (parse_json(embedded, f"{path}: its {METADATA_KEY} metadata") if embedded is not None else None), widths
