"""Speed of the batched reads of the hard-attention families against per-image loops, on a small and
a large canvas: attention sampling's patch extraction (zoo.attention.sampling.extract_patches) and
RAM's retina (zoo.attention.glimpse.Retina).

    python benchmarks/sampling.py                       # CPU, 1 thread, B=128, 60 and 400 px
    python benchmarks/sampling.py --device cuda

Patches: B images of S x S, K patches of P px each at cells drawn without replacement from an
(S/4) x (S/4) attention grid (the cluttered60 recipe's K = 4 and P = 28 at both sizes: the item
is 28 px on every canvas), against two loops, both checked equal to the batched read (exactly)
before timing:
- "loop_image": per image, zero-pad that image, slice its K patches, stack (a port's read);
- "loop_batch": zero-pad the whole batch once, then slice per image and patch.

Retina: the cluttered60 glimpse (g = 12, k = 3 scales, factor 2) at integer-aligned locations,
against benchmarks/glimpse.py's loops ("loop_port": per scale and image, pad that image and slice;
"loop_lean": pad the batch once, then slice and pool per image), checked equal first.

The machine may be shared, so each timing keeps the median and minimum wall time and the median
and minimum process CPU time over `--repeats` runs after warm-up; speedups use the minimum CPU time
on a CPU (with one thread it is the work done, not time spent preempted) and the median wall time
on a GPU. Compare ratios, not absolute times, across machines. Writes
results/bench_sampling_<device>.json (git commit, device and date added by zoo.results.write_json).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from glimpse import LeanLoopRetina, PortLoopRetina, _key, aligned_locations, timeit  # noqa: E402
from zoo.attention import sampling  # noqa: E402
from zoo.attention.glimpse import Retina  # noqa: E402
from zoo.results import write_json  # noqa: E402

GOAL = 20.0  # the target: each batched read >= 20x its per-image loop


def loop_image(images: torch.Tensor, corners: torch.Tensor, P: int) -> torch.Tensor:
    """Per image: its corners read on the host, the image zero-padded by P, K slices."""
    out = []
    for b, image_corners in enumerate(corners.tolist()):
        padded = F.pad(images[b], (P, P, P, P))
        out.append(torch.stack([padded[:, y + P:y + 2 * P, x + P:x + 2 * P] for x, y in image_corners]))
    return torch.stack(out)


def loop_batch(images: torch.Tensor, corners: torch.Tensor, P: int) -> torch.Tensor:
    """The batch zero-padded once, then a slice per image and patch."""
    padded = F.pad(images, (P, P, P, P))
    return torch.stack([torch.stack([padded[b, :, y + P:y + 2 * P, x + P:x + 2 * P] for x, y in image_corners])
                        for b, image_corners in enumerate(corners.tolist())])


def bench_patches(device: str, batch: int, size: int, K: int, P: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, size, size, generator=g).to(device)
    grid = (max(1, size // 4),) * 2
    log_a = torch.randn(batch, grid[0] * grid[1], generator=g).log_softmax(-1)
    index = sampling.sample_without_replacement(log_a, K, sampling.gumbel_noise(log_a.shape, log_a, g))
    corners = sampling.patch_corners(index, grid, (size, size), P).to(device)
    fast = sampling.extract_patches(images, corners, P)
    for name, fn in (("loop_image", loop_image), ("loop_batch", loop_batch)):
        if not torch.equal(fn(images, corners, P), fast):
            raise SystemExit(f"patches: {name} differs from the batched read at {size} px")
    key, record = _key(device), {}
    for name, fn in (("loop_image", loop_image), ("loop_batch", loop_batch)):
        record[name] = timeit(lambda: fn(images, corners, P), device, max(5, repeats // 4))
    record["batched"] = timeit(lambda: sampling.extract_patches(images, corners, P), device, repeats)
    for r in record.values():
        r["speedup_vs_loop_image"] = record["loop_image"][key] / r[key]
        r["speedup_vs_loop_batch"] = record["loop_batch"][key] / r[key]
    return record


def bench_retina(device: str, batch: int, size: int, g: int, k: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, size, size, generator=gen).to(device)
    locations = aligned_locations(batch, size, gen).to(device)
    reference = PortLoopRetina(g, k)(images, locations)
    key, record = _key(device), {}
    for name, loop in (("loop_port", PortLoopRetina(g, k)), ("loop_lean", LeanLoopRetina(g, k))):
        record[name] = timeit(lambda: loop(images, locations), device, max(5, repeats // 4))
    for name, retina in (("crop", Retina(g, k)), ("crop_snapped", Retina(g, k, subpixel=False))):
        retina = retina.to(device)
        max_diff = (retina(images, locations) - reference).abs().max().item()
        if max_diff > 1e-4:  # float32 locations are aligned to about 1e-5 px at 400 px
            raise SystemExit(f"retina {name} differs from the loop reference by {max_diff} at {size} px")
        record[name] = {**timeit(lambda: retina(images, locations), device, repeats), "max_abs_diff": max_diff}
    for r in record.values():
        r["speedup_vs_loop_port"] = record["loop_port"][key] / r[key]
        r["speedup_vs_loop_lean"] = record["loop_lean"][key] / r[key]
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--sizes", type=int, nargs="+", default=[60, 400], help="canvas sides (px)")
    parser.add_argument("--num-patches", type=int, default=4, help="K patches per image")
    parser.add_argument("--patch-size", type=int, default=28, help="P, the patches' side (px)")
    parser.add_argument("--glimpse", type=int, nargs=2, default=[12, 3], metavar=("G", "SCALES"),
                        help="the retina's patch size and number of scales")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; 0 keeps torch's)")
    parser.add_argument("--out", default=None, help="default: results/bench_sampling_<device>.json")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    stat = "min process CPU time" if args.device == "cpu" else "median wall time"
    results = {}
    for size in args.sizes:
        patches = bench_patches(args.device, args.batch_size, size, args.num_patches, args.patch_size, args.repeats)
        retina = bench_retina(args.device, args.batch_size, size, *args.glimpse, args.repeats)
        results[str(size)] = {"patches": patches, "retina": retina}
        print(f"\n== {size}x{size}, B={args.batch_size}, {args.device} ({torch.get_num_threads()} threads); "
              f"speedups on {stat}")
        print(f"{'read':22s} {'wall med ms':>11s} {'cpu min ms':>10s} {'vs loop 1':>9s} {'vs loop 2':>9s}")
        for part, record, loops in (("patches", patches, ("loop_image", "loop_batch")),
                                    ("retina", retina, ("loop_port", "loop_lean"))):
            for name, r in record.items():
                print(f"{part + ' ' + name:22s} {1e3 * r['median_s']:11.3f} {1e3 * r['cpu_min_s']:10.3f} "
                      f"{r['speedup_vs_' + loops[0]]:8.1f}x {r['speedup_vs_' + loops[1]]:8.1f}x")
    setting = {"batch": args.batch_size, "sizes": args.sizes, "dtype": "float32", "channels": 1,
               "patches": {"num_patches": args.num_patches, "patch_size": args.patch_size, "grid": "side / 4"},
               "retina": {"patch_size": args.glimpse[0], "num_scales": args.glimpse[1], "scale_factor": 2,
                          "locations": "integer-aligned"},
               "threads": torch.get_num_threads(), "repeats": args.repeats, "speedup_statistic": stat,
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    out = args.out or f"results/bench_sampling_{args.device}.json"
    path = write_json(out, {"benchmark": "sampling", "setting": setting, "results": results,
                            "goal": f"each batched read >= {GOAL:.0f}x its per-image loop (loop_image, loop_port)"})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
