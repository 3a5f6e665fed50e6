"""Why hard attention learns where to look so slowly: how much of its REINFORCE gradient is signal.

    python scripts/sat_reinforce_snr.py (--checkpoint PATH | --model NAME) [--draws 32] [--batches 2] [--out FILE.json]

For a hard-attention captioner and a few FashionScenes training batches (its own data config),
the script draws the hard attention's samples `--draws` times on each batch (same weights, same
captions, dropout off) and computes, for each way of charging the samples, the REINFORCE gradient
on the attention network's parameters (reward scale 1, no entropy bonus):
- `caption/moving_average`: the authors' rule: every step's sample pays the caption's per-word
  NLL, against the model's running baseline b;
- `caption/leave_one_out`: the same cost against the mean cost of the other draws of the same
  caption (the best baseline that does not know the sample);
- `word/leave_one_out`: step t's sample pays the NLL of word t only, against the other draws'
  mean NLL of that word (a biased estimator: later words are not charged);
- `word_discounted/leave_one_out`: word t plus later words at discount 0.5.
Per variant it reports the mean gradient's norm (signal), the single draw's deviation from it
(noise), their ratio (SNR of one draw; a minibatch of B captions averages B draws), and the cosine
between the mean REINFORCE gradient and the gradient soft attention would follow (backprop of
the expected-context NLL). Writes the table as JSON with --out.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.attention.hard import reinforce_surrogate  # noqa: E402
from zoo.guards.errors import UserError  # noqa: E402
from zoo.guards.writes import check_output  # noqa: E402
from zoo.results import write_json  # noqa: E402

VARIANTS = ("caption/moving_average", "caption/leave_one_out", "word/leave_one_out",
            "word_discounted/leave_one_out")
DISCOUNT = 0.5


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def _costs(terms: dict, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    out, mask = terms["out"], terms["step_mask"]
    B, T1 = targets.shape
    nll = F.cross_entropy(out["logits"].reshape(B * T1, -1), targets.reshape(-1), reduction="none").view(B, T1) * mask
    later = torch.arange(T1).view(1, -1) - torch.arange(T1).view(-1, 1)
    weight = torch.where(later >= 0, DISCOUNT ** later.clamp(min=0).float(), torch.zeros(()))
    return {"caption": (nll.sum(1) / mask.sum(1).clamp(min=1)).detach(), "word": nll.detach(),
            "word_discounted": (nll @ weight.T).detach()}


def analyse(model, batches: list[dict], draws: int) -> dict:
    params = [p for p in model.net.attend.score.parameters()]
    rows = {v: {"signal": [], "noise": [], "snr": [], "cosine_with_soft": []} for v in VARIANTS}
    for batch in batches:
        targets = batch["captions"][:, 1:]
        soft = model.loss_terms(batch, "expected")["nll"]
        g_soft = _flat(torch.autograd.grad(soft, params))
        costs = []
        for d in range(draws):  # pass 1: every draw's costs, for the leave-one-out baselines
            torch.manual_seed(d)
            with torch.no_grad():
                costs.append(_costs(model.loss_terms(batch, "sample"), targets))
        totals = {k: sum(c[k] for c in costs) for k in costs[0]}
        grads = {v: [] for v in VARIANTS}
        for d in range(draws):  # pass 2: the same samples again, now with gradients
            torch.manual_seed(d)
            terms = model.loss_terms(batch, "sample")
            out, mask = terms["out"], terms["step_mask"]
            for variant in VARIANTS:
                kind, baseline_kind = variant.split("/")
                cost = costs[d][kind]
                baseline = (model.net.baseline.value if baseline_kind == "moving_average"
                            else (totals[kind] - cost) / (draws - 1))
                surrogate = reinforce_surrogate(out["log_alpha"], out["location"], cost, baseline, mask,
                                                reward_scale=1.0, entropy_coef=0.0)
                grads[variant].append(_flat(torch.autograd.grad(surrogate, params, retain_graph=True)))
        for variant, gs in grads.items():
            g = torch.stack(gs)  # [draws, P]
            mean = g.mean(0)
            noise = (g - mean).pow(2).sum(1).mean().sqrt()
            rows[variant]["signal"].append(float(mean.norm()))
            rows[variant]["noise"].append(float(noise))
            rows[variant]["snr"].append(float(mean.norm() / noise) if noise > 0 else math.nan)
            rows[variant]["cosine_with_soft"].append(float(F.cosine_similarity(mean, g_soft, dim=0)))
    return {v: {k: sum(x) / len(x) for k, x in r.items()} for v, r in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--model")
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", help="also write the table as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    args = parser.parse_args()
    import zoo
    from zoo.data.scenes import FashionScenesDataModule

    try:
        if args.out:
            check_output(args.out, "--out", args.overwrite)  # before any work, as every command's output
        model = zoo.load_checkpoint(args.checkpoint) if args.checkpoint else zoo.create_model(args.model, pretrained=True)
        if model.card.output != "caption" or model.hparams.get("attention") != "hard":
            raise UserError("this script analyses hard-attention captioners")
        data = (getattr(model, "_zoo_data_config", None) or {}).get("init_args") or {}
        dm = FashionScenesDataModule(**{**{k: v for k, v in data.items() if not k.startswith("_")},
                                        "batch_size": args.batch_size})
    except UserError as err:
        sys.exit(f"sat_reinforce_snr: error: {err}")
    dm.setup("fit")
    model.eval()  # no dropout: the draws differ in their samples only
    loader = iter(dm.train_dataloader())
    batches = [next(loader) for _ in range(args.batches)]
    table = analyse(model, batches, args.draws)
    print(f"{'variant':32s} {'signal':>10s} {'noise':>10s} {'SNR':>8s} {'cos(soft)':>10s}")
    for variant, r in table.items():
        print(f"{variant:32s} {r['signal']:10.4g} {r['noise']:10.4g} {r['snr']:8.3f} {r['cosine_with_soft']:10.3f}")
    if args.out:
        from zoo.weights import hub

        weights = hub.fetch(args.checkpoint) if args.checkpoint else hub.fetch_release(args.model)
        write_json(args.out, {"analysis": "sat_reinforce_snr", "source": args.checkpoint or args.model,
                              "weights_sha256": hub.sha256_file(weights),
                              "draws": args.draws, "batches": args.batches, "batch_size": args.batch_size,
                              "discount": DISCOUNT, "table": table})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
