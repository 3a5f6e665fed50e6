"""The Show, Attend and Tell captioner (Xu et al. 2015) as a zoo LightningModule: the network of
zoo.models.captioner_network (mixed in, with the equations) plus its hyperparameters, vocabulary,
training objective, step hooks (zoo.models.accel), evaluation, captioning and figures.

Training loss per caption (functions in zoo.models.caption_losses, wired up by `loss_terms`):
sum_t -log p(y_t) over real words + the doubly stochastic regulariser lambda * sum_i (1 - sum_t
alpha_ti)^2 (eq. 14), both averaged over the batch.
- Hard attention adds the REINFORCE surrogate of zoo.attention.hard. The authors' rule
  (`reinforce_cost: caption`, `baseline: moving_average`) charges every step's sample with the
  caption's per-word NLL against a moving average; `reinforce_cost: word` charges step t's sample
  with the NLL of word t and, discounted by `reinforce_discount`, of the later words it can affect;
  `baseline: learned` regresses that cost on the state before the sample (h_{t-1}, the target
  word), as Mnih et al. 2014 do for RAM. With probability `semi_sampling_p` a minibatch uses the
  expected context instead (sec. 4.1): a device-side coin blended with torch.where, not a branch.
- Other estimators (`hard_estimator`, issue 33; their equations are in zoo.attention.hard):
  - `vimco` (Mnih & Rezende 2016): K = `hard_samples` paths per caption; the loss is minus the bound
    log (1/K) sum_k p(caption | z_k), each path's log q(z_k) = sum_t log alpha_t(s_kt) scored with
    the leave-one-out signal. (`reinforce` with `baseline: leave_one_out` is the plainer version:
    each word's cost baselined by the mean cost of the caption's other paths.)
  - `marginal` (Deng et al. 2018): no samples; log p(y_t) = logsumexp_i [log alpha_ti + log p(y_t |
    a_i)], exact, with the LSTM fed the expected context (zoo.models.captioner_network); decode and
    score it with `hard_test_mode: marginal`, the same likelihood.
  - `straight_through` (Jang et al. 2017): the sample's one-hot forward, the Gumbel-softmax
    gradient at `gumbel_temperature` backward.
  The coin applies to every sampling estimator; the entropy bonus (`entropy_coef`) also to the marginal.
- Supervised attention (Liu et al. 2017), off by default: `supervised_attention` (lambda_s) adds
  lambda_s * sum_t loss(alpha_t, box) over the words that name an item (the data module says which
  item and where): `supervised_attention_target: box`, their strong supervision, is the
  cross-entropy to the box mask normalised to sum 1; `mass` is -log(alpha_t's mass in the box).

Speed: `loss_terms` is tensors only (no logging, no host sync), so a compiled step can wrap it.
`active_rows`: a batch sorted longest caption first with plain-int `host_lengths` (FashionScenes'
training batches) runs only the rows still decoding at each step; otherwise every row runs (static
shapes: a compiled step gets no host lengths, and `pad_to_multiple` keeps caption lengths few).

Validation and test decode every image ONCE, free-running, with batched beam search, and score the
whole split in one call (coco-caption metrics) plus attention localisation where boxes are known.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.attention.hard import (MovingAverageBaseline, leave_one_out_baseline, negative_entropy,
                                reinforce_surrogate, vimco_signal)
from zoo.backbones.spec import BackboneSpec
from zoo.data.vocab import END_ID, PAD_ID, SPECIALS, START_ID, Vocab, pad_captions
from zoo.decoding import beam_search, greedy_decode
from zoo.errors import UserError
from zoo.limits import check_dimensions, check_memory
from zoo.models import caption_losses, optim
from zoo.models.base import ZooModule, evaluating
from zoo.models.card import CompileHints, FamilyCard
from zoo.models.captioner_network import COORDS, ShowAttendTellNetwork

DEFAULT_BACKBONE = {"kind": "stem", "in_chans": 3, "channels": [32, 64, 128], "strides": [2, 2, 2]}
CHOICES = {"attention": ("soft", "hard"), "hard_test_mode": ("expected", "argmax", "marginal"),
           "hard_estimator": ("reinforce", "vimco", "marginal", "straight_through"),
           "attention_query": ("previous", "current"),
           "deep_output_activation": ("tanh", "none"), "reinforce_cost": ("caption", "word"),
           "baseline": ("moving_average", "learned", "leave_one_out"), "optimizer": ("adam", "rmsprop"),
           "supervised_attention_target": ("box", "mass"), "lr_schedule": optim.RECIPE_SCHEDULES}
TINY = dict(vocab=[*SPECIALS, "a", "red", "blue", "shirt", "bag"], embed_dim=16, hidden_dim=24, attention_dim=12,
            dropout=0.0, image_size=[32, 32], decode_max_len=6, beam_size=1,
            backbone={"kind": "stem", "in_chans": 3, "channels": [8, 16], "strides": [4, 2]})


class Captioner(ShowAttendTellNetwork, ZooModule):
    """images [B, 3, H, W] in [0, 1] -> captions, with per-word attention maps and gates.

    The vocabulary is `vocab` (a list of words starting with <pad>, <start>, <end>, <unk>); when it
    is None, `setup()` takes it from the datamodule (`trainer.datamodule.vocab`) and stores it in
    `hparams`, so every checkpoint rebuilds the model alone."""

    card = FamilyCard(
        # RGB scenes and photographs (a grayscale image is repeated to three channels)
        "captioner", output="caption", channels=3, attention="soft", progress_bar=("loss",),
        vocab_keys=("embed.weight", "L_o.weight", "L_o.bias"),
        # accel auto: on CUDA the compiled step; on CPU eager, whose packed active rows are what
        # benchmarks/sat_train.py measures. Caption lengths vary by batch: one static graph per padded
        # length, up to 8 (FashionScenes' `pad_to_multiple` keeps the count small); others run eagerly.
        compile=CompileHints(max_shapes=8), bench_recipes=("sat_soft_scenes", "sat_hard_scenes"),
        filled_by_data={"vocab": [*SPECIALS, "a", "shirt"]},
        # sample paths per caption multiply the decoder's work; a temperature
        dimensions={"hidden_dim": 16_384, "attention_dim": 16_384, "hard_samples": 256, "gumbel_temperature": 1_000},
        tiny={"": TINY, "hard_supervised": {**TINY, "attention": "hard", "reinforce_cost": "word", "baseline": "learned",
                                            "supervised_attention": 1.0}},
        skip={"inductor": "auto never compiles it on CPU, where inductor takes minutes on its whole step: AOT "
                          "tracing checks it there, inductor on CUDA"})
    backbone_attribute = "encoder"

    def __init__(self, vocab: list[str] | None = None, attention: str = "soft", score: str = "additive",
                 backbone: BackboneSpec | None = None, image_size: list[int] = (64, 64),
                 annotation_coords: bool = False,
                 embed_dim: int = 64, hidden_dim: int = 256, attention_dim: int = 128, init_layers: int = 1,
                 gate: bool = True, deep_output: bool = True, deep_output_activation: str = "tanh",
                 dropout: float = 0.5, alpha_c: float = 1.0,
                 semi_sampling_p: float = 0.5, entropy_coef: float = 0.002, reward_scale: float = 0.1,
                 baseline_decay: float = 0.9, reinforce_cost: str = "caption", reinforce_discount: float = 0.0,
                 baseline: str = "moving_average", hard_test_mode: str = "expected",
                 hard_estimator: str = "reinforce", hard_samples: int = 1, gumbel_temperature: float = 1.0,
                 feed_context: bool = True, attention_query: str = "previous",
                 supervised_attention: float = 0.0, supervised_attention_target: str = "box",
                 active_rows: bool = True, optimizer: str = "adam", lr: float = 1e-3, backbone_lr: float | None = None,
                 weight_decay: float = 0.0, lr_schedule: str = "none",
                 beam_size: int = 3, decode_max_len: int = 20, length_penalty: float = 1.0,
                 val_meteor: bool = False, num_figures: int = 4):
        super().__init__()
        # a typed spec from the CLI, or a plain dict from an old checkpoint or a Python caller
        spec = BackboneSpec.coerce(backbone, default=DEFAULT_BACKBONE)
        self.save_hyperparameters()
        self.hparams.image_size = [int(s) for s in image_size]
        for name, allowed in CHOICES.items():
            if self.hparams[name] not in allowed:
                raise UserError(f"captioner: {name} must be one of {', '.join(allowed)}, got '{self.hparams[name]}'")
        if init_layers < 0:
            raise UserError(f"captioner: init_layers must be >= 0, got {init_layers}")
        if supervised_attention < 0:
            raise UserError(f"captioner: supervised_attention (its weight) must be >= 0, got {supervised_attention}")
        # the estimator: one line, before anything is built, for a setting that cannot run or cannot
        # mean what it says (a million paths per caption, a temperature <= 0, VIMCO with one path)
        hp = self.hparams
        if int(hp.hard_samples) != hp.hard_samples or hp.hard_samples < 1:
            raise UserError(f"captioner: hard_samples (sample paths per caption) must be a whole number >= 1, "
                            f"got {hp.hard_samples}")
        if not hp.gumbel_temperature > 0:
            raise UserError(f"captioner: gumbel_temperature must be > 0, got {hp.gumbel_temperature}")
        if hp.attention != "hard" and (hp.hard_estimator != "reinforce" or hp.hard_samples != 1):
            raise UserError("captioner: hard_estimator and hard_samples apply to attention: hard")
        needs_paths = hp.hard_estimator == "vimco" or (hp.hard_estimator == "reinforce" and hp.baseline == "leave_one_out")
        if needs_paths and hp.hard_samples < 2:
            what = "vimco" if hp.hard_estimator == "vimco" else "baseline: leave_one_out"
            raise UserError(f"captioner: {what} needs hard_samples >= 2 (paths per caption), got {hp.hard_samples}")
        if hp.hard_estimator == "marginal" and hp.hard_samples != 1:
            raise UserError("captioner: the exact marginal draws no samples; hard_samples must be 1")
        marginal = hp.attention == "hard" and hp.hard_estimator == "marginal"
        if hp.attention_query == "current" and hp.feed_context and not marginal:
            raise UserError("captioner: attention_query: current feeds the LSTM a context only for the exact marginal "
                            "(its expected context); with another estimator set feed_context: false")
        if hp.attention == "hard" and "marginal" in (hp.hard_estimator, hp.hard_test_mode) and not hp.deep_output:
            raise UserError("captioner: the exact marginal sums the cell out at the deep output; it needs "
                            "deep_output: true")

        from zoo.backbones import check_input

        encoder = spec.build()
        check_input(encoder, self.input_chans, self.hparams.image_size, "the captioner")
        self.backbone_spec = spec
        self.hparams.backbone = spec.to_dict()  # plain values; a zoo weight's architecture filled in
        self._build_network(encoder)
        # hard attention's REINFORCE baselines (the authors' moving average, or a learned one: the
        # expected cost of step t from what is known before its sample, h_{t-1} and E y_t)
        self.baseline = MovingAverageBaseline(baseline_decay) if attention == "hard" else None
        self.baseline_net = (nn.Linear(hidden_dim + embed_dim, 1) if attention == "hard" and baseline == "learned"
                             else None)
        if vocab is not None:
            self._build_vocab_layers(vocab)
        self._eval_store: dict[str, list] = {}

    # ------------------------------------------------------------------ vocabulary
    def _build_vocab_layers(self, vocab: list[str]) -> None:
        if not isinstance(vocab, (list, tuple)) or not all(isinstance(w, str) for w in vocab):
            raise UserError("captioner: the vocabulary must be a list of words (strings)")
        try:  # the specials first, no word twice
            vocab = Vocab(vocab).itos
        except UserError as exc:
            raise UserError(f"captioner: {exc}") from None
        if len(vocab) <= len(SPECIALS):
            raise UserError("captioner: empty vocabulary (no words besides the special tokens)")
        self.hparams.vocab = vocab
        self.itos = vocab
        self._build_word_layers(len(vocab))

    def example_batch(self, n: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
        """FashionScenes' batch form: images, captions (word ids 4 and 5 of the vocabulary, which
        needs six entries), one item box per image (its top-left quarter) and, per word, the item it
        names (word 5 names item 0)."""
        images, _ = self.example_images(n, seed)
        H, W = self.input_size
        rows = [[START_ID, 4, 5, END_ID], [START_ID, 5, END_ID, PAD_ID]]
        captions = torch.tensor([rows[i % 2] for i in range(n)])
        boxes = torch.tensor([[[0.0, 0.0, W / 2, H / 2]]] * n)
        return {"images": images, "captions": captions, "item_boxes": boxes,
                "word_items": torch.where(captions == 5, 0, -1)}

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        data_vocab = getattr(datamodule, "vocab", None)
        if self.embed is None:
            if data_vocab is None:
                raise UserError("captioner: no vocabulary; give model.vocab or a datamodule with .vocab")
            self._build_vocab_layers(list(data_vocab.itos))
        elif data_vocab is not None and list(data_vocab.itos) != list(self.hparams.vocab):
            raise UserError("captioner: the datamodule's vocabulary differs from the model's "
                            f"({len(data_vocab.itos)} vs {len(self.hparams.vocab)} entries)")
        if (self.hparams.supervised_attention > 0 and datamodule is not None
                and not getattr(datamodule, "provides_word_boxes", False)):
            raise UserError(f"captioner: supervised_attention needs the box of the item each word names; "
                            f"{type(datamodule).__name__} has no boxes (use FashionScenes, or set "
                            "supervised_attention: 0)")

    # ------------------------------------------------------------------ training
    def loss_terms(self, batch: dict, mode: str | None = None, coin: bool = False,
                   draws: tuple | None = None) -> dict[str, torch.Tensor]:
        """The training loss of a batch and its parts, as tensors: no logging, no host sync.

        mode (hard attention): "sample" draws the samples (and with coin=True the 50% expected-
        context coin, the training rule), "expected" uses the expected context; default: sample
        when training. Returns loss, nll (per caption), nll_word, doubly_stochastic,
        supervised_attention, and for hard attention reinforce, cost [B] or [B, T-1],
        baseline_loss; plus `out` (the teacher-forced outputs) and step_mask [B, T-1].
        draws: hard attention's (gumbel, use_expected), drawn beforehand (`train_inputs`)."""
        self._require_vocab()
        hp = self.hparams
        annotations, grid = self.encode(batch["images"])
        if draws is None:
            draws = self._draws(batch["captions"], annotations.shape[1], annotations, mode, coin)
        gumbel, use_expected = draws
        paths = gumbel.shape[0] // batch["captions"].shape[0] if gumbel is not None else 1
        if paths > 1:  # `hard_samples` sample paths per caption: its rows repeated, side by side
            annotations = annotations.repeat_interleave(paths, 0)
            batch = _repeat_rows(batch, paths)
        captions = batch["captions"]
        targets = captions[:, 1:]
        step_mask = (targets != PAD_ID).to(torch.float32)  # [B, T-1]: pads carry no loss
        supervised = hp.supervised_attention > 0
        marginal = hp.attention == "hard" and self.resolve_mode(mode) == "marginal"
        out = self.teacher_forced(annotations, captions, gumbel, use_expected, need_log_alpha=supervised,
                                  active=self._active_rows(batch, captions.shape[1] - 1), marginal=marginal)
        nll = caption_losses.caption_nll(out["logits"], targets, step_mask)  # [B, T1]
        n_words = step_mask.sum(1).clamp(min=1)
        caption_nll = nll.sum(1)  # [B], -log p(caption)
        doubly = caption_losses.doubly_stochastic(out["alpha"], step_mask)  # eq. (14)
        terms = {"nll": caption_nll.mean(), "nll_word": nll.sum() / step_mask.sum().clamp(min=1),
                 "doubly_stochastic": doubly, "out": out, "step_mask": step_mask}
        sampled = hp.attention == "hard" and gumbel is not None
        if sampled and hp.hard_estimator == "vimco":
            # the K-sample bound replaces the mean NLL: its gradient weighs path k's by w_k
            bound, signal = vimco_signal(-caption_nll.view(-1, paths))
            terms["vimco_bound"] = bound.mean()
            loss = -terms["vimco_bound"] + hp.alpha_c * doubly
        else:
            loss = terms["nll"] + hp.alpha_c * doubly
        if supervised:
            terms["supervised_attention"] = self.supervised_attention_loss(
                out["log_alpha"], batch, grid, tuple(batch["images"].shape[-2:]), step_mask)
            loss = loss + hp.supervised_attention * terms["supervised_attention"]
        if sampled and hp.hard_estimator == "reinforce":
            terms["reinforce"], extra = self._reinforce(out, nll, caption_nll / n_words, step_mask, targets,
                                                        use_expected, paths)
            terms.update(extra)
            loss = loss + terms["reinforce"] + extra.get("baseline_loss", 0.0)
        elif sampled and hp.hard_estimator == "vimco":
            terms["reinforce"] = self._vimco(out, signal, step_mask, use_expected)
            loss = loss + terms["reinforce"]
        elif hp.attention == "hard" and (sampled or marginal) and hp.entropy_coef:
            # straight-through and the exact marginal: no score-function term; the entropy bonus only
            terms["entropy_bonus"] = hp.entropy_coef * negative_entropy(out["log_alpha"], step_mask) / captions.shape[0]
            loss = loss + terms["entropy_bonus"]
        terms["loss"] = loss
        return terms

    def _active_rows(self, batch: dict, steps: int) -> list[int] | None:
        """Rows still decoding at each step, from the batch's plain-int lengths (with <start> and
        <end>) when it is sorted longest first; None (all rows) otherwise."""
        lengths = batch.get("host_lengths") if self.hparams.active_rows else None
        if not lengths or any(a < b for a, b in zip(lengths, lengths[1:])):
            return None
        active, rows = [], len(lengths)
        for t in range(steps):  # step t predicts word t + 1: rows whose caption is longer than t + 1
            while rows and lengths[rows - 1] - 1 <= t:
                rows -= 1
            active.append(max(rows, 1))
        return active

    def _reinforce(self, out: dict, nll: torch.Tensor, per_word_nll: torch.Tensor, step_mask: torch.Tensor,
                   targets: torch.Tensor, use_expected: torch.Tensor, paths: int = 1) -> tuple[torch.Tensor, dict]:
        """The hard-attention surrogate (zoo.attention.hard) for this minibatch: REINFORCE on the
        sampled minibatches only (a multiplier, not a branch), the entropy bonus on all. `paths`
        sample paths per caption (rows side by side) for the leave-one-out baseline."""
        hp = self.hparams
        extra: dict[str, torch.Tensor] = {}
        if hp.reinforce_cost == "caption":  # the authors: every step pays the caption's per-word NLL
            cost = per_word_nll.detach()  # [B]
        else:  # step t pays for word t and, discounted, the later words its sample can change
            cost = caption_losses.discounted_cost(nll.detach(), hp.reinforce_discount)  # [B, T1]
        if self.baseline_net is not None:
            known = torch.cat([out["h_prev"], self.embed(targets)], dim=-1).detach()  # before s_t is drawn
            predicted = self.baseline_net(known).squeeze(-1)  # [B, T1]
            if cost.dim() == 1:
                predicted = (predicted * step_mask).sum(1) / step_mask.sum(1).clamp(min=1)  # one per caption
                extra["baseline_loss"] = ((predicted - cost) ** 2).mean()
            else:
                extra["baseline_loss"] = (((predicted - cost) ** 2) * step_mask).sum() / step_mask.sum().clamp(min=1)
            baseline = predicted.detach()
        elif hp.baseline == "leave_one_out":  # the mean cost of the caption's other paths
            baseline = leave_one_out_baseline(cost.view(-1, paths, *cost.shape[1:])).view(cost.shape)
        else:
            baseline = self.baseline.value
        extra["cost"] = cost
        scale = hp.reward_scale * (~use_expected).to(cost.dtype)  # no REINFORCE on expected minibatches
        return reinforce_surrogate(out["log_alpha"], out["location"], cost, baseline, step_mask,
                                   reward_scale=scale, entropy_coef=hp.entropy_coef), extra

    def _vimco(self, out: dict, signal: torch.Tensor, step_mask: torch.Tensor,
               use_expected: torch.Tensor) -> torch.Tensor:
        """VIMCO's score-function term (Mnih & Rezende 2016): minus sum_k signal_k log q(z_k) per
        caption, log q(z_k) = sum_t log alpha_t(s_kt) over the real steps of path k, averaged over
        the captions, times `reward_scale`; and the entropy bonus. Off on expected minibatches
        (a multiplier, not a branch)."""
        hp = self.hparams
        log_q = (out["log_alpha"].gather(-1, out["location"].unsqueeze(-1)).squeeze(-1) * step_mask).sum(1)  # [B*K]
        scale = hp.reward_scale * (~use_expected).to(log_q.dtype)
        score = -(signal.reshape(-1) * log_q).sum() / signal.shape[0]
        return scale * score + hp.entropy_coef * negative_entropy(out["log_alpha"], step_mask) / log_q.shape[0]

    def supervised_attention_loss(self, log_alpha: torch.Tensor, batch: dict, grid: tuple[int, int],
                                  image_size: tuple[int, int], step_mask: torch.Tensor) -> torch.Tensor:
        """Liu et al. 2017 (zoo.models.caption_losses.supervised_attention) on this batch's items:
        batch["word_items"] [B, T], batch["item_boxes"] [B, K, 4] in pixels of `image_size`."""
        from zoo.metrics.localization import cell_masks

        if batch.get("word_items") is None or batch.get("item_boxes") is None:
            raise UserError("captioner: supervised_attention needs batches with word_items and item_boxes")
        masks = cell_masks(batch["item_boxes"].to(log_alpha.dtype), grid, image_size)  # [B, K, L]
        return caption_losses.supervised_attention(log_alpha, masks, batch["word_items"], step_mask,
                                           self.hparams.supervised_attention_target)

    # ------------------------------------------------------------------ steps (zoo.models.accel)
    def train_inputs(self, batch: dict) -> dict:
        """The batch's tensors and hard attention's draws (Gumbel noise of every step, the
        expected-context coin), drawn here so that every acceleration mode sees the same stream;
        and the plain-int lengths that let an eager step pack its active rows (a host-side hint:
        a compiled step gets None and runs every row)."""
        images = batch["images"]
        cells = self._cells(images) if self.hparams.attention == "hard" else 0
        gumbel, use_expected = self._draws(batch["captions"], cells, images, "sample", coin=True)
        return {**self.eval_inputs(batch, "train"), "gumbel": gumbel, "use_expected": use_expected}

    def _cells(self, images: torch.Tensor) -> int:
        """L, the annotation vectors of an image of this size (one encoder pass, then cached)."""
        key = tuple(images.shape[-2:])
        cells = self.__dict__.setdefault("_cells_by_size", {})
        if key not in cells:
            with torch.no_grad():
                grid = self.encoder(images[:1])[1]
            cells[key] = int(grid[0]) * int(grid[1])
        return cells[key]

    def train_loss(self, gumbel, use_expected, **batch):
        """Pure: the training loss and its parts (no logging, no host sync, no draws). batch: images,
        captions, word_items, item_boxes (None where words name no items), host_lengths."""
        terms = self.loss_terms(batch, "sample", draws=(gumbel, use_expected))
        metrics = {key: terms[key].detach() for key in ("loss", "nll_word", "doubly_stochastic",
                                                        "supervised_attention", "reinforce") if key in terms}
        if "cost" in terms:  # what the moving-average baseline tracks: the minibatch's mean cost
            cost, mask = terms["cost"].detach(), terms["step_mask"]
            metrics["mean_cost"] = cost.mean() if cost.dim() == 1 else (cost * mask).sum() / mask.sum()
        return terms["loss"], metrics

    def log_step_metrics(self, stage: str, metrics: dict, batch_size: int) -> None:
        if stage == "train" and "mean_cost" in metrics:
            self.baseline.update(metrics.pop("mean_cost"))  # in place, after the step: no sync
            self.log("train/baseline", self.baseline.value)
        super().log_step_metrics(stage, metrics, batch_size)

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._eval_store = {}

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def eval_inputs(self, batch: dict, stage: str) -> dict:
        return {key: batch.get(key) for key in ("images", "captions", "word_items", "item_boxes", "host_lengths")}

    def eval_metrics(self, stage, **batch):
        """The teacher-forced NLL of one reference, for model selection by loss (the decoded
        captions are scored per split, `_score_split`)."""
        terms = self.loss_terms(batch, self.scoring_mode())
        return {"loss": terms["nll"], "nll_word": terms["nll_word"]}

    def _eval_step(self, batch: dict, stage: str) -> None:
        images = batch["images"]
        if "captions" in batch:
            self.log_step_metrics(stage, self.accel.eval_step(self, batch, stage), images.shape[0])
        results = self.caption(images, beam_size=self.hparams.beam_size, max_len=self.hparams.decode_max_len)
        store = self._eval_store
        ids = [str(i) for i in batch["image_ids"]]
        store.setdefault("ids", []).extend(ids)
        store.setdefault("predictions", []).extend(" ".join(r["words"]) for r in results)
        store.setdefault("references", []).extend(list(refs) for refs in batch["references"])
        if "boxes" in batch and "box_words" in batch:
            store.setdefault("words", []).extend(r["words"] for r in results)
            store.setdefault("alphas", []).extend(r["alpha"].cpu() for r in results)
            store.setdefault("grids", []).extend(tuple(r["alpha"].shape[1:]) for r in results)
            store.setdefault("boxes", []).extend(torch.as_tensor(b).cpu() for b in batch["boxes"])
            store.setdefault("box_words", []).extend(list(w) for w in batch["box_words"])
            store.setdefault("image_sizes", []).extend([tuple(images.shape[-2:])] * images.shape[0])

    def on_validation_epoch_end(self) -> None:
        self._score_split("val")

    def on_test_epoch_end(self) -> None:
        self._score_split("test")

    def _score_split(self, stage: str) -> None:
        store = _gather(self._eval_store)
        self._eval_store = {}
        if not store.get("ids") or (self._trainer is not None and self.trainer.sanity_checking):
            return
        from zoo.metrics import localization_stats, score_captions

        predictions = dict(zip(store["ids"], store["predictions"]))
        references = dict(zip(store["ids"], store["references"]))
        scores = score_captions(predictions, references, meteor=stage == "test" or self.hparams.val_meteor)
        metrics = {k: v for k, v in scores.items() if isinstance(v, float)}
        if store.get("boxes"):
            stats = localization_stats(store["alphas"], store["grids"], store["boxes"], store["box_words"],
                                       store["words"], store["image_sizes"][0])
            # box_area is the chance level of the first two; localization_previous_word a diagnostic
            metrics.update({key: stats[key] for key in ("localization", "attention_mass_in_box", "box_area",
                                                        "localization_previous_word")})
        self.last_eval = {"stage": stage, "metrics": metrics, "predictions": predictions,
                          "notes": scores.get("notes", {})}
        for name, value in metrics.items():
            # every rank scored the same gathered captions: averaging equal values keeps them, and
            # says so to Lightning (which otherwise advises sync_dist once per metric under DDP)
            self.log(f"{stage}/{name}", float(value), prog_bar=name in ("Bleu_4", "CIDEr", "localization"),
                     sync_dist=True)

    # ------------------------------------------------------------------ captions
    def _check_images(self, images: torch.Tensor) -> None:
        """One line for images the model would caption as nonsense: wrong rank, channels, dtype or
        range (a uint8 tensor of pixels, an image normalised twice)."""
        channels = (self.hparams.backbone or {}).get("in_chans", 3)
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != channels:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise UserError(f"caption() wants images [B, {channels}, H, W], got {shape}")
        expected = tuple(self.hparams.image_size)
        if tuple(images.shape[-2:]) != expected:  # the size rule: tensors must already match (README)
            raise UserError(f"caption() wants images of the model's size {expected[0]}x{expected[1]}, got "
                            f"{images.shape[-2]}x{images.shape[-1]} (prepare files with zoo.preprocessing(model))")
        if not images.is_floating_point():
            raise UserError(f"caption() wants float images in [0, 1], got {images.dtype} "
                            "(uint8 pixels: divide by 255, or prepare them with zoo.preprocessing(model))")
        low, high = (float(v) for v in images.aminmax())
        if low < -1e-3 or high > 1 + 1e-3:
            raise UserError(f"caption() wants images in [0, 1], got values from {low:.3g} to {high:.3g} "
                            "(the model normalises them itself: do not normalise beforehand)")

    # what zoo.limits runs on the meta device to measure a forward pass: the encoder and the
    # decoder's start (a whole caption's decoding is `decoding_memory`'s)
    memory_probe = ShowAttendTellNetwork.decode_start

    def decoding_memory(self, images: torch.Tensor, beam_size: int, max_len: int) -> dict[str, float]:
        """Bytes a `caption` of images [B, 3, H, W] would hold at once (zoo.limits.check_memory):
        per hypothesis (B x k rows) its copy of the annotation vectors [L, D] and their keys [L, P],
        the LSTM state and three vocabulary-wide score rows; per step of max_len, each row's token,
        back-pointer, attention map [L] and gate."""
        rows = images.shape[0] * max(1, int(beam_size))
        hp, cells = self.hparams, self._cells(images)
        width = self.encoder.out_dim + (COORDS if hp.annotation_coords else 0)
        per_row = 4 * (cells * (width + hp.attention_dim) + 4 * hp.hidden_dim + 3 * len(self.itos))
        return {f"{rows:,} hypotheses (beam_size {beam_size} x {images.shape[0]} image(s))": float(rows) * per_row,
                f"their history over max_len {max_len}": float(rows) * max_len * (16 + 4 * (cells + 2))}

    @torch.no_grad()
    def caption(self, images: torch.Tensor, beam_size: int | None = None, max_len: int | None = None,
                length_penalty: float | None = None) -> list[dict[str, Any]]:
        """Caption B images at once. images float [B, 3, H, W] in [0, 1], prepared as
        `zoo.preprocessing(model)` does (the model normalises them itself). beam_size: default the
        recipe's (`hparams.beam_size`); 1 decodes greedily.

        Returns one dict per image: `words` (list[str]), `alpha` (float [n_words, h, w], the
        attention map each word was emitted with), `beta` (float [n_words], the gate), `score`
        (summed log-probability), `finished` (False when cut at max_len) and, for hard attention,
        `locations` (int64 [n_words, 2], the (row, col) grid cell chosen: the argmax location,
        which is the sample's mode when decoding with the expected context)."""
        self._require_vocab()
        self._check_images(images)
        beam_size = self.hparams.beam_size if beam_size is None else beam_size
        max_len = int(max_len or self.hparams.decode_max_len)
        check_dimensions({"beam_size": beam_size, "max_len": max_len}, "caption()")
        check_memory(self.decoding_memory(images, beam_size, max_len), "caption()")
        with evaluating(self):
            step_fn, state, static, grid = self.decoder(images)
            if beam_size <= 1:
                decoded = greedy_decode(step_fn, state, static, images.shape[0], START_ID, END_ID, max_len)
            else:
                lp = self.hparams.length_penalty if length_penalty is None else length_penalty
                decoded = beam_search(step_fn, state, static, images.shape[0], int(beam_size), START_ID, END_ID,
                                      max_len, length_penalty=lp)
        h, w = grid
        results = []
        for r in decoded:
            n = len(r.tokens)
            item = {"words": [self.itos[i] for i in r.tokens], "alpha": r.extras["alpha"].view(n, h, w).cpu(),
                    "beta": r.extras["beta"].cpu(), "score": r.score, "finished": r.finished}
            if "location" in r.extras:
                loc = r.extras["location"].cpu()
                item["locations"] = torch.stack([loc // w, loc % w], dim=-1)
            results.append(item)
        return results

    @torch.no_grad()
    def attention_record(self, images: torch.Tensor, beam_size: int | None = None):
        """Caption images [B, 3, H, W] and record, per word, the attention it was emitted with (the
        expected alpha for hard attention, as it decodes), each cell's mass spread over its pixels.
        `word_probs` are each word's probability given the words before it (teacher-forced on the
        decoded caption)."""
        from zoo.attention import record

        results = self.caption(images, beam_size=beam_size)
        B, T = len(results), max(1, max(len(r["words"]) for r in results))
        h, w = results[0]["alpha"].shape[-2:]
        cells = images.new_zeros(B, T, h, w)
        mask = torch.zeros(B, T, dtype=torch.bool, device=images.device)
        for b, r in enumerate(results):  # B short lists: padding only
            n = len(r["words"])
            cells[b, :n] = r["alpha"].to(cells)
            mask[b, :n] = True
        labels = [r["words"] + [""] * (T - len(r["words"])) for r in results]
        return record.AttentionRecord(
            family=self.family, kind=self.hparams.attention, labels=labels, step_mask=mask,
            maps=record.maps_from_cells(cells, tuple(images.shape[-2:])),
            prediction={"words": [r["words"] for r in results], "word_probs": self.word_probs(images, results),
                        "finished": [bool(r["finished"]) for r in results]})

    @torch.no_grad()
    def word_probs(self, images: torch.Tensor, results: list[dict]) -> list[list[float]]:
        """p(word_t | image, words_<t) for each decoded caption (for hard attention the expected
        context or the exact marginal, as decoding uses: `scoring_mode`), by one teacher-forced pass."""
        tokens = self.caption_tokens([r["words"] for r in results], images.device)
        with evaluating(self):
            logits = self(images, tokens, mode=self.scoring_mode())["logits"]  # [B, T-1, V]
        probs = logits.float().softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return [probs[b, :len(r["words"])].tolist() for b, r in enumerate(results)]

    def evidence(self, record, images: torch.Tensor, steps: torch.Tensor):
        """A word's probability given the words before it (teacher-forced, as decoding scores it:
        `scoring_mode`): the probability of word `steps[s]` of caption `images[s]` as the image is edited."""
        tokens = self.caption_tokens([record.prediction["words"][i] for i in images.tolist()], self.device)
        rows = torch.arange(len(images), device=self.device)
        steps, word = steps.to(self.device), tokens.gather(1, steps.to(self.device)[:, None] + 1)[:, 0]

        def score(x: torch.Tensor) -> torch.Tensor:
            logits = self(x.to(self.device), tokens, mode=self.scoring_mode())["logits"]  # [S, T-1, V]
            return logits.float().softmax(-1)[rows, steps, word]

        return score

    def caption_tokens(self, captions: list[list[str]], device) -> torch.Tensor:
        """Word lists -> token ids [B, T] as <start> words <end> <pad>.. (unknown words as <unk>)."""
        vocab = Vocab(self.itos)
        return pad_captions([vocab.encode_caption(words) for words in captions])[0].to(device)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.hparams
        encoder_params = [p for p in self.encoder.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in encoder_params}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in encoder_ids]
        groups = [{"params": other}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": hp.backbone_lr or hp.lr})
        return optim.configure(self, groups, hp.optimizer, lr=hp.lr, weight_decay=hp.weight_decay,
                               schedule=hp.lr_schedule)


def _repeat_rows(batch: dict, times: int) -> dict:
    """A training batch with every caption's row repeated `times` times, side by side (the K sample
    paths of one caption): its tensors, and the plain-int lengths that stay sorted longest first."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            value = value.repeat_interleave(times, 0)
        elif key == "host_lengths" and value:
            value = [length for length in value for _ in range(times)]
        out[key] = value
    return out


def _gather(store: dict[str, list]) -> dict[str, list]:
    """Concatenate the per-rank evaluation lists under DDP (every rank then scores the same split)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return store
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, store)
    merged: dict[str, list] = {}
    seen: set = set()
    for part in gathered:
        for j, image_id in enumerate(part.get("ids", [])):
            if image_id in seen:  # DistributedSampler pads with repeats
                continue
            seen.add(image_id)
            for key, values in part.items():
                merged.setdefault(key, []).append(values[j])
    return merged
