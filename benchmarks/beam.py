"""Batched beam search vs one image at a time, and captioner training throughput.

    python benchmarks/beam.py [--checkpoint PATH | --model NAME] [--batch-size 64] [--beam-size 5]

Decoding: the FashionScenes captioner (trained weights when given or released, else the recipe
with random weights) captions B held-out test scenes three ways, which must return identical
captions:
- batched: `zoo.decoding.beam_search` once for the whole batch (B x k rows per step, fewer as
  images finish and leave the batch; one host sync per step);
- per image: the same vectorised search once per image (k rows per step, what public ports do);
- reference: the obvious per-image beam search that tests/test_decoding.py checks the batched one
  against (one decoder call per hypothesis and step, candidates in Python lists).
The issue's speed-up is batched against the reference; batched against per image is also
reported, because it isolates what batching over images alone buys. Random weights give
degenerate (often empty) captions while the beams still run to max_len, so quote figures measured
with trained weights (`--checkpoint` or released weights). On CPU the per-row compute (the
additive attention's tanh over L x A per row and step, the LSTM) is the same in all three, so the
ratios there are bounded by the per-call overhead that batching removes.
Training: images/s of full optimisation steps (teacher-forced forward, backward, Adam) for soft
and hard attention. Prints a table and writes results/bench_beam.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # the reference search lives next to the test that checks it

from zoo.results import write_json  # noqa: E402

RECIPE = "sat_soft_scenes"


def load_model(args):
    import zoo

    if args.checkpoint:
        return zoo.load_checkpoint(args.checkpoint), args.checkpoint
    if args.model in zoo.list_models(pretrained=True):
        return zoo.create_model(args.model, pretrained=True), f"{args.model} (released weights)"
    words = ["a", "an", "the", "red", "blue", "green", "shirt", "bag", "coat", "left", "of", "right", "above",
             "below", "and", "there", "is", "pair", "trousers", "dress"]
    model = zoo.create_model(args.model, vocab=["<pad>", "<start>", "<end>", "<unk>"] + words)
    return model, f"{args.model} (random weights)"


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def reference_captions(model, images: torch.Tensor, args) -> list[list[str]]:
    """The per-image, per-hypothesis reference search of tests/test_decoding.py on the captioner."""
    from test_decoding import reference_beam

    from zoo.data.vocab import END_ID, START_ID

    step_fn, state, static, _ = model.net.decoder(images)
    adapter = SimpleNamespace(init=lambda: (state, static), step=step_fn)
    captions = []
    for b in range(len(images)):
        tokens, _, _, _ = reference_beam(adapter, b, args.beam_size, args.max_len, model.hparams.length_penalty,
                                         start=START_ID, end=END_ID)
        captions.append([model.itos[i] for i in tokens])
    return captions


def held_out_images(model, n: int) -> tuple[torch.Tensor, str]:
    """The first n FashionScenes test scenes when the model was trained on FashionScenes (real
    captions of realistic, varied lengths), else uniform noise images."""
    data = getattr(model, "_zoo_data_config", None) or {}
    if data.get("class_path", "").endswith("FashionScenesDataModule"):
        from zoo.data.scenes import FashionScenesDataModule

        args = {k: v for k, v in (data.get("init_args") or {}).items() if not k.startswith("_")}
        dm = FashionScenesDataModule(**{**args, "num_test": max(n, 1)})
        test = dm.build_split("test")
        return torch.from_numpy(test.images[:n]).float() / 255, f"the first {n} FashionScenes test scenes"
    torch.manual_seed(0)
    H, W = model.hparams.image_size
    return torch.rand(n, 3, H, W), f"{n} uniform noise images"


def bench_decoding(model, args) -> dict:
    images, what = held_out_images(model, args.batch_size)
    kw = dict(beam_size=args.beam_size, max_len=args.max_len)
    with torch.no_grad():
        batched_s, batched = timed(lambda: model.caption(images, **kw), args.repeats)
        per_image_s, per_image = timed(lambda: [model.caption(images[i:i + 1], **kw)[0]
                                                for i in range(len(images))], args.repeats)
        reference_s, reference = timed(lambda: reference_captions(model, images, args), args.reference_repeats)
    words = [r["words"] for r in batched]
    lengths = [len(w) for w in words]
    return {"images": what, "batch_size": args.batch_size, "beam_size": args.beam_size, "max_len": args.max_len,
            "batched_s": batched_s, "reference_s": reference_s, "per_image_s": per_image_s,
            "speedup_vs_reference": reference_s / batched_s, "speedup_vs_per_image": per_image_s / batched_s,
            "batched_images_per_s": args.batch_size / batched_s,
            "identical_to_reference": words == reference,
            "identical_to_per_image": words == [r["words"] for r in per_image],
            "mean_caption_words": sum(lengths) / len(lengths),
            "finished_fraction": sum(r["finished"] for r in batched) / len(batched)}


def bench_training(attention: str, args) -> dict:
    import zoo

    torch.manual_seed(0)
    vocab = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(43)]  # FashionScenes' size
    model = zoo.create_model(f"sat_{attention}_scenes", vocab=vocab).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    H, W = model.hparams.image_size
    B, T = args.batch_size, args.train_caption_len + 2
    captions = torch.randint(4, len(vocab), (B, T))
    captions[:, 0], captions[:, -1] = 1, 2
    batch = {"images": torch.rand(B, 3, H, W), "captions": captions, "lengths": torch.full((B,), T),
             "image_ids": list(range(B))}
    model.log = lambda *a, **k: None  # no trainer attached here

    def step():
        optimizer.zero_grad()
        model.training_step(batch, 0).backward()
        optimizer.step()

    seconds, _ = timed(lambda: [step() for _ in range(args.train_steps)], 1)
    return {"attention": attention, "batch_size": B, "caption_tokens": T, "steps": args.train_steps,
            "images_per_s": B * args.train_steps / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint")
    parser.add_argument("--model", default=RECIPE)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-repeats", type=int, default=1, help="the reference is slow; best of N")
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--train-caption-len", type=int, default=12, help="words per training caption")
    parser.add_argument("--out", default="results/bench_beam.json")
    args = parser.parse_args()

    model, source = load_model(args)
    model.eval()
    decoding = bench_decoding(model, args)
    training = [bench_training(a, args) for a in ("soft", "hard")]
    print(f"model: {source}; torch threads: {torch.get_num_threads()}")
    print(f"beam search, B={decoding['batch_size']}, k={decoding['beam_size']}, max_len={decoding['max_len']}:")
    print(f"  batched   {decoding['batched_s'] * 1e3:9.1f} ms  ({decoding['batched_images_per_s']:.1f} images/s)")
    print(f"  reference {decoding['reference_s'] * 1e3:9.1f} ms  speedup {decoding['speedup_vs_reference']:6.1f} x"
          f"  identical captions: {decoding['identical_to_reference']}")
    print(f"  per image {decoding['per_image_s'] * 1e3:9.1f} ms  speedup {decoding['speedup_vs_per_image']:6.1f} x"
          f"  identical captions: {decoding['identical_to_per_image']}")
    for t in training:
        print(f"training ({t['attention']}), B={t['batch_size']}, {t['caption_tokens']} tokens: "
              f"{t['images_per_s']:.1f} images/s")
    path = write_json(args.out, {"benchmark": "beam", "model": source, "decoding": decoding, "training": training,
                                 "args": vars(args)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
