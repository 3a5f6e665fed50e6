"""Caption an image with a `zoo export` of a captioner and no torch: onnxruntime, numpy and PIL, and
the zoo's torch-free `zoo.weights.export_set`, which checks the set before anything runs (the files are the
ones export.json names by sha256, the decoder scores its vocabulary, the sizes are bounded), as
`zoo.load_export` does. Everything the programs need besides their weights is in the export's
export.json: the vocabulary and special token ids, how to prepare an image (size, resize rule, and
how a file becomes pixels: `alpha` "composite on black", `colour`, `orientation`; `prepare` follows
them, so a transparent PNG gives the caption `zoo caption` gives), the decoding settings.

    zoo export --model sat_soft_scenes --out exported/
    python docs/examples/onnx_caption.py exported/ scene.png [--beam-size K] [--max-len N]

On the machine that runs it, the `zoo` package comes without torch when pip skips the package's
dependencies (pyproject.toml's `dependencies` pull torch; the modules this example uses import none
of them), and the example's own imports are installed by name:

    pip install --no-deps .                        # from a checkout of attention-zoo (or its wheel)
    pip install --no-deps attention-zoo            # from an index that serves the package
    pip install onnxruntime numpy pillow

(Offline, `pip install --no-deps --no-build-isolation .` builds with the setuptools already installed.)

It runs `encoder.onnx` once, then beam search over `decoder_step.onnx` (Show, Attend and Tell
decodes each image once, free-running, with beam search; Xu et al. 2015). The search follows the
zoo's (zoo/decoding/search.py): k hypotheses ranked by summed log-probability; one that emits
<end> keeps its score and competes for the k slots; the answer is the finished hypothesis with the
best score / length ** length_penalty (the length counts <end>), else the best unfinished one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from PIL import Image, ImageOps

from zoo.guards.budget import check_flags
from zoo.guards.errors import UserError, printable
from zoo.weights.export_set import check_set


#: export.json's preprocessing.alpha rules this example knows (an export written before the rule was
#: stated composited on black as well)
ALPHA_RULES = ("composite on black",)


def prepare(path: str, spec: dict) -> np.ndarray:
    """The image as the model's evaluation data was, by export.json's rules (`spec`, its
    preprocessing): float [1, C, H, W] in [0, 1] (the programs normalise it themselves)."""
    alpha = spec.get("alpha", ALPHA_RULES[0])
    if alpha not in ALPHA_RULES:
        raise UserError(f"export.json: preprocessing.alpha {alpha!r} is not a rule this example follows "
                        f"({', '.join(ALPHA_RULES)})")
    try:
        image = ImageOps.exif_transpose(Image.open(path))  # orientation: EXIF applied
        image.load()
        if image.mode == "P":
            image = image.convert("RGBA")
        if image.mode in ("RGBA", "LA", "PA"):  # a transparent pixel is its colour over black, by its alpha
            black = Image.new("RGBA", image.size, (0, 0, 0, 255))
            image = Image.alpha_composite(black, image.convert("RGBA"))
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        image = image.convert("RGB" if spec["in_chans"] == 3 else "L")  # colour: RGB, or PIL's luma
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"{path}: not a readable image ({exc})") from None
    height, width = spec["size"]
    if spec["resize"] == "crop":  # the shorter side to resize_size (the longer scaled, cut down), the centre
        shorter = spec.get("resize_size") or min(height, width)
        longer = int(shorter * max(image.size) / min(image.size))
        size = (shorter, longer) if image.width <= image.height else (longer, shorter)
        image = image.resize(size, Image.BILINEAR)
        left, top = int(round((image.width - width) / 2.0)), int(round((image.height - height) / 2.0))
        image = image.crop((left, top, left + width, top + height))
    elif image.size != (width, height):
        image = image.resize((width, height), Image.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return pixels[None]


def beam_search(step, h, c, projected, annotations, k: int, start: int, end: int, max_len: int,
                length_penalty: float) -> tuple[list[int], bool]:
    """One image's beam search; returns (word ids without <start>/<end>, finished)."""
    h, c = np.repeat(h, k, 0), np.repeat(c, k, 0)
    projected, annotations = np.repeat(projected, k, 0), np.repeat(annotations, k, 0)
    tokens = np.full(k, start, dtype=np.int64)
    scores = np.full(k, -np.inf, dtype=np.float32)
    scores[0] = 0.0
    finished = np.zeros(k, dtype=bool)
    lengths = np.zeros(k, dtype=np.int64)
    history = []  # (tokens, parents) per step
    for _ in range(max_len):
        log_probs, h, c, _alpha, _beta = step.run(None, {"token": tokens, "h": h, "c": c, "projected": projected,
                                                         "annotations": annotations})
        vocab = log_probs.shape[-1]
        frozen = np.full_like(log_probs, -np.inf)
        frozen[:, end] = 0.0  # a finished hypothesis continues with <end> at no cost
        log_probs = np.where(finished[:, None], frozen, log_probs)
        candidates = (scores[:, None] + log_probs).reshape(-1)
        best = np.argsort(-candidates, kind="stable")[:k]
        parents, tokens = best // vocab, best % vocab
        parent_finished = finished[parents]
        scores = candidates[best]
        lengths = lengths[parents] + (~parent_finished)
        finished = parent_finished | (tokens == end)
        h, c = h[parents], c[parents]
        history.append((tokens, parents))
        if finished.all():
            break
    normalised = scores / np.maximum(lengths, 1).astype(np.float32) ** length_penalty
    choice = int(np.argmax(np.where(finished, normalised, -np.inf))) if finished.any() else int(np.argmax(normalised))
    words, beam = [], choice
    for tokens_t, parents_t in reversed(history):
        words.append(int(tokens_t[beam]))
        beam = int(parents_t[beam])
    words.reverse()
    n_words = int(lengths[choice]) - int(finished[choice])
    return words[:n_words], bool(finished[choice])


def caption(folder: Path, images: list[str], beam_size: int | None, max_len: int | None) -> None:
    info = check_set(folder)  # the set export.json names, or one line saying what is wrong
    if info.get("vocabulary") is None:
        raise UserError(f"{folder}: an export of a {info.get('family')} model, not of a captioner")
    check_flags({"--beam-size": beam_size, "--max-len": max_len})
    special, decoding = info["special_tokens"], info["decoding"]
    vocabulary = info["vocabulary"]
    providers = ["CPUExecutionProvider"]
    encoder = onnxruntime.InferenceSession(str(folder / "encoder.onnx"), providers=providers)
    step = onnxruntime.InferenceSession(str(folder / "decoder_step.onnx"), providers=providers)
    for path in images:
        annotations, projected, h, c = encoder.run(None, {"images": prepare(path, info["preprocessing"])})
        words, finished = beam_search(step, h, c, projected, annotations, beam_size or decoding["beam_size"],
                                      special["start"], special["end"], max_len or decoding["decode_max_len"],
                                      decoding["length_penalty"])
        text = printable(" ".join(vocabulary[i] for i in words))  # words from a file: shown, never obeyed
        print(f"{printable(path)}\t{text}" + ("" if finished else "\t[cut at --max-len]"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="a folder written by `zoo export` for a captioner")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--beam-size", type=int, help="default: the model's")
    parser.add_argument("--max-len", type=int, help="default: the model's")
    args = parser.parse_args()
    try:
        caption(Path(args.export), args.images, args.beam_size, args.max_len)
    except UserError as exc:
        print(f"{parser.prog}: error: {printable(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
