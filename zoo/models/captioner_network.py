"""The Show, Attend and Tell network (Xu et al. 2015) alone, to read beside the paper: its layers
and what runs them, with soft (sec. 4.2) or hard (sec. 4.1) attention. zoo.models.captioner holds
it as its child `net` and trains, evaluates and logs it.

Per step t, with annotations a [B, L, D] from the encoder (any zoo.backbones backbone):
    e_t, alpha_t = f_att(a, h_{t-1}), softmax(e_t)        eq. (4)-(5)
    z^_t         = sum_i alpha_ti a_i (soft) | a_{s_t}, s_t ~ Cat(alpha_t) (hard)   eq. (13) / (8)-(9)
    beta_t       = sigmoid(f_beta(h_{t-1}))               sec. 4.2.1: ONE scalar per step
    z_t          = beta_t * z^_t
    h_t, c_t     = LSTM([E y_{t-1}, z_t], (h_{t-1}, c_{t-1}))   eq. (1)-(3)
    p(y_t)       ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))      eq. (7), the deep output
with h_0, c_0 = f_init,h / f_init,c(mean_i a_i) (MLPs with tanh, sec. 3.1.2), or zeros with
`init_layers: 0` (an ablation).

The exact marginal (`hard.estimator: marginal`, Deng et al. 2018) cannot sum over the cell where
z_t feeds the LSTM (L^T paths), so, as harvardnlp/var-attn does, the LSTM gets the EXPECTED context
and the cell z_t ~ Cat(alpha_t) reaches only the deep output (`marginal_output`):
    p(y_t) = sum_i alpha_ti p(y_t | a_i),  p(y_t | a_i) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z beta_t a_i))
`attention_query: current` (var-attn's order, Luong et al. 2015's input feeding) reads
alpha_t = f_att(a, h_t) after the LSTM took in E y_{t-1} and the previous step's expected context,
so z_t reaches y_t alone; `feed_context: false` (an ablation) feeds the LSTM no context.
`annotation_coords` appends each cell's (x, y) in [-1, 1] to its annotation vector (the captions say
"left of", and a frozen convolutional encoder is translation-equivariant).

The layers are registered in the order that names them in checkpoints. Speed: `teacher_forced`
computes outside the time loop all that does not feed back and fuses every linear map of h_{t-1}
into one matmul per step; `step` is the same model one step at a time (decoding, the tests' reference).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.hard import (HardAttention, HardSpec, MovingAverageBaseline, build_estimator, gather_context,
                                marginal_log_prob)
from zoo.attention.scores import build_score
from zoo.attention.soft import SoftAttention, expected_context
from zoo.data.vocab import PAD_ID, START_ID
from zoo.guards.errors import UserError
from zoo.hparams import Block

COORDS = 2  # (x, y): what `annotation_coords` appends to each annotation vector


def _mlp(in_dim: int, out_dim: int, layers: int) -> nn.Sequential:
    """`layers` Linear+tanh layers (the authors' f_init uses tanh)."""
    dims = [in_dim] + [out_dim] * layers
    return nn.Sequential(*[module for a, b in zip(dims, dims[1:]) for module in (nn.Linear(a, b), nn.Tanh())])


@dataclass
class DecoderSpec(Block):
    """The decoder's architecture (the captioner's `decoder:` block): f_att (`score`,
    `attention_dim`), E's `embed_dim` m, the LSTM's `hidden_dim` n, f_init's `init_layers`, the gate
    beta, the deep output (eq. 7) and the switches of the module docstring."""

    score: str = "additive"
    annotation_coords: bool = False
    embed_dim: int = 64
    hidden_dim: int = 256
    attention_dim: int = 128
    init_layers: int = 1
    gate: bool = True
    deep_output: bool = True
    deep_output_activation: Literal["tanh", "none"] = "tanh"
    dropout: float = 0.5
    feed_context: bool = True
    attention_query: Literal["previous", "current"] = "previous"
    active_rows: bool = True


class ShowAttendTellNetwork(nn.Module):
    """The network from its config (`spec`, `attention` "soft" or "hard", `hard`); E and L_o wait for
    the vocabulary (`build_word_layers`). D annotation, n hidden, m embedding, P key, V vocabulary."""

    def __init__(self, encoder: nn.Module, spec: DecoderSpec, attention: str = "soft", hard: HardSpec | None = None):
        super().__init__()
        self.spec, self.attention, self.hard = spec, attention, hard or HardSpec()
        self.estimator = build_estimator(self.hard) if attention == "hard" else None
        # decoding never emits <pad> or <start>; a buffer, so no step copies it to the device
        self.register_buffer("never_emitted", torch.tensor([PAD_ID, START_ID]), persistent=False)
        self.encoder = encoder
        D, n, m = encoder.out_dim + (COORDS if spec.annotation_coords else 0), spec.hidden_dim, spec.embed_dim
        try:
            score_module = build_score(spec.score, D, n, spec.attention_dim)
        except ValueError as exc:
            raise UserError(f"captioner: decoder: {exc}") from None
        self.attend = SoftAttention(score_module) if attention == "soft" else HardAttention(score_module)
        # init_layers 0: no f_init, h_0 = c_0 = 0
        layers = spec.init_layers
        self.init_h, self.init_c = (_mlp(D, n, layers), _mlp(D, n, layers)) if layers else (None, None)
        self.f_beta = nn.Linear(n, 1) if spec.gate else None  # [n, 1]: a scalar gate, not a vector
        self.lstm = nn.LSTMCell(m + D, n)
        self.drop = nn.Dropout(spec.dropout)
        if spec.deep_output:
            self.L_h, self.L_z = nn.Linear(n, m), nn.Linear(D, m, bias=False)
        # REINFORCE baselines: the authors' moving average, or a learned b(h_{t-1}, E y_t) (before the sample)
        self.baseline = MovingAverageBaseline(self.hard.baseline_decay) if attention == "hard" else None
        self.baseline_net = nn.Linear(n + m, 1) if attention == "hard" and self.hard.baseline == "learned" else None
        self.embed: nn.Embedding | None = None
        self.L_o: nn.Linear | None = None

    def build_word_layers(self, vocab_size: int) -> None:
        """E (the embedding) and L_o (the output layer), whose rows are the V words."""
        spec = self.spec
        self.embed = nn.Embedding(vocab_size, spec.embed_dim)
        self.L_o = nn.Linear(spec.embed_dim if spec.deep_output else spec.hidden_dim, vocab_size)

    def _require_vocab(self) -> None:
        if self.embed is None:
            raise UserError("captioner has no vocabulary yet (train it, or load a trained checkpoint)")

    # ------------------------------------------------------------------ one step
    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images [B, 3, H, W] -> annotations [B, L, D], grid (h, w) with L = h * w."""
        tokens, grid = self.encoder(images)
        h, w = int(grid[0]), int(grid[1])
        annotations = tokens[:, tokens.shape[1] - h * w:]  # drop ViT prefix tokens if kept
        if self.spec.annotation_coords:  # (x, y) of every cell's centre in [-1, 1], row-major: [h * w, 2]
            ys = (torch.arange(h, device=annotations.device, dtype=annotations.dtype) + 0.5) / h * 2 - 1
            xs = (torch.arange(w, device=annotations.device, dtype=annotations.dtype) + 0.5) / w * 2 - 1
            coords = torch.stack([xs.repeat(h), ys.repeat_interleave(w)], dim=-1)
            annotations = torch.cat([annotations, coords.expand(annotations.shape[0], -1, -1)], dim=-1)
        return annotations, (h, w)

    def init_state(self, annotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f_init,h and f_init,c (sec. 3.1.2): annotations [B, L, D] -> h_0, c_0 [B, n]."""
        if self.init_h is None:
            zeros = annotations.new_zeros(annotations.shape[0], self.spec.hidden_dim)
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
        marginal = mode == "marginal"  # the expected context feeds the LSTM; the cell is summed out at the output

        def attend(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """-> the gated context beta * z^ [N, D], alpha [N, L], beta [N, 1]."""
            if self.attention == "soft":
                context, alpha = self.attend(projected, annotations, query)  # eq. (4), (5), (13)
            else:
                att = self.attend(projected, annotations, query,
                                  mode="expected" if marginal else mode)  # eq. (8), (9)
                context, alpha = att.context, att.alpha
                out["log_alpha"], out["location"] = att.log_alpha, att.location
            beta = self._gate(query)
            return beta * context, alpha, beta

        context, alpha, beta = attend(h)
        fed = context if self.spec.feed_context else torch.zeros_like(context)
        h, c = self.lstm(torch.cat([emb, fed], dim=-1), (h, c))  # eq. (1)-(3)
        if self.spec.attention_query == "current":  # the word's attention reads h_t
            context, alpha, beta = attend(h)
        logits = (self.marginal_output(emb, h, beta, self.L_z(annotations), out["log_alpha"]) if marginal
                  else self.output(emb, h, context))
        out.update(logits=logits, h=h, c=c, alpha=alpha, beta=beta.squeeze(-1))
        return out

    def _gate(self, h: torch.Tensor) -> torch.Tensor:
        """beta = sigmoid(f_beta(h)) [N, 1] (sec. 4.2.1), or ones without the gate."""
        if self.f_beta is None:
            return h.new_ones(h.shape[0], 1)
        return torch.sigmoid(self.f_beta(h))

    def output(self, emb: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The deep output, eq. (7): (E y_{t-1}, h_t, z_t) [..., m / n / D] -> logits [..., V]."""
        if not self.spec.deep_output:
            return self.L_o(self.drop(h))
        pre = emb + self.L_h(self.drop(h)) + self.L_z(z)
        if self.spec.deep_output_activation == "tanh":
            pre = torch.tanh(pre)
        return self.L_o(self.drop(pre))

    def marginal_output(self, emb: torch.Tensor, h: torch.Tensor, beta: torch.Tensor, cell_terms: torch.Tensor,
                        log_alpha: torch.Tensor) -> torch.Tensor:
        """The deep output with the cell summed out (Deng et al. 2018's exact marginal):
        log p(y_t) = logsumexp_i [log alpha_ti + log softmax L_o(E y_{t-1} + L_h h_t + L_z beta_t a_i)].
        emb [N, m], h [N, n], beta [N, 1], cell_terms [N, L, m] (L_z a_i), log_alpha [N, L] ->
        log-probabilities [N, V]; one dropout mask per word, shared by its L cells."""
        pre = (emb + self.L_h(self.drop(h))).unsqueeze(1) + beta.unsqueeze(1) * cell_terms  # [N, L, m], eq. (7)
        if self.spec.deep_output_activation == "tanh":
            pre = torch.tanh(pre)
        mask = self.drop(pre.new_ones(pre.shape[0], 1, pre.shape[2]))  # ones when not training
        cell_log_probs = torch.log_softmax(self.L_o(pre * mask).float(), dim=-1)  # [N, L, V]
        return marginal_log_prob(log_alpha.float(), cell_log_probs).to(pre.dtype)

    # ------------------------------------------------------------------ a whole caption
    def _fused_h_maps(self) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        """Every linear map of h_{t-1} in one matrix: the attention query, the gate's logit and the
        LSTM's recurrent term -> (weight [Q + G + 4n, n], bias or None, split sizes [Q, G, 4n])."""
        n = self.spec.hidden_dim
        weights, biases, splits = [], [], []
        for linear in (self.attend.score.query_linear, self.f_beta):  # either may be absent: Q or G = 0
            splits.append(0 if linear is None else linear.out_features)
            if linear is not None:
                weights.append(linear.weight)
                biases.append(linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features))
        weights.append(self.lstm.weight_hh)
        biases.append(self.lstm.weight_hh.new_zeros(4 * n))  # its biases join the input term
        splits.append(4 * n)
        return torch.cat(weights), torch.cat(biases), splits

    def teacher_forced(self, annotations: torch.Tensor, captions: torch.Tensor,
                       gumbel: torch.Tensor | None = None, use_expected: torch.Tensor | None = None,
                       need_log_alpha: bool = False, active: list[int] | None = None,
                       marginal: bool = False) -> dict[str, torch.Tensor]:
        """`step` applied T-1 times: annotations [B, L, D], captions [B, T] (<start> .. <end> <pad>..).
        Hard attention: gumbel [B, T-1, L] (s_t = argmax(log alpha_t + gumbel_t); None: the expected
        context), use_expected (bool scalar: the minibatch uses the expected context), marginal (the
        exact marginal, `marginal_output`). active: rows still decoding per step, captions sorted
        longest first (finished rows output zeros, masked as pads by the losses).
        -> logits [B, T-1, V], alpha [B, T-1, L], beta [B, T-1], h_prev [B, T-1, n] (h_{t-1}),
        and log_alpha [B, T-1, L] (hard, or when asked), location [B, T-1] (hard)."""
        hard = self.attention == "hard"
        B, T1 = captions.shape[0], captions.shape[1] - 1
        m = self.spec.embed_dim
        active = list(active) if active is not None else [B] * T1
        score = self.attend.score
        projected = score.project_keys(annotations)  # [B, L, P], once per image
        h, c = self.init_state(annotations)
        # Time-major packing of the (row, step) pairs that decode: step t holds rows [:active[t]].
        # Per-step tensors come from unbind/split (whose backward is one stack/cat), never from
        # slicing a [B, T, ...] tensor per step (whose backward zero-fills all of it every step).
        emb = torch.cat([e[:rows] for e, rows in zip(self.embed(captions[:, :-1]).unbind(1), active)])  # [N, m]
        w_ih = self.lstm.weight_ih  # [4n, m + D]
        # the LSTM's input term for the words: one matmul for all steps
        word_gates = F.linear(emb, w_ih[:, :m], self.lstm.bias_ih + self.lstm.bias_hh).split(active)  # [rows_t, 4n]
        w_z = w_ih[:, m:]  # [4n, D]
        fused_w, fused_b, splits = self._fused_h_maps()
        keep_log = hard or need_log_alpha
        h_prev, h_new, zs, alphas, betas, log_alphas, locations = [], [], [], [], [], [], []
        keys, values = projected, annotations
        gumbel_steps = gumbel.unbind(1) if gumbel is not None else None
        for t in range(T1):
            rows = active[t]
            if rows < h.shape[0]:  # sorted longest first: a finished row never returns
                h, c, keys, values = h[:rows], c[:rows], keys[:rows], values[:rows]
            h_prev.append(h)
            query, gate_logit, h_gates = F.linear(h, fused_w, fused_b).split(splits, dim=-1)
            scores = score.combine(keys, query if splits[0] else h)  # eq. (4), [rows, L]
            if keep_log:
                log_alpha = torch.log_softmax(scores, dim=-1)  # eq. (5)
                alpha = log_alpha.exp()
                log_alphas.append(log_alpha)
            else:
                alpha = torch.softmax(scores, dim=-1)
            context = expected_context(alpha, values)  # eq. (13)
            if hard:
                if gumbel_steps is not None and not marginal:
                    noise = gumbel_steps[t][:rows]
                    context, location = self._sampled(log_alpha, noise, values, context, use_expected)
                else:
                    location = alpha.detach().argmax(dim=-1)
                locations.append(location)
            if self.f_beta is not None:
                beta = torch.sigmoid(gate_logit)  # [rows, 1], sec. 4.2.1
                z = beta * context
                betas.append(beta.squeeze(-1))
            else:
                beta = None
                z = context
            gates = word_gates[t] + h_gates  # eq. (1)-(3): i, f, g, o
            if self.spec.feed_context:
                gates = gates + F.linear(z, w_z)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            h_new.append(h)
            zs.append(beta if marginal else z)  # the marginal's output needs the gate, not the context
            alphas.append(alpha)

        def unpack(steps) -> torch.Tensor:  # [rows_t, ...] per step (or packed [N, ...]) -> [B, T1, ...]
            steps = steps.split(active) if isinstance(steps, torch.Tensor) else steps
            return torch.stack([x if x.shape[0] == B else torch.cat([x, x.new_zeros(B - x.shape[0], *x.shape[1:])])
                                for x in steps], dim=1)

        # the deep output (eq. 7) does not feed back: all steps at once, on the decoding pairs only
        rows_of = torch.cat([torch.arange(rows, device=captions.device) for rows in active])  # packed pair -> row
        h_all = torch.cat(h_new)
        if self.spec.attention_query == "current":  # each word's attention reads h_t: all steps at once
            log_alpha = torch.log_softmax(score(projected[rows_of], h_all), dim=-1)  # [N, L]
            alpha, gates = log_alpha.exp(), self._gate(h_all)
            location = log_alpha.detach().argmax(-1)
            if marginal:
                logits = self.marginal_output(emb, h_all, gates, self.L_z(annotations)[rows_of], log_alpha)
            else:  # nothing is fed back (checked at construction), so the sample can be drawn after the loop
                values_rows = annotations[rows_of]  # [N, L, D]
                context = expected_context(alpha, values_rows)
                if hard and gumbel_steps is not None:
                    noise = torch.cat([g[:rows] for g, rows in zip(gumbel_steps, active)])  # [N, L]
                    context, location = self._sampled(log_alpha, noise, values_rows, context, use_expected)
                logits = self.output(emb, h_all, gates * context)
            log_alphas, alphas, locations = log_alpha.split(active), alpha.split(active), location.split(active)
            if self.f_beta is not None:
                betas = gates.squeeze(-1).split(active)
        elif marginal:
            gates = torch.cat(zs) if self.f_beta is not None else emb.new_ones(emb.shape[0], 1)
            logits = self.marginal_output(emb, h_all, gates, self.L_z(annotations)[rows_of], torch.cat(log_alphas))
        else:
            logits = self.output(emb, h_all, torch.cat(zs))
        out = {"logits": unpack(logits), "alpha": unpack(alphas), "h_prev": unpack(h_prev)}
        out["beta"] = unpack(betas) if betas else out["alpha"].new_ones(B, T1)
        if keep_log:
            out["log_alpha"] = unpack(log_alphas)
        if hard:
            out["location"] = unpack(locations)
        return out

    def _sampled(self, log_alpha: torch.Tensor, noise: torch.Tensor, values: torch.Tensor,
                 expected: torch.Tensor, use_expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hard attention's context from the sample s_t = argmax(log alpha_t + noise): a_{s_t} or the
        estimator's step weights' context; the `expected` one on expected minibatches. [N, L, D] values."""
        location = (log_alpha.detach() + noise).argmax(dim=-1)  # s_t ~ Cat(alpha_t), eq. (8)
        weights = self.estimator.step_weights(log_alpha, noise)
        sampled = gather_context(values, location) if weights is None else expected_context(weights, values)
        return torch.where(use_expected, expected, sampled), location  # eq. (9)

    def _draws(self, captions: torch.Tensor, cells: int, like: torch.Tensor, mode: str | None = None,
               coin: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Hard attention's draws for `captions` over `cells` cells: the Gumbel noise [B * K, T-1, L]
        (K = `hard.samples` paths per caption, side by side) and (coin=True) the expected-context
        coin (sec. 4.1); None, None where the pass samples nothing."""
        if self.attention != "hard" or self.resolve_mode(mode) != "sample":
            return None, None
        B, T1 = captions.shape[0] * self.hard.samples, captions.shape[1] - 1  # hard.samples paths per caption
        gumbel = -torch.empty(B, T1, cells, device=like.device, dtype=like.dtype).exponential_().log()
        use_expected = (torch.rand((), device=like.device) < self.hard.semi_sampling_p if coin
                        else torch.zeros((), dtype=torch.bool, device=like.device))
        return gumbel, use_expected

    def resolve_mode(self, mode: str | None) -> str:
        """A teacher-forced pass's attention: `mode`, by default "sample" when training, else
        `scoring_mode`; hard attention's "sample" is its estimator's `train_mode`."""
        if mode is None:
            mode = "sample" if self.training else self.scoring_mode()
        if mode == "sample" and self.attention == "hard":
            return self.estimator.train_mode
        return mode

    def scoring_mode(self) -> str:
        """Scoring outside training: "marginal" for `hard.test_mode: marginal`, else "expected"."""
        return "marginal" if self.attention == "hard" and self.hard.test_mode == "marginal" else "expected"

    def forward(self, images: torch.Tensor, captions: torch.Tensor, mode: str | None = None) -> dict[str, torch.Tensor]:
        """Teacher forcing (`teacher_forced`, its draws made here): images [B, 3, H, W], captions
        [B, T] -> logits [B, T-1, V], alpha, beta (+ log_alpha, location for hard). mode: `resolve_mode`."""
        self._require_vocab()
        annotations, _ = self.encode(images)
        if self.resolve_mode(mode) == "marginal":
            return self.teacher_forced(annotations, captions, marginal=True)
        gumbel, use_expected = self._draws(captions, annotations.shape[1], annotations, mode)
        if gumbel is not None and gumbel.shape[0] != captions.shape[0]:  # hard.samples paths: one of each
            gumbel = gumbel[::self.hard.samples]
        return self.teacher_forced(annotations, captions, gumbel, use_expected)

    # ------------------------------------------------------------------ decoding (caption, export)
    def decode_start(self, images: torch.Tensor) -> tuple:
        """What decoding computes once per image: images [B, 3, H, W] -> annotations [B, L, D],
        their projected keys [B, L, P], h_0 and c_0 [B, n], and the grid (h, w) with L = h * w."""
        annotations, grid = self.encode(images)
        return annotations, self.attend.score.project_keys(annotations), *self.init_state(annotations), grid

    def decode_step(self, token: torch.Tensor, h: torch.Tensor, c: torch.Tensor, projected: torch.Tensor,
                    annotations: torch.Tensor) -> dict[str, torch.Tensor]:
        """`step` with the test-time attention, <pad> and <start> never emitted, float32 log_probs
        [N, V]: what beam search, greedy decoding and the exported `decoder_step` run."""
        mode = "soft" if self.attention == "soft" else self.hard.test_mode
        out = self.step(token, h, c, projected, annotations, mode)
        logits = out.pop("logits").index_fill(-1, self.never_emitted, float("-inf"))
        return {"log_probs": torch.log_softmax(logits.float(), dim=-1), **out}

    @torch.no_grad()
    def decoder(self, images: torch.Tensor):
        """What `zoo.decoding` needs to caption images [B, 3, H, W] (in eval mode): step_fn, state
        (h_0, c_0), static (projected keys, annotations: once per image) and the grid (h, w)."""
        annotations, projected, h0, c0, grid = self.decode_start(images.to(self.never_emitted.device, torch.float32))

        def step_fn(tokens, state, static):
            out = self.decode_step(tokens, state[0], state[1], static[0], static[1])
            extras = {k: out[k] for k in ("alpha", "beta", "location") if k in out}
            return out["log_probs"], (out["h"], out["c"]), extras

        return step_fn, (h0, c0), (projected, annotations), grid
