"""Recurrent Attention Model (Mnih, Heess, Graves, Kavukcuoglu 2014, "Recurrent Models of Visual
Attention", NIPS version; equation numbers refer to it).

    l_t ~ N(mu(h_{t-1}), sigma^2)          location network (h_0 = 0, so l_1 is learned too)
    g_t = f_g(rho(x, l_t), l_t)            glimpse network on the retina's patches
    h_t = f_h(h_{t-1}, g_t)                core network (ReLU RNN, or an LSTM)
    y   = softmax(f_a(h_T))                classifier on the last state

Training is the paper's hybrid loss: cross-entropy trains the classifier, the core and the glimpse
network (the sampled location is detached: the read is not differentiable in l); REINFORCE (eqs.
1-3) with reward R = 1 for a correct prediction trains the location network, -sum_t log pi(l_t |
h_{t-1}) (R - b_t), with the log-probability of the raw Gaussian sample before it is clamped into
the image; the baseline b_t = f_b(h_{t-1}) is fitted to R by its own MSE on a detached state.
`policy.train_samples` M > 1 runs M paths per training image (eq. 2's M episodes), each baselined
by the mean reward of the image's other M - 1. `policy.reinforce_to_core` lets REINFORCE flow into
the core through h_{t-1} (the paper's reading; the default stops it at the location network, the
stable choice of most public ports).

`remedies` (each off by default: the paper's RAM) for a policy gradient that barely sees the item:
- `where_layer` (Ba, Mnih, Kavukcuoglu 2015, DRAM, sec. 3): a second recurrent layer r2 ("where")
  reads the core r1 ("what", detached unless `reinforce_to_core`) and alone feeds the location
  network and the baseline; `context: conv` (DRAM's context network) sets r2's initial state from
  a coarse view of the whole canvas, so the first glimpse is proposed from the image; `context: map`
  (not in the paper) proposes it as the soft arg max of a convolutional score map over that view
  (the spatial softmax of Levine et al. 2016), which finds an item anywhere on a large canvas where
  a linear read-out of the whole view must learn every position apart;
- `step_pixels` s > 0 (not in the paper): after the first glimpse the policy moves from where the
  last one looked, mu_t = l_{t-1} + s tanh(f_l(r2_t)) in pixels, so that later glimpses stay on what
  the first found at any canvas size (absolute means learnt on a small canvas jump off the item);
- `reward: log_prob`: R = log p(y | glimpses), the score function of DRAM's bound (eq. 4-5), which
  moves with every change of the prediction, not only where the arg max flips;
- `reward_at: every_glimpse`: r_t from the running prediction after every glimpse, glimpse t
  credited with sum_{s >= t} r_s (`classify_every_glimpse` trains the classifier on every h_t);
- `baseline: per_glimpse`: b_t with its own weights per glimpse;
- `location_supervision`: an MSE pulling every policy mean onto the item's centre (needs boxes;
  labelled separately, never a headline).

`test_step` reports the deterministic policy (the Gaussian's mean) as `test/acc`, one sampled
trajectory (`acc_sampled`), the probabilities averaged over `eval_samples` trajectories
(`acc_mc{M}`, the paper's "M=10"), the classifier after each glimpse count (`acc_glimpses_t`) and
uniform random glimpses (`acc_random`). A rollout takes its random draws as an input ([T, B, 2]),
so eager and compiled steps consume the same random stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.glimpse import Retina
from zoo.attention.hard import leave_one_out_baseline
from zoo.data.base import as_size
from zoo.guards.errors import UserError
from zoo.hparams import Block
from zoo.models import optim
from zoo.models.base import ZooModule
from zoo.models.card import CompileHints, FamilyCard, StepCost

POLICIES = ("sample", "mean", "random")
TINY = dict(image_size=20, num_classes=4, retina=dict(patch_size=4, num_scales=2), num_glimpses=2,
            network=dict(glimpse_hidden=16, location_hidden=8, glimpse_dim=24, hidden_size=32), eval_samples=3)
CONTEXT_CHANNELS = [16, 16, 4]  # the context network's 3x3 convolutions when a recipe names none


@dataclass
class RetinaSpec(Block):
    """rho(x, l) (sec. 4): `num_scales` square patches around l, the first `patch_size` pixels wide
    and each next one `scale_factor` times wider, all resampled to patch_size squared; `method` and
    `subpixel` as zoo.attention.glimpse.Retina reads them."""

    patch_size: int = 8
    num_scales: int = 1
    scale_factor: float = 2
    method: str = "crop"
    subpixel: bool = True


@dataclass
class NetworkSpec(Block):
    """The paper's sizes: f_g's what and where layers and its output g_t, and the core f_h's state
    h_t (a ReLU RNN, or an LSTM)."""

    glimpse_hidden: int = 128
    location_hidden: int = 128
    glimpse_dim: int = 256
    hidden_size: int = 256
    core: Literal["rnn", "lstm"] = "rnn"


@dataclass
class PolicySpec(Block):
    """The location policy: a Gaussian of `std` (fixed, learnable, or annealed to `std_final` over
    `std_anneal_steps` optimiser steps) around a learned mean, or uniform locations (the paper's
    control); the weights of REINFORCE and its baseline's MSE in the hybrid loss."""

    location_policy: Literal["learned", "random"] = "learned"
    location_mean: Literal["tanh", "linear"] = "tanh"
    std: float = 0.15
    std_mode: Literal["fixed", "learnable", "annealed"] = "fixed"
    std_final: float = 0.05
    std_anneal_steps: int = 10000
    reinforce_weight: float = 1.0
    baseline_weight: float = 1.0
    reinforce_to_core: bool = False
    train_samples: int = 1


@dataclass
class RemediesSpec(Block):
    """The module docstring's remedies; the defaults are the paper's RAM."""

    where_layer: bool = False
    where_hidden: int = 256
    context: Literal["none", "conv", "map"] = "none"
    context_size: int = 12
    context_channels: list[int] | None = None
    context_temperature: float = 1.0
    step_pixels: float = 0.0
    reward: Literal["correct", "log_prob"] = "correct"
    reward_at: Literal["last", "every_glimpse"] = "last"
    classify_every_glimpse: bool = False
    baseline: Literal["shared", "per_glimpse"] = "shared"
    location_supervision: float = 0.0


@dataclass
class OptimizationSpec(Block):
    """The optimiser (the paper: SGD with momentum 0.9; the recipes: Adam), its schedule, and the
    location network's own step size (`location_lr_scale` times `lr`)."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: Literal["none", "cosine"] = "cosine"
    location_lr_scale: float = 1.0


class GlimpseNetwork(nn.Module):
    """f_g (sec. 4): h_g = ReLU(Linear(rho(x, l))), h_l = ReLU(Linear(l)),
    g = ReLU(Linear(h_g) + Linear(h_l)).  images [B, C, H, W], l [B, 2] -> g [B, glimpse_dim]."""

    def __init__(self, retina: Retina, in_chans: int, glimpse_hidden: int, location_hidden: int,
                 glimpse_dim: int):
        super().__init__()
        self.retina = retina
        patch_features = retina.num_scales * in_chans * retina.patch_size ** 2
        self.what = nn.Linear(patch_features, glimpse_hidden)
        self.where = nn.Linear(2, location_hidden)
        self.what_out = nn.Linear(glimpse_hidden, glimpse_dim)
        self.where_out = nn.Linear(location_hidden, glimpse_dim, bias=False)  # one bias is enough

    def forward(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        patches = self.retina(images, locations).flatten(1)  # [B, k*C*g*g]
        h_g = F.relu(self.what(patches))
        h_l = F.relu(self.where(locations))
        return F.relu(self.what_out(h_g) + self.where_out(h_l))


def _convs(in_chans: int, channels: list[int]) -> list[nn.Module]:
    """3x3 convolutions (padding 1), each followed by a ReLU: in_chans -> channels[0] -> ... -> channels[-1]."""
    widths = [in_chans] + list(channels)
    return [layer for a, b in zip(widths, widths[1:]) for layer in (nn.Conv2d(a, b, 3, padding=1), nn.ReLU())]


class ContextNetwork(nn.Module):
    """DRAM's context network (Ba et al. 2015, sec. 3): the canvas area-averaged to view_size squared,
    3x3 convolutions, a linear layer to the where layer's initial state. [B, C, H, W] -> [B, out_dim]."""

    def __init__(self, in_chans: int, view_size: int, channels: list[int], out_dim: int):
        super().__init__()
        self.view_size = int(view_size)
        self.convs = nn.Sequential(*_convs(in_chans, channels))
        self.out = nn.Linear(([in_chans] + channels)[-1] * self.view_size ** 2, out_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        view = F.adaptive_avg_pool2d(images, self.view_size)  # [B, C, s, s]
        return F.relu(self.out(self.convs(view).flatten(1)))


class ContextMap(nn.Module):
    """The first glimpse's mean from a coarse view (`context: map`): the canvas area-averaged to
    view_size squared, 3x3 convolutions to one score per cell, their softmax p over the cells, and
    the expected cell centre sum_i p_i c_i (a spatial soft arg max, Levine et al. 2016), with
    p = softmax(scores / temperature). Fully convolutional: a score depends on the cell's
    neighbourhood, not on where it lies; a lower temperature keeps the many background cells of a
    large view from pulling the mean toward the centre. [B, C, H, W] -> [B, 2] (x, y) in [-1, 1]."""

    def __init__(self, in_chans: int, view_size: int, channels: list[int], temperature: float = 1.0):
        super().__init__()
        self.view_size, self.temperature = int(view_size), float(temperature)
        self.convs = nn.Sequential(*_convs(in_chans, channels),  # then the scores: no ReLU
                                   nn.Conv2d(([in_chans] + channels)[-1], 1, 3, padding=1))
        centres = (torch.arange(self.view_size) * 2 + 1) / self.view_size - 1  # cell centres in [-1, 1]
        grid = torch.stack(torch.meshgrid(centres, centres, indexing="xy"), -1)  # [s, s, (x, y)]
        self.register_buffer("centres", grid.reshape(-1, 2), persistent=False)  # [s*s, 2], row-major

    def probs(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] -> p [B, s*s], row-major over the view's cells."""
        view = F.adaptive_avg_pool2d(images, self.view_size)  # [B, C, s, s]
        return (self.convs(view).flatten(1) / self.temperature).softmax(-1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.probs(images) @ self.centres.to(images.dtype)


class RAM(ZooModule):
    """images [B, C, H, W] in [0, 1] -> logits [B, num_classes] after `num_glimpses` glimpses."""

    card = FamilyCard(
        "ram", resize="exact", attention="glimpse", head_keys=("classifier.",), exports=("logits", "locations"),
        # CPU: compiled steps 1.7-1.9x eager, 1.5 min to compile: pays off after ~1,800 steps (benchmarks/accel.py)
        compile=CompileHints(cpu_min_steps=5000), bench_recipes=("ram_fmnist_cluttered60",),
        steps=StepCost("num_glimpses", once=("context_net",)),
        # train_samples: whole rollouts per training image; context_size: the coarse view's side
        dimensions={**dict.fromkeys(["glimpse_hidden", "location_hidden", "glimpse_dim", "hidden_size", "where_hidden",
                                     "context_channels"], 16_384),
                    "num_scales": 16, "num_glimpses": 1_000, "train_samples": 1_000, "eval_samples": 10_000,
                    "context_size": 4_096},
        tiny={"": TINY,
              "lstm_learnable_to_core": {**TINY, "network": {**TINY["network"], "core": "lstm"},
                                         "policy": {"std_mode": "learnable", "reinforce_to_core": True},
                                         "retina": {**TINY["retina"], "method": "filterbank"}},
              "annealed_random": {**TINY, "policy": {"std_mode": "annealed", "location_policy": "random"}},
              # issue 33's remedies: DRAM's where layer and context network, the shaped return, 2 paths per image
              "dram_shaped": {**TINY, "policy": {"train_samples": 2},
                              "remedies": {"where_layer": True, "where_hidden": 16, "context": "conv", "context_size": 5,
                                           "context_channels": [2], "reward": "log_prob",
                                           "reward_at": "every_glimpse", "classify_every_glimpse": True,
                                           "baseline": "per_glimpse"}},
              "dram_map": {**TINY, "remedies": {"where_layer": True, "where_hidden": 16, "context": "map",
                                                "context_size": 5, "context_channels": [2],
                                                "step_pixels": 3}}})

    def __init__(
        self,
        image_size: int | list[int] = 28,
        in_chans: int = 1,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        retina: RetinaSpec | None = None,
        num_glimpses: int = 6,
        network: NetworkSpec | None = None,
        policy: PolicySpec | None = None,
        remedies: RemediesSpec | None = None,
        optimization: OptimizationSpec | None = None,
        # evaluation
        eval_samples: int = 10,
        eval_seed: int = 0,
        num_figures: int = 4,
    ):
        super().__init__()
        # typed blocks from the CLI, or plain dicts from a checkpoint or a Python caller (zoo.hparams.Block)
        self.retina = retina = RetinaSpec.coerce(retina, "RAM: retina")
        self.network = net = NetworkSpec.coerce(network, "RAM: network")
        self.policy = policy = PolicySpec.coerce(policy, "RAM: policy")
        self.remedies = fix = RemediesSpec.coerce(remedies, "RAM: remedies")
        self.optimization = opt = OptimizationSpec.coerce(optimization, "RAM: optimization")
        self.save_hyperparameters()
        for name in ("retina", "network", "policy", "remedies", "optimization"):
            self.hparams[name] = getattr(self, name).to_dict()  # plain values
        context_channels = CONTEXT_CHANNELS if fix.context_channels is None else list(fix.context_channels)
        if policy.train_samples < 1:
            raise UserError(f"RAM: policy.train_samples must be >= 1, got {policy.train_samples}")
        if fix.context != "none" and not fix.where_layer:
            raise UserError("RAM: a context network needs remedies.where_layer: true (it sets the where layer's "
                            "state; the classifier must not read the coarse view)")
        if fix.context != "none" and (fix.context_size < 1 or fix.where_hidden < 1 or 0 in context_channels):
            raise UserError(f"RAM: the context view is empty (context_size {fix.context_size}, "
                            f"context_channels {context_channels}); give a coarse view of at least 1x1 pixel")
        if not 0 < fix.context_temperature < math.inf:
            raise UserError(f"RAM: remedies.context_temperature must be positive, got {fix.context_temperature}")
        if not 0 <= fix.step_pixels < math.inf:
            raise UserError(f"RAM: remedies.step_pixels must be >= 0, got {fix.step_pixels}")
        if fix.location_supervision < 0 or not math.isfinite(fix.location_supervision):
            raise UserError(f"RAM: remedies.location_supervision must be >= 0, got {fix.location_supervision}")
        if opt.location_lr_scale <= 0:
            raise UserError(f"RAM: optimization.location_lr_scale must be positive, got {opt.location_lr_scale}")
        if not policy.std > 0 or (policy.std_mode == "annealed" and not policy.std_final > 0):
            raise UserError("RAM: policy.std and policy.std_final must be positive")
        self.image_hw = as_size(image_size)
        if len(self.image_hw) != 2:
            raise UserError(f"RAM: image_size is an int or [H, W], got {image_size}")
        try:
            reader = Retina(retina.patch_size, retina.num_scales, retina.scale_factor, method=retina.method,
                            subpixel=retina.subpixel, image_size=self.image_hw)
        except ValueError as exc:
            raise UserError(f"RAM: retina: {exc}") from None
        # step_pixels as a move in [-1, 1] coordinates, (x, y): half the width, half the height
        self.register_buffer("_step_scale", torch.tensor([2 * fix.step_pixels / self.image_hw[1],
                                                          2 * fix.step_pixels / self.image_hw[0]]), persistent=False)
        self.glimpse = GlimpseNetwork(reader, in_chans, net.glimpse_hidden, net.location_hidden, net.glimpse_dim)
        cell = nn.LSTMCell if net.core == "lstm" else partial(nn.RNNCell, nonlinearity="relu")
        # f_h: h_t = ReLU(Linear(h_{t-1}) + Linear(g_t)) (sec. 4), or an LSTM
        self.core = cell(net.glimpse_dim, net.hidden_size)
        policy_size = fix.where_hidden if fix.where_layer else net.hidden_size  # the state the policy reads
        self.locator = nn.Linear(policy_size, 2)  # mean of the location policy f_l
        self.log_std = nn.Parameter(torch.tensor(math.log(policy.std)),
                                    requires_grad=policy.std_mode == "learnable")
        # b_t, eq. 3: one linear map for every glimpse, or one per glimpse
        self.baseline = nn.Linear(policy_size, 1 if fix.baseline == "shared" else num_glimpses)
        self.classifier = nn.Linear(net.hidden_size, num_classes)  # f_a on h_T
        if fix.where_layer:  # DRAM's r2 on r1 (built last: the paper's RAM initialises as it did)
            self.where = cell(net.hidden_size, fix.where_hidden)
        if fix.context == "conv":
            self.context_net = ContextNetwork(in_chans, fix.context_size, context_channels, fix.where_hidden)
        elif fix.context == "map":
            self.context_net = ContextMap(in_chans, fix.context_size, context_channels, fix.context_temperature)

    # ------------------------------------------------------------------ policy
    def current_std(self) -> torch.Tensor | float:
        """sigma: a constant, a learned scalar, or linearly annealed (a Python float, no sync)."""
        policy = self.policy
        if policy.std_mode == "learnable":
            return self.log_std.exp()
        if policy.std_mode == "annealed":
            step = self.trainer.global_step if self._trainer is not None else policy.std_anneal_steps
            frac = min(1.0, step / max(1, policy.std_anneal_steps))
            return policy.std + (policy.std_final - policy.std) * frac
        return policy.std

    # ------------------------------------------------------------------ rollout
    def policy_noise(self, policy: str, batch_size: int, like: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor | None:
        """The random draws of one rollout, [T, B, 2], glimpse by glimpse: normals for "sample",
        uniforms in [0, 1) for "random", None for "mean"."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        if policy == "mean":
            return None
        draw = torch.randn if policy == "sample" else torch.rand
        return torch.stack([draw((batch_size, 2), generator=generator, device=like.device, dtype=like.dtype)
                            for _ in range(self.hparams.num_glimpses)])

    def _std_input(self, like: torch.Tensor) -> torch.Tensor | None:
        """The annealed sigma as a step input, a 0-d tensor (it changes every step: a compiled step
        must not see it as a constant), in float64 so that eager steps compute what they did with
        the Python float the released recipes were trained with. None otherwise: a fixed sigma is
        a constant and a learnable one is computed inside the step, where its gradient flows."""
        if self.policy.std_mode != "annealed":
            return None
        return torch.full((), self.current_std(), device=like.device, dtype=torch.float64)

    def rollout(self, images: torch.Tensor, policy: str = "sample",
                generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
                std: float | torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """All T glimpses of images [B, C, H, W] under `policy` ("sample", "mean" or "random"), with
        `noise` (`policy_noise`, else drawn from `generator`) and sigma `std` (else `current_std()`).
        -> logits [B, classes] (from h_T), step_logits [B, T, classes], locations [B, T, 2] (clamped,
        as read), log_probs [B, T], baselines [B, T], means [B, T, 2]."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.check_images(images)
        net, fix, loc = self.network, self.remedies, self.policy  # (`policy` names the rollout's)
        B, T = images.shape[0], self.hparams.num_glimpses
        if noise is None:
            noise = self.policy_noise(policy, B, images, generator)
        h = images.new_zeros(B, net.hidden_size)
        c = torch.zeros_like(h) if net.core == "lstm" else None
        if fix.where_layer:  # r2_0: the context network's proposal, or an empty state
            w = self.context_net(images) if fix.context == "conv" else images.new_zeros(B, fix.where_hidden)
            wc = torch.zeros_like(w) if net.core == "lstm" else None
        first = self.context_net(images) if fix.context == "map" else None  # mu_1 [B, 2], the map's soft arg max
        if std is None:
            std = self.current_std()  # a float, or a 0-d tensor when learnable (no host round trip)
        log_std = torch.log(std) if isinstance(std, torch.Tensor) else math.log(std)
        steps = []  # per glimpse: h_t, l_t, log pi(l_t | h_{t-1}), b_t, mu_t
        for t in range(T):
            # The switch: a detached state keeps REINFORCE inside the location network (with a
            # where layer, r2 is the location network's own state; its input r1 is detached below).
            h_policy = w if fix.where_layer else h if loc.reinforce_to_core else h.detach()
            if t == 0 and first is not None:
                mu = first  # already in [-1, 1]
            elif t > 0 and fix.step_pixels > 0:  # a move of at most step_pixels from l_{t-1} (a constant)
                mu = steps[-1][1] + torch.tanh(self.locator(h_policy)) * self._step_scale.to(images.dtype)
            else:
                mu = self.locator(h_policy)  # [B, 2], the policy's mean
                mu = torch.tanh(mu) if loc.location_mean == "tanh" else mu
            if policy == "sample":
                raw = (mu + std * noise[t]).detach()  # the action is a constant for every gradient
            elif policy == "mean":
                raw = mu.detach()
            else:
                raw = noise[t] * 2 - 1
            # log pi(l_t | h_{t-1}) of the raw sample, before clamping (eq. 2): the clamp is part
            # of the environment, not of the policy whose density REINFORCE differentiates.
            log_prob = (-((raw - mu) ** 2) / (2 * std ** 2) - log_std).sum(-1) - math.log(2 * math.pi)  # [B]
            location = raw.clamp(-1.0, 1.0)
            b = self.baseline(h_policy.detach())  # b_t from the detached state
            b = b.squeeze(-1) if fix.baseline == "shared" else b[:, t]
            h, c = _recur(self.core, self.glimpse(images, location), h, c)
            if fix.where_layer and t < T - 1:  # r2_t = f(r1_t, r2_{t-1}); the last one would propose nothing
                w, wc = _recur(self.where, h if loc.reinforce_to_core else h.detach(), w, wc)
            steps.append((h, location, log_prob, b, mu))
        states, locations, log_probs, baselines, means = (torch.stack(x, 1) for x in zip(*steps))
        step_logits = self.classifier(states)  # [B, T, classes]
        return {"logits": step_logits[:, -1], "step_logits": step_logits, "locations": locations,
                "log_probs": log_probs, "baselines": baselines, "means": means}

    def forward(self, images: torch.Tensor, policy: str = "mean") -> torch.Tensor:
        """images [B, C, H, W] -> logits [B, num_classes] (deterministic policy by default)."""
        return self.rollout(images, policy)["logits"]

    # ------------------------------------------------------------------ losses
    def returns(self, out: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """G [B, T], detached: the final reward R for every glimpse (the paper), or with `reward_at:
        every_glimpse` G_t = sum_{s >= t} r_s (glimpse t changes no reward before it)."""
        fix = self.remedies
        logits = out["step_logits"] if fix.reward_at == "every_glimpse" else out["logits"][:, None]  # [B, T or 1, C]
        if fix.reward == "correct":
            rewards = (logits.argmax(-1) == labels[:, None]).to(out["baselines"].dtype)
        else:
            rewards = logits.detach().log_softmax(-1).gather(-1, labels[:, None, None].expand(-1, logits.shape[1], 1))[..., 0]
        if fix.reward_at == "every_glimpse":
            return rewards.flip(1).cumsum(1).flip(1).detach()  # reward-to-go
        return rewards.expand_as(out["baselines"]).detach()

    def losses(self, out: dict[str, torch.Tensor], labels: torch.Tensor,
               targets: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The hybrid loss's terms and their weighted sum, from a rollout. targets: the item's
        centre [B, 2] in [-1, 1] (only for `location_supervision`)."""
        fix, policy = self.remedies, self.policy
        if fix.classify_every_glimpse:
            T = out["step_logits"].shape[1]
            ce = F.cross_entropy(out["step_logits"].flatten(0, 1), labels.repeat_interleave(T))
        else:
            ce = F.cross_entropy(out["logits"], labels)
        baselines = out["baselines"]  # [B, T]
        returns = self.returns(out, labels)  # [B, T]
        M, reference = policy.train_samples, baselines
        if M > 1:  # the M paths of an image (adjacent rows) are each other's baseline: leave-one-out
            reference = leave_one_out_baseline(returns.view(-1, M, returns.shape[1])).reshape(returns.shape)
        advantage = (returns - reference).detach()
        # eq. 3: sum over steps of log pi (R - b_t), averaged over the batch; minimised, so negated
        reinforce = -(out["log_probs"] * advantage).sum(1).mean()
        baseline_mse = F.mse_loss(baselines, returns)
        if policy.location_policy == "random":  # the paper's control: nothing to reinforce
            reinforce = reinforce * 0
        total = ce + policy.reinforce_weight * reinforce + policy.baseline_weight * baseline_mse
        terms = {"ce": ce, "reinforce": reinforce, "baseline_mse": baseline_mse, "reward": returns[:, 0].mean()}
        if fix.location_supervision > 0:
            if targets is None:
                raise UserError("RAM: remedies.location_supervision needs the item's box in every batch "
                                "(FashionMNISTDataModule with_boxes: true)")
            # weak supervision: every glimpse's policy mean onto the item's centre
            supervision = ((out["means"] - targets[:, None]) ** 2).sum(-1).mean()
            total = total + fix.location_supervision * supervision
            terms["location_mse"] = supervision
        return {"loss": total, **terms}

    def _policy(self, learned: str) -> str:  # learned: "sample" to train, "mean" to evaluate
        return "random" if self.policy.location_policy == "random" else learned

    # ------------------------------------------------------------------ steps (zoo.models.accel)
    def example_batch(self, n: int = 2, seed: int = 0):
        """(images, labels), plus the item's box [n, 4] where the recipe supervises the location
        (the batches of `FashionMNISTDataModule(with_boxes=true)`)."""
        images, labels = self.labelled_batch(n, seed)
        if self.remedies.location_supervision <= 0:
            return images, labels
        height, width = self.image_hw
        corner = torch.rand(n, 2, generator=torch.Generator().manual_seed(seed + 1)) * 0.5
        boxes = torch.cat([corner, corner + 0.5], 1) * torch.tensor([width, height, width, height])
        return images, labels, boxes

    def item_centres(self, boxes: torch.Tensor) -> torch.Tensor:
        """boxes [B, 4] (x0, y0, x1, y1 in pixel edges) -> their centres [B, 2] as locations in [-1, 1]."""
        height, width = self.image_hw
        size = boxes.new_tensor([width, height])
        return (boxes[:, :2] + boxes[:, 2:]) / size - 1

    def train_inputs(self, batch):
        images, labels, *boxes = batch
        targets = self.item_centres(boxes[0].to(images.dtype)) if boxes and self.remedies.location_supervision > 0 else None
        M = self.policy.train_samples
        if M > 1:  # eq. 2's M episodes, here per image
            images = images.repeat_interleave(M, 0)
            labels = labels.repeat_interleave(M, 0)
            targets = None if targets is None else targets.repeat_interleave(M, 0)
        noise = self.policy_noise(self._policy("sample"), images.shape[0], images)
        return {"images": images, "labels": labels, "noise": noise, "std": self._std_input(images), "targets": targets}

    def train_loss(self, images, labels, noise, std, targets=None):
        out = self.rollout(images, self._policy("sample"), noise=noise, std=std)
        terms = self.losses(out, labels, targets)
        return terms["loss"], {key: value.detach() for key, value in terms.items()}

    def log_step_metrics(self, stage, metrics, batch_size):
        super().log_step_metrics(stage, metrics, batch_size)
        if stage == "train":
            std = self.current_std()
            self.log("train/std", std.detach() if isinstance(std, torch.Tensor) else float(std))

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._eval_generator = torch.Generator(device=self.device).manual_seed(self.hparams.eval_seed)

    on_test_epoch_start = on_validation_epoch_start

    def eval_inputs(self, batch, stage):
        """The batch and, from the evaluation generator, the draws of the deterministic (none
        unless the policy is random), sampled, and for "test" the M-sample and random rollouts."""
        images, labels = batch[:2]
        n, gen, train_policy = images.shape[0], self._eval_generator, self._policy("sample")
        inputs = {"images": images, "labels": labels,
                  "det_noise": self.policy_noise(self._policy("mean"), n, images, gen),
                  "sampled_noise": self.policy_noise(train_policy, n, images, gen)}
        if stage == "test":
            inputs["many_noise"] = self.policy_noise(train_policy, n * self.hparams.eval_samples, images, gen)
            inputs["random_noise"] = self.policy_noise("random", n, images, gen)
        return {**inputs, "std": self._std_input(images)}

    def eval_metrics(self, stage, images, labels, det_noise, sampled_noise, std, many_noise=None, random_noise=None):
        n, hp = images.shape[0], self.hparams
        det = self.rollout(images, self._policy("mean"), noise=det_noise, std=std)
        sampled = self.rollout(images, self._policy("sample"), noise=sampled_noise, std=std)
        metrics = {"loss": F.cross_entropy(det["logits"], labels), "acc": _accuracy(det["logits"], labels)}
        if stage == "test":
            metrics["error_pct"] = 100 * (1 - metrics["acc"])
        metrics["acc_sampled"] = _accuracy(sampled["logits"], labels)
        if stage != "test":
            return metrics
        # M trajectories per image in one batched rollout; average the class probabilities
        m = hp.eval_samples
        many = self.rollout(images.repeat_interleave(m, 0), self._policy("sample"), noise=many_noise, std=std)
        probs = many["logits"].softmax(-1).view(n, m, -1).mean(1)
        metrics[f"acc_mc{m}"] = _accuracy(probs, labels)
        for t in range(hp.num_glimpses):
            metrics[f"acc_glimpses_{t + 1}"] = _accuracy(det["step_logits"][:, t], labels)
        metrics["acc_random"] = _accuracy(self.rollout(images, "random", noise=random_noise, std=std)["logits"], labels)
        return metrics

    # ------------------------------------------------------------------ where it looked
    @torch.no_grad()
    def attention_record(self, images: torch.Tensor, policy: str | None = None):
        """One step per glimpse of images [B, C, H, W], a box per retina scale, on the "mean" path
        (the default, unless the policy is random) or a "sample"d one."""
        from zoo.attention import record

        if policy not in (None, "mean", "sample"):
            raise ValueError(f"policy must be mean or sample, got {policy!r}")
        out = self.rollout(images, self._policy("mean") if policy is None else self._policy("sample")
                           if policy == "sample" else "mean")
        B, T = out["locations"].shape[:2]
        boxes = self.glimpse.retina.boxes(out["locations"].flatten(0, 1), *self.image_hw).view(B, T, -1, 4)
        probs = out["logits"].softmax(-1)
        return record.AttentionRecord(
            family=self.family, kind="glimpse", maps=record.maps_from_boxes(boxes, self.image_hw),
            labels=record.step_labels("glimpse", B, T), step_mask=record.full_mask(B, T, images.device),
            boxes=boxes, box_labels=[f"scale {k + 1}" for k in range(boxes.shape[2])],
            prediction={"probs": probs, "label": probs.argmax(-1), "class_names": self.hparams.class_names})

    def export_forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, C, H, W] -> (logits [B, classes], locations [B, T, 2]) with the mean policy."""
        out = self.rollout(images, "mean")
        return out["logits"], out["locations"]

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        opt = self.optimization
        params = [p for p in self.parameters() if p.requires_grad]
        if opt.location_lr_scale != 1.0:
            # The location network (f_l, DRAM's where layer and context network) learns from
            # REINFORCE alone: its own step size damps the random walk of a noisy policy gradient.
            parts = [self.locator] + [getattr(self, n) for n in ("where", "context_net") if hasattr(self, n)]
            location = [p for part in parts for p in part.parameters()]
            located = {id(p) for p in location}
            params = [{"params": [p for p in params if id(p) not in located]},
                      {"params": location, "lr": opt.lr * opt.location_lr_scale}]
        # the paper: SGD with momentum 0.9; the recipes: Adam
        return optim.configure(self, params, opt.optimizer, lr=opt.lr, momentum=opt.momentum,
                               weight_decay=opt.weight_decay, schedule=opt.lr_schedule)


def _recur(cell: nn.RNNCell | nn.LSTMCell, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None):
    """One step of an RNN cell (c None) or an LSTM cell: -> (h, c)."""
    return (cell(x, h), None) if c is None else cell(x, (h, c))


def _accuracy(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (scores.argmax(-1) == labels).float().mean()
