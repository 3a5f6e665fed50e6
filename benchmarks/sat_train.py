"""Show-Attend-Tell training step: the captioner's fused teacher-forced pass against a
straightforward reference, on the same weights and the same batch.

    python benchmarks/sat_train.py [--threads 1] [--rounds 7] [--attention soft]

The reference is written the way the common public tutorial writes the decoder's training loop,
over our model's own modules: sort the batch by caption length, then one Python step per time
step that runs only the rows still decoding (`batch_size_t = sum(decode_lengths > t)`), computing
the attention keys' projection, the additive score (torch.tanh), the gate, the LSTM cell and the
deep output inside the step, and writing logits and alphas into preallocated tensors. It computes the same loss (checked to 1e-5
on the same batch, dropout off) as `Captioner.loss_terms`, which projects the annotations once,
computes the words' LSTM input term and the deep output for all steps outside the loop, fuses
every linear map of h_{t-1} into one matmul per step, runs the additive score's tanh as
2 sigmoid(2x) - 1 with a two-kernel backward, and skips finished rows from plain-int lengths
(`ours`); `ours_all_rows` runs every row at every step (static shapes, for a compiled step).

Sizes (the issue's): batch 64, 64 regions of 256-d annotation vectors (given, as the tutorial's
encoder output; neither side runs an encoder), decoder 512, embedding 512, attention 512,
vocabulary 60. Caption lengths are drawn from FashionScenes' training captions: a random batch
(lengths vary; the reference's row-skipping helps it most) and a length-bucketed one (as our
data module batches). A step is forward + backward + Adam. Timings alternate the two
implementations round by round in one process, and the ratio is of the medians. Writes
results/bench_sat_train.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo.data.vocab import PAD_ID  # noqa: E402
from zoo.models.captioner import Captioner  # noqa: E402
from zoo.results import write_json  # noqa: E402

V, L, D = 60, 64, 256


def reference_loss(model: Captioner, annotations: torch.Tensor, captions: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """The tutorial's loop (soft attention): only the rows still decoding run at each step."""
    lengths, order = lengths.sort(descending=True)
    annotations, captions = annotations[order], captions[order]
    B = captions.shape[0]
    decode_lengths = (lengths - 1).tolist()
    T = max(decode_lengths)
    net = model.net
    h, c = net.init_state(annotations)
    logits = annotations.new_zeros(B, T, V)
    alphas = annotations.new_zeros(B, T, annotations.shape[1])
    score = net.attend.score
    for t in range(T):
        bt = sum(n > t for n in decode_lengths)
        keys = annotations[:bt]
        att1 = score.key_proj(keys)  # the tutorial projects the encoder output again at every step
        att2 = score.query_proj(h[:bt])
        scores = score.out(torch.tanh(att1 + att2.unsqueeze(1))).squeeze(2)
        alpha = torch.softmax(scores, dim=-1)
        context = (keys * alpha.unsqueeze(2)).sum(dim=1)
        z = torch.sigmoid(net.f_beta(h[:bt])) * context
        emb = net.embed(captions[:bt, t])
        h, c = net.lstm(torch.cat([emb, z], dim=1), (h[:bt], c[:bt]))
        logits[:bt, t] = net.output(emb, h, z)
        alphas[:bt, t] = alpha
    targets = captions[:, 1:T + 1]
    mask = targets != PAD_ID
    nll = F.cross_entropy(logits[mask], targets[mask], reduction="sum") / B
    doubly = ((1.0 - alphas.sum(1)) ** 2).sum(1).mean()
    return nll + model.hparams.alpha_c * doubly


def ours_loss(model: Captioner, annotations: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
              active_rows: bool = True):
    """Captioner.loss_terms without its encoder (the annotations are given), on the batch sorted
    longest first with its lengths as plain ints, as FashionScenes' loader hands it over (the
    sort is timed here, as in the reference)."""
    lengths, order = lengths.sort(descending=True)
    annotations, captions = annotations[order], captions[order]
    model.net.encode = lambda images: (annotations, (8, 8))
    batch = {"images": annotations, "captions": captions}
    if active_rows:
        batch["host_lengths"] = lengths.tolist()
    return model.loss_terms(batch)["loss"]


def caption_batches(batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Lengths of FashionScenes training captions: a random batch and a bucketed one."""
    from zoo.data.scenes import FashionScenesDataModule

    dm = FashionScenesDataModule(num_train=2000, num_val=10, num_test=10, batch_size=batch_size, seed=seed)
    dm.setup("fit")
    lengths = dm.datasets["train"].lengths
    g = torch.Generator().manual_seed(seed)
    random_batch = lengths[torch.randperm(len(lengths), generator=g)[:batch_size]]
    bucketed = torch.as_tensor(next(iter(dm.train_dataloader()))["lengths"])
    return {"random": random_batch, "bucketed": bucketed}


def make_captions(lengths: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    captions = torch.zeros(len(lengths), int(lengths.max()), dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):  # benchmark setup, not timed
        captions[b, 0], captions[b, n - 1] = 1, 2
        captions[b, 1:n - 1] = torch.randint(4, V, (n - 2,), generator=g)
    return captions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/bench_sat_train.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vocab = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(V - 4)]
    results = {}
    for name, lengths in caption_batches(args.batch_size, args.seed).items():
        torch.manual_seed(args.seed)
        model = Captioner(vocab=vocab, attention="soft", backbone={"kind": "stem", "in_chans": 3, "channels": [D],
                                                                   "strides": [8]},
                          decoder=dict(embed_dim=512, hidden_dim=512, attention_dim=512, dropout=0.5),
                          image_size=[64, 64])
        annotations = torch.randn(len(lengths), L, D, generator=torch.Generator().manual_seed(args.seed)).relu()
        captions = make_captions(lengths, args.seed)
        model.eval()  # equal loss: dropout off
        with torch.no_grad():
            ref, ours, ours_all = (float(reference_loss(model, annotations, captions, lengths)),
                                   float(ours_loss(model, annotations, captions, lengths)),
                                   float(ours_loss(model, annotations, captions, lengths, active_rows=False)))
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        fns = {"reference": lambda: reference_loss(model, annotations, captions, lengths),
               "ours": lambda: ours_loss(model, annotations, captions, lengths),
               "ours_all_rows": lambda: ours_loss(model, annotations, captions, lengths, active_rows=False)}
        times = {k: [] for k in fns}
        for r in range(args.rounds + 1):  # round 0 warms up
            for k, fn in fns.items():
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                fn().backward()
                optimizer.step()
                if r:
                    times[k].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        results[name] = {"lengths": lengths.tolist(), "loss_reference": ref, "loss_ours": ours,
                         "loss_ours_all_rows": ours_all,
                         "equal_loss": max(abs(ref - ours), abs(ref - ours_all)) <= 1e-5 * max(1.0, abs(ref)),
                         "median_s": med, "all_s": times, "speedup": med["reference"] / med["ours"],
                         "speedup_all_rows": med["reference"] / med["ours_all_rows"],
                         "row_steps_reference": int((lengths - 1).sum()),
                         "row_steps_ours": int(len(lengths) * (lengths.max() - 1))}
        print(f"{name:9s} lengths {int(lengths.min())}-{int(lengths.max())}: reference {med['reference'] * 1e3:7.1f} ms, "
              f"ours {med['ours'] * 1e3:7.1f} ms, speedup {results[name]['speedup']:.2f}x "
              f"(all rows {med['ours_all_rows'] * 1e3:7.1f} ms, {results[name]['speedup_all_rows']:.2f}x); "
              f"loss {ref:.6f} vs {ours:.6f} (equal: {results[name]['equal_loss']})")
    path = write_json(args.out, {"benchmark": "sat_train", "sizes": {"batch": args.batch_size, "regions": L,
                                                                      "features": D, "decoder": 512, "embed": 512,
                                                                      "attention": 512, "vocab": V},
                                 "threads": args.threads, "rounds": args.rounds, "results": results,
                                 "note": "alternating rounds in one process; the machine may be shared"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
