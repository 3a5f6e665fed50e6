"""What a model costs: its parameters and the multiply-accumulates (MACs) of one inference at its input
size, timm's `param_count` and `infer_gmacs`. One inference is the program `zoo export` writes (a
classifier's logits, a captioner's greedy decoding unrolled to `decode_max_len`, DRAW's samples from
the prior), so that the count, the benchmark and a deployment measure the same work. MACs = FLOPs / 2
of torch.utils.flop_counter: matrix products, convolutions and attention, as timm counts them (not
element-wise work, gathers or RAM's retina crops).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass
class Inference:
    """One inference of a model: `module(*inputs(batch, device))`, and what it is in words."""

    what: str
    module: nn.Module
    inputs: Callable[[int, torch.device], tuple]
    img_size: int  # the image side it reads (or, for a generator, writes)


class _Sample(nn.Module):
    def __init__(self, generator):
        super().__init__()
        self.generator = generator

    def forward(self, n: int) -> torch.Tensor:
        return self.generator.sample(n)["images"]  # [n, C, S, S]


def inference(model) -> Inference:
    """The model's inference program (see the module docstring), in eval mode. A UserError where
    there is none yet (a captioner before training has given it a vocabulary)."""
    from zoo.preprocess import for_model
    from zoo.weights.export import programs

    model = model.eval()
    size = for_model(model).size
    if model.card.output == "sample":
        return Inference(f"sample {size[0]}x{size[1]} images from the prior", _Sample(model),
                         lambda n, device: (n,), size[-1])
    found = programs(model)
    name = "greedy" if "greedy" in found else "model"
    program = found[name]
    chans = program.inputs[0].shape[1]
    what = (f"greedy caption of {model.hparams.decode_max_len} words" if name == "greedy"
            else f"{' and '.join(program.output_names)} of an image")
    return Inference(f"{what} ({chans}x{size[0]}x{size[1]})", program.module,
                     lambda n, device: (torch.rand(n, chans, *size, device=device),), size[-1])


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_macs(model, batch_size: int = 1) -> int:
    """Multiply-accumulates of one inference of `batch_size` images (FLOPs / 2; module docstring)."""
    return _counted(model, batch_size).get_total_flops() // 2


def _counted(model, batch_size: int = 1):
    from torch.utils.flop_counter import FlopCounterMode

    run = inference(model)
    device = next(model.parameters()).device
    counter = FlopCounterMode(display=False)
    with counter:
        run.module(*run.inputs(batch_size, device))
    return counter


def step_macs(model, counter) -> dict | None:
    """A glimpse family's MACs per step from a flop counter that ran one image (its card's
    `steps`): {count, once_per_image, per_step}; None for a family of one pass."""
    steps = model.card.steps
    if steps is None:
        return None
    per_module, once = counter.get_flop_counts(), 0
    for name in steps.once:  # the outermost module of that name (the counter's keys are dotted paths)
        keys = sorted((k for k in per_module if k == name or k.endswith("." + name)), key=len)
        once += sum(per_module[keys[0]].values()) // 2 if keys else 0
    count = int(model.hparams[steps.count])
    return {"name": steps.count, "count": count, "once_per_image": once,
            "per_step": (counter.get_total_flops() // 2 - once) // count}


def facts(model) -> dict:
    """What `zoo info` shows that takes torch to know: parameters, MACs per image and what the
    inference is, the preprocessing (zoo.preprocess) and the size of the label set."""
    from zoo.preprocess import for_model

    spec = for_model(model)
    record = {"num_params": num_params(model), "preprocessing": spec.as_dict()}
    record["preprocessing"].pop("class_names", None)  # not a preprocessing fact
    if spec.class_names:
        record["num_classes"] = len(spec.class_names)
        record["class_names"] = list(spec.class_names)  # a release's from before its model stored them too
    elif model.hparams.get("num_classes"):
        record["num_classes"] = int(model.hparams["num_classes"])
    vocab = model.hparams.get("vocab")
    if vocab:
        record["vocab_size"] = len(vocab)
    if model.card.vocab_keys and not vocab:
        record["num_params_note"] = (f"without the vocabulary-sized layers ({', '.join(model.card.vocab_keys)}), "
                                     "which training sizes from the data")
        record["inference"] = record["macs"] = None
        record["gmacs_note"] = "depends on the vocabulary, which training takes from the data"
    else:
        with torch.no_grad():
            counter = _counted(model)
        record["inference"] = inference(model).what
        record["macs"] = counter.get_total_flops() // 2
        if model.card.steps is not None:
            record["steps"] = step_macs(model, counter)
    return record
