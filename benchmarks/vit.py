"""ViT training speed: the zoo's LightningModule step against a plain PyTorch loop, same run.

CPU (default): the vit_fmnist recipe's model (about 0.53 M parameters, 28x28, conv stem, stride 4) at the
recipe's batch of 64. Both sides train the same timm VisionTransformer on the same batch with
(fused) AdamW, label smoothing and a per-step LR schedule; the Lightning side goes through
`Trainer.fit` with the module's own `training_step` (logging included), the plain side is a
hand-written loop. Rounds alternate between the two so that load from other processes hits both
alike, and throughput is taken from the median step time (each step measured start to start, so
Lightning's work between steps counts), which shrugs off other processes' bursts; the mean is
reported too. The headline ratio is the median of the per-round ratios.
Goal: Lightning >= 0.95x the plain loop's images/s.

    python benchmarks/vit.py                      # -> results/bench_vit.json
    python benchmarks/vit.py --steps 30 --rounds 3

GPU (`--gpu`): ViT-B/16 at 224 px, batch 256, bf16 autocast, with and without torch.compile, for
both sides. Reports images/s and MFU: achieved FLOP/s over the dense bf16 peak (H100/H200 SXM
989 TFLOP/s, A100 312; `--peak-tflops` for others). Training FLOPs per image are counted with
torch's FlopCounterMode on the forward and tripled for forward + backward (about 105 GFLOPs for
ViT-B/16). Goal: MFU >= 40%.

    python benchmarks/vit.py --gpu                # -> results/bench_vit_gpu.json
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo.models.optim import build_optimizer  # noqa: E402
from zoo.results import write_json  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0}

CPU_MODEL = dict(image_size=28, in_chans=1, num_classes=10, backbone=dict(
    kind="timm_vit", model_name="vit_tiny_patch16_224", patch_size=4, conv_stem=[32, 64], conv_stem_blocks=2, depth=6,
    embed_dim=96, num_heads=3, mlp_ratio=2.0, drop_path_rate=0.05, mean=[0.286], std=[0.353]))
GPU_MODEL = dict(image_size=224, in_chans=3, num_classes=1000,
                 backbone=dict(kind="timm_vit", model_name="vit_base_patch16_224", patch_size=16, drop_path_rate=0.0))
TRAIN = dict(lr=1e-3, weight_decay=0.05, warmup_epochs=0.0, label_smoothing=0.1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_batch(cfg: dict, batch_size: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch_size, cfg["in_chans"], cfg["image_size"], cfg["image_size"], generator=g)
    y = torch.randint(0, cfg["num_classes"], (batch_size,), generator=g)
    if device.type == "cuda":  # both sides copy a pinned host batch to the device every step
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def build(cfg: dict, bf16: bool, compile: bool):
    from zoo.models.vit import ViTClassifier

    torch.manual_seed(0)
    model = ViTClassifier(**cfg, **TRAIN, bf16=bf16)
    model.accel.force("compile" if compile else "eager")  # the run's --accel, as a fit outside train.py sets it
    return model


# ----------------------------------------------------------------------------- the two sides
def plain_loop(cfg, batch, steps: int, warmup: int, device, bf16: bool, compile: bool) -> list[float]:
    """Step times (s) of a hand-written loop over the same timm model (no Lightning, no zoo module),
    from step `warmup` on; each step is measured from one step's start to the next's."""
    module = build(cfg, bf16, compile).to(device).train()
    vit, backbone = module.vit, module.backbone
    mean, std = backbone.mean.to(device), backbone.std.to(device)
    # the same optimizer as the module's (fused AdamW)
    optimizer = build_optimizer(module.parameter_groups(), "adamw", lr=TRAIN["lr"])  # fused on CUDA, foreach elsewhere (zoo.models.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    forward = torch.compile(vit) if compile else vit
    x_host, y_host = batch
    marks = []
    for step in range(steps):
        if step >= warmup:
            sync(device)
            marks.append(time.perf_counter())
        x = x_host.to(device, non_blocking=True)
        y = y_host.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = forward((x - mean) / std)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=TRAIN["label_smoothing"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    sync(device)
    marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks, marks[1:])]


class _Repeat(torch.utils.data.Dataset):
    def __init__(self, batch, n):
        self.batch, self.n = batch, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.batch


def lightning_fit(cfg, batch, steps: int, warmup: int, device, bf16: bool, compile: bool) -> list[float]:
    """Step times (s) of the zoo module's training_step under Trainer.fit, from step `warmup` on;
    a step runs from one batch start hook to the next, so Lightning's work between steps (data
    fetch, logging, hooks, optimizer and scheduler calls) is inside it."""
    import lightning as L

    marks = []

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx >= warmup:
                sync(device)
                marks.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == steps - 1:
                sync(device)
                marks.append(time.perf_counter())

    module = build(cfg, bf16, compile)
    loader = torch.utils.data.DataLoader(_Repeat(batch, steps), batch_size=None, shuffle=False,
                                         pin_memory=device.type == "cuda")
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_epochs=1,
                        precision="32-true", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[Timer()])
    trainer.fit(module, train_dataloaders=loader)
    return [b - a for a, b in zip(marks, marks[1:])]


def images_per_s(step_times: list[float], batch_size: int) -> dict:
    """Median-step and whole-run throughput: the median shrugs off other processes' bursts."""
    return {"median_step": batch_size / statistics.median(step_times),
            "mean": batch_size * len(step_times) / sum(step_times)}


def train_flops_per_image(cfg, device) -> float:
    """3 x the forward FLOPs counted by FlopCounterMode (backward ~ 2 x forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    module = build(cfg, False, False).to(device).eval()
    x = torch.rand(1, cfg["in_chans"], cfg["image_size"], cfg["image_size"], device=device)
    # Unfused attention makes q k^T and attn v plain matmuls, which every device's counter sees.
    fused = [m for m in module.modules() if hasattr(m, "fused_attn")]
    for m in fused:
        m.fused_attn = False
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module.vit(x)
    return 3.0 * counter.get_total_flops()


# ----------------------------------------------------------------------------- modes
def run_cpu(args) -> dict:
    device = torch.device("cpu")
    batch = make_batch(CPU_MODEL, args.batch_size or 64, device)
    B = batch[0].shape[0]
    plain_times, lightning_times, rounds = [], [], []
    for r in range(args.rounds):
        p_t = plain_loop(CPU_MODEL, batch, args.steps, args.warmup, device, False, False)
        l_t = lightning_fit(CPU_MODEL, batch, args.steps, args.warmup, device, False, False)
        plain_times += p_t
        lightning_times += l_t
        rounds.append({"plain": images_per_s(p_t, B), "lightning": images_per_s(l_t, B)})
        print(f"round {r}: plain {rounds[-1]['plain']['median_step']:.1f} img/s, "
              f"lightning {rounds[-1]['lightning']['median_step']:.1f} img/s (median step)", flush=True)
    p, l = images_per_s(plain_times, B), images_per_s(lightning_times, B)
    flops = train_flops_per_image(CPU_MODEL, device)
    print(f"\nViT fmnist recipe model, batch {B}, {args.steps - args.warmup} timed steps x "
          f"{args.rounds} rounds on {torch.get_num_threads()} threads")
    print(f"{'side':12s} {'img/s (median step)':>20s} {'img/s (mean)':>13s} {'GFLOP/s':>8s}")
    for side, v in (("plain loop", p), ("lightning", l)):
        print(f"{side:12s} {v['median_step']:20.1f} {v['mean']:13.1f} {v['median_step'] * flops / 1e9:8.1f}")
    # Each round's ratio compares the two sides under nearly the same load; their median is the
    # headline figure (the pooled medians can mix a quiet window on one side with a busy one).
    per_round = [r["lightning"]["median_step"] / r["plain"]["median_step"] for r in rounds]
    ratio = statistics.median(per_round)
    print(f"lightning / plain: {ratio:.3f} (median over rounds of {', '.join(f'{x:.3f}' for x in per_round)}; "
          f"pooled median-step {l['median_step'] / p['median_step']:.3f}, mean-based {l['mean'] / p['mean']:.3f}); "
          "goal >= 0.95")
    return {"benchmark": "vit_lightning_overhead", "mode": "cpu", "model": CPU_MODEL, "train": TRAIN,
            "batch_size": B, "steps": args.steps, "warmup_steps": args.warmup, "rounds": rounds,
            "train_gflops_per_image": flops / 1e9, "plain_images_per_s": p, "lightning_images_per_s": l,
            "ratio": ratio, "ratio_per_round": per_round, "ratio_pooled_median_step": l["median_step"] / p["median_step"],
            "ratio_mean_based": l["mean"] / p["mean"], "goal_ratio": 0.95,
            "load_average": list(os.getloadavg())}


def run_gpu(args) -> dict:
    if not torch.cuda.is_available():
        print("vit benchmark: error: --gpu needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    batch = make_batch(GPU_MODEL, args.batch_size or 256, device)
    flops = train_flops_per_image(GPU_MODEL, device)
    rows = []
    for compile in (False, True):
        for side, fn in (("plain", plain_loop), ("lightning", lightning_fit)):
            ips = images_per_s(fn(GPU_MODEL, batch, args.steps, args.warmup, device, True, compile),
                               batch[0].shape[0])["median_step"]
            mfu = ips * flops / (peak * 1e12) if peak else None
            rows.append({"side": side, "compile": compile, "images_per_s": ips, "mfu": mfu})
            print(f"{side:10s} compile={compile!s:5s} {ips:9.1f} img/s  MFU "
                  f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'}", flush=True)
            torch.cuda.empty_cache()
    for compile in (False, True):
        p, l = (next(r["images_per_s"] for r in rows if r["side"] == s and r["compile"] == compile)
                for s in ("plain", "lightning"))
        print(f"compile={compile}: lightning / plain {l / p:.3f}")
    return {"benchmark": "vit_b16_gpu", "mode": "gpu", "gpu": name, "model": "vit_base_patch16_224",
            "image_size": 224, "batch_size": batch[0].shape[0], "precision": "bf16 autocast",
            "steps": args.steps, "warmup_steps": args.warmup, "train_gflops_per_image": flops / 1e9,
            "peak_bf16_tflops": peak, "rows": rows, "goal_mfu": 0.40,
            "memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def main(argv=None) -> int:
    import logging
    import warnings

    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="ViT-B/16 224 px bf16 on the GPU, with/without compile")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: CPU 25, GPU 40)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default: CPU 5, GPU 10)")
    parser.add_argument("--rounds", type=int, default=3, help="CPU: alternating plain/Lightning rounds")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of an unlisted GPU")
    parser.add_argument("--out", default=None, help="JSON path (default results/bench_vit[_gpu].json)")
    args = parser.parse_args(argv)
    args.steps = args.steps or (40 if args.gpu else 25)
    args.warmup = args.warmup if args.warmup is not None else (10 if args.gpu else 5)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    record = run_gpu(args) if args.gpu else run_cpu(args)
    out = Path(args.out or ROOT / "results" / f"bench_vit{'_gpu' if args.gpu else ''}.json")
    write_json(out, record)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
