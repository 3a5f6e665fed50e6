"""Export a zoo model to run without the zoo: torch.export (an ExportedProgram saved as .pt2) or
ONNX (through torch.onnx's exporter). The batch dimension stays dynamic.

What is exported:
- classifiers (the baselines, RAM with its deterministic mean-location policy, the DRAW
  classifier, ViT): `model`: images [B, C, H, W] in [0, 1] -> logits [B, K];
- captioners, three programs (a serving loop can use the first two, the third is complete):
  `encoder`: images [B, 3, H, W] -> annotations [B, L, D], projected keys [B, L, P], h_0, c_0 [B, n];
  `decoder_step`: token [B] int64, h, c, projected, annotations -> log-probabilities [B, V], h, c,
      alpha [B, L], beta [B] (one word of Show-Attend-Tell; <pad> and <start> are never emitted);
  `greedy`: images -> tokens [B, max_len] int64 and alphas [B, max_len, L]: greedy decoding
      unrolled to max_len steps; a caption ends at its first <end> (id 2), later tokens are padding.
  Hard-attention captioners decode with their test mode (the expected context, or the argmax cell).
Images are prepared as zoo.preprocess describes (`zoo.get_weights(name).transforms()`); the model's
own normalisation is inside the exported program.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from zoo.errors import UserError

FORMATS = ("onnx", "torch")
MAX_BATCH = 4096


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
        return self.model(images)


class _Encoder(nn.Module):
    def __init__(self, captioner):
        super().__init__()
        self.captioner = captioner

    def forward(self, images):
        annotations, _ = self.captioner.encode(images)
        projected = self.captioner.attend.score.project_keys(annotations)
        h, c = self.captioner.init_state(annotations)
        return annotations, projected, h, c


class _DecoderStep(nn.Module):
    def __init__(self, captioner):
        super().__init__()
        self.captioner = captioner
        hp = captioner.hparams
        self.mode = "soft" if hp.attention == "soft" else hp.hard_test_mode
        from zoo.data.vocab import PAD_ID, START_ID

        self.register_buffer("never", torch.tensor([PAD_ID, START_ID]), persistent=False)

    def forward(self, token, h, c, projected, annotations):
        out = self.captioner.step(token, h, c, projected, annotations, self.mode)
        logits = out["logits"].index_fill(-1, self.never, float("-inf"))
        return torch.log_softmax(logits.float(), dim=-1), out["h"], out["c"], out["alpha"], out["beta"]


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
    from zoo.preprocess import for_model

    family = getattr(model, "family", None)
    model = model.eval()
    if family == "draw":
        raise UserError("a DRAW generator has no images -> outputs program to export (export the "
                        "DRAW classifier, RAM, ViT, a baseline or a captioner)")
    spec = for_model(model)
    images = torch.rand(2, spec.in_chans, *spec.size)
    if family != "captioner":
        return {"model": Program(_Classifier(model), (images,), ["images"], ["logits"])}
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


def _batch_dynamic(program: Program):
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    return tuple({0: batch} for _ in program.inputs)


def export_program(program: Program, path: str | os.PathLike, fmt: str = "onnx") -> Path:
    """Write one program as ONNX or as a torch.export .pt2 file, atomically."""
    from zoo.io import atomic_write_bytes

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        exported = torch.export.export(program.module, program.inputs, dynamic_shapes=_batch_dynamic(program))
    if fmt == "torch":
        import io

        buffer = io.BytesIO()
        torch.export.save(exported, buffer)
        atomic_write_bytes(path, buffer.getvalue())
        return path
    onnx_program = torch.onnx.export(exported, input_names=program.input_names,
                                     output_names=program.output_names, dynamo=True, verbose=False)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        onnx_program.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def export(model, out_dir: str | os.PathLike, fmt: str = "onnx", max_len: int | None = None) -> list[Path]:
    """Export every program of `model` into `out_dir` (<program>.onnx or <program>.pt2)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    suffix = ".onnx" if fmt == "onnx" else ".pt2"
    return [export_program(program, Path(out_dir) / f"{name}{suffix}", fmt)
            for name, program in programs(model, max_len).items()]
