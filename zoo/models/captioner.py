"""Show, Attend and Tell (Xu et al. 2015): an LSTM captioner that attends over annotation vectors,
with soft (sec. 4.2) or hard (sec. 4.1) attention.

Per step t, with annotations a [B, L, D] from the encoder (any zoo.backbones backbone):
    e_t, alpha_t = f_att(a, h_{t-1}), softmax(e_t)        eq. (4)-(5)
    z^_t         = sum_i alpha_ti a_i (soft) | a_{s_t}, s_t ~ Cat(alpha_t) (hard)   eq. (13) / (8)-(9)
    beta_t       = sigmoid(f_beta(h_{t-1}))               sec. 4.2.1: ONE scalar per step
    z_t          = beta_t * z^_t
    h_t, c_t     = LSTM([E y_{t-1}, z_t], (h_{t-1}, c_{t-1}))   eq. (1)-(3)
    p(y_t)       ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))      eq. (7), the deep output
with h_0, c_0 = f_init,h / f_init,c(mean_i a_i) (MLPs with tanh), or zeros when `init_layers: 0`
(an ablation, not the paper: the image then reaches the decoder only through attention).

Training loss per caption: sum_t -log p(y_t) over real words (pads masked) + the doubly stochastic
regularisation lambda * sum_i (1 - sum_t alpha_ti)^2 (eq. 14), both averaged over the batch. Hard
attention adds the REINFORCE surrogate of zoo.attention.hard (authors' learning rule).

Validation and test decode every image ONCE, free-running, with batched beam search, and score the
whole split in one call (coco-caption metrics) plus attention localisation where boxes are known.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.hard import HardAttention, MovingAverageBaseline, reinforce_surrogate
from zoo.attention.scores import build_score
from zoo.attention.soft import SoftAttention
from zoo.backbones.spec import BackboneSpec
from zoo.decoding import beam_search, greedy_decode
from zoo.errors import UserError
from zoo.models.base import ZooModule

PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
SPECIALS = ["<pad>", "<start>", "<end>", "<unk>"]
DEFAULT_BACKBONE = {"kind": "stem", "in_chans": 3, "channels": [32, 64, 128], "strides": [2, 2, 2]}


def _mlp(in_dim: int, out_dim: int, layers: int) -> nn.Sequential:
    """`layers` Linear+tanh layers (the authors' f_init uses tanh)."""
    modules: list[nn.Module] = []
    for i in range(layers):
        modules += [nn.Linear(in_dim if i == 0 else out_dim, out_dim), nn.Tanh()]
    return nn.Sequential(*modules)


class Captioner(ZooModule):
    """images [B, 3, H, W] in [0, 1] -> captions, with per-word attention maps and gates.

    The vocabulary is `vocab` (a list of words starting with <pad>, <start>, <end>, <unk>); when it
    is None, `setup()` takes it from the datamodule (`trainer.datamodule.vocab`) and stores it in
    `hparams`, so every checkpoint rebuilds the model alone."""

    family = "captioner"

    def __init__(self, vocab: list[str] | None = None, attention: str = "soft", score: str = "additive",
                 backbone: BackboneSpec | None = None, image_size: list[int] = (64, 64),
                 embed_dim: int = 64, hidden_dim: int = 256, attention_dim: int = 128, init_layers: int = 1,
                 gate: bool = True, deep_output: bool = True, deep_output_activation: str = "tanh",
                 dropout: float = 0.5, alpha_c: float = 1.0,
                 semi_sampling_p: float = 0.5, entropy_coef: float = 0.002, reward_scale: float = 0.1,
                 baseline_decay: float = 0.9, hard_test_mode: str = "expected",
                 optimizer: str = "adam", lr: float = 1e-3, backbone_lr: float | None = None,
                 weight_decay: float = 0.0, lr_schedule: str = "none",
                 beam_size: int = 3, decode_max_len: int = 20, length_penalty: float = 1.0,
                 val_meteor: bool = False, num_figures: int = 4):
        super().__init__()
        # a typed spec from the CLI, or a plain dict from an old checkpoint or a Python caller
        spec = BackboneSpec.coerce(backbone, default=DEFAULT_BACKBONE)
        self.save_hyperparameters()
        self.hparams.image_size = [int(s) for s in image_size]
        if attention not in ("soft", "hard"):
            raise UserError(f"captioner: attention must be 'soft' or 'hard', got '{attention}'")
        if hard_test_mode not in ("expected", "argmax"):
            raise UserError(f"captioner: hard_test_mode must be 'expected' or 'argmax', got '{hard_test_mode}'")
        if deep_output_activation not in ("tanh", "none"):
            raise UserError("captioner: deep_output_activation must be 'tanh' or 'none'")

        from zoo.backbones import check_input

        self.encoder = spec.build(option="--model.init_args.backbone.")
        check_input(self.encoder, 3, self.hparams.image_size, "the captioner")
        self.backbone_spec = spec
        self.hparams.backbone = spec.to_dict()  # plain values; a zoo weight's architecture filled in
        D, n, m = self.encoder.out_dim, hidden_dim, embed_dim
        try:
            score_module = build_score(score, D, n, attention_dim)
        except ValueError as exc:
            raise UserError(f"captioner: {exc}") from None
        self.attend = SoftAttention(score_module) if attention == "soft" else HardAttention(score_module)
        if init_layers < 0:
            raise UserError(f"captioner: init_layers must be >= 0, got {init_layers}")
        # init_layers 0: no f_init, h_0 = c_0 = 0
        self.init_h, self.init_c = (_mlp(D, n, init_layers), _mlp(D, n, init_layers)) if init_layers else (None, None)
        self.f_beta = nn.Linear(n, 1) if gate else None  # [n, 1]: a scalar gate, not a vector
        self.lstm = nn.LSTMCell(m + D, n)
        self.drop = nn.Dropout(dropout)
        if deep_output:
            self.L_h, self.L_z = nn.Linear(n, m), nn.Linear(D, m, bias=False)
        self.baseline = MovingAverageBaseline(baseline_decay) if attention == "hard" else None
        self.embed: nn.Embedding | None = None
        self.L_o: nn.Linear | None = None
        if vocab is not None:
            self._build_vocab_layers(vocab)
        self._eval_store: dict[str, list] = {}

    # ------------------------------------------------------------------ checkpoints
    def zoo_config(self) -> dict:
        # The encoder's weights are in the checkpoint: rebuilding it must neither download them
        # nor need the user's pretrained file or released backbone, and must normalise as trained.
        config = super().zoo_config()
        config["init_args"]["backbone"] = self.backbone_spec.self_contained(self.encoder)
        return config

    # ------------------------------------------------------------------ vocabulary
    def _build_vocab_layers(self, vocab: list[str]) -> None:
        vocab = [str(w) for w in vocab]
        if vocab[:4] != SPECIALS:
            raise UserError(f"captioner: vocabulary must start with {SPECIALS}, got {vocab[:4]}")
        if len(vocab) <= len(SPECIALS):
            raise UserError("captioner: empty vocabulary (no words besides the special tokens)")
        self.hparams.vocab = vocab
        self.itos = vocab
        m, V = self.hparams.embed_dim, len(vocab)
        self.embed = nn.Embedding(V, m)
        out_in = m if self.hparams.deep_output else self.hparams.hidden_dim
        self.L_o = nn.Linear(out_in, V)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        data_vocab = getattr(datamodule, "vocab", None) if datamodule is not None else None
        if self.embed is None:
            if data_vocab is None:
                raise UserError("captioner: no vocabulary; give model.vocab or a datamodule with .vocab")
            self._build_vocab_layers(list(data_vocab.itos))
        elif data_vocab is not None and list(data_vocab.itos) != list(self.hparams.vocab):
            raise UserError("captioner: the datamodule's vocabulary differs from the model's "
                            f"({len(data_vocab.itos)} vs {len(self.hparams.vocab)} entries)")

    def _require_vocab(self) -> None:
        if self.embed is None:
            raise UserError("captioner has no vocabulary yet (train it, or load a trained checkpoint)")

    # ------------------------------------------------------------------ the model
    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images [B, 3, H, W] -> annotations [B, L, D], grid (h, w) with L = h * w."""
        tokens, grid = self.encoder(images)
        h, w = grid
        return tokens[:, tokens.shape[1] - h * w:], (int(h), int(w))  # drop ViT prefix tokens if kept

    def init_state(self, annotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # annotations [B, L, D] -> h_0, c_0 [B, n]
        if self.init_h is None:
            zeros = annotations.new_zeros(annotations.shape[0], self.hparams.hidden_dim)
            return zeros, zeros
        mean = annotations.mean(dim=1)  # [B, D]
        return self.init_h(mean), self.init_c(mean)

    def step(self, prev: torch.Tensor, h: torch.Tensor, c: torch.Tensor, projected: torch.Tensor,
             annotations: torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
        """One decoder step. prev [N] int64 (y_{t-1}), h/c [N, n], projected [N, L, P],
        annotations [N, L, D] -> dict(logits [N, V], h, c, alpha [N, L], beta [N], and for hard
        attention log_alpha [N, L], location [N])."""
        emb = self.embed(prev)  # E y_{t-1}  [N, m]
        out: dict[str, torch.Tensor] = {}
        if self.hparams.attention == "soft":
            context, alpha = self.attend(projected, annotations, h)  # eq. (4), (5), (13)
        else:
            att = self.attend(projected, annotations, h, mode=mode)  # eq. (8), (9)
            context, alpha = att.context, att.alpha
            out["log_alpha"], out["location"] = att.log_alpha, att.location
        if self.f_beta is not None:
            beta = torch.sigmoid(self.f_beta(h))  # [N, 1], sec. 4.2.1
            context = beta * context
        else:
            beta = torch.ones(h.shape[0], 1, device=h.device, dtype=h.dtype)
        h, c = self.lstm(torch.cat([emb, context], dim=-1), (h, c))  # eq. (1)-(3)
        if self.hparams.deep_output:
            pre = emb + self.L_h(self.drop(h)) + self.L_z(context)  # eq. (7)
            if self.hparams.deep_output_activation == "tanh":
                pre = torch.tanh(pre)
            logits = self.L_o(self.drop(pre))
        else:
            logits = self.L_o(self.drop(h))
        out.update(logits=logits, h=h, c=c, alpha=alpha, beta=beta.squeeze(-1))
        return out

    def forward(self, images: torch.Tensor, captions: torch.Tensor, mode: str | None = None) -> dict[str, torch.Tensor]:
        """Teacher forcing. images [B, 3, H, W], captions [B, T] (<start> .. <end> <pad>..) ->
        logits [B, T-1, V], alpha [B, T-1, L], beta [B, T-1] (+ log_alpha, location for hard)."""
        self._require_vocab()
        mode = mode or self._train_mode()
        annotations, _ = self.encode(images)
        projected = self.attend.score.project_keys(annotations)  # once per image, not per step
        h, c = self.init_state(annotations)
        steps = []
        for t in range(captions.shape[1] - 1):
            out = self.step(captions[:, t], h, c, projected, annotations, mode)
            h, c = out.pop("h"), out.pop("c")
            steps.append(out)
        return {k: torch.stack([s[k] for s in steps], dim=1) for k in steps[0]}

    def _train_mode(self) -> str:
        if self.hparams.attention == "soft":
            return "soft"
        return "sample" if self.training else self.hparams.hard_test_mode

    # ------------------------------------------------------------------ training
    def _losses(self, batch: dict, mode: str) -> dict[str, torch.Tensor]:
        captions = batch["captions"]
        targets = captions[:, 1:]
        step_mask = (targets != PAD_ID).to(torch.float32)  # [B, T-1]: pads carry no loss
        out = self(batch["images"], captions, mode)
        B, T1 = targets.shape
        nll = F.cross_entropy(out["logits"].reshape(B * T1, -1), targets.reshape(-1), reduction="none").view(B, T1)
        nll = nll * step_mask
        n_words = step_mask.sum(1).clamp(min=1)
        caption_nll = nll.sum(1)  # [B], -log p(caption)
        attention_sum = (out["alpha"] * step_mask.unsqueeze(-1)).sum(1)  # [B, L] = sum_t alpha_ti
        doubly = ((1.0 - attention_sum) ** 2).sum(1).mean()  # eq. (14)
        losses = {"nll": caption_nll.mean(), "nll_word": nll.sum() / step_mask.sum().clamp(min=1),
                  "doubly_stochastic": doubly, "caption_nll": caption_nll, "n_words": n_words, "out": out,
                  "step_mask": step_mask}
        losses["loss"] = losses["nll"] + self.hparams.alpha_c * doubly
        return losses

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        mode = "soft"
        if self.hparams.attention == "hard":
            # Paper sec. 4.1: with probability semi_sampling_p a minibatch uses the expected context.
            use_expected = torch.rand(()) < self.hparams.semi_sampling_p  # a CPU draw: no device sync
            mode = "expected" if use_expected else "sample"
        losses = self._losses(batch, mode)
        loss = losses["loss"]
        if self.hparams.attention == "hard":
            out = losses["out"]
            cost = (losses["caption_nll"] / losses["n_words"]).detach()  # per-word NLL, as the authors
            # Sampled minibatch: REINFORCE + entropy. Expected minibatch: the NLL gradient reaches
            # alpha directly; only the entropy bonus is added (reward_scale 0).
            loss = loss + reinforce_surrogate(out["log_alpha"], out["location"], cost, self.baseline.value,
                                              losses["step_mask"],
                                              reward_scale=self.hparams.reward_scale if mode == "sample" else 0.0,
                                              entropy_coef=self.hparams.entropy_coef)
            self.baseline.update(cost)  # b <- 0.9 b + 0.1 mean(cost), every minibatch as the authors
            self.log("train/baseline", self.baseline.value)
        bs = batch["captions"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/nll_word", losses["nll_word"], batch_size=bs)
        self.log("train/doubly_stochastic", losses["doubly_stochastic"], batch_size=bs)
        return loss

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._eval_store = {}

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _eval_step(self, batch: dict, stage: str) -> None:
        images = batch["images"]
        if "captions" in batch:  # teacher-forced NLL of one reference, for model selection by loss
            losses = self._losses(batch, self._train_mode())
            self.log(f"{stage}/loss", losses["nll"], batch_size=images.shape[0], sync_dist=True)
            self.log(f"{stage}/nll_word", losses["nll_word"], batch_size=images.shape[0], sync_dist=True)
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
            metrics["localization"] = stats["localization"]
            metrics["localization_previous_word"] = stats["localization_previous_word"]  # a diagnostic
        self.last_eval = {"stage": stage, "metrics": metrics, "predictions": predictions,
                          "notes": scores.get("notes", {})}
        for name, value in metrics.items():
            self.log(f"{stage}/{name}", float(value), prog_bar=name in ("Bleu_4", "CIDEr", "localization"))

    # ------------------------------------------------------------------ captioning
    @torch.no_grad()
    def decoder(self, images: torch.Tensor):
        """What `zoo.decoding` needs to caption images [B, 3, H, W]: (step_fn, state, static, grid).
        step_fn(tokens [N], (h, c), (projected, annotations)) -> (log_probs [N, V], (h, c),
        extras {alpha [N, L], beta [N] (, location [N])}); state (h_0, c_0) [B, n]; static (projected
        [B, L, P], annotations [B, L, D]), computed once per image; grid (h, w) with L = h * w.
        Put the model in eval mode first (`caption` does)."""
        annotations, grid = self.encode(images.to(self.device, torch.float32))
        projected = self.attend.score.project_keys(annotations)
        mode = "soft" if self.hparams.attention == "soft" else self.hparams.hard_test_mode
        never = torch.tensor([PAD_ID, START_ID], device=annotations.device)

        def step_fn(tokens, state, static):
            out = self.step(tokens, state[0], state[1], static[0], static[1], mode)
            logits = out["logits"].index_fill(-1, never, float("-inf"))  # never emit <pad>/<start>
            extras = {"alpha": out["alpha"], "beta": out["beta"]}
            if "location" in out:
                extras["location"] = out["location"]
            return torch.log_softmax(logits.float(), dim=-1), (out["h"], out["c"]), extras

        return step_fn, self.init_state(annotations), (projected, annotations), grid

    @torch.no_grad()
    def caption(self, images: torch.Tensor, beam_size: int = 1, max_len: int | None = None,
                length_penalty: float | None = None) -> list[dict[str, Any]]:
        """Caption B images at once. images [B, 3, H, W] in [0, 1].

        Returns one dict per image: `words` (list[str]), `alpha` (float [n_words, h, w], the
        attention map each word was emitted with), `beta` (float [n_words], the gate), `score`
        (summed log-probability), `finished` (False when cut at max_len) and, for hard attention,
        `locations` (int64 [n_words, 2], the (row, col) grid cell chosen: the argmax location,
        which is the sample's mode when decoding with the expected context)."""
        self._require_vocab()
        if images.dim() != 4:
            raise UserError(f"caption() wants images [B, C, H, W], got shape {tuple(images.shape)}")
        was_training = self.training
        self.eval()
        try:
            step_fn, state, static, grid = self.decoder(images)
            max_len = int(max_len or self.hparams.decode_max_len)
            if beam_size <= 1:
                decoded = greedy_decode(step_fn, state, static, images.shape[0], START_ID, END_ID, max_len)
            else:
                lp = self.hparams.length_penalty if length_penalty is None else length_penalty
                decoded = beam_search(step_fn, state, static, images.shape[0], int(beam_size), START_ID, END_ID,
                                      max_len, length_penalty=lp)
        finally:
            self.train(was_training)
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

    def attention_figures(self, batch: dict) -> dict[str, Any]:
        from zoo.viz.caption import caption_figure

        images = batch["images"][: self.hparams.num_figures]
        results = self.caption(images, beam_size=self.hparams.beam_size)
        return {f"{i}: {' '.join(r['words'])}": caption_figure(images[i], r) for i, r in enumerate(results)}

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.hparams
        encoder_params = [p for p in self.encoder.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in encoder_params}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in encoder_ids]
        groups = [{"params": other}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": hp.backbone_lr or hp.lr})
        if hp.optimizer == "adam":
            optimizer = torch.optim.Adam(groups, lr=hp.lr, weight_decay=hp.weight_decay)
        elif hp.optimizer == "rmsprop":
            optimizer = torch.optim.RMSprop(groups, lr=hp.lr, weight_decay=hp.weight_decay)
        else:
            raise UserError(f"captioner: optimizer must be 'adam' or 'rmsprop', got '{hp.optimizer}'")
        if hp.lr_schedule == "none":
            return optimizer
        if hp.lr_schedule != "cosine":
            raise UserError(f"captioner: lr_schedule must be 'none' or 'cosine', got '{hp.lr_schedule}'")
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, self.trainer.max_epochs or 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


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
