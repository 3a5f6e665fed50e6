"""Speed of RAM's retina: the batched implementations against a per-sample loop, and end-to-end
RAM training throughput.

    python benchmarks/glimpse.py                 # CPU (and CUDA when available)
    python benchmarks/glimpse.py --device cpu --threads 1

Part 1 (the issue's target): B=128 images of 60x60, g=12, k=3 (the paper's cluttered60
setting), float32, against two per-sample loops, both checked equal to every batched method at
integer-aligned locations before timing. Both loops snap a glimpse to whole pixels, like the
`*_snapped` methods (`Retina(subpixel=False)`, also checked equal to them at random locations);
the plain methods (the default) interpolate sub-pixel locations, which is extra work:
- "loop_port": what public ports do: for each scale and each image, read the location
  on the host (`.item()`), zero-pad that image, slice the window; then average-pool each scale.
- "loop_lean": a leaner loop that pads the whole batch once, then slices and pools per image.
Part 2: training images/s of a RAM with the cluttered60 recipe's sizes (8 glimpses) on random
data (forward, hybrid loss, backward, Adam step), with the batched retina (sub-pixel and
snapped) and with loop_port.

The machine these numbers come from may be shared, so each timing keeps the median and minimum
wall time and the median and minimum process CPU time over `--repeats` runs after warm-up. With
one thread (the default here) CPU time is the work done, not the time spent preempted by other
processes; speedups use its minimum. Compare ratios, not absolute times, across machines.
Writes results/bench_glimpse.json (with git commit, device and date).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.attention.glimpse import METHODS, Retina  # noqa: E402
from zoo.results import write_json  # noqa: E402


class PortLoopRetina(nn.Module):
    """The public ports' retina: per scale, per image, a host-side location, a zero-padded copy of
    that image, a slice; then the scale's patches are average-pooled together."""

    def __init__(self, patch_size: int, num_scales: int, scale_factor: int = 2):
        super().__init__()
        self.patch_size, self.num_scales, self.scale_factor = patch_size, num_scales, scale_factor

    def forward(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        B, C, H, W = images.shape
        g, out = self.patch_size, []
        for i in range(self.num_scales):
            w = g * self.scale_factor ** i
            patches = []
            for b in range(B):
                cx = (locations[b, 0].item() + 1) / 2 * W  # a host sync per slice
                cy = (locations[b, 1].item() + 1) / 2 * H
                x0, y0 = math.floor(cx - w / 2 + 0.5) + w, math.floor(cy - w / 2 + 0.5) + w
                padded = F.pad(images[b:b + 1], (w, w, w, w))
                patches.append(padded[:, :, y0:y0 + w, x0:x0 + w])
            scale = torch.cat(patches)
            out.append(F.avg_pool2d(scale, w // g) if w > g else scale)
        return torch.stack(out, 1)  # [B, k, C, g, g]


class LeanLoopRetina(nn.Module):
    """A leaner per-sample loop: pad the batch once, then slice and pool image by image."""

    def __init__(self, patch_size: int, num_scales: int, scale_factor: int = 2):
        super().__init__()
        self.patch_size, self.num_scales, self.scale_factor = patch_size, num_scales, scale_factor

    def forward(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        B, C, H, W = images.shape
        g = self.patch_size
        big = g * self.scale_factor ** (self.num_scales - 1)
        padded = F.pad(images, (big, big, big, big))
        out = []
        for b in range(B):
            cx = (locations[b, 0].item() + 1) / 2 * W
            cy = (locations[b, 1].item() + 1) / 2 * H
            scales = []
            for i in range(self.num_scales):
                w = g * self.scale_factor ** i
                x0 = math.floor(cx - w / 2 + 0.5) + big
                y0 = math.floor(cy - w / 2 + 0.5) + big
                patch = padded[b:b + 1, :, y0:y0 + w, x0:x0 + w]
                scales.append(F.avg_pool2d(patch, w // g) if w > g else patch)
            out.append(torch.cat(scales, 0))
        return torch.stack(out, 0)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timeit(fn, device: str, repeats: int, warmup: int = 3) -> dict:
    for _ in range(warmup):
        fn()
    sync(device)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        sync(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"median_s": statistics.median(wall), "min_s": min(wall), "cpu_median_s": statistics.median(cpu),
            "cpu_min_s": min(cpu)}


def _key(device: str) -> str:
    """The statistic speedups use: the least process CPU time on the CPU (the run least disturbed
    by other processes, as `timeit` advises, and not inflated by preemption, which a long loop
    suffers more than a short batched call), the median wall time on a GPU."""
    return "cpu_min_s" if device == "cpu" else "median_s"


def aligned_locations(B: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Integer pixel centres (edges on pixel edges for even g) anywhere in [-1, 1]^2, as RAM
    clamps them, so that the larger patches reach past the border."""
    centres = torch.randint(0, size + 1, (B, 2), generator=generator).float()
    return centres / size * 2 - 1


def bench_retina(device: str, batch: int, size: int, g: int, k: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, size, size, generator=gen).to(device)
    locations = aligned_locations(batch, size, gen).to(device)
    key = _key(device)
    record = {}
    for name, loop in (("loop_port", PortLoopRetina(g, k)), ("loop_lean", LeanLoopRetina(g, k))):
        record[name] = timeit(lambda: loop(images, locations), device, max(5, repeats // 4))
    reference = PortLoopRetina(g, k)(images, locations)
    # The snapped variants round edges as the loops do, so they must also equal them off-grid.
    anywhere = (torch.rand(batch, 2, generator=gen) * 2 - 1).to(device)
    reference_anywhere = PortLoopRetina(g, k)(images, anywhere)
    for method in METHODS:
        for subpixel in (True, False):
            name = method if subpixel else f"{method}_snapped"
            retina = Retina(g, k, method=method, subpixel=subpixel)
            max_diff = (retina(images, locations) - reference).abs().max().item()
            if not subpixel:
                max_diff = max(max_diff, (retina(images, anywhere) - reference_anywhere).abs().max().item())
            if max_diff > 1e-5:
                raise SystemExit(f"{name} differs from the loop reference by {max_diff}")
            record[name] = {**timeit(lambda: retina(images, locations), device, repeats), "max_abs_diff": max_diff}
    for name, r in record.items():
        r["speedup_vs_loop_port"] = record["loop_port"][key] / r[key]
        r["speedup_vs_loop_lean"] = record["loop_lean"][key] / r[key]
    return record


def bench_training(device: str, batch: int, repeats: int, retina: str) -> dict:
    from zoo.models.ram import RAM

    torch.manual_seed(0)
    model = RAM(image_size=60, retina=dict(patch_size=12, num_scales=3, subpixel=retina != "batched_snapped"),
                num_glimpses=8).to(device)
    if retina == "loop_port":
        model.glimpse.retina = PortLoopRetina(12, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.rand(batch, 1, 60, 60, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)

    def step():
        out = model.rollout(images, "sample")
        loss = model.losses(out, labels)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    timing = timeit(step, device, repeats if retina.startswith("batched") else max(3, repeats // 3))
    return {**timing, "images_per_s": batch / timing[_key(device)],
            "images_per_s_wall": batch / timing["median_s"], "retina_method": model.hparams.retina["method"],
            "retina_subpixel": model.hparams.retina["subpixel"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: CPU, plus CUDA when available")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1; 0 keeps torch's choice)")
    parser.add_argument("--out", default="results/bench_glimpse.json")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device in ("auto", "cpu") else []
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        devices.append("cuda")
    setting = {"batch": args.batch_size, "image": 60, "patch_size": 12, "num_scales": 3, "dtype": "float32",
               "threads": torch.get_num_threads(), "repeats": args.repeats,
               "speedup_statistic": "min process CPU time (cpu), median wall time (cuda)",
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    results = {}
    for device in devices:
        retina = bench_retina(device, args.batch_size, 60, 12, 3, args.repeats)
        training = {kind: bench_training(device, args.batch_size, max(5, args.repeats // 3), kind)
                    for kind in ("batched", "batched_snapped", "loop_port")}
        results[device] = {"retina": retina, "training": training}
        stat = "min process CPU time" if device == "cpu" else "median wall time"
        print(f"\n== {device} (threads={torch.get_num_threads()}) retina B={args.batch_size} 60x60 g=12 k=3; "
              f"speedups on {stat}")
        print(f"{'method':20s} {'wall med ms':>11s} {'wall min ms':>11s} {'cpu med ms':>10s} {'cpu min ms':>10s} "
              f"{'vs port':>8s} {'vs lean':>8s}")
        for name, r in retina.items():
            print(f"{name:20s} {1e3 * r['median_s']:11.3f} {1e3 * r['min_s']:11.3f} {1e3 * r['cpu_median_s']:10.3f} "
                  f"{1e3 * r['cpu_min_s']:10.3f} {r['speedup_vs_loop_port']:7.1f}x {r['speedup_vs_loop_lean']:7.1f}x")
        print(f"training RAM cluttered60 (8 glimpses), batch {args.batch_size}:")
        for kind, r in training.items():
            print(f"  retina={kind:16s} {r['images_per_s']:8.0f} images/s ({stat}); "
                  f"{r['images_per_s_wall']:8.0f} images/s (wall)")
    path = write_json(args.out, {"benchmark": "glimpse", "setting": setting, "results": results,
                                 "goal": "batched retina >= 20x faster than the per-sample loop",
                                 "note": "loop_port and loop_lean snap glimpses to whole pixels, as the "
                                         "*_snapped methods do; the plain methods also interpolate "
                                         "sub-pixel locations (our default)"})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
