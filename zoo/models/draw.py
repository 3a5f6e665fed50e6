"""DRAW (Gregor et al. 2015, arXiv 1502.04623): a recurrent VAE that draws on a canvas, with the
Gaussian filterbank attention of zoo.attention.filterbank, and the paper's sec. 4.1
"differentiable RAM" classifier that only reads.

Generator, one step t = 1..T (eqs. 3-8):
    x^_t   = x - sigmoid(c_{t-1})                                  eq. 3
    r_t    = read(x, x^_t, h_dec_{t-1})                            eq. 4
    h_enc_t = LSTM_enc(h_enc_{t-1}, [r_t, h_dec_{t-1}])            eq. 5
    z_t ~ q(z_t | h_enc_t) = N(mu_t, sigma_t)                      eqs. 6, 1-2; fresh noise each t
    h_dec_t = LSTM_dec(h_dec_{t-1}, z_t)                           eq. 7
    c_t    = c_{t-1} + write(h_dec_t)                              eq. 8
Loss (eqs. 9-12): L = -log Bernoulli(x | sigmoid(c_T)) + sum_t KL(q(z_t|h_enc_t) || N(0, I)),
    KL_t = 1/2 sum_d (mu^2 + sigma^2 - log sigma^2) - 1/2 per latent dimension d    eq. 11
Without attention, read = [x, x^] (eq. 17) and write = W(h_dec_t) (eq. 18): the same code with
`attention: none`.

Pixels are binarized afresh every training step (dynamic); validation and test use one fixed
binarization, a function of the image and `binarize_seed` only (`zoo.data.binarize`), so every
model sees the same binary test set. `test_step` reports the negative ELBO in nats/image (the
paper's "<=" numbers), an importance-weighted bound with `iwae_samples` samples (Burda et al. 2016)
and each step's KL. Compiled modes compile the per-step cell (`_cell`), not the T-step unroll.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import filterbank as fb
from zoo.data.binarize import fixed_binarize
from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.base import ClassifierModule, ZooModule
from zoo.models.card import CompileHints, FamilyCard, StepCost

ATTENTION_KINDS = ("none", "filterbank")
BINARIZATIONS = ("dynamic", "fixed")


# ----------------------------------------------------------------------------- pieces
def kl_std_normal(mu: torch.Tensor, logsigma: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, sigma^2) || N(0, 1)) summed over the last dim (eq. 11, its constant -1/2 per latent
    dimension): [..., Z] -> [...]."""
    return 0.5 * (mu.pow(2) + torch.exp(2 * logsigma) - 2 * logsigma - 1).sum(-1)


def _window_record(model, windows: dict[str, tuple[list, int]], step: str, prediction: dict):
    """windows {box label: (T per-step FilterParams (fields [B]), N)}, the read first -> the
    AttentionRecord: one step per time step, the read's filter weight per pixel as its map."""
    from zoo.attention import record

    # each field [T, B]
    stacked = [(fb.FilterParams(*(torch.stack(f) for f in zip(*steps))), n) for steps, n in windows.values()]
    (reads, read_n), S = stacked[0], model.S
    T, B = reads.gx.shape
    fx, fy = fb.filterbank(fb.FilterParams(*(field.reshape(T * B) for field in reads)), read_n, S, S)
    maps = record.maps_from_filters(fx, fy).view(T, B, S, S).transpose(0, 1)  # [B, T, S, S]
    boxes = torch.stack([record.window_boxes(p.gx, p.gy, p.delta, n) for p, n in stacked], 2)  # [T, B, K, 4]
    return record.AttentionRecord(
        family=model.family, kind="window", maps=maps, labels=record.step_labels(step, B, T),
        step_mask=record.full_mask(B, T, maps.device), boxes=boxes.transpose(0, 1), box_labels=list(windows),
        prediction=prediction)


def _check_size(value, name: str, lo: int = 1, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f" and <= {hi}" if hi is not None else ""
        raise UserError(f"DRAW config: {name} must be an integer >= {lo}{bound}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- generator
class DRAW(ZooModule):
    """The DRAW generative model. images [B, C, S, S] in [0, 1] (binarized here) -> bound in nats."""

    card = FamilyCard(
        "draw", output="sample", resize="exact", attention="window", bench_recipes=("draw_fmnist",),
        # CPU: the compiled cell is 1.1-1.5x faster, 1.5 min to compile: pays off after ~450 steps (benchmarks/accel.py)
        compile=CompileHints(pieces=("_cell",), cpu_min_steps=1000),
        dimensions={**dict.fromkeys(["enc_size", "dec_size", "z_size"], 16_384), "read_n": 1_024, "write_n": 1_024,
                    "T": 1_000, "iwae_samples": 100_000, "iwae_chunk": 100_000},
        tiny={"": dict(image_size=12, T=2, enc_size=16, dec_size=16, z_size=3, read_n=3, write_n=4, iwae_samples=4,
                       iwae_chunk=2),
              "noattn": dict(image_size=12, T=2, enc_size=16, dec_size=16, z_size=3, attention="none",
                             iwae_samples=4, iwae_chunk=2)},
        skip={"figures": "its figures show its canvases and samples too (tests/test_draw.py)"})

    def __init__(self, image_size: int = 28, in_chans: int = 1, T: int = 64, enc_size: int = 256,
                 dec_size: int = 256, z_size: int = 100, attention: str = "filterbank", read_n: int = 2,
                 write_n: int = 5, lr: float = 1e-3, betas: list[float] = (0.9, 0.999),
                 train_binarization: str = "dynamic", binarize_seed: int = 0,
                 iwae_samples: int = 1000, iwae_chunk: int = 100, iwae_batches: int | None = None,
                 num_figures: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.S = S = _check_size(image_size, "image_size")
        self.C = C = _check_size(in_chans, "in_chans")
        self.T = _check_size(T, "T")
        for name in ("enc_size", "dec_size", "z_size", "iwae_samples", "iwae_chunk"):
            _check_size(self.hparams[name], name)
        if iwae_batches is not None:
            _check_size(iwae_batches, "iwae_batches", 0)
        if attention not in ATTENTION_KINDS:
            raise UserError(f"DRAW config: attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if train_binarization not in BINARIZATIONS:
            raise UserError(f"DRAW config: train_binarization must be one of {BINARIZATIONS}, "
                            f"got {train_binarization!r}")
        if attention == "filterbank":
            _check_size(read_n, "read_n", 1, S)
            _check_size(write_n, "write_n", 1, S)
            self.read_attn = fb.FilterbankAttention(dec_size, S, S, read_n)  # eq. 21 from h_dec_{t-1}
            self.write_attn = fb.FilterbankAttention(dec_size, S, S, write_n)  # its own parameters
            read_size = 2 * C * read_n * read_n
            self.write_patch = nn.Linear(dec_size, C * write_n * write_n)  # eq. 28: w_t
        else:
            read_size = 2 * C * S * S  # eq. 17
            self.write_patch = nn.Linear(dec_size, C * S * S)  # eq. 18
        self.encoder = nn.LSTMCell(read_size + dec_size, enc_size)  # eq. 5
        self.q = nn.Linear(enc_size, 2 * z_size)  # eqs. 1-2: mu, log sigma
        self.decoder = nn.LSTMCell(z_size, dec_size)  # eq. 7

    # ------------------------------------------------------------------ one step's pieces
    def _read(self, x, x_hat, h_dec):
        """x, x_hat [B, C, S, S], h_dec [B, dec] -> (r [B, read_size], FilterParams | None)."""
        if self.hparams.attention == "none":
            return torch.cat([x, x_hat], 1).flatten(1), None  # eq. 17
        params, fx, fy = self.read_attn(h_dec)
        return fb.read(x, x_hat, fx, fy, params.gamma).flatten(1), params  # eq. 27

    def _write(self, h_dec):
        """h_dec [B, dec] -> (canvas increment [B, C, S, S], FilterParams | None)."""
        w = self.write_patch(h_dec)
        if self.hparams.attention == "none":
            return w.view(-1, self.C, self.S, self.S), None  # eq. 18
        n = self.hparams.write_n
        params, fx, fy = self.write_attn(h_dec)
        return fb.write(w.view(-1, self.C, n, n), fx, fy, params.gamma), params  # eq. 29

    # ------------------------------------------------------------------ the model
    def _cell(self, x, canvas, h_enc, c_enc, h_dec, c_dec, eps):
        """One step t (eqs. 3-8). x [B, C, S, S], canvas c_{t-1} [B, C, S, S], LSTM states [B, *],
        eps [B, Z] this step's standard normal draw -> (canvas c_t, h_enc, c_enc, h_dec, c_dec,
        kl_t [B], log p(z_t) - log q(z_t) [B], mu, logsigma, z [B, Z], read / write FilterParams)."""
        x_hat = x - torch.sigmoid(canvas)  # eq. 3
        r, read_params = self._read(x, x_hat, h_dec)  # eq. 4
        h_enc, c_enc = self.encoder(torch.cat([r, h_dec], 1), (h_enc, c_enc))  # eq. 5
        mu, logsigma = self.q(h_enc).chunk(2, dim=1)
        z = mu + torch.exp(logsigma) * eps  # eq. 6, reparameterised with this step's draw
        h_dec, c_dec = self.decoder(z, (h_dec, c_dec))  # eq. 7
        increment, write_params = self._write(h_dec)
        canvas = canvas + increment  # eq. 8
        # log N(z; 0, I) - log N(z; mu, sigma): the 2 pi terms cancel, (z - mu)/sigma = eps
        log_pq = (0.5 * eps.pow(2) - 0.5 * z.pow(2) + logsigma).sum(1)
        return (canvas, h_enc, c_enc, h_dec, c_dec, kl_std_normal(mu, logsigma), log_pq, mu, logsigma, z,
                read_params, write_params)

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None, record: bool = False) -> dict:
        """Encode and reconstruct binary images x [B, C, S, S] with noise [T, B, Z] (drawn if None)
        -> logits [B, C, S, S] (= c_T), kl [T, B], log_pq [B] = sum_t log p(z_t) - log q(z_t | ...),
        and with `record` per-step mu, logsigma, z, canvases (logits) and read/write parameters."""
        self.check_images(x)
        B, Z = x.shape[0], self.hparams.z_size
        if noise is None:
            noise = torch.randn(self.T, B, Z, device=x.device, dtype=x.dtype)
        h_enc = c_enc = x.new_zeros(B, self.hparams.enc_size)
        h_dec = c_dec = x.new_zeros(B, self.hparams.dec_size)
        canvas = x.new_zeros(B, self.C, self.S, self.S)
        kls, log_pq, steps = [], x.new_zeros(B), []
        for t in range(self.T):
            canvas, h_enc, c_enc, h_dec, c_dec, kl, log_pq_t, *step = self._cell(
                x, canvas, h_enc, c_enc, h_dec, c_dec, noise[t])
            kls.append(kl)
            log_pq = log_pq + log_pq_t
            steps.append((*step, canvas))  # mu, logsigma, z, read, write, canvas
        out = {"logits": canvas, "kl": torch.stack(kls), "log_pq": log_pq}
        if record:
            mu, logsigma, z, read, write, canvases = zip(*steps)
            out.update(mu=torch.stack(mu), logsigma=torch.stack(logsigma), z=torch.stack(z),
                       canvas=torch.stack(canvases), read=list(read), write=list(write))
        return out

    def negative_elbo(self, x: torch.Tensor, noise: torch.Tensor | None = None) -> dict:
        """x binary [B, C, S, S] -> {nelbo, rec, kl: [B], kl_steps: [T, B], log_w: [B]}."""
        out = self(x, noise)
        # -log Bernoulli(x | sigmoid(c_T)) in nats per image (eq. 9)
        rec = F.binary_cross_entropy_with_logits(out["logits"], x, reduction="none").flatten(1).sum(1)
        kl = out["kl"].sum(0)
        return {"nelbo": rec + kl, "rec": rec, "kl": kl, "kl_steps": out["kl"],
                "log_w": -rec + out["log_pq"]}  # log p(x, z) - log q(z | x) at the sampled z

    @torch.no_grad()
    def iwae_bound(self, x: torch.Tensor, samples: int | None = None, chunk: int | None = None) -> torch.Tensor:
        """Importance-weighted bound: -log 1/K sum_k p(x, z_k)/q(z_k | x) in nats, x [B, ...] -> [B];
        the K samples run as `chunk`-sized replicas of the batch."""
        K = samples or self.hparams.iwae_samples
        chunk = min(chunk or self.hparams.iwae_chunk, K)
        B, Z = x.shape[0], self.hparams.z_size
        log_ws = []
        for start in range(0, K, chunk):
            k = min(chunk, K - start)
            xr = x.repeat_interleave(k, dim=0)  # [B * k, ...], rows b*k .. b*k+k-1 are image b
            noise = torch.randn(self.T, B * k, Z, device=x.device, dtype=x.dtype)
            log_ws.append(self.negative_elbo(xr, noise)["log_w"].view(B, k))
        log_w = torch.cat(log_ws, 1)  # [B, K]
        return -(torch.logsumexp(log_w.double(), 1) - math.log(K)).to(x.dtype)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> dict:
        """Draw n images from the prior, z_t ~ N(0, I) (eq. 13-14): images [n, C, S, S] (Bernoulli
        means), canvases [T, n, C, S, S] (sigmoid of each c_t), write (T FilterParams or None)."""
        n = _check_size(n, "n")
        h_dec = c_dec = self.q.weight.new_zeros(n, self.hparams.dec_size)
        canvas = self.q.weight.new_zeros(n, self.C, self.S, self.S)
        canvases, writes = [], []
        for _ in range(self.T):
            z = torch.randn(n, self.hparams.z_size, generator=generator).to(canvas)
            h_dec, c_dec = self.decoder(z, (h_dec, c_dec))
            increment, params = self._write(h_dec)
            canvas = canvas + increment
            canvases.append(torch.sigmoid(canvas))
            writes.append(params)
        return {"images": canvases[-1], "canvases": torch.stack(canvases), "write": writes}

    example_batch = ZooModule.labelled_batch  # the data's form; the generator reads the images only

    @torch.no_grad()
    def attention_record(self, images: torch.Tensor):
        """The read and write windows while the model redraws images [B, C, S, S] (binarized as the
        test sets, one fixed noise draw); the prediction is the final canvas."""
        if self.hparams.attention == "none":
            raise UserError("this DRAW model has no attention (attention: none) to record")
        x = self.binarize(images)
        noise = torch.randn(self.T, x.shape[0], self.hparams.z_size,
                            generator=torch.Generator().manual_seed(0)).to(x)
        out = self(x, noise=noise, record=True)
        windows = {"read": (out["read"], self.hparams.read_n), "write": (out["write"], self.hparams.write_n)}
        canvas, canvases = torch.sigmoid(out["logits"]), torch.sigmoid(out["canvas"]).transpose(0, 1)
        return _window_record(self, windows, "step", {"canvas": canvas, "canvases": canvases})

    # ------------------------------------------------------------------ Lightning
    def binarize(self, images: torch.Tensor, train: bool = False) -> torch.Tensor:
        """images [B, C, S, S] in [0, 1] -> {0, 1}: a fresh draw per step when training (dynamic
        binarization), else the fixed binarization that defines the test sets."""
        self.check_images(images)
        if train and self.hparams.train_binarization == "dynamic":
            return torch.bernoulli(images)
        return fixed_binarize(images, self.hparams.binarize_seed)

    # ------------------------------------------------------------------ steps (zoo.models.accel)
    def train_inputs(self, batch, train: bool = True):
        """The binarized images and the latent noise [T, B, Z] of one step."""
        x = self.binarize(batch[0], train=train)
        return {"x": x, "noise": torch.randn(self.T, x.shape[0], self.hparams.z_size, device=x.device, dtype=x.dtype)}

    def train_loss(self, x, noise):
        terms = self.negative_elbo(x, noise)
        loss = terms["nelbo"].mean()
        return loss, {"loss": loss.detach(), "kl": terms["kl"].mean().detach()}

    def eval_inputs(self, batch, stage):
        return self.train_inputs(batch, train=False)  # fixed binarization: the same images for every model

    def eval_metrics(self, stage, x, noise):
        terms = self.negative_elbo(x, noise)
        metrics = {"nelbo" if stage == "test" else "loss": terms["nelbo"].mean(), "rec": terms["rec"].mean(),
                   "kl": terms["kl"].mean()}
        if stage == "test":
            metrics["kl_steps"] = terms["kl_steps"].mean(1)  # [T]
        return metrics

    def log_step_metrics(self, stage, metrics, batch_size):
        kl_steps = metrics.pop("kl_steps", None)
        super().log_step_metrics(stage, metrics, batch_size)
        if kl_steps is not None:
            for t in range(self.T):
                self.log(f"test/kl_step{t + 1:03d}", kl_steps[t], batch_size=batch_size, sync_dist=True)

    def test_step(self, batch, batch_idx):
        metrics = self.accel.eval_step(self, batch, "test")
        x = batch[0]
        limit = self.hparams.iwae_batches  # IWAE costs K forward passes: optionally a prefix only
        if limit is None or batch_idx < limit:
            with self.accel.running(self, "iwae", "eval"):
                x = self.binarize(x, train=False)
                metrics[f"iwae_k{self.hparams.iwae_samples}"] = self.iwae_bound(x).mean()
        self.log_step_metrics("test", metrics, x.shape[0])

    def configure_optimizers(self):
        hp = self.hparams
        return optim.configure(self, self.parameters(), "adam", lr=hp.lr, betas=hp.betas)

    @torch.no_grad()
    def attention_figures(self, batch) -> dict:
        from zoo.viz import draw as viz

        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        x = self.binarize(images[: self.hparams.num_figures], train=False)
        out = self(x, record=True)
        canvases = torch.sigmoid(out["canvas"])  # [T, n, C, S, S]
        strip = viz.reconstruction_strip(x, canvases, out["read"], out["write"], self.hparams.read_n,
                                         self.hparams.write_n)
        samples = self.sample(16, generator=torch.Generator().manual_seed(0))
        return {"draw/reconstruction (input, steps, final)": strip,
                "draw/samples": viz.sample_grid(samples["images"], nrow=4, scale=2)}


# ----------------------------------------------------------------------------- classifier
class DRAWClassifier(ClassifierModule):
    """DRAW's differentiable-attention classifier (sec. 4.1): an LSTM reads one N x N filterbank
    glimpse per step, placed from its previous state, and classifies from its state after T
    glimpses; plain backprop. images [B, C, S, S] in [0, 1] -> logits [B, num_classes]."""

    card = FamilyCard(
        "draw_classifier", resize="exact", attention="window", head_keys=("head.",),
        # CPU: compiled steps 1.25-1.8x eager, 1.5 min to compile: pays off after ~1,900 steps (benchmarks/accel.py)
        compile=CompileHints(cpu_min_steps=4000), bench_recipes=("draw_cluttered100_classifier",),
        steps=StepCost("T"),
        dimensions={"hidden_size": 16_384, "glimpse_hidden": 16_384, "read_n": 1_024, "T": 1_000},
        tiny={"": dict(image_size=16, num_classes=3, T=2, read_n=4, hidden_size=16, glimpse_hidden=16)})

    def __init__(self, image_size: int = 100, in_chans: int = 1, num_classes: int = 10, T: int = 8,
                 read_n: int = 12, hidden_size: int = 256, glimpse_hidden: int = 256,
                 lr: float = 1e-3, weight_decay: float = 0.0, lr_schedule: str = "cosine",
                 read_init: str = "whole_image", num_figures: int = 8, class_names: list[str] | None = None):
        super().__init__()
        self.save_hyperparameters()
        optim.check_schedule(lr_schedule, "DRAWClassifier")
        if read_init not in ("whole_image", "default"):
            raise UserError(f"DRAWClassifier: read_init must be whole_image or default, got '{read_init}'")
        self.S = S = _check_size(image_size, "image_size")
        self.C = _check_size(in_chans, "in_chans")
        self.T = _check_size(T, "T")
        _check_size(read_n, "read_n", 1, S)
        _check_size(num_classes, "num_classes", 2)
        _check_size(hidden_size, "hidden_size")
        _check_size(glimpse_hidden, "glimpse_hidden", 0)
        self.attn = fb.FilterbankAttention(hidden_size, S, S, read_n)  # eq. 21 from h_{t-1}
        if read_init == "whole_image":  # the paper gives no initialisation; see init_whole_image
            self.attn.init_whole_image()
        glimpse = self.C * read_n * read_n
        self.embed = (nn.Sequential(nn.Linear(glimpse, glimpse_hidden), nn.ReLU()) if glimpse_hidden
                      else nn.Identity())
        self.rnn = nn.LSTMCell(glimpse_hidden or glimpse, hidden_size)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, images: torch.Tensor, record: bool = False):
        """images [B, C, S, S] -> logits [B, classes] (and per-step FilterParams with `record`)."""
        self.check_images(images)
        B = images.shape[0]
        h = c = images.new_zeros(B, self.hparams.hidden_size)
        reads = []
        for _ in range(self.T):
            params, fx, fy = self.attn(h)
            glimpse = fb.filter_read(images, fx, fy, params.gamma).flatten(1)  # [B, C N N], eq. 27
            h, c = self.rnn(self.embed(glimpse.to(images.dtype)), (h, c))
            reads.append(params)
        logits = self.head(h)
        return (logits, reads) if record else logits

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, S, S] -> class probabilities [B, classes]."""
        return torch.softmax(self(images), -1)

    @torch.no_grad()
    def attention_record(self, images: torch.Tensor):
        """One step per glimpse: the map is the read's filter weight per pixel, the box its window."""
        logits, reads = self(images, record=True)
        probs = logits.float().softmax(-1)
        prediction = {"probs": probs, "label": probs.argmax(-1), "class_names": self.hparams.class_names}
        return _window_record(self, {"read": (reads, self.hparams.read_n)}, "glimpse", prediction)

