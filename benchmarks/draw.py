"""DRAW speed: training images/s of the paper's MNIST-sized model (T=64, 256-unit LSTMs, z=100,
read 2x2, write 5x5; also without attention) and the batched filterbank against a per-sample
loop reference.

    .venv/bin/python benchmarks/draw.py [--batch-size 100] [--iters 5] [--device cpu|cuda|all] [--threads N]

On a shared CPU pass --threads 1: with more threads than free cores OpenMP's spin-waiting can
make small ops 100x slower and the numbers meaningless.

Prints a table and writes results/bench_draw.json (with git commit and device).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.attention import filterbank as fb  # noqa: E402
from zoo.models.draw import DRAW  # noqa: E402
from zoo.results import write_json  # noqa: E402

MNIST_MODEL = dict(image_size=28, in_chans=1, T=64, enc_size=256, dec_size=256, z_size=100,
                   read_n=2, write_n=5)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, iters: int, warmup: int, device) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def bench_training(attention: str, batch_size: int, iters: int, device) -> dict:
    torch.manual_seed(0)
    model = DRAW(attention=attention, **MNIST_MODEL).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.bernoulli(torch.rand(batch_size, 1, 28, 28, device=device) * 0.3)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model.negative_elbo(x)["nelbo"].mean()
        loss.backward()
        optimizer.step()

    seconds = _timed(step, iters, warmup=1, device=device)
    return {"what": f"train step, attention={attention}", "batch_size": batch_size,
            "seconds_per_step": seconds, "images_per_s": batch_size / seconds,
            "params": sum(p.numel() for p in model.parameters())}


def reference_read_write(x, w, raw, n):
    """The per-sample loop a naive port would write: one example's filters, read, write at a time."""
    H, W = x.shape[-2:]
    reads, writes = [], []
    for b in range(x.shape[0]):
        p = fb.params_from_raw(raw[b:b + 1], H, W, n)
        fx, fy = fb.filterbank(p, n, H, W)
        reads.append(fb.read(x[b:b + 1], x[b:b + 1], fx, fy, p.gamma))
        writes.append(fb.write(w[b:b + 1], fx, fy, p.gamma))
    return torch.cat(reads), torch.cat(writes)


def batched_read_write(x, w, raw, n):
    H, W = x.shape[-2:]
    p = fb.params_from_raw(raw, H, W, n)
    fx, fy = fb.filterbank(p, n, H, W)
    return fb.read(x, x, fx, fy, p.gamma), fb.write(w, fx, fy, p.gamma)


def bench_filterbank(batch_size: int, size: int, n: int, iters: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch_size, 1, size, size, generator=g).to(device)
    w = torch.randn(batch_size, 1, n, n, generator=g).to(device)
    raw = (torch.randn(batch_size, 5, generator=g) * 0.5).to(device)
    got, ref = batched_read_write(x, w, raw, n), reference_read_write(x, w, raw, n)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, ref)), "batched != reference"
    batched = _timed(lambda: batched_read_write(x, w, raw, n), iters, 2, device)
    loop = _timed(lambda: reference_read_write(x, w, raw, n), iters, 1, device)
    return {"what": f"filterbank build+read+write {size}x{size}, N={n}", "batch_size": batch_size,
            "batched_ms": 1e3 * batched, "per_sample_loop_ms": 1e3 * loop, "speedup": loop / batched}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", default="results/bench_draw.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device == "cpu" else ["cuda"] if args.device == "cuda" else (
        ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    rows = []
    for name in devices:
        device = torch.device(name)
        for attention in ("filterbank", "none"):
            rows.append({"device": name, **bench_training(attention, args.batch_size, args.iters, device)})
            print(f"{name:5s} {rows[-1]['what']:36s} {rows[-1]['images_per_s']:9.1f} images/s "
                  f"({rows[-1]['seconds_per_step']:.3f} s/step, batch {args.batch_size})", flush=True)
        for size, n in ((28, 5), (100, 12)):
            rows.append({"device": name, **bench_filterbank(args.batch_size, size, n, max(args.iters, 10), device)})
            r = rows[-1]
            print(f"{name:5s} {r['what']:36s} batched {r['batched_ms']:.2f} ms, per-sample loop "
                  f"{r['per_sample_loop_ms']:.2f} ms ({r['speedup']:.0f}x)", flush=True)
    path = write_json(args.out, {"benchmark": "draw", "model": MNIST_MODEL, "threads": torch.get_num_threads(),
                                 "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
