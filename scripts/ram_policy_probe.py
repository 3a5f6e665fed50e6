"""Why do RAM's glimpses miss the item? Three measurements of a RAM release or checkpoint on its
own data's test canvases (the target item's box known):

1. where the deterministic policy looks, glimpse by glimpse: the glimpse centre inside the item's
   box (the pointing game), its distance to the item's centre, and its correlation with it;
2. whether the model *knows* where the item is: a least-squares linear read-out of the item's
   offset from the last glimpse, fitted on the core state h_t of the first 3/4 of the canvases and
   scored (R^2, error in pixels) on the rest. A linear location network could act on this;
3. whether looking at the item would pay: accuracy with the policy's own glimpses, with every
   glimpse at the item's centre (plus Gaussian jitter), and with every glimpse at the canvas centre;
4. how hard the reward pulls each glimpse toward the item, which is what REINFORCE can learn from
   (for the paper's reward, and for the return the model is trained on, "own", when it is shaped):
   with K sampled paths per canvas and the advantage A = R - (the canvas's mean reward),
   E[A eps_t . u_t] (eps_t the policy's standard-normal draw, u_t the unit vector from the glimpse's
   mean to the item's centre) is sigma times the derivative of the expected reward along u_t
   (the score-function identity behind eq. 2): the expected reward gained by moving glimpse t's mean
   one sigma toward the item. Its standard error says how many paths a gradient step needs to see it.

    python scripts/ram_policy_probe.py ram_fmnist_cluttered60
    python scripts/ram_policy_probe.py runs/x/checkpoints/last.ckpt --tag x --n 2000

Writes results/ram_policy_<name>[_<tag>].json with the git commit, device and wall time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402
from zoo import registry  # noqa: E402
from zoo.guards.errors import UserError  # noqa: E402
from zoo.results import write_json  # noqa: E402


def _accuracy(model, images, labels, locations) -> float:
    """Accuracy with the glimpses put at `locations` [B, T, 2] (normalised): the "random" policy
    reads its uniform draws u as l = 2u - 1, so draws of (l + 1) / 2 place every glimpse."""
    out = model.rollout(images, "random", noise=((locations + 1) / 2).transpose(0, 1))
    return (out["logits"].argmax(-1) == labels).float().mean().item()


def _read_out(states: torch.Tensor, offsets: torch.Tensor, fit: int) -> dict:
    """Least-squares linear map (with bias) from states [N, H] to offsets [N, 2], fitted on the
    first `fit` rows and scored on the rest: R^2 per axis and the RMS error in normalised units."""
    design = torch.cat([states, torch.ones(len(states), 1)], 1).double()
    weights = torch.linalg.lstsq(design[:fit], offsets[:fit].double()).solution
    held, truth = design[fit:] @ weights, offsets[fit:].double()
    r2 = 1 - ((held - truth) ** 2).sum(0) / ((truth - truth.mean(0)) ** 2).sum(0)
    return {"r2_x": r2[0].item(), "r2_y": r2[1].item(), "rmse": ((held - truth) ** 2).mean().sqrt().item()}


def _reward_pull(model, images, labels, item_normalised, paths: int, generator, own_returns=None) -> list[dict]:
    """Per glimpse, the expected reward gained by moving its mean one sigma toward the item
    (first order), estimated from `paths` sampled paths per canvas (see the module docstring), for
    the paper's reward (1 for a correct final prediction). `own_returns(out, labels) -> [N * K, T]`,
    when given, is the return each glimpse is trained on (RAM.returns: a shaped reward); its pull is
    reported as "own" beside, with `snr_batch128`, the pull over one 128-path batch's standard error
    (a signal-to-noise ratio, comparable across rewards of different scales)."""
    n, std = len(images), float(model.current_std())
    images, labels = images.repeat_interleave(paths, 0), labels.repeat_interleave(paths, 0)
    noise = model.policy_noise("sample", len(images), images, generator)  # [T, N * K, 2]
    out = model.rollout(images, "sample", noise=noise, std=std)
    reward = (out["logits"].argmax(-1) == labels).float()[:, None].expand(-1, len(noise))  # [N * K, T]
    item = item_normalised.repeat_interleave(paths, 0)

    def pull(returns: torch.Tensor, t: int, eps: torch.Tensor) -> dict:
        per_image = returns[:, t].view(n, paths)
        advantage = (per_image - per_image.mean(1, keepdim=True)).reshape(-1)  # [N * K]
        mean = out["locations"][:, t] - std * eps  # the policy's mean where the sample was not clamped
        per_path = advantage * (eps * F.normalize(item - mean, dim=-1)).sum(-1)  # [N * K]
        per_canvas = per_path.view(n, paths).mean(1)
        # one path's spread: a training batch of B paths estimates the pull with standard error
        # path_std / sqrt(B)
        path_std = per_path.std().item()
        return {"reward_per_sigma": per_canvas.mean().item(), "standard_error": (per_canvas.std() / n ** 0.5).item(),
                "path_std": path_std, "snr_batch128": per_canvas.mean().item() / max(path_std / 128 ** 0.5, 1e-12)}

    own = None if own_returns is None else own_returns(out, labels)
    steps = []
    for t, eps in enumerate(noise):
        steps.append({"glimpse": t + 1, **pull(reward, t, eps)})
        if own is not None:
            steps[-1]["own"] = pull(own, t, eps)
    return steps


@torch.no_grad()
def probe(name: str, n: int, jitter_px: float, seed: int, pull_canvases: int = 300, paths: int = 64) -> dict:
    model = (zoo.load_checkpoint(name) if Path(name).suffix in (".ckpt", ".safetensors")
             else zoo.create_model(name, pretrained=True)).eval()
    if model.family != "ram":
        raise UserError(f"{name} is a {model.family} model; this probe reads RAM's glimpses")
    data = registry.build_datamodule(model)
    examples = data.boxed_examples("test", n)
    images, boxes = examples["images"], examples["targets"][:, 0]  # [N, C, H, W], [N, 4] (x0, y0, x1, y1)
    labels = data.datasets["test"].tensors[1][: len(images)]
    height, width = model.image_hw
    half = torch.tensor([width / 2, height / 2])
    item = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2], -1)  # [N, 2] px
    item_normalised = item / half - 1

    states: list[torch.Tensor] = []
    hook = model.core.register_forward_hook(lambda m, i, o: states.append(o if torch.is_tensor(o) else o[0]))
    out = model.rollout(images, "mean")
    hook.remove()
    glimpses = (out["locations"] + 1) * half  # [N, T, 2] px, (x, y)
    fit = len(images) * 3 // 4
    steps = []
    for t in range(glimpses.shape[1]):
        x, y = glimpses[:, t].unbind(-1)
        inside = (x >= boxes[:, 0]) & (x < boxes[:, 2]) & (y >= boxes[:, 1]) & (y < boxes[:, 3])
        corr = [torch.corrcoef(torch.stack([glimpses[:, t, a], item[:, a]]))[0, 1].nan_to_num().item() for a in (0, 1)]
        steps.append({"glimpse": t + 1, "pointing": inside.float().mean().item(),
                      "distance_px": (glimpses[:, t] - item).norm(dim=-1).mean().item(),
                      "corr_x": corr[0], "corr_y": corr[1],
                      # what h_t (after glimpse t) says about the item's offset from glimpse t
                      "read_out": _read_out(states[t], item_normalised - out["locations"][:, t], fit)})
    for step in steps:
        step["read_out"]["rmse_px"] = step["read_out"].pop("rmse") * float(half.mean())
    generator = torch.Generator().manual_seed(seed)
    T = glimpses.shape[1]
    at_item = item_normalised[:, None].expand(-1, T, -1)
    jitter = torch.randn(at_item.shape, generator=generator) * jitter_px / half
    pull = _reward_pull(model, images[:pull_canvases], labels[:pull_canvases], item_normalised[:pull_canvases],
                        paths, generator, own_returns=model.returns)
    for step, pulled in zip(steps, pull):
        step["reward_pull"] = {**pulled, "canvases": min(pull_canvases, len(images)), "paths": paths,
                               "sigma_px": float(model.current_std()) * float(half.mean())}
    return {
        "name": name, "examples": len(images), "seed": seed, "jitter_px": jitter_px,
        "centre_pointing": (((boxes[:, 0] <= width / 2) & (width / 2 < boxes[:, 2]) & (boxes[:, 1] <= height / 2)
                             & (height / 2 < boxes[:, 3])).float().mean().item()),
        "per_glimpse": steps,
        "accuracy": {"policy": (out["logits"].argmax(-1) == labels).float().mean().item(),
                     "at_item_centre": _accuracy(model, images, labels, at_item),
                     "at_item_centre_jittered": _accuracy(model, images, labels, (at_item + jitter).clamp(-1, 1)),
                     "at_canvas_centre": _accuracy(model, images, labels, torch.zeros_like(at_item))},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a RAM release, or a .ckpt / .safetensors of one")
    parser.add_argument("--n", type=int, default=2000, help="test canvases")
    parser.add_argument("--jitter", type=float, default=5.0, help="px of jitter around the item's centre")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", help="suffix of the JSON's name; needed for a checkpoint")
    parser.add_argument("--trained-with", help="for a checkpoint: the command that trained it (kept in the JSON)")
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args(argv)
    try:
        if Path(args.name).suffix and not args.tag:
            raise UserError("a checkpoint needs --tag to name its JSON")
        started = time.perf_counter()
        result = probe(args.name, args.n, args.jitter, args.seed)
        stem = args.tag if Path(args.name).suffix else "_".join(filter(None, [args.name, args.tag]))
        result["trained_with"] = args.trained_with
        result["wall_time_s"] = round(time.perf_counter() - started, 1)
        result["command"] = "python scripts/ram_policy_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
        path = write_json(Path(args.out) / f"ram_policy_{stem}.json", result)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for step in result["per_glimpse"]:
        print(f"glimpse {step['glimpse']}: pointing {step['pointing']:.3f}  distance {step['distance_px']:.1f} px  "
              f"read-out R2 {step['read_out']['r2_x']:.2f}/{step['read_out']['r2_y']:.2f}  "
              f"reward per sigma toward the item {100 * step['reward_pull']['reward_per_sigma']:+.2f} "
              f"+- {100 * step['reward_pull']['standard_error']:.2f} points; own return: signal/noise per "
              f"128-path batch {step['reward_pull']['own']['snr_batch128']:.2f} "
              f"(paper's reward {step['reward_pull']['snr_batch128']:.2f})")
    print(f"centre pointing {result['centre_pointing']:.3f}; accuracy {result['accuracy']}")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
