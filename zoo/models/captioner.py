"""The Show, Attend and Tell captioner (Xu et al. 2015) as a zoo LightningModule: the network of
zoo.models.captioner_network (its child `net`, with the equations, built from the `decoder:` and
`hard:` blocks) plus its vocabulary, training objective, step hooks, evaluation, captioning and
figures. Every state_dict keeps the released names (`encoder....`, `embed.weight`): hooks drop and
restore the child's `net.` prefix.

Training loss per caption (zoo.models.caption_losses, wired up by `loss_terms`), averaged over the
batch: sum_t -log p(y_t) over real words + lambda * sum_i (1 - sum_t alpha_ti)^2 (eq. 14, the doubly
stochastic regulariser). Hard attention adds its estimator's term (zoo.attention.hard: REINFORCE
with the authors' rule, VIMCO, the exact marginal, Gumbel-softmax; docs/captioning.md); with
probability `semi_sampling_p` a minibatch uses the expected context instead (sec. 4.1), a
device-side coin blended with torch.where, not a branch. Supervised attention (Liu et al. 2017, off
by default) adds lambda_s * sum_t loss(alpha_t, box) over the words that name an item: `box`, the
cross-entropy to the box mask normalised to sum 1, or `mass`, -log(alpha_t's mass in the box).

`decoder.active_rows`: a batch sorted longest caption first with plain-int `host_lengths` runs only
the rows still decoding at each step (a compiled step gets no host lengths and runs every row).
Validation and test decode every image once with batched beam search and score the whole split in
one call (coco-caption metrics, plus attention localisation where boxes are known).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import torch

from zoo.attention.hard import HardBatch, HardSpec
from zoo.backbones.spec import BackboneSpec
from zoo.data.vocab import END_ID, PAD_ID, SPECIALS, START_ID, Vocab, pad_captions
from zoo.decoding import beam_search, greedy_decode
from zoo.guards.budget import check_dimensions, check_memory
from zoo.guards.errors import UserError
from zoo.hparams import Block
from zoo.models import caption_losses, optim
from zoo.models.base import ZooModule, evaluating
from zoo.models.captioner_network import COORDS, DecoderSpec, ShowAttendTellNetwork
from zoo.models.card import CompileHints, FamilyCard

DEFAULT_BACKBONE = {"kind": "stem", "in_chans": 3, "channels": [32, 64, 128], "strides": [2, 2, 2]}
CHOICES = {"attention": ("soft", "hard"), "supervised_attention_target": ("box", "mass")}
TINY = dict(vocab=[*SPECIALS, "a", "red", "blue", "shirt", "bag"], image_size=[32, 32], decode_max_len=6, beam_size=1,
            decoder=dict(embed_dim=16, hidden_dim=24, attention_dim=12, dropout=0.0),
            backbone={"kind": "stem", "in_chans": 3, "channels": [8, 16], "strides": [4, 2]})


@dataclass
class OptimizationSpec(Block):
    """The optimiser (the authors: Adam on Flickr8k, RMSProp on COCO), its schedule, and the
    encoder's own learning rate when it trains (`backbone_lr`; None: `lr`)."""

    optimizer: Literal["adam", "rmsprop"] = "adam"
    lr: float = 1e-3
    backbone_lr: float | None = None
    weight_decay: float = 0.0
    lr_schedule: str = "none"


class Captioner(ZooModule):
    """images [B, 3, H, W] in [0, 1] -> captions, with per-word attention maps and gates. `vocab`
    (the specials first) None: `setup()` takes the datamodule's and stores it in `hparams`."""

    card = FamilyCard(
        # RGB scenes and photographs (a grayscale image is repeated to three channels)
        "captioner", output="caption", channels=3, attention="soft", progress_bar=("loss",),
        vocab_keys=("embed.weight", "L_o.weight", "L_o.bias"),
        # one static graph per padded caption length, up to 8 (FashionScenes' `pad_to_multiple`)
        compile=CompileHints(max_shapes=8), bench_recipes=("sat_soft_scenes", "sat_hard_scenes"),
        filled_by_data={"vocab": [*SPECIALS, "a", "shirt"]},
        # sample paths per caption multiply the decoder's work; a temperature
        dimensions={"hidden_dim": 16_384, "attention_dim": 16_384, "samples": 256, "gumbel_temperature": 1_000},
        tiny={"": TINY, "hard_supervised": {**TINY, "attention": "hard", "supervised_attention": 1.0,
                                            "hard": {"reinforce_cost": "word", "baseline": "learned"}}},
        skip={"inductor": "auto never compiles it on CPU, where inductor takes minutes on its whole step: AOT "
                          "tracing checks it there, inductor on CUDA"})
    backbone_attribute = "encoder"

    def __init__(self, vocab: list[str] | None = None, attention: str = "soft", backbone: BackboneSpec | None = None,
                 image_size: list[int] = (64, 64), decoder: DecoderSpec | None = None, hard: HardSpec | None = None,
                 alpha_c: float = 1.0, supervised_attention: float = 0.0, supervised_attention_target: str = "box",
                 optimization: OptimizationSpec | None = None,
                 beam_size: int = 3, decode_max_len: int = 20, length_penalty: float = 1.0,
                 val_meteor: bool = False, num_figures: int = 4):
        super().__init__()
        # typed blocks from the CLI, or plain dicts from an old checkpoint or a Python caller
        spec = BackboneSpec.coerce(backbone, default=DEFAULT_BACKBONE)
        decoder = DecoderSpec.coerce(decoder, "captioner: decoder")
        hard = HardSpec.coerce(hard, "captioner: hard")
        optimization = self.optimization = OptimizationSpec.coerce(optimization, "captioner: optimization")
        self.save_hyperparameters()
        self.hparams.image_size = [int(s) for s in image_size]
        for name, block in (("decoder", decoder), ("hard", hard), ("optimization", optimization)):
            self.hparams[name] = block.to_dict()  # plain values
        for name, allowed in CHOICES.items():
            if self.hparams[name] not in allowed:
                raise UserError(f"captioner: {name} must be one of {', '.join(allowed)}, got '{self.hparams[name]}'")
        optim.check_schedule(optimization.lr_schedule, "captioner: optimization")
        if decoder.init_layers < 0:
            raise UserError(f"captioner: decoder.init_layers must be >= 0, got {decoder.init_layers}")
        if supervised_attention < 0:
            raise UserError(f"captioner: supervised_attention (its weight) must be >= 0, got {supervised_attention}")
        self._check_hard(attention, decoder, hard)

        from zoo.backbones import check_input

        encoder = spec.build()
        check_input(encoder, self.input_chans, self.hparams.image_size, "the captioner")
        self.backbone_spec = spec
        self.hparams.backbone = spec.to_dict()  # plain values; a zoo weight's architecture filled in
        self.net = ShowAttendTellNetwork(encoder, decoder, attention, hard)
        if vocab is not None:
            self._build_vocab_layers(vocab)
        # every state_dict names the network's tensors as releases and checkpoints do (no `net.`)
        self.register_state_dict_post_hook(_released_names)
        self.register_load_state_dict_pre_hook(_network_names)
        self._eval_store: dict[str, list] = {}

    @staticmethod
    def _check_hard(attention: str, decoder: DecoderSpec, hard: HardSpec) -> None:
        """One line, before anything is built, for a hard-attention setting that cannot run or mean
        what it says: the block's own bounds here, the estimator's in its `check`."""
        from zoo.attention.hard import build_estimator

        if int(hard.samples) != hard.samples or hard.samples < 1:
            raise UserError(f"captioner: hard.samples (sample paths per caption) must be a whole number >= 1, "
                            f"got {hard.samples}")
        if not hard.gumbel_temperature > 0:
            raise UserError(f"captioner: hard.gumbel_temperature must be > 0, got {hard.gumbel_temperature}")
        if attention != "hard" and (hard.estimator != HardSpec().estimator or hard.samples != 1):
            raise UserError("captioner: hard.estimator and hard.samples apply to attention: hard")
        try:
            estimator = build_estimator(hard)
            if attention == "hard":
                estimator.check(decoder)
        except ValueError as exc:
            raise UserError(f"captioner: {exc}") from None
        feeds_expected = attention == "hard" and estimator.train_mode == "marginal"
        if decoder.attention_query == "current" and decoder.feed_context and not feeds_expected:
            raise UserError("captioner: attention_query: current feeds the LSTM a context only for the exact marginal "
                            "(its expected context); with another estimator set decoder.feed_context: false")
        if attention == "hard" and hard.test_mode == "marginal" and not decoder.deep_output:
            raise UserError("captioner: the exact marginal sums the cell out at the deep output; it needs "
                            "decoder.deep_output: true")

    # ------------------------------------------------------------------ the network's faces
    @property
    def encoder(self):
        """The backbone (the trunk a `backbone:` block built: `backbone_attribute`)."""
        return self.net.encoder

    @property
    def embed(self):
        """E, None until the vocabulary is known."""
        return self.net.embed

    def forward(self, images: torch.Tensor, captions: torch.Tensor, mode: str | None = None) -> dict[str, torch.Tensor]:
        """Teacher forcing (ShowAttendTellNetwork.forward): images [B, 3, H, W], captions [B, T] ->
        logits [B, T-1, V], alpha [B, T-1, L], beta [B, T-1] (+ log_alpha, location for hard)."""
        return self.net(images, captions, mode)

    def decode_start(self, images: torch.Tensor) -> tuple:
        return self.net.decode_start(images)

    # the forward pass zoo.guards.budget measures (a whole caption's decoding: `decoding_memory`)
    memory_probe = decode_start

    # ------------------------------------------------------------------ vocabulary
    @staticmethod
    def _vocab(vocab: list[str]) -> list[str]:
        """The vocabulary, checked: a list of words, the specials first, no word twice, not empty."""
        if not isinstance(vocab, (list, tuple)) or not all(isinstance(w, str) for w in vocab):
            raise UserError("captioner: the vocabulary must be a list of words (strings)")
        try:  # the specials first, no word twice
            vocab = Vocab(vocab).itos
        except UserError as exc:
            raise UserError(f"captioner: {exc}") from None
        if len(vocab) <= len(SPECIALS):
            raise UserError("captioner: empty vocabulary (no words besides the special tokens)")
        return vocab

    def _build_vocab_layers(self, vocab: list[str]) -> None:
        vocab = self._vocab(vocab)
        self.hparams.vocab = self.itos = vocab
        self.net.build_word_layers(len(vocab))

    def example_batch(self, n: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
        """FashionScenes' batch form: images, captions of word ids 4 and 5, one item box per image
        (its top-left quarter) and per word the item it names (word 5 names item 0)."""
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
        if self.net.embed is None:
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
        """The training loss of a batch and its parts, as tensors (no logging, no host sync), plus
        `out` (the teacher-forced outputs) and step_mask [B, T-1]. mode, coin: as `net._draws`;
        draws: hard attention's (gumbel, use_expected), drawn beforehand (`train_inputs`)."""
        net, hp = self.net, self.hparams
        net._require_vocab()
        annotations, grid = net.encode(batch["images"])
        if draws is None:
            draws = net._draws(batch["captions"], annotations.shape[1], annotations, mode, coin)
        gumbel, use_expected = draws
        paths = gumbel.shape[0] // batch["captions"].shape[0] if gumbel is not None else 1
        if paths > 1:  # `hard.samples` sample paths per caption: its rows repeated, side by side
            annotations = annotations.repeat_interleave(paths, 0)
            batch = _repeat_rows(batch, paths)
        captions = batch["captions"]
        targets = captions[:, 1:]
        step_mask = (targets != PAD_ID).to(torch.float32)  # [B, T-1]: pads carry no loss
        supervised = hp.supervised_attention > 0
        marginal = hp.attention == "hard" and net.resolve_mode(mode) == "marginal"
        out = net.teacher_forced(annotations, captions, gumbel, use_expected, need_log_alpha=supervised,
                                 active=self._active_rows(batch, captions.shape[1] - 1), marginal=marginal)
        nll = caption_losses.caption_nll(out["logits"], targets, step_mask)  # [B, T1]
        n_words = step_mask.sum(1).clamp(min=1)
        caption_nll = nll.sum(1)  # [B], -log p(caption)
        doubly = caption_losses.doubly_stochastic(out["alpha"], step_mask)  # eq. (14)
        terms = {"nll": caption_nll.mean(), "nll_word": nll.sum() / step_mask.sum().clamp(min=1),
                 "doubly_stochastic": doubly, "out": out, "step_mask": step_mask}
        sampled = hp.attention == "hard" and gumbel is not None
        estimated = None
        if sampled or marginal:  # the estimator's term (zoo.attention.hard): REINFORCE, VIMCO, the entropy bonus
            learned = None
            if net.baseline_net is not None:
                def learned():  # b(h_{t-1}, E y_t): what is known before s_t is drawn -> [B, T1]
                    known = torch.cat([out["h_prev"], net.embed(targets)], dim=-1).detach()
                    return net.baseline_net(known).squeeze(-1)
            estimated = net.estimator.terms(HardBatch(
                out["log_alpha"], out.get("location") if sampled else None, nll, caption_nll, n_words, step_mask,
                use_expected, paths, sampled, net.baseline.value, learned))
            terms.update(estimated.logged)
        objective = terms["nll"] if estimated is None or estimated.objective is None else estimated.objective
        loss = objective + hp.alpha_c * doubly
        if supervised:
            terms["supervised_attention"] = self.supervised_attention_loss(
                out["log_alpha"], batch, grid, tuple(batch["images"].shape[-2:]), step_mask)
            loss = loss + hp.supervised_attention * terms["supervised_attention"]
        for name, term in (estimated.added if estimated is not None else {}).items():
            terms[name] = term
            loss = loss + term
        terms["loss"] = loss
        return terms

    def _active_rows(self, batch: dict, steps: int) -> list[int] | None:
        """Rows still decoding at each step, from the batch's plain-int lengths (with <start> and
        <end>) when it is sorted longest first; None (all rows) otherwise."""
        lengths = batch.get("host_lengths") if self.net.spec.active_rows else None
        if not lengths or any(a < b for a, b in zip(lengths, lengths[1:])):
            return None
        active, rows = [], len(lengths)
        for t in range(steps):  # step t predicts word t + 1: rows whose caption is longer than t + 1
            while rows and lengths[rows - 1] - 1 <= t:
                rows -= 1
            active.append(max(rows, 1))
        return active

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
        """The batch (with its plain-int lengths, a host-side hint) and hard attention's draws: the
        Gumbel noise of every step and the expected-context coin."""
        images = batch["images"]
        cells = self._cells(images) if self.hparams.attention == "hard" else 0
        gumbel, use_expected = self.net._draws(batch["captions"], cells, images, "sample", coin=True)
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
        """Pure: the training loss and its parts from `train_inputs`."""
        terms = self.loss_terms(batch, "sample", draws=(gumbel, use_expected))
        metrics = {key: terms[key].detach() for key in ("loss", "nll_word", "doubly_stochastic",
                                                        "supervised_attention", "reinforce") if key in terms}
        if "cost" in terms:  # what the moving-average baseline tracks: the minibatch's mean cost
            cost, mask = terms["cost"].detach(), terms["step_mask"]
            metrics["mean_cost"] = cost.mean() if cost.dim() == 1 else (cost * mask).sum() / mask.sum()
        return terms["loss"], metrics

    def log_step_metrics(self, stage: str, metrics: dict, batch_size: int) -> None:
        if stage == "train" and "mean_cost" in metrics:
            self.net.baseline.update(metrics.pop("mean_cost"))  # in place, after the step: no sync
            self.log("train/baseline", self.net.baseline.value)
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
        terms = self.loss_terms(batch, self.net.scoring_mode())
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
            # every rank scored the same gathered captions: sync_dist averages equal values
            self.log(f"{stage}/{name}", float(value), prog_bar=name in ("Bleu_4", "CIDEr", "localization"),
                     sync_dist=True)

    # ------------------------------------------------------------------ captions
    def decoding_memory(self, images: torch.Tensor, beam_size: int, max_len: int) -> dict[str, float]:
        """Bytes a `caption` of images [B, 3, H, W] would hold at once: per hypothesis its annotations,
        keys, LSTM state and score rows; per step its token, back-pointer, attention map and gate."""
        rows = images.shape[0] * max(1, int(beam_size))
        spec, cells = self.net.spec, self._cells(images)
        width = self.encoder.out_dim + (COORDS if spec.annotation_coords else 0)
        per_row = 4 * (cells * (width + spec.attention_dim) + 4 * spec.hidden_dim + 3 * len(self.itos))
        return {f"{rows:,} hypotheses (beam_size {beam_size} x {images.shape[0]} image(s))": float(rows) * per_row,
                f"their history over max_len {max_len}": float(rows) * max_len * (16 + 4 * (cells + 2))}

    @torch.no_grad()
    def caption(self, images: torch.Tensor, beam_size: int | None = None, max_len: int | None = None,
                length_penalty: float | None = None) -> list[dict[str, Any]]:
        """Caption images float [B, 3, H, W] in [0, 1] (`zoo.preprocessing(model)`); beam_size 1
        decodes greedily. One dict per image: `words`, `alpha` [n_words, h, w] (each word's map),
        `beta` [n_words] (the gate), `score` (summed log-probability), `finished` (False when cut
        at max_len) and for hard attention `locations` [n_words, 2] (the argmax (row, col) cell)."""
        self.net._require_vocab()
        self.check_images(images)
        beam_size = self.hparams.beam_size if beam_size is None else beam_size
        max_len = int(max_len or self.hparams.decode_max_len)
        check_dimensions({"beam_size": beam_size, "max_len": max_len}, "caption()")
        check_memory(self.decoding_memory(images, beam_size, max_len), "caption()")
        with evaluating(self):
            step_fn, state, static, grid = self.net.decoder(images)
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
        """Caption images [B, 3, H, W] and record each word's attention (hard: the expected alpha, as
        it decodes) and `word_probs`, each word's probability given the words before it."""
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
        """p(word_t | image, words_<t) of each decoded caption, teacher-forced as `scoring_mode` scores."""
        tokens = self.caption_tokens([r["words"] for r in results], images.device)
        with evaluating(self):
            logits = self(images, tokens, mode=self.net.scoring_mode())["logits"]  # [B, T-1, V]
        probs = logits.float().softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return [probs[b, :len(r["words"])].tolist() for b, r in enumerate(results)]

    def evidence(self, record, images: torch.Tensor, steps: torch.Tensor):
        """The probability of word `steps[s]` of caption `images[s]` given the words before it, as the
        image is edited (teacher-forced, `scoring_mode`)."""
        tokens = self.caption_tokens([record.prediction["words"][i] for i in images.tolist()], self.device)
        rows = torch.arange(len(images), device=self.device)
        steps, word = steps.to(self.device), tokens.gather(1, steps.to(self.device)[:, None] + 1)[:, 0]

        def score(x: torch.Tensor) -> torch.Tensor:
            logits = self(x.to(self.device), tokens, mode=self.net.scoring_mode())["logits"]  # [S, T-1, V]
            return logits.float().softmax(-1)[rows, steps, word]

        return score

    def caption_tokens(self, captions: list[list[str]], device) -> torch.Tensor:
        """Word lists -> token ids [B, T] as <start> words <end> <pad>.. (unknown words as <unk>)."""
        vocab = Vocab(self.itos)
        return pad_captions([vocab.encode_caption(words) for words in captions])[0].to(device)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        opt = self.optimization
        encoder_params = [p for p in self.encoder.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in encoder_params}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in encoder_ids]
        groups = [{"params": other}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": opt.backbone_lr or opt.lr})
        return optim.configure(self, groups, opt.optimizer, lr=opt.lr, weight_decay=opt.weight_decay,
                               schedule=opt.lr_schedule)


def _released_names(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook: the network's tensors without the child's `net.` prefix, order kept."""
    inner = prefix + "net."
    items = list(state_dict.items())
    state_dict.clear()
    state_dict.update(OrderedDict((prefix + key[len(inner):] if key.startswith(inner) else key, value)
                                  for key, value in items))


def _network_names(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
    """load_state_dict pre-hook: a release's or checkpoint's names read as the child's (`net.`)."""
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "net.")]:
        state_dict[prefix + "net." + key[len(prefix):]] = state_dict.pop(key)


def _repeat_rows(batch: dict, times: int) -> dict:
    """A training batch with every caption's row (tensors and plain-int lengths) repeated `times`
    times, side by side: the K sample paths of one caption."""
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
