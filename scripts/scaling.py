"""Where attention pays (issue 43, item 4): every family's cost, and its accuracy where it was
trained, against the canvas side, from 60 to 400 px and on Megapixel Fashion.

    python scripts/scaling.py                  # both steps below
    python scripts/scaling.py measure          # slow: results/scaling_cost_<device>.json
    python scripts/scaling.py report           # fast: results/scaling.csv, docs/figures/scaling.png and
                                               # the generated tables of docs/scaling.md
    python scripts/scaling.py report --check   # exit 1 where the committed CSV or tables differ (tests)
    make scaling

`measure` builds each family's architecture through the registry (the recipe in PLANS, its image
size linked from the data it is measured on: `zoo.data.cluttered_scale` at side S, or
`zoo.data.megapixel` at 1,500 px) with untrained weights, and measures per family and side:
- MACs per image: torch.utils.flop_counter (MACs = FLOPs / 2) on the inference program that
  `zoo info` and the leaderboard count (zoo.commands.cost.inference), and beside it, stated apart,
  an analytic term for the work the counter does not see, by a formula per op on the shapes each op
  sees in the same forward pass (`UnseenWork`): pooling and reductions (one add or compare per
  element read: the area averages of DRAM's context view, ATS's view, STN's coarse view), interpolation
  (grid sampling 4 MACs per output element, lerp 1, the affine grid 3) and attention kernels the
  counter has no formula for (the CPU's fused scaled-dot-product attention, B H L S (E + Ev)).
  Gathers and crops (`gather`, `index_select`, indexing: the retina's and the patches' reads, the
  strips `as_strided` views) move elements and do no arithmetic: their count is its own column.
  Element-wise work (activations, normalisation) is not counted, as timm and fvcore do not.
  Glimpse families also get MACs per step: the counter's MACs less those of the modules run once
  per image (DRAM's context network, STN's localisation network, ATS's attention network), over the
  steps (glimpses, or ATS's patches).
- latency: batch 1, `--threads` CPU threads (1), the median and minimum wall and process-CPU
  time of `--repeats` runs after `--warmup` (fewer where a run is slow: `--max-seconds`);
- throughput: images/s at batch `--batch-size` (256), or the largest power of two below it whose
  forward pass fits the memory budget (zoo.models.memory.model_memory on the meta device) and whose
  run takes at most a quarter of `--max-seconds` at the batch-1 rate; the batch and what limited it
  are recorded;
- peak training memory at batch `--memory-batch` (32): zoo.models.memory.training_memory, the
  family's training step (forward and backward) run on the meta device with every tensor alive at
  once counted (shapes, no storage: a measure of what autograd keeps, not of an allocator's peak),
  plus the weights four times (weights, gradients, Adam's two moments); the input batch's bytes
  are stated beside it;
and computes the issue's checks as ratios (`checks`). A family that cannot run at a size within the
memory budget (zoo.guards.budget, 4 GiB) keeps its row, with the reason in `notes` (its MACs are
then counted on the meta device).

`report` reads the committed results/scaling_cost_*.json and every training result
(results/*.json) of a recipe on the scale or Megapixel data: a result joins the cost row of the same
recipe and image size, with its seeds' mean top-1, their spread (sample std) and a bootstrap 95%
interval of the mean over test examples (each seed's test set resampled: a binomial draw at its
accuracy, `BOOTSTRAP` replicates from a fixed seed). It writes timm's column names.
"""
from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "results"
DOC = ROOT / "docs" / "scaling.md"
FIGURE = ROOT / "docs" / "figures" / "scaling.png"
CSV_PATH = RESULTS / "scaling.csv"
SCALE_DATA = "zoo.data.cluttered_scale.ClutteredScaleDataModule"
MEGAPIXEL_DATA = "zoo.data.megapixel.MegapixelFashionDataModule"
TASKS = {SCALE_DATA: "scale", MEGAPIXEL_DATA: "megapixel"}
#: data of another module that is the scale task at one side: FashionMNISTDataModule's cluttered60 is
#: the RAM paper's cluttered task at 60 px (4 distractors), which zoo.data.cluttered_scale generalises
SAME_TASK = {("zoo.data.fashion_mnist.FashionMNISTDataModule", "cluttered60"): ("scale", 60)}
MEGAPIXEL_SIDE = 1500  # the paper's canvas (zoo.data.megapixel's default)
#: test canvases of the scale family: one per Fashion-MNIST test item (zoo.data.cluttered_scale)
FASHION_MNIST_TEST = 10_000
BOOTSTRAP = 10_000  # replicates of the accuracy's interval
TABLE_MARKERS = ("<!-- scaling:cost -->", "<!-- /scaling:cost -->")
CHECK_MARKERS = ("<!-- scaling:checks -->", "<!-- /scaling:checks -->")


@dataclass(frozen=True)
class Plan:
    """A family's row: the registry entry whose architecture is measured at every side (its card
    says its glimpse steps, for MACs per step), and `coarse`: an argument that divides the canvas into a coarse view, scaled with the side so
    that the view keeps the recipe's size (STN's localisation view)."""

    family: str
    recipe: str
    coarse: str | None = None
    #: recipes that train the same architecture (other optimisation, or a stage of a curriculum):
    #: their results join this family's rows too (tests/test_scaling.py holds them to it)
    same_model: tuple[str, ...] = ()
    #: the recipes of the family's size curriculum that train another model than `recipe` (a view sized
    #: for their canvas): each measured as it is, at its own canvas, on a row of its own ("<family>, own recipe")
    stages: tuple[str, ...] = ()


#: model arguments that change how a model is trained, not what it is (a `same_model` recipe may differ in them)
OPTIMISATION = frozenset({"lr", "weight_decay", "lr_schedule", "betas", "min_lr", "warmup_epochs"})

#: the families of issue 43, item 3, each at every side with one architecture
PLANS = (
    # the modern small CNN (conv-BN-ReLU, global pooling), and the same model's 60 px recipe
    Plan("SmallCNN", "baseline_smallcnn_scale400", same_model=("baseline_smallcnn_cluttered60",)),
    # RAM's CNN baseline (8 10x10 filters, stride 5, FC 256), and the same model's 400 px recipe
    Plan("PaperCNN", "baseline_cnn_cluttered60", same_model=("baseline_cnn_scale400",)),
    # a score map over a 50x50 view, 4 glimpses of 16 px at 3 scales; and the curriculum's stages, whose
    # views keep ~8 px cells (8x8 at 60 px, 13x13 at 100, 25x25 at 200)
    Plan("DRAM", "ram_scale400_dram", stages=("ram_scale60_dram", "ram_scale100_dram", "ram_scale200_dram")),
    Plan("STN", "stn_fmnist_cluttered60", coarse="loc_downsample"),
    Plan("DRAW", "draw_cluttered100_classifier"),
    Plan("ViT", "vit_fmnist_cluttered60"),  # its 6 px patches at every side: tokens grow with the area
    # the curriculum: its 60 px stage, and its fine-tunes at 100 and 200 px
    Plan("ATS", "ats_scale400", same_model=("ats_fmnist_cluttered60", "ats_scale100", "ats_scale200")),
)
#: Megapixel Fashion: every plan on the full 1,500 px canvas, and these recipes of the task as they are
#: (the small CNN on the canvas served at 500 px, and at 192 px; ATS's Megapixel model in place of its 400 px one)
MEGAPIXEL_RECIPES = {"SmallCNN": ("baseline_smallcnn_megapixel", "baseline_smallcnn_megapixel192"),
                     "ATS": ("ats_megapixel",)}
#: the issue's Megapixel comparison: (ATS's recipe, the small CNN's on the canvas downsampled to ATS's
#: training memory), and the least top-1 lead in points ATS must have
MEGAPIXEL_SAME_MEMORY = ("ats_megapixel", "baseline_smallcnn_megapixel192")
MEGAPIXEL_LEAD = 10.0
#: the issue's DRAM at 400 px: at least this top-1 (%) over this many seeds
DRAM_TOP1, DRAM_SEEDS = 65.0, 3
#: the families whose pointing must beat the centre prior at every size
POINTING = ("DRAM", "ATS")


# ============================================================================= measure
def _unseen_work():
    """A dispatch mode counting, per op, what torch.utils.flop_counter does not (module docstring):
    `macs` {kind: MACs} and `moved` (elements gathered or cropped)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import flop_registry

    reductions = {"avg_pool2d", "_adaptive_avg_pool2d", "adaptive_avg_pool2d", "max_pool2d_with_indices",
                  "max_pool2d", "adaptive_max_pool2d", "amax", "amin", "max", "min", "mean", "sum", "cumsum"}
    interpolation = {"grid_sampler_2d": 4, "upsample_bilinear2d": 4, "lerp": 1, "lerp_": 1,
                     "affine_grid_generator": 3}
    gathers = {"gather", "index_select", "index", "take", "embedding"}

    def numel(tree) -> int:
        return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))

    class UnseenWork(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.macs = {"pooling and reductions": 0, "interpolation": 0, "attention kernels": 0}
            self.moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            packet = func.overloadpacket
            name = packet.__name__
            if packet in flop_registry:
                return out
            if name in reductions:
                self.macs["pooling and reductions"] += args[0].numel()  # every element read once
            elif name in interpolation:
                self.macs["interpolation"] += interpolation[name] * numel(out if name != "lerp_" else args[0])
            elif "scaled_dot_product" in name:
                q, k, v = args[:3]  # [B, H, L, E], [B, H, S, E], [B, H, S, Ev]
                self.macs["attention kernels"] += q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
            elif name in gathers:
                self.moved += numel(out)
            return out

    return UnseenWork()


def count_macs(run, device, plan: Plan, model) -> dict:
    """MACs of one image through `run` (zoo.commands.cost.Inference, or a (module, inputs) pair on
    meta): the counter's, the analytic term's parts, the elements moved, and per step."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from zoo.commands.cost import step_macs

    module, inputs = run
    counter, unseen = FlopCounterMode(display=False), _unseen_work()
    with torch.no_grad(), counter, unseen:
        module(*inputs)
    total = counter.get_total_flops() // 2
    analytic = sum(unseen.macs.values())
    record = {"counter": total, "analytic": analytic, "total": total + analytic,
              "analytic_parts": dict(unseen.macs), "gathered_elements": unseen.moved, "counted_on": device}
    steps = step_macs(model, counter)  # the family card's glimpse steps
    if steps is not None:
        record["steps"] = steps
    return record


def timed(fn, device: str, repeats: int, warmup: int, max_seconds: float, min_repeats: int = 3) -> dict:
    """Wall and process-CPU seconds of `fn()`: median and minimum of `repeats` runs after `warmup`,
    stopping after `min_repeats` runs once `max_seconds` have passed."""
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    wall, cpu = [], []
    deadline = time.perf_counter() + max_seconds
    while len(wall) < repeats and (len(wall) < min_repeats or time.perf_counter() < deadline):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"repeats": len(wall), "warmup": warmup, "median_s": statistics.median(wall), "min_s": min(wall),
            "cpu_median_s": statistics.median(cpu), "cpu_min_s": min(cpu)}


def calibrate(device: str) -> float:
    """MACs per second of a float32 matrix product here (to guess, before a run, how long it takes)."""
    import torch

    n = 512
    a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
    record = timed(lambda: a @ b, device, repeats=10, warmup=2, max_seconds=5)
    return n ** 3 / record["median_s"]


def config_for(plan: Plan, task: str, side: int, recipe: str | None = None) -> tuple[dict, str, dict]:
    """(the model config with its data, linked: zoo.registry.Entry.recipe_config's form, the entry's
    name, the overrides made for the side). `recipe`: a recipe of the task itself, measured with its
    own data (its served size), instead of the plan's architecture at `side`."""
    from zoo import registry

    name = recipe or plan.recipe
    entry = registry.get_entry(name)
    if recipe:
        data = copy.deepcopy(entry.data)
    else:
        data = {"class_path": SCALE_DATA if task == "scale" else MEGAPIXEL_DATA, "init_args": {"canvas_size": side}}
    config = {**registry.linked(entry.model, data), "data": data}
    overrides = {}
    if plan.coarse and not recipe:  # the coarse view keeps the recipe's side
        own = registry.linked(entry.model, entry.data)
        divisor = int(own["init_args"].get(plan.coarse, _default(config, plan.coarse)))
        overrides[plan.coarse] = max(1, round(_image_side(config) * divisor / _image_side(own)))
        config["init_args"] = {**config["init_args"], **overrides}
    return config, name, overrides


def _canvas_side(data: dict) -> int:
    """The canvas side of a scale or Megapixel data config (its class default where it sets none)."""
    return int((data.get("init_args") or {}).get("canvas_size") or _default(data, "canvas_size", "data"))


def _stage_side(recipe: str) -> int:
    """The canvas side a stage recipe trains on."""
    from zoo import registry

    return _canvas_side(registry.get_entry(recipe).data)


def _side(size) -> int:
    return int(size if isinstance(size, int) else size[-1])


def _image_side(config: dict) -> int:
    """The side of the images a model config reads (its class default where linking left it)."""
    init = config.get("init_args") or {}
    return _side(init["image_size"] if "image_size" in init else _default(config, "image_size"))


def _default(config: dict, key: str, kind: str = "model"):
    import inspect

    from zoo.classes import resolve_class

    return inspect.signature(resolve_class(config["class_path"], kind)).parameters[key].default


def measure_row(plan: Plan, task: str, side: int, recipe: str | None, args, rate: float) -> dict:
    import torch

    from zoo import registry
    from zoo.classes import resolve_class
    from zoo.commands import cost
    from zoo.guards.budget import human_bytes, limit
    from zoo.guards.errors import UserError
    from zoo.models.memory import model_memory, training_memory

    config, name, overrides = config_for(plan, task, side, recipe)
    cls, init_args = resolve_class(config["class_path"]), config["init_args"]
    img_size = _image_side(config)
    chans = int(init_args.get("in_chans", 1))
    row = {"family": plan.family, "task": task, "img_size": img_size,
           "canvas_size": int((config["data"].get("init_args") or {}).get("canvas_size") or img_size),
           "recipe": name, "recipe_file": registry.get_entry(name).metadata.get("recipe_file"),
           "overrides": overrides, "model": init_args, "notes": [], **({"stage": True} if recipe in plan.stages else {})}
    budget = limit("memory_mb") * 2 ** 20
    try:
        model = registry.build(config).eval()
        where = "cpu"
    except UserError as exc:  # its weights and one image's forward pass do not fit the budget
        row["notes"].append(f"not run: {str(exc).split(': ', 1)[-1].split('; raise the budget')[0]}")
        with torch.device("meta"):
            model = cls(**init_args).eval()
        where = "meta"
    row["param_count"] = sum(p.numel() for p in model.parameters())
    if where == "cpu":
        run = cost.inference(model)
        program = (run.module, run.inputs(1, torch.device("cpu")))
    else:  # the same program (the export's forward) on meta inputs
        program = (model.export_forward, (torch.zeros(1, chans, img_size, img_size, device="meta"),))
    row["macs"] = count_macs(program, where, plan, model)

    # peak training memory at a fixed batch (meta device), with the input batch's own bytes
    parts = training_memory(cls, init_args, args.memory_batch)
    step = next((k for k in parts if "step" in k), None)
    if step is None:
        row["train_memory"] = None
        row["notes"].append("training memory: the step does not run on the meta device")
    else:
        total = float(sum(parts.values()))
        row["train_memory"] = {
            "batch": args.memory_batch, "bytes": total, "input_bytes": float(args.memory_batch * chans * img_size ** 2 * 4),
            "parts": parts, "step": "forward and backward" if "training step (forward and backward)" in step
            else "forward only (the step does not run on meta)", "within_budget": total <= budget}
        if total > budget:
            row["notes"].append(f"training at batch {args.memory_batch} would need {human_bytes(total)}, more than the "
                                f"{human_bytes(budget)} budget")
    if where != "cpu":
        row["latency"] = row["throughput"] = None
        return row

    device = torch.device(args.device)
    module = run.module.to(device)
    one = run.inputs(1, device)
    guess = row["macs"]["total"] / rate
    if guess > args.max_seconds / 4:
        row["latency"] = row["throughput"] = None
        row["notes"].append(f"not timed: one image takes about {guess:.0f} s here (calibrated rate), more than a "
                            f"quarter of --max-seconds {args.max_seconds:g}")
        return row
    with torch.no_grad():
        row["latency"] = {"batch": 1, **timed(lambda: module(*one), args.device, args.repeats, args.warmup,
                                               args.max_seconds)}
        per_image = row["latency"]["cpu_min_s" if args.device == "cpu" else "median_s"]
        batch, why = args.batch_size, "the target batch"
        while batch > 1 and sum(model_memory(cls, init_args, batch).values()) > budget:
            batch, why = batch // 2, "the memory budget (the forward pass, meta device)"
        while batch > 1 and batch * per_image > args.max_seconds / 4:
            batch, why = batch // 2, "--max-seconds (a quarter of it per run at the batch-1 rate)"
        images = run.inputs(batch, device)
        record = timed(lambda: module(*images), args.device, args.throughput_repeats, 1, args.max_seconds,
                       min_repeats=2)
        key = "cpu_min_s" if args.device == "cpu" else "median_s"
        row["throughput"] = {"batch": batch, "batch_limited_by": why, **record,
                             "samples_per_sec": batch / record["median_s"], "samples_per_sec_cpu": batch / record[key]}
    del module, model, images, one
    return row


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def checks(rows: list[dict], device: str = "cpu") -> list[dict]:
    """The issue's cost checks (issue 43, "Done when") as ratios of the measured rows; a check whose
    rows are missing has value None."""
    by = {(r["family"], r["img_size"]): r for r in rows if r["task"] == "scale" and not r.get("stage")}
    stat = "cpu_min_s" if device == "cpu" else "median_s"

    def get(family, side, *path):
        value = by.get((family, side))
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def check(name, what, value, low, high, target, also=None):
        meets = None if value is None else (low is None or value >= low) and (high is None or value <= high)
        return {"name": name, "what": what, "value": value, "target": target, "meets": meets,
                **({"also": also} if also else {})}

    out = [check("dram_macs_400_over_60", "DRAM MACs per image, 400 px / 60 px (counter + analytic term)",
                 _ratio(get("DRAM", 400, "macs", "total"), get("DRAM", 60, "macs", "total")), 0.95, 1.05, "within ±5%",
                 {"counter only": _ratio(get("DRAM", 400, "macs", "counter"), get("DRAM", 60, "macs", "counter"))})]
    for cnn in ("SmallCNN", "PaperCNN"):
        out.append(check(f"{cnn}_macs_400_over_60", f"{cnn} MACs per image, 400 px / 60 px (counter + analytic term)",
                         _ratio(get(cnn, 400, "macs", "total"), get(cnn, 60, "macs", "total")), 40, None, ">= 40x"))
    out.append(check("dram_latency_400_over_60", f"DRAM batch-1 latency, 400 px / 60 px ({stat})",
                     _ratio(get("DRAM", 400, "latency", stat), get("DRAM", 60, "latency", stat)), None, 1.3, "<= 1.3x",
                     {"median wall time": _ratio(get("DRAM", 400, "latency", "median_s"),
                                                 get("DRAM", 60, "latency", "median_s"))}))
    for cnn in ("SmallCNN", "PaperCNN"):
        out.append(check(f"{cnn}_latency_400_over_60", f"{cnn} batch-1 latency, 400 px / 60 px ({stat})",
                         _ratio(get(cnn, 400, "latency", stat), get(cnn, 60, "latency", stat)), 10, None, ">= 10x",
                         {"median wall time": _ratio(get(cnn, 400, "latency", "median_s"),
                                                     get(cnn, 60, "latency", "median_s"))}))

    def without_input(family, side):
        total, batch = get(family, side, "train_memory", "bytes"), get(family, side, "train_memory", "input_bytes")
        return None if total is None or batch is None else total - batch

    out.append(check("ats_train_memory_400_over_100", "ATS peak training memory, 400 px / 100 px (same batch)",
                     _ratio(get("ATS", 400, "train_memory", "bytes"), get("ATS", 100, "train_memory", "bytes")),
                     0.9, 1.1, "within ±10%",
                     {"without the input batch": _ratio(without_input("ATS", 400), without_input("ATS", 100))}))
    out.append(check("ats_over_smallcnn_train_memory_400", "ATS / small CNN peak training memory at 400 px",
                     _ratio(get("ATS", 400, "train_memory", "bytes"), get("SmallCNN", 400, "train_memory", "bytes")),
                     None, 0.2, "<= 1/5"))
    out.append(check("ats_over_smallcnn_macs_400", "ATS / small CNN MACs per image at 400 px",
                     _ratio(get("ATS", 400, "macs", "total"), get("SmallCNN", 400, "macs", "total")),
                     None, 0.1, "<= 1/10"))
    megapixel = {r["recipe"]: r for r in rows if r["task"] == "megapixel"}
    ats, cnn = (((megapixel.get(name) or {}).get("train_memory") or {}).get("bytes") for name in MEGAPIXEL_SAME_MEMORY)
    out.append(check("megapixel_cnn_over_ats_train_memory", f"Megapixel: {MEGAPIXEL_SAME_MEMORY[1]} / ATS peak "
                     "training memory (the CNN's canvas downsampled to ATS's memory)", _ratio(cnn, ats), None, 1.0,
                     "<= 1x"))
    return out


def accuracy_checks(rows: list[dict]) -> list[dict]:
    """The issue's accuracy comparisons, from one device's report rows (`checks`' form; `shown` the
    value as the table prints it): ATS against the small CNN at 400 px, and on Megapixel Fashion
    against the small CNN on the canvas downsampled to ATS's training memory."""
    def top1(**match):
        row = next((r for r in rows if r["top1"] and all(r[k] == v for k, v in match.items())), None)
        if not row:
            return None, None, 0
        whose = re.search(r"top-1 of (\S+)", row["notes"])  # a same-model recipe's top-1 on the plan's row
        return float(row["top1"]), (f"{whose.group(1) if whose else row['model']} {row['top1']} "
                                    f"({row['seeds']} seed{'s' * (row['seeds'] != 1)})"), int(row["seeds"])

    out = []
    for what, name, (ats, ats_says, _), (cnn, cnn_says, _), low, target in (
            ("ATS - small CNN top-1 at 400 px (points)", "ats_minus_smallcnn_top1_400",
             top1(family="ATS", task="scale", img_size=400), top1(family="SmallCNN", task="scale", img_size=400),
             0.0, ">= 0"),
            ("Megapixel: ATS - the small CNN at ATS's training memory, top-1 (points)", "megapixel_ats_lead",
             top1(model=MEGAPIXEL_SAME_MEMORY[0]), top1(model=MEGAPIXEL_SAME_MEMORY[1]),
             MEGAPIXEL_LEAD, f">= {MEGAPIXEL_LEAD:g}")):
        value = None if ats is None or cnn is None else ats - cnn
        out.append({"name": name, "what": what, "value": value, "target": target,
                    "meets": None if value is None else value >= low, "shown": "-" if value is None else f"{value:+.2f}",
                    "also": {"ATS": ats_says or "not trained", "small CNN": cnn_says or "not trained"}})
    # DRAM at 400 px: at least DRAM_TOP1 over DRAM_SEEDS seeds, at least the paper's CNN; its gap to the
    # small CNN reported, whatever it is
    dram, dram_says, seeds = top1(family="DRAM", task="scale", img_size=400)
    out.append({"name": "dram_top1_400", "what": f"DRAM top-1 at 400 px (%, over {DRAM_SEEDS} seeds)", "value": dram,
                "target": f">= {DRAM_TOP1:g}", "meets": None if dram is None else dram >= DRAM_TOP1 and seeds >= DRAM_SEEDS,
                "shown": "-" if dram is None else f"{dram:.2f} ({seeds} seed{'s' * (seeds != 1)})",
                "also": {"DRAM": dram_says or "not trained"}})
    for family, label, low in (("PaperCNN", "the paper's CNN", 0.0), ("SmallCNN", "small CNN", None)):
        other, other_says, _ = top1(family=family, task="scale", img_size=400)
        value = None if dram is None or other is None else dram - other
        out.append({"name": f"dram_minus_{family.lower()}_top1_400", "what": f"DRAM - {label} top-1 at 400 px (points)",
                    "value": value, "target": ">= 0" if low is not None else "reported",
                    "meets": None if value is None or low is None else value >= low,
                    "shown": "-" if value is None else f"{value:+.2f}",
                    "also": {"DRAM": dram_says or "not trained", label: other_says or "not trained"}})
    return out


def _attention_numbers(record: dict) -> tuple[dict, list[list[float]], int] | None:
    """({pointing, pointing_centre, pointing_minus_centre}, the bootstrap 95% intervals of the last
    (one per seed), seeds) of an attention result (scripts/attention_results.py: one run's, or a
    summary over seeds)."""
    keys = ("pointing", "pointing_centre", "pointing_minus_centre")
    if isinstance(record.get("metrics"), dict) and all(k in record["metrics"] for k in keys):
        metrics = record["metrics"]
        return ({k: metrics[k]["mean"] for k in keys}, metrics["pointing_minus_centre"]["per_seed_ci95"],
                len(metrics["pointing_minus_centre"]["per_seed"]))
    correctness = (record.get("trained") or {}).get("correctness") or {}
    if all(k in correctness for k in keys):
        return {k: correctness[k] for k in keys}, [correctness["ci95"]["pointing_minus_centre"]], 1
    return None


def pointing_checks(results: Path) -> list[dict]:
    """Pointing against the centre prior (issue 43), for the families of POINTING at every task and
    side one of their recipes has an attention result for (attention_<name>.json, or its
    attention_<name>_seeds.json summary): the recipes whose top-1 joins the family's rows (its plan's
    and `same_model` ones, and any recipe of its class on the scale or Megapixel data). It beats the
    prior when every seed's bootstrap interval of pointing minus the prior lies above 0."""
    from zoo import registry
    from zoo.guards.errors import UserError

    out = []
    for plan in (p for p in PLANS if p.family in POINTING):
        class_path = registry.get_entry(plan.recipe).model["class_path"]
        joined = {plan.recipe, *plan.same_model}
        found = {}
        for path in sorted(results.glob("attention_*.json")):
            name = path.stem.removeprefix("attention_")
            if re.search(r"_seed\d+$", name):
                continue  # one seed's: its summary stands for it
            name = name.removesuffix("_seeds")
            try:
                entry, record = registry.get_entry(name), json.loads(path.read_text())
            except (OSError, ValueError, UserError):
                continue
            data = entry.data or {}
            if entry.model["class_path"] != class_path or (data.get("class_path") not in TASKS and name not in joined):
                continue
            task, side = SAME_TASK.get((data.get("class_path"), (data.get("init_args") or {}).get("variant")),
                                       (TASKS.get(data.get("class_path")), None))
            side = side or _canvas_side(data)
            numbers = _attention_numbers(record)
            if numbers and (name not in found or numbers[2] > found[name][3][2]):
                found[name] = (task, int(side), path.name, numbers)
        for name, (task, side, file, (values, intervals, seeds)) in sorted(found.items(), key=lambda kv: (kv[1][0] != "scale", kv[1][1])):
            low, high = min(i[0] for i in intervals), max(i[1] for i in intervals)
            out.append({"name": f"{plan.family.lower()}_pointing_{task}_{side}",
                        "what": f"{plan.family} pointing - centre prior, {task} {side} px (points)",
                        "value": 100 * values["pointing_minus_centre"], "target": "> 0, every interval above 0",
                        "meets": all(i[0] > 0 for i in intervals),
                        "shown": f"{100 * values['pointing_minus_centre']:+.1f} [{100 * low:.1f}, {100 * high:.1f}]",
                        "also": {"pointing": f"{100 * values['pointing']:.1f}%",
                                 "centre prior": f"{100 * values['pointing_centre']:.1f}%",
                                 "from": f"{file} ({seeds} seed{'s' * (seeds != 1)})"}})
    return out


def device_slug(device: str) -> str:
    import torch

    if device != "cuda":
        return device
    return re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")


def measure(args) -> int:
    import torch

    from zoo.guards.budget import limit
    from zoo.results import write_json

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("scaling: --device cuda: no CUDA device here")
    unknown = sorted(set(args.families) - {p.family for p in PLANS})
    if unknown:
        raise SystemExit(f"scaling: unknown families {', '.join(unknown)} (known: {', '.join(p.family for p in PLANS)})")
    plans = [p for p in PLANS if p.family in args.families]
    jobs = []
    for p in plans:  # the plan at every side, then the stages of its curriculum at theirs
        jobs += [(p, "scale", s, None) for s in args.sizes]
        stages = {own: _stage_side(own) for own in p.stages}
        jobs += [(p, "scale", side, own) for own, side in stages.items() if side in args.sizes]
    if args.megapixel:
        for p in plans:  # the task's own recipes where there are some, and the plan on the full canvas
            served = {_image_side(config_for(p, "megapixel", MEGAPIXEL_SIDE, own)[0]): own
                      for own in MEGAPIXEL_RECIPES.get(p.family, ())}
            jobs += [(p, "megapixel", side, own) for side, own in served.items()]
            jobs += [] if MEGAPIXEL_SIDE in served else [(p, "megapixel", MEGAPIXEL_SIDE, None)]
    start = time.perf_counter()
    rate = calibrate(args.device)
    rows = []
    for plan, task, side, recipe in jobs:
        t0 = time.perf_counter()
        row = measure_row(plan, task, side, recipe, args, rate)
        rows.append(row)
        lat = row.get("latency") or {}
        print(f"{plan.family:16s} {task:9s} {row['img_size']:5d} px  {row['macs']['total'] / 1e9:9.4f} GMACs  "
              f"latency {1e3 * lat.get('cpu_min_s', float('nan')):9.2f} ms  "
              f"{(row.get('throughput') or {}).get('samples_per_sec', float('nan')):9.1f} img/s  "
              f"train mem {((row.get('train_memory') or {}).get('bytes') or float('nan')) / 2 ** 20:9.1f} MB  "
              f"({time.perf_counter() - t0:.0f} s){'  ' + '; '.join(row['notes']) if row['notes'] else ''}", flush=True)
    setting = {"device": args.device, "threads": torch.get_num_threads(), "sizes": args.sizes,
               "megapixel": args.megapixel, "repeats": args.repeats, "warmup": args.warmup,
               "throughput_repeats": args.throughput_repeats, "batch_size": args.batch_size,
               "memory_batch": args.memory_batch, "max_seconds": args.max_seconds,
               "memory_budget_mb": limit("memory_mb"), "calibrated_macs_per_s": rate,
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "latency_statistic": "cpu_min_s (the least disturbed run's process CPU time)" if args.device == "cpu"
               else "median_s", "note": args.note}
    out = args.out or RESULTS / f"scaling_cost_{device_slug(args.device)}.json"
    path = write_json(out, {"benchmark": "scaling", "setting": setting, "definitions": DEFINITIONS, "rows": rows,
                            "checks": checks(rows, args.device), "wall_time_s": time.perf_counter() - start})
    for c in checks(rows, args.device):
        print(f"check {c['name']}: {_fmt_ratio(c['value'])} (target {c['target']})")
    print(f"wrote {path}")
    return 0


DEFINITIONS = {
    "macs.counter": "torch.utils.flop_counter.FlopCounterMode on the inference program (zoo.commands.cost.inference), "
                    "batch 1, FLOPs / 2",
    "macs.analytic": "work the counter does not see, by a formula per op on the shapes it sees: pooling and "
                     "reductions (1 per element read), interpolation (grid_sampler_2d 4, lerp 1, affine_grid 3 per "
                     "output element), attention kernels without a counter formula (B H L S (E + Ev))",
    "macs.gathered_elements": "elements copied by gather, index_select, indexing (crops and patch reads; no arithmetic)",
    "macs.steps.per_step": "(counter MACs - the once-per-image modules' counter MACs) / steps",
    "latency": "batch 1, seconds per image; median and minimum of wall and process-CPU time after warm-up",
    "throughput": "images/s at `batch`: batch / median wall time of a run (samples_per_sec_cpu: / least CPU time)",
    "train_memory": "zoo.models.memory.training_memory at `batch`: the family's training step on the meta device "
                    "(every tensor alive at once counted) plus the weights x4 (weights, gradients, Adam's moments)",
}


# ============================================================================= report
def _load_costs(results: Path) -> list[tuple[str, dict]]:
    return [(p.stem.removeprefix("scaling_cost_"), json.loads(p.read_text()))
            for p in sorted(results.glob("scaling_cost_*.json"))]


def training_results(results: Path) -> dict[tuple, dict]:
    """{(recipe file, task, image size): {"per_seed": [...], "seeds": [...], "n_test": n, "names": [...]}}
    of the training results of recipes on the scale or Megapixel data (a multi-seed summary, else its
    per-seed files)."""
    groups: dict[tuple, dict] = {}
    for path in sorted(results.glob("*.json")):
        if path.stem.startswith(("attention_", "bench_", "scaling_")):
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        config = record.get("config") if isinstance(record, dict) else None
        data = (config or {}).get("data") or {}
        task, side = SAME_TASK.get((data.get("class_path"), (data.get("init_args") or {}).get("variant")),
                                   (TASKS.get(data.get("class_path")), None))
        acc = (record.get("metrics") or {}).get("test/acc")
        if task is None or acc is None:
            continue
        init = config.get("init_args") or {}
        side = side or (init.get("image_size") and _side(init["image_size"]))  # (a ViT's is its backbone's)
        if side is None:
            continue
        recipe = str(record.get("recipe") or "")
        recipe = Path(recipe).relative_to(ROOT).as_posix() if Path(recipe).is_absolute() and \
            Path(recipe).is_relative_to(ROOT) else recipe
        key = (recipe, task, side, json.dumps(record.get("train_args") or []))
        group = groups.setdefault(key, {"summary": None, "seeds": {}, "n_test": _test_examples(data), "names": [],
                                        "data": None if data.get("class_path") in TASKS else
                                        f"{data['class_path'].rsplit('.', 1)[-1]} {data['init_args']['variant']}"})
        group["names"].append(path.stem)
        if isinstance(acc, dict):
            group["summary"] = (list(record.get("seeds") or range(len(acc["per_seed"]))), list(acc["per_seed"]))
        else:
            group["seeds"][record.get("seed", 0)] = acc
    out = {}
    for (recipe, task, size, train_args), group in groups.items():
        seeds, values = group["summary"] or (sorted(group["seeds"]), [group["seeds"][s] for s in sorted(group["seeds"])])
        pairs = [(s, v) for s, v in zip(seeds, values) if v is not None]
        if not pairs:
            continue
        out[(recipe, task, size, train_args)] = {"seeds": [s for s, _ in pairs], "per_seed": [v for _, v in pairs],
                                                 "n_test": group["n_test"], "names": sorted(group["names"]),
                                                 "data": group["data"]}
    return out


def _test_examples(data: dict) -> int:
    init = data.get("init_args") or {}
    if data.get("class_path") == MEGAPIXEL_DATA:
        n = init.get("num_test") or _default({"class_path": MEGAPIXEL_DATA}, "num_test")
    else:
        n = FASHION_MNIST_TEST
    return int(min(n, init["limit_eval"]) if init.get("limit_eval") else n)


def accuracy(entry: dict) -> dict:
    """Mean top-1 over seeds, the seeds' sample std, and a bootstrap 95% interval of the mean: each
    seed's test set resampled (a binomial draw of its n examples at its accuracy)."""
    import numpy as np

    values, n = np.asarray(entry["per_seed"], dtype=float), entry["n_test"]
    rng = np.random.default_rng(0)
    draws = rng.binomial(n, np.broadcast_to(values, (BOOTSTRAP, len(values)))) / n
    low, high = np.percentile(draws.mean(1), [2.5, 97.5])
    return {"top1": 100 * float(values.mean()), "top1_std": 100 * float(values.std(ddof=1)) if len(values) > 1 else None,
            "top1_ci95": (100 * float(low), 100 * float(high)), "seeds": len(values), "n_test": n}


CSV_COLUMNS = ["model", "family", "task", "device", "img_size", "top1", "top1_err", "top1_std", "top1_ci95_low",
               "top1_ci95_high", "seeds", "infer_samples_per_sec", "infer_step_time", "infer_batch_size",
               "infer_latency_ms", "infer_gmacs", "infer_gmacs_counter", "infer_gmacs_analytic",
               "infer_gathered_melements", "steps", "infer_gmacs_per_step", "train_batch_size", "train_peak_mem_mb",
               "param_count", "notes"]


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def recipe_files(row: dict) -> set[str]:
    """The recipe files whose results join a cost row: its own, and its plan's `same_model` ones."""
    from zoo import registry

    plan = next((p for p in PLANS if p.family == row["family"]), None)
    same = plan.same_model if plan and row["recipe"] == plan.recipe else ()
    return {row["recipe_file"], *(registry.get_entry(n).metadata.get("recipe_file") for n in same)}


def report_rows(costs: list[tuple[str, dict]], trained: dict) -> list[dict]:
    """One row per cost row and device, with the accuracy of the training results of its recipe at its
    size; training results no cost row has get rows of their own."""
    rows, joined = [], set()
    for device, record in costs:
        # on a CPU the least process-CPU time of the runs (the work done, not time spent preempted on a
        # shared machine), for latency and throughput alike; on a GPU the median wall time
        cpu = record["setting"]["device"] == "cpu"
        stat, rate = ("cpu_min_s", "samples_per_sec_cpu") if cpu else ("median_s", "samples_per_sec")
        for r in record["rows"]:
            # runs of the row's recipe on its task at its size; arguments that change the model's
            # architecture make another model (their own row), others (a budget) are stated in the notes
            found = [k for k in trained if k[0] in recipe_files(r) and k[1] == r["task"] and k[2] == r["img_size"]
                     and not any(str(a).startswith("--model") for a in json.loads(k[3]))]
            key = max(found, key=lambda k: (len(trained[k]["seeds"]), k[3] == "[]"), default=None)
            acc = accuracy(trained[key]) if key else {}
            joined.add(key)
            trained_with = [f"trained with {' '.join(json.loads(key[3]))}"] if key and key[3] != "[]" else []
            trained_with = ([f"{r['recipe']} as it is"] if r.get("stage") else []) + trained_with
            if key and (key[0] != r["recipe_file"] or trained[key]["data"]):  # whose top-1 it is, where not the row's
                trained_with.append(f"top-1 of {min(trained[key]['names'], key=len)}" + (f" on {trained[key]['data']}"
                                                                       if trained[key]["data"] else ""))
            lat, thr, mem, macs = r.get("latency") or {}, r.get("throughput") or {}, r.get("train_memory") or {}, r["macs"]
            rows.append({
                "model": r["recipe"], "family": f"{r['family']}, own recipe" if r.get("stage") else r["family"],
                "task": r["task"], "device": device, "img_size": r["img_size"],
                **_acc_cells(acc),
                "infer_samples_per_sec": _num(thr.get(rate), 2),
                "infer_step_time": _num(thr.get(stat) and 1e3 * thr[stat], 3),
                "infer_batch_size": thr.get("batch", ""),
                "infer_latency_ms": _num(lat.get(stat) and 1e3 * lat[stat], 3),
                "infer_gmacs": _num(macs["total"] / 1e9, 6), "infer_gmacs_counter": _num(macs["counter"] / 1e9, 6),
                "infer_gmacs_analytic": _num(macs["analytic"] / 1e9, 6),
                "infer_gathered_melements": _num(macs["gathered_elements"] / 1e6, 4),
                "steps": (macs.get("steps") or {}).get("count", ""),
                "infer_gmacs_per_step": _num(macs.get("steps") and macs["steps"]["per_step"] / 1e9, 6),
                "train_batch_size": mem.get("batch", ""),
                "train_peak_mem_mb": _num(mem.get("bytes") and mem["bytes"] / 2 ** 20, 1),
                "param_count": _num(r["param_count"] / 1e6, 3),
                "notes": "; ".join(trained_with + (["MACs counted on the meta device"] if macs["counted_on"] == "meta"
                                                   else []) + r["notes"])})
    for key, entry in sorted(trained.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if key in joined or entry["data"]:  # (other recipes on another module's data of the task: the leaderboard's)
            continue
        recipe, task, size, train_args = key
        rows.append({c: "" for c in CSV_COLUMNS} | {
            "model": Path(recipe or "?").stem, "task": task, "img_size": size, **_acc_cells(accuracy(entry)),
            "notes": "no cost row: " + ", ".join(entry["names"])
                     + (f" (train_args {train_args})" if train_args != "[]" else "")})
    return rows


def _acc_cells(acc: dict) -> dict:
    if not acc:
        return {"top1": "", "top1_err": "", "top1_std": "", "top1_ci95_low": "", "top1_ci95_high": "", "seeds": ""}
    return {"top1": _num(acc["top1"], 2), "top1_err": _num(100 - acc["top1"], 2), "top1_std": _num(acc["top1_std"], 2),
            "top1_ci95_low": _num(acc["top1_ci95"][0], 2), "top1_ci95_high": _num(acc["top1_ci95"][1], 2),
            "seeds": acc["seeds"]}


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _fmt_ratio(value) -> str:
    return "-" if value is None else f"{value:#.3g}x"


def _si(value: float) -> str:
    """A count with three significant figures and its unit (k, M, G)."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g}"


def _sig(value: float) -> str:
    """Three significant figures, thousands separated, never in exponent form."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1e}"


def _megabytes(mb: float) -> str:
    return f"{mb:,.0f} MB" if mb < 10_000 else f"{mb / 1024:,.0f} GB"


def cost_table(rows: list[dict], record: dict) -> str:
    """The markdown table of one device's rows."""
    header = ["family", "task", "side (px)", "params", "MACs: counter + analytic", "per step", "latency, batch 1",
              "images/s (batch)", f"training memory (batch {record['setting']['memory_batch']})", "top-1 %", "notes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        notes = r["notes"].replace("|", "/")
        per_step = f"{_si(float(r['infer_gmacs_per_step']) * 1e9)} x {r['steps']}" if r["infer_gmacs_per_step"] else ""
        top1 = ""
        if r["top1"]:
            top1 = f"{r['top1']}" + (f" ± {r['top1_std']}" if r["top1_std"] else "") + \
                   f" [{r['top1_ci95_low']}, {r['top1_ci95_high']}] ({r['seeds']} seed{'s' if r['seeds'] != 1 else ''})"
        macs = ""
        if r["infer_gmacs"]:
            macs = f"{_si(float(r['infer_gmacs_counter']) * 1e9)} + {_si(float(r['infer_gmacs_analytic']) * 1e9)}"
        lines.append("| " + " | ".join([
            f"{r['family'] or r['model']}", r["task"], str(r["img_size"]),
            _si(float(r["param_count"]) * 1e6) if r["param_count"] else "", macs, per_step,
            f"{_sig(float(r['infer_latency_ms']))} ms" if r["infer_latency_ms"] else "-",
            f"{_sig(float(r['infer_samples_per_sec']))} ({r['infer_batch_size']})" if r["infer_samples_per_sec"] else "-",
            _megabytes(float(r["train_peak_mem_mb"])) if r["train_peak_mem_mb"] else "-", top1 or "-", notes]) + " |")
    return "\n".join(lines)


def checks_table(record: dict, rows: list[dict], pointing: list[dict]) -> str:
    """The cost checks of one device's JSON, then the accuracy checks of its report rows, then pointing."""
    lines = ["| check | measured | target | meets it | also |", "|---|---|---|---|---|"]
    for c in checks(record["rows"], record["setting"]["device"]) + accuracy_checks(rows) + pointing:
        also = ", ".join(f"{k}: {v if isinstance(v, str) else _fmt_ratio(v)}" for k, v in (c.get("also") or {}).items())
        verdict = "-" if c["meets"] is None else "yes" if c["meets"] else "no"
        lines.append(f"| {c['what']} | {c.get('shown') or _fmt_ratio(c['value'])} | {c['target']} | {verdict} | {also} |")
    return "\n".join(lines)


def document_tables(costs: list[tuple[str, dict]], rows: list[dict], pointing: list[dict]) -> tuple[str, str]:
    """(the cost tables, the checks tables), one of each per device, with what produced it."""
    tables, check_tables = [], []
    for device, record in costs:
        mine = [r for r in rows if r["device"] == device]
        setting = record["setting"]
        what = (f"*{device}*: `{record.get('device', {}).get('device', device)}`, {setting['threads']} thread(s), "
                f"commit `{str(record.get('git_commit', '?'))[:12]}`, {record.get('date', '?')[:10]}, "
                f"{record.get('wall_time_s', 0) / 60:.0f} min; latency: {setting['latency_statistic'].split(' ')[0]} "
                f"of up to {setting['repeats']} runs after {setting['warmup']} warm-up; load average "
                f"{', '.join(f'{v:.1f}' for v in setting.get('load_average') or [])}")
        tables.append(what + "\n\n" + cost_table(mine, record))
        check_tables.append(f"*{device}*\n\n" + checks_table(record, mine, pointing))
    orphans = [r for r in rows if not r["device"]]
    if orphans:
        tables.append("Training results without a cost row:\n\n" + cost_table(orphans, costs[0][1] if costs else
                                                                               {"setting": {"memory_batch": "-"}}))
    return "\n\n".join(tables) or "(no cost measured yet: `python scripts/scaling.py measure`)", \
        "\n\n".join(check_tables) or "(no cost measured yet)"


def fill(text: str, markers: tuple[str, str], body: str) -> str:
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"scaling: {DOC.relative_to(ROOT)} lacks the markers {start} ... {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def figure_png(rows: list[dict], budget_mb: float | None = None, memory_batch: int | None = None) -> bytes:
    """Four panels against the image side, log axes: top-1, MACs, batch-1 latency, peak training
    memory (with the memory budget); circles the scale task, squares Megapixel Fashion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("top1", "test top-1 (%)"), ("infer_gmacs", "GMACs per image (counter + analytic)"),
              ("infer_latency_ms", "latency, batch 1, one thread (ms)"),
              ("train_peak_mem_mb", f"peak training memory, batch {memory_batch} (MB)")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    families = list(dict.fromkeys(r["family"] for r in rows if r["family"]))
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    device = next((r["device"] for r in rows if r["device"] == "cpu"), next((r["device"] for r in rows), None))
    sizes = [int(r["img_size"]) for r in rows if r["img_size"] != ""]
    ticks = sorted({int(r["img_size"]) for r in rows if r["task"] == "scale"} | {MEGAPIXEL_SIDE})
    for ax, (column, label) in zip(axes.flat, panels):
        drawn = False
        for family in families:
            for task, marker in (("scale", "o"), ("megapixel", "s")):
                points = sorted((int(r["img_size"]), float(r[column])) for r in rows
                                if r["family"] == family and r["task"] == task and r["device"] in (device, "")
                                and r[column])
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker=marker, linestyle="-" if task == "scale" else "none", color=colours[family],
                        markerfacecolor=colours[family] if task == "scale" else "none",
                        label=family if task == "scale" else None)
                drawn = True
        if column == "train_peak_mem_mb" and budget_mb:
            ax.axhline(budget_mb, color="grey", linestyle="--", linewidth=1)
            ax.text(min(sizes or [60]), budget_mb, " memory budget", va="bottom", color="grey", fontsize=8)
        ax.set_xscale("log")
        if column != "top1" and drawn:
            ax.set_yscale("log")
        ax.set_xlim(min(sizes or [60]) / 1.2, max(sizes or [MEGAPIXEL_SIDE]) * 1.2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("image side (px); squares: Megapixel Fashion at the side read")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "no results yet", ha="center", va="center", transform=ax.transAxes, color="grey")
    handles, labels = axes.flat[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels) or 1, frameon=False)
    fig.suptitle(f"Cost and accuracy against the image side ({device}; scripts/scaling.py)")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def stale_rows(costs: list[tuple[str, dict]]) -> list[str]:
    """The cost rows that measured another model than their recipe builds now (a recipe changed since
    `measure`): each as "family task side px (the arguments that differ)"."""
    stale = []
    for _, record in costs:
        for r in record["rows"]:
            plan = next((p for p in PLANS if p.family == r["family"]), None)
            own = r["recipe"] if plan and r["recipe"] != plan.recipe else None
            try:
                now = json.loads(json.dumps(config_for(plan, r["task"], r["canvas_size"], own)[0]["init_args"])) \
                    if plan else None  # (as the JSON holds it)
            except Exception as exc:  # noqa: BLE001 (a recipe gone or renamed is stale too)
                now = {"error": str(exc)}
            if now != r.get("model"):
                keys = sorted(k for k in set(now or {}) | set(r.get("model") or {})
                              if (now or {}).get(k) != (r.get("model") or {}).get(k))
                stale.append(f"{r['family']} {r['task']} {r['img_size']} px ({', '.join(keys) or 'no plan'})")
    return stale


def report(args) -> int:
    from zoo.guards.writes import atomic_write_bytes

    results = Path(args.results)
    costs = _load_costs(results)
    stale = stale_rows(costs)
    if stale:
        print(f"scaling: {len(stale)} cost row(s) measured another model than their recipe builds now: "
              f"{'; '.join(stale[:4])}{' ...' if len(stale) > 4 else ''}; run python scripts/scaling.py measure",
              file=sys.stderr)
        return 1
    rows = report_rows(costs, training_results(results))
    csv_new = csv_text(rows)
    doc_path = Path(args.doc)
    doc = doc_path.read_text()
    tables, check_tables = document_tables(costs, rows, pointing_checks(results))
    doc_new = fill(fill(doc, TABLE_MARKERS, tables), CHECK_MARKERS, check_tables)
    csv_path = Path(args.csv)
    if args.check:
        stale = [str(p) for p, new in ((csv_path, csv_new), (doc_path, doc_new))
                 if not p.is_file() or p.read_text() != new]
        if stale:
            print(f"scaling: out of date: {', '.join(stale)}; run python scripts/scaling.py report", file=sys.stderr)
            return 1
        return 0
    atomic_write_bytes(csv_path, csv_new.encode())
    atomic_write_bytes(doc_path, doc_new.encode())
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    setting = costs[0][1]["setting"] if costs else {}
    atomic_write_bytes(Path(args.figure), figure_png(rows, setting.get("memory_budget_mb"), setting.get("memory_batch")))
    print(f"wrote {csv_path}, {doc_path} (tables) and {args.figure}: {len(rows)} rows from {len(costs)} cost file(s)")
    return 0


# ============================================================================= command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step")
    m = steps.add_parser("measure", help="measure the cost rows (slow)")
    m.add_argument("--families", nargs="+", default=[p.family for p in PLANS], help="rows of PLANS to measure")
    m.add_argument("--sizes", type=int, nargs="+", default=[60, 100, 200, 400], help="canvas sides of the scale task")
    m.add_argument("--no-megapixel", dest="megapixel", action="store_false", help="leave out Megapixel Fashion")
    m.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    m.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 keeps torch's)")
    m.add_argument("--repeats", type=int, default=10, help="batch-1 runs timed (at most)")
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--batch-size", type=int, default=256, help="the throughput batch (smaller where it must be)")
    m.add_argument("--throughput-repeats", type=int, default=3)
    m.add_argument("--memory-batch", type=int, default=32, help="the batch of the training-memory measure")
    m.add_argument("--max-seconds", type=float, default=30.0, help="time cap of one timing (it stops after 3 runs)")
    m.add_argument("--note", default="", help="a note kept in the JSON's setting (e.g. the machine's load)")
    m.add_argument("--out", default=None, help="default: results/scaling_cost_<device>.json")
    r = steps.add_parser("report", help="write the CSV, the figure and docs/scaling.md's tables (fast)")
    r.add_argument("--results", default=str(RESULTS), help="the folder of the cost and training JSON")
    r.add_argument("--csv", default=str(CSV_PATH))
    r.add_argument("--doc", default=str(DOC))
    r.add_argument("--figure", default=str(FIGURE))
    r.add_argument("--check", action="store_true", help="only say whether the CSV and tables are up to date (exit 1)")
    args = parser.parse_args(argv)
    if args.step == "measure":
        return measure(args)
    if args.step == "report":
        return report(args)
    return measure(parser.parse_args(["measure"])) or report(parser.parse_args(["report"]))


if __name__ == "__main__":
    sys.exit(main())
