"""Export a zoo model to run without the zoo: torch.export (.pt2) or ONNX, the batch dimension dynamic.

- classifiers: `model`: images [B, C, H, W] in [0, 1] -> logits [B, K] (RAM also `locations`
  [B, T, 2], its glimpse centres (x, y) in [-1, 1]);
- captioners: `encoder`: images [B, 3, H, W] -> annotations [B, L, D], projected [B, L, P], h_0, c_0;
  `decoder_step`: token [B], h, c, projected, annotations -> log-probabilities [B, V], h, c, alpha
  [B, L], beta [B]; `greedy`: images -> tokens [B, max_len] and alphas [B, max_len, L], a caption
  ending at its first <end> (id 2). Hard attention decodes in its test mode.
Images are prepared as zoo.preprocess says. The set (`export.json` and the programs) is written whole
and replaces only an export the zoo can prove it wrote (docs/design-notes.md, "Export sets").
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from zoo.guards.errors import UserError, shorten, sigterm_stops
from zoo.guards.files import plain_name, read_json, sha256_file
from zoo.guards.writes import (OVERWRITE_HINT, atomic_write_bytes, check_writable, output_folder, replacing,
                               swap_in_folder, writing)
from zoo.preprocess import for_model, image_rules
from zoo.weights.export_set import MANIFEST, MANIFEST_DIGEST, METADATA_KEY, check_set, manifest_digest

FORMATS = ("onnx", "torch")
MAX_BATCH = 4096
MAX_MANIFEST_BYTES = 64 * 2**20  # a captioner's vocabulary is in it
EXPORT_EXTRA = "pip install 'attention-zoo[export]'"


@dataclass
class Program:
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]


class _Classifier(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images):
        return self.model.export_forward(images)  # the outputs its card's `exports` names


class _Encoder(nn.Module):
    def __init__(self, captioner):
        super().__init__()
        self.captioner = captioner

    def forward(self, images):
        return self.captioner.decode_start(images)[:4]  # annotations, projected, h, c


class _DecoderStep(nn.Module):
    def __init__(self, captioner):
        super().__init__()
        self.captioner = captioner

    def forward(self, token, h, c, projected, annotations):
        out = self.captioner.net.decode_step(token, h, c, projected, annotations)
        return out["log_probs"], out["h"], out["c"], out["alpha"], out["beta"]


class _Greedy(nn.Module):
    def __init__(self, captioner, max_len: int):
        super().__init__()
        self.encoder, self.step, self.max_len = _Encoder(captioner), _DecoderStep(captioner), max_len

    def forward(self, images):
        from zoo.data.vocab import START_ID

        annotations, projected, h, c = self.encoder(images)
        token = torch.full_like(h[:, 0], START_ID, dtype=torch.long)
        tokens, alphas = [], []
        for _ in range(self.max_len):  # unrolled: a fixed-length graph, no data-dependent stop
            log_probs, h, c, alpha, _ = self.step(token, h, c, projected, annotations)
            token = log_probs.argmax(-1)
            tokens.append(token)
            alphas.append(alpha)
        return torch.stack(tokens, 1), torch.stack(alphas, 1)


def programs(model, max_len: int | None = None) -> dict[str, Program]:
    """The programs to export for `model`, each with example inputs (batch 2)."""
    kind = model.card.output
    model = model.eval()
    if kind == "sample":
        raise UserError(f"{type(model).__name__} ({model.family}) is a generator: it has no images -> outputs "
                        "program to export")
    spec = for_model(model)
    images = torch.rand(2, spec.in_chans, *spec.size)
    if kind != "caption":
        outputs = list(model.card.exports)
        return {"model": Program(_Classifier(model), (images,), ["images"], outputs)}
    if getattr(model, "embed", None) is None:
        raise UserError("the captioner has no vocabulary yet (train it, or load a trained checkpoint)")
    encoder = _Encoder(model)
    with torch.no_grad():
        annotations, projected, h, c = encoder(images)
    token = torch.full((2,), 4, dtype=torch.long)
    max_len = int(max_len or model.hparams.decode_max_len)
    return {"encoder": Program(encoder, (images,), ["images"], ["annotations", "projected", "h", "c"]),
            "decoder_step": Program(_DecoderStep(model), (token, h, c, projected, annotations),
                                    ["token", "h", "c", "projected", "annotations"],
                                    ["log_probs", "h_next", "c_next", "alpha", "beta"]),
            "greedy": Program(_Greedy(model, max_len), (images,), ["images"], ["tokens", "alphas"])}


def export_program(program: Program, path: str | os.PathLike, fmt: str = "onnx",
                   metadata: dict[str, str] | None = None) -> Path:
    """Write one program as ONNX (`metadata` in its metadata_props) or torch.export .pt2, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad():
        exported = torch.export.export(program.module, program.inputs,
                                       dynamic_shapes=tuple({0: batch} for _ in program.inputs))
    if fmt == "torch":
        import io

        buffer = io.BytesIO()
        torch.export.save(exported, buffer)
        atomic_write_bytes(path, buffer.getvalue())
        return path
    try:
        import onnx  # noqa: F401 (torch.onnx's exporter needs onnx and onnxscript)
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise UserError(f"exporting ONNX needs {exc.name}: {EXPORT_EXTRA}") from None
    onnx_program = torch.onnx.export(exported, input_names=program.input_names,
                                     output_names=program.output_names, dynamo=True, verbose=False)
    with replacing(path) as tmp:
        onnx_program.save(str(tmp))
        if metadata:
            proto = onnx.load(str(tmp))
            for key, value in metadata.items():
                proto.metadata_props.add(key=key, value=value)
            onnx.save(proto, str(tmp))
    return path


def describe(model, fmt: str) -> dict:
    """What a deployer needs beside the programs: the model, its preprocessing, class names or vocabulary."""
    from importlib.metadata import PackageNotFoundError, version

    from zoo.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID

    try:
        zoo_version = version("attention-zoo")
    except PackageNotFoundError:
        zoo_version = "unknown"
    spec = for_model(model)
    info = {"family": model.family, "class_path": f"{type(model).__module__}.{type(model).__qualname__}",
            "format": fmt, "zoo_version": zoo_version,
            "preprocessing": preprocessing_record(spec),
            "class_names": list(spec.class_names) if spec.class_names else None}
    if getattr(model, "itos", None):
        info["vocabulary"] = list(model.itos)
        info["special_tokens"] = {"pad": PAD_ID, "start": START_ID, "end": END_ID, "unk": UNK_ID}
        info["decoding"] = {key: model.hparams.get(key) for key in ("beam_size", "length_penalty", "decode_max_len")}
    return info


def preprocessing_record(spec) -> dict:
    """export.json's `preprocessing`: `spec` with the rules a deployment follows to match it pixel for pixel."""
    return {**spec.as_dict(), **image_rules(spec.in_chans), "value_range": [0.0, 1.0],
            "normalisation": "inside the program (mean/std above are applied by it)"}


def check_target(out_dir: str | os.PathLike, overwrite: bool = True) -> Path:
    """The export's folder (a symlink followed), before any work: new, empty, or (with `overwrite`) an
    intact earlier export; never the current folder, one above it, or a mount point."""
    given, target = Path(out_dir), output_folder(out_dir)
    if target == target.parent or os.path.ismount(target):
        raise UserError(f"--out {given}: is a mount point; the export replaces its folder whole, so give a "
                        "folder inside it")
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise UserError(f"--out {given}: is the current folder{' (or holds it)' if target != cwd else ''}; the "
                        "export replaces its folder whole, so give a folder for it, e.g. --out ./exported")
    if target.is_dir() and any(target.iterdir()):
        problem = earlier_export_problem(target)
        if problem:
            raise UserError(f"--out {given}: {problem}; nothing was changed (give a new or empty folder, or "
                            "move those files out)")
        if not overwrite:
            raise UserError(f"--out {given}: holds an earlier export; {OVERWRITE_HINT}")
    check_writable(target.parent, "--out: the folder above", directory=True)
    return target


def earlier_export_problem(folder: Path) -> str | None:
    """None when `folder` is intact, exactly the set its manifest names; otherwise why not, in words."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file() or manifest_path.is_symlink():
        return f"holds other files (not an earlier export): it has no {MANIFEST}"
    try:
        manifest = read_json(manifest_path, MANIFEST, expect=dict, max_bytes=MAX_MANIFEST_BYTES)
        files = manifest.get("files")
        if not (isinstance(files, dict) and files and manifest.get("format") in FORMATS
                and isinstance(manifest.get("family"), str) and "zoo_version" in manifest):
            raise UserError("no files, format, family and zoo_version as `zoo export` writes them")
    except UserError as exc:
        return (f"holds other files (not an earlier export): its {MANIFEST} is not a zoo export manifest "
                f"({shorten(str(exc), 80)})")
    for name in files:
        entry = folder / str(name)
        if not plain_name(name) or name == MANIFEST or entry.is_symlink() or not entry.is_file():
            return (f"holds other files (not an earlier export): its {MANIFEST} names {shorten(repr(name), 60)}, "
                    "which is not a file there")
    others = sorted(set(os.listdir(folder)) - set(files) - {MANIFEST})
    if others:
        listed = ", ".join(shorten(name, 40) for name in others[:3])
        listed += f" and {len(others) - 3} more" if len(others) > 3 else ""
        return f"holds other files (not an earlier export): {listed}, which its {MANIFEST} does not name"
    if MANIFEST_DIGEST in manifest and manifest[MANIFEST_DIGEST] != manifest_digest(manifest):  # older ones have none
        return f"{MANIFEST} is not the one the earlier export wrote (edited since: not the digest it records)"
    for name, digest in files.items():
        try:
            same = sha256_file(folder / name) == digest
        except OSError as exc:
            return f"{shorten(name, 60)} of the earlier export cannot be read ({exc.strerror or exc})"
        if not same:
            return (f"{shorten(name, 60)} is not the file the earlier export wrote (its sha256 is not the one "
                    f"{MANIFEST} records: changed or replaced since)")
    return None


def export(model, out_dir: str | os.PathLike, fmt: str = "onnx", max_len: int | None = None,
           overwrite: bool = True, progress=None) -> list[Path]:
    """Export every program of `model` into `out_dir` as one set (an earlier one replaced with `overwrite`);
    `progress(line)` hears of each program before its export (each takes seconds: `zoo export` prints them)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    out_dir = check_target(out_dir, overwrite)
    suffix = ".onnx" if fmt == "onnx" else ".pt2"
    info = describe(model, fmt)
    metadata = {METADATA_KEY: json.dumps(info)}
    with sigterm_stops(), writing(out_dir) as staging:
        staging.mkdir()
        todo = programs(model, max_len)
        for written, (name, program) in enumerate(todo.items(), 1):
            if progress is not None:
                progress(f"exporting {name} ({written} of {len(todo)}) to {name}{suffix}")
            export_program(program, staging / f"{name}{suffix}", fmt, metadata)
            _test_hook(written)
        # every file the exporters wrote (an ONNX file's external data too) is in the set
        files = {path.name: sha256_file(path) for path in sorted(staging.iterdir())}
        record = {**info, "files": files}
        record[MANIFEST_DIGEST] = manifest_digest(record)
        atomic_write_bytes(staging / MANIFEST, (json.dumps(record, indent=2) + "\n").encode())
        check_target(out_dir, overwrite)  # someone wrote there while we worked?
        swap_in_folder(staging, out_dir, earlier_export_problem)
    return [out_dir / name for name in files]


def _test_hook(written: int) -> None:
    """ZOO_TEST_KILL_EXPORT_AFTER=N: the tests' kill after the N-th file (ZOO_TEST_KILL_EXPORT_SIGNAL, or SIGKILL)."""
    if os.environ.get("ZOO_TEST_KILL_EXPORT_AFTER") == str(written):
        import signal

        os.kill(os.getpid(), getattr(signal, os.environ.get("ZOO_TEST_KILL_EXPORT_SIGNAL", "SIGKILL")))


load_export = check_set  # zoo.load_export: an export's manifest, once the folder is shown to be its set
