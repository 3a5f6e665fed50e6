"""RAM: gradients flow exactly where the hybrid loss says, the policy's log-probability is taken
before clamping, evaluation metrics, a tiny fit, checkpoint round-trips and `zoo attend` on RAM."""
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

import zoo
from zoo.commands.cli import main as zoo_main
from zoo.guards.errors import UserError
from zoo.hparams import block_types
from zoo.models.ram import RAM
from zoo.weights import hub

TINY = dict(image_size=20, in_chans=1, num_classes=4, retina=dict(patch_size=4, num_scales=2), num_glimpses=3,
            network=dict(glimpse_hidden=16, location_hidden=8, glimpse_dim=24, hidden_size=32),
            class_names=["zero", "one", "two", "three"], eval_samples=3, num_figures=2)
#: block -> its fields (zoo.hparams.Block): `tiny` places an override by its field name
FIELDS = {block: set(cls.__dataclass_fields__) for block, cls in block_types(RAM).items()}


def tiny(**overrides) -> RAM:
    """The tiny RAM with `overrides`, each a top-level argument or a field of its block."""
    args = {key: dict(value) if key in FIELDS else value for key, value in TINY.items()}
    for key, value in overrides.items():
        block = next((b for b, fields in FIELDS.items() if key in fields), None)
        if block is None:
            args[key] = value
        else:
            args.setdefault(block, {})[key] = value
    torch.manual_seed(0)
    return RAM(**args)


def batch(n=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 20, 20, generator=gen), torch.randint(0, 4, (n,), generator=gen)


def _parts(name):
    return lambda m: list(getattr(m, name).parameters()) if hasattr(m, name) else []


GROUPS = {
    "glimpse": _parts("glimpse"),
    "core": _parts("core"),
    "locator": _parts("locator"),
    "log_std": lambda m: [m.log_std],
    "baseline": _parts("baseline"),
    "classifier": _parts("classifier"),
    "where": _parts("where"),  # DRAM's r2
    "context": _parts("context_net"),
}


def reached(model, loss) -> set[str]:
    """Parameter groups that receive a non-zero gradient from `loss`."""
    params = {name: [p for p in get(model) if p.requires_grad] for name, get in GROUPS.items()}
    flat = [p for ps in params.values() for p in ps]
    grads = dict(zip(map(id, flat), torch.autograd.grad(loss, flat, retain_graph=True, allow_unused=True)))
    return {name for name, ps in params.items()
            if any(grads[id(p)] is not None and grads[id(p)].abs().sum() > 0 for p in ps)}


@pytest.mark.parametrize("core", ["rnn", "lstm"])
@pytest.mark.parametrize("to_core", [False, True])
def test_gradients_flow_exactly_where_intended(core, to_core):
    model = tiny(core=core, reinforce_to_core=to_core, std_mode="learnable")
    images, labels = batch()
    out = model.rollout(images, "sample")
    terms = model.losses(out, labels)
    # cross-entropy: classifier, core, glimpse network; never the location policy or baseline
    assert reached(model, terms["ce"]) == {"classifier", "core", "glimpse"}
    # REINFORCE: the location network (mean and learnable std); core and glimpse net only if switched on
    expected = {"locator", "log_std"} | ({"core", "glimpse"} if to_core else set())
    assert reached(model, terms["reinforce"]) == expected
    # the baseline is trained by its MSE and nothing else, and the MSE trains nothing else
    assert reached(model, terms["baseline_mse"]) == {"baseline"}
    total = reached(model, terms["loss"])
    assert total == {"classifier", "core", "glimpse", "locator", "log_std", "baseline"}


def test_log_prob_is_of_the_raw_sample_before_clamping():
    """Push the policy's mean far outside the image: the locations read are clamped to the border,
    but the log-probability is the Gaussian density of the unclamped sample."""
    model = tiny(location_mean="linear", std=0.2)
    with torch.no_grad():
        model.locator.weight.zero_()
        model.locator.bias.copy_(torch.tensor([3.0, -2.5]))
    images, _ = batch()
    out = model.rollout(images, "sample", generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    mu = torch.tensor([3.0, -2.5])
    for t in range(TINY["num_glimpses"]):
        raw = mu + 0.2 * torch.randn(images.shape[0], 2, generator=gen)
        expected = torch.distributions.Normal(mu, 0.2).log_prob(raw).sum(-1)
        torch.testing.assert_close(out["log_probs"][:, t], expected)
        torch.testing.assert_close(out["locations"][:, t], raw.clamp(-1, 1))
    assert torch.equal(out["locations"].abs(), torch.ones_like(out["locations"]))


def test_mean_policy_is_deterministic_and_batch_independent():
    """The batched rollout equals running each image alone (a slow per-sample reference)."""
    model = tiny().eval()
    images, _ = batch(5)
    with torch.no_grad():
        out = model.rollout(images, "mean")
        again = model.rollout(images, "mean")
        single = [model.rollout(images[i:i + 1], "mean") for i in range(5)]
    torch.testing.assert_close(out["logits"], again["logits"], rtol=0, atol=0)
    torch.testing.assert_close(out["logits"], torch.cat([s["logits"] for s in single]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["locations"], torch.cat([s["locations"] for s in single]), rtol=1e-5, atol=1e-6)
    # the first location comes from the empty state: the same for every image
    assert torch.allclose(out["locations"][:, 0], out["locations"][:1, 0].expand(5, 2))
    torch.testing.assert_close(out["step_logits"][:, -1], out["logits"])


def test_std_modes():
    assert tiny(std=0.1).current_std() == 0.1
    learnable = tiny(std=0.1, std_mode="learnable")
    assert isinstance(learnable.current_std(), torch.Tensor)
    assert math.isclose(float(learnable.current_std().detach()), 0.1, rel_tol=1e-6)
    assert not tiny(std=0.1).log_std.requires_grad

    class FakeTrainer:
        global_step = 0

    annealed = tiny(std=0.2, std_mode="annealed", std_final=0.05, std_anneal_steps=100)
    annealed._trainer = FakeTrainer()
    assert math.isclose(annealed.current_std(), 0.2)
    FakeTrainer.global_step = 50
    assert math.isclose(annealed.current_std(), 0.125)
    FakeTrainer.global_step = 500
    assert math.isclose(annealed.current_std(), 0.05)
    annealed._trainer = None


def test_random_policy_control_has_no_reinforce_gradient():
    model = tiny(location_policy="random")
    images, labels = batch()
    terms = model.losses(model.rollout(images, "random"), labels)
    assert reached(model, terms["reinforce"]) == set()


def test_bad_hyperparameters_and_images():
    with pytest.raises(UserError):
        tiny(core="gru")
    with pytest.raises(UserError):
        tiny(std_mode="cosine")
    with pytest.raises(UserError, match="expects"):
        tiny()(torch.zeros(2, 1, 28, 28))
    with pytest.raises(UserError, match="location_lr_scale"):
        tiny(location_lr_scale=0)


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_location_network_learns_at_its_own_rate(scale):
    model = tiny(lr=0.01, location_lr_scale=scale)
    optimizer = model.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    rates = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sorted(rates) == sorted(id(p) for p in trainable)  # every trainable parameter, once
    located = {id(p) for p in model.locator.parameters()}
    assert [rates[k] for k in located] == pytest.approx([0.01 * scale] * len(located))
    assert {rates[k] for k in rates if k not in located} == {0.01}
    assert len(optimizer.param_groups) == (1 if scale == 1.0 else 2)  # old checkpoints' optimizer state still loads


# ----------------------------------------------------------------------------- training, metrics
def loaders(n=48):
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(n, 1, 20, 20, generator=gen)
    labels = torch.randint(0, 4, (n,), generator=gen)
    data = TensorDataset(images, labels)
    return DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny fit with checkpointing on val/acc, as the recipes do."""
    root = tmp_path_factory.mktemp("ram_fit")
    L.seed_everything(0)
    model = tiny()
    train, val = loaders()
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "checkpoints", monitor="val/acc",
                                                     mode="max", save_last=True)
    trainer = L.Trainer(max_epochs=2, default_root_dir=root, logger=False, callbacks=[checkpoint],
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, train, val)
    assert checkpoint.best_model_path
    # Lightning 2.6 refreshes last.ckpt only when a monitored checkpoint is saved; write the final
    # state explicitly so the round-trip compares like with like.
    final = root / "final.ckpt"
    trainer.save_checkpoint(final)
    return model, trainer, final, root


def test_fit_runs_and_logs(trained):
    model, trainer, ckpt, _ = trained
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/ce", "train/reinforce", "train/baseline_mse", "val/acc", "val/acc_sampled"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert ckpt.is_file()


def test_test_metrics(trained):
    model, trainer, _, _ = trained
    _, val = loaders()
    metrics = trainer.test(model, val, verbose=False)[0]
    T = TINY["num_glimpses"]
    expected = {"test/loss", "test/acc", "test/error_pct", "test/acc_sampled", "test/acc_mc3",
                "test/acc_random", *(f"test/acc_glimpses_{t}" for t in range(1, T + 1))}
    assert expected <= set(metrics)
    assert metrics[f"test/acc_glimpses_{T}"] == pytest.approx(metrics["test/acc"])
    # the deterministic accuracy, computed here directly, is what test/acc reports
    model.eval()
    with torch.no_grad():
        direct = torch.cat([(model(x).argmax(-1) == y).float() for x, y in val]).mean()
    assert metrics["test/acc"] == pytest.approx(float(direct), abs=1e-6)
    # evaluation is seeded: the sampled metrics repeat exactly
    again = trainer.test(model, val, verbose=False)[0]
    assert again["test/acc_mc3"] == metrics["test/acc_mc3"]
    assert again["test/acc_random"] == metrics["test/acc_random"]


def test_checkpoint_round_trip(trained, tmp_path):
    model, _, ckpt, _ = trained
    images, _ = batch(6)
    model.eval()
    loaded = zoo.load_checkpoint(ckpt).eval()
    assert isinstance(loaded, RAM) and loaded.family == "ram"
    assert loaded.hparams.class_names == TINY["class_names"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images), rtol=0, atol=0)
    # released form: safetensors with the config inside
    path = tmp_path / "ram.safetensors"
    hub.save_release(model, model.zoo_config(), path)
    released = zoo.load_checkpoint(path).eval()
    with torch.no_grad():
        torch.testing.assert_close(released(images), model(images), rtol=0, atol=0)


def test_the_attention_record_follows_the_policy_asked_for(trained):
    """`zoo attend --record policy=sample` draws one sampled path (what `zoo glimpses --policy
    sample` drew); the default is the deterministic path that `zoo export` returns."""
    model, _, _, _ = trained
    images, _ = batch(3)
    model.eval()
    mean = model.attention_record(images)
    locations = model.export_forward(images)[1]  # [B, T, 2] in [-1, 1]
    centres = (mean.boxes[:, :, 0, :2] + mean.boxes[:, :, 0, 2:]) / 2  # the finest scale's box centre
    H, W = model.input_size
    torch.testing.assert_close(centres, (locations + 1) / 2 * torch.tensor([W, H]), atol=1e-4, rtol=0)
    torch.manual_seed(0)
    sampled = model.attention_record(images, policy="sample")
    assert sampled.boxes.shape == mean.boxes.shape and not torch.allclose(sampled.boxes, mean.boxes)
    with pytest.raises(ValueError, match="policy must be mean or sample"):
        model.attention_record(images, policy="random")


# ----------------------------------------------------------------------------- CLI
def save_png(path, array):
    Image.fromarray(array).save(path)
    return str(path)


@pytest.fixture()
def images_dir(tmp_path):
    rng = np.random.default_rng(0)
    return {
        "good": save_png(tmp_path / "good.png", rng.integers(0, 255, (20, 20), dtype=np.uint8)),
        "grey_rgb": save_png(tmp_path / "grey_rgb.png", np.repeat(rng.integers(0, 255, (20, 20, 1), dtype=np.uint8), 3, 2)),
        "colour": save_png(tmp_path / "colour.png", rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)),
        "big": save_png(tmp_path / "big.png", rng.integers(0, 255, (28, 28), dtype=np.uint8)),
        "broken": str(Path(tmp_path / "broken.png").write_bytes(b"not a png") and tmp_path / "broken.png"),
    }


def run_cli(args, capsys):
    code = zoo_main(["attend", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_cli_draws_figures(trained, images_dir, tmp_path, capsys):
    _, _, ckpt, _ = trained
    out = tmp_path / "figs"
    code, stdout, err = run_cli([images_dir["good"], images_dir["grey_rgb"], "--checkpoint", ckpt, "--out", out],
                                capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["good_attend.png", "grey_rgb_attend.png"]
    assert Image.open(out / "good_attend.png").size[0] > 100
    assert len(stdout.strip().splitlines()) == 2 and "good.png" in stdout
    assert err == ""


@pytest.mark.slow
@pytest.mark.parametrize("which,message", [("big", "expects 20x20"), ("colour", "colour image"),
                                           ("broken", "not a readable image")])
def test_cli_bad_images(trained, images_dir, tmp_path, capsys, which, message):
    _, _, ckpt, _ = trained
    code, _, err = run_cli([images_dir[which], "--checkpoint", ckpt, "--out", tmp_path / "o"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not list((tmp_path / "o").glob("*"))


@pytest.mark.slow
def test_cli_partly_bad_batch_and_a_sampled_path(trained, images_dir, tmp_path, capsys):
    _, _, ckpt, _ = trained
    code, stdout, err = run_cli([images_dir["good"], images_dir["big"], "--checkpoint", ckpt,
                                 "--out", tmp_path / "o", "--json", "--record", "policy=sample"], capsys)
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    import json
    records = json.loads(stdout)
    assert len(records) == 1 and len(records[0]["steps"]) == TINY["num_glimpses"]
    code, _, err = run_cli([images_dir["good"], "--checkpoint", ckpt, "--out", tmp_path / "o2",
                            "--record", "policy=random"], capsys)
    assert code == 2 and err.strip() == "zoo attend: error: --record: policy must be mean or sample, got 'random'"
    code, _, err = run_cli([images_dir["good"], "--checkpoint", ckpt, "--out", tmp_path / "o2",
                            "--record", "heads=true"], capsys)
    assert code == 2 and err.strip() == "zoo attend: error: --record heads: RAM's attention record takes policy"


@pytest.mark.slow
def test_cli_missing_checkpoint_and_console_entry(images_dir, tmp_path):
    """The installed entry point, in a real process: a missing file is one line and exit 2."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "-m", "zoo.commands.cli", "attend", images_dir["good"], "--checkpoint",
                             str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "nope.ckpt" in result.stderr


def test_several_paths_per_image_baseline_each_other_leave_one_out():
    model = tiny(train_samples=3)
    images, labels = batch(n=4)
    inputs = model.train_inputs((images, labels))
    assert inputs["images"].shape[0] == 12 and torch.equal(inputs["labels"], labels.repeat_interleave(3))
    assert torch.equal(inputs["images"][3:6], images[1:2].expand(3, -1, -1, -1))  # an image's paths are adjacent
    out = model.rollout(inputs["images"], "sample", noise=inputs["noise"])
    out["log_probs"].retain_grad()
    terms = model.losses(out, inputs["labels"])
    terms["reinforce"].backward()
    reward = (out["logits"].argmax(-1) == inputs["labels"]).float()
    T = out["log_probs"].shape[1]
    for i in range(12):  # d reinforce / d log pi_i,t = -(R_i - mean of the other paths of its image) / rows
        image = i // 3
        others = [reward[j].item() for j in range(3 * image, 3 * image + 3) if j != i]
        advantage = reward[i].item() - sum(others) / 2
        assert torch.allclose(out["log_probs"].grad[i], torch.full((T,), -advantage / 12), atol=1e-6)
    with pytest.raises(UserError, match="train_samples"):
        tiny(train_samples=0)


def test_the_annealed_sigma_as_a_float64_step_input_equals_the_python_float():
    """The released recipes were trained eagerly with sigma as a Python float; the step input is a
    0-d float64 tensor (so a compiled step does not bake it in), and eager rollouts, losses and
    gradients must not move by a bit."""
    model = tiny(std_mode="annealed", std=0.17, std_final=0.03)
    images, labels = batch(n=8)
    noise = model.policy_noise("sample", 8, images)
    for std in (0.17, 0.1234567, 0.0712345678):
        runs = []
        for given in (std, torch.tensor(std, dtype=torch.float64)):
            model.zero_grad(set_to_none=True)
            out = model.rollout(images, "sample", noise=noise, std=given)
            terms = model.losses(out, labels)
            terms["loss"].backward()
            runs.append((out, terms, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (out_f, terms_f, grads_f), (out_t, terms_t, grads_t) = runs
        assert all(torch.equal(out_f[k], out_t[k]) for k in out_f)
        assert all(torch.equal(terms_f[k], terms_t[k]) for k in terms_f)
        assert len(grads_f) == len(grads_t) and all(torch.equal(a, b) for a, b in zip(grads_f, grads_t))
    assert model._std_input(images).dtype == torch.float64


# ----------------------------------------------------------------------------- remedies (issue 33)
DRAM = dict(where_layer=True, where_hidden=20, context="conv", context_size=5, context_channels=[3, 2])


@pytest.mark.parametrize("core", ["rnn", "lstm"])
@pytest.mark.parametrize("to_core", [False, True])
@pytest.mark.parametrize("context", ["none", "conv", "map", "map+steps"])
def test_where_layer_and_context_gradients_flow_exactly_where_intended(core, to_core, context):
    """DRAM: cross-entropy trains the what-pathway (r1, glimpse network, classifier) and never the
    where layer or the context network; REINFORCE trains the where-pathway (locator, r2, context)
    and reaches r1 only with reinforce_to_core; the baseline only by its MSE."""
    steps = {"context": "map", "step_pixels": 3.0} if context == "map+steps" else {"context": context}
    model = tiny(core=core, reinforce_to_core=to_core, std_mode="learnable", **{**DRAM, **steps})
    images, labels = batch()
    terms = model.losses(model.rollout(images, "sample"), labels)
    assert reached(model, terms["ce"]) == {"classifier", "core", "glimpse"}
    where = {"locator", "log_std", "where"} | ({"context"} if context != "none" else set())
    assert reached(model, terms["reinforce"]) == where | ({"core", "glimpse"} if to_core else set())
    assert reached(model, terms["baseline_mse"]) == {"baseline"}
    assert reached(model, terms["loss"]) == where | {"classifier", "core", "glimpse", "baseline"}


@pytest.mark.parametrize("reward", ["correct", "log_prob"])
@pytest.mark.parametrize("reward_at", ["last", "every_glimpse"])
def test_shaped_rewards_are_constants_for_every_gradient(reward, reward_at):
    """However the reward is computed (a log-probability from the classifier, at every glimpse),
    it is a constant: REINFORCE still trains only the location network, the per-glimpse
    cross-entropy only the what-pathway."""
    model = tiny(reward=reward, reward_at=reward_at, classify_every_glimpse=True, baseline="per_glimpse", **DRAM)
    images, labels = batch()
    terms = model.losses(model.rollout(images, "sample"), labels)
    assert reached(model, terms["reinforce"]) == {"locator", "where", "context"}
    assert reached(model, terms["ce"]) == {"classifier", "core", "glimpse"}
    assert reached(model, terms["baseline_mse"]) == {"baseline"}


@pytest.mark.parametrize("reward", ["correct", "log_prob"])
@pytest.mark.parametrize("reward_at", ["last", "every_glimpse"])
def test_returns_equal_a_slow_reference(reward, reward_at):
    model = tiny(reward=reward, reward_at=reward_at)
    images, labels = batch()
    out = model.rollout(images, "sample", generator=torch.Generator().manual_seed(3))
    returns = model.returns(out, labels)
    T = TINY["num_glimpses"]
    for i in range(len(images)):
        def earned(t):  # what the prediction after glimpse t + 1 earns
            logits = out["step_logits"][i, t]
            if reward == "correct":
                return float(logits.argmax() == labels[i])
            return float(torch.log_softmax(logits.detach(), -1)[labels[i]])
        for t in range(T):
            expected = sum(earned(s) for s in range(t, T)) if reward_at == "every_glimpse" else earned(T - 1)
            assert returns[i, t].item() == pytest.approx(expected, abs=1e-5)
    assert not returns.requires_grad


def test_leave_one_out_baselines_per_glimpse_return():
    model = tiny(train_samples=3, reward="log_prob", reward_at="every_glimpse")
    images, labels = batch(n=4)
    inputs = model.train_inputs((images, labels))
    out = model.rollout(inputs["images"], "sample", noise=inputs["noise"])
    out["log_probs"].retain_grad()
    model.losses(out, inputs["labels"])["reinforce"].backward()
    returns = model.returns(out, inputs["labels"])
    for i in range(12):
        others = [j for j in range(3 * (i // 3), 3 * (i // 3) + 3) if j != i]
        advantage = returns[i] - returns[others].mean(0)  # per glimpse
        torch.testing.assert_close(out["log_probs"].grad[i], -advantage / 12)


def test_classify_every_glimpse_averages_the_cross_entropy_over_glimpses():
    model = tiny(classify_every_glimpse=True)
    images, labels = batch()
    out = model.rollout(images, "sample")
    expected = torch.stack([torch.nn.functional.cross_entropy(out["step_logits"][:, t], labels)
                            for t in range(TINY["num_glimpses"])]).mean()
    torch.testing.assert_close(model.losses(out, labels)["ce"], expected)


def test_per_glimpse_baseline_has_its_own_weights_per_glimpse():
    model = tiny(baseline="per_glimpse")
    images, _ = batch()
    noise = model.policy_noise("sample", len(images), images)
    with torch.no_grad():
        before = model.rollout(images, "sample", noise=noise)["baselines"]
        model.baseline.weight[1] += 1.0
        after = model.rollout(images, "sample", noise=noise)["baselines"]
    assert torch.equal(before[:, [0, 2]], after[:, [0, 2]]) and not torch.equal(before[:, 1], after[:, 1])
    assert tiny().baseline.out_features == 1  # the paper's shared baseline


@pytest.mark.parametrize("context", ["conv", "map"])
def test_the_context_proposes_the_first_glimpse_but_the_classifier_never_reads_it(context):
    model = tiny(**{**DRAM, "context": context}).eval()
    images, _ = batch(5)
    with torch.no_grad():
        first = model.rollout(images, "mean")["locations"][:, 0]
        assert (first - first[:1]).abs().max() > 0  # image-dependent, unlike the empty state's
        blind = tiny(**{**DRAM, "context": "none"}).rollout(images, "mean")["locations"][:, 0]
        assert torch.equal(blind, blind[:1].expand(5, 2))  # without context: one place for every image
        placed = torch.rand(TINY["num_glimpses"], 5, 2, generator=torch.Generator().manual_seed(1))
        logits = model.rollout(images, "random", noise=placed)["logits"]
        for p in model.context_net.parameters():
            p.add_(torch.randn_like(p))
        torch.testing.assert_close(model.rollout(images, "random", noise=placed)["logits"], logits, rtol=0, atol=0)


@pytest.mark.parametrize("options", [DRAM, {**DRAM, "core": "lstm", "baseline": "per_glimpse"},
                                     {**DRAM, "context": "map"}, {**DRAM, "context": "map", "step_pixels": 3.0}])
def test_dram_batched_rollout_equals_one_image_at_a_time(options):
    model = tiny(**options).eval()
    images, _ = batch(5)
    noise = model.policy_noise("sample", 5, images, torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model.rollout(images, "sample", noise=noise)
        single = [model.rollout(images[i:i + 1], "sample", noise=noise[:, i:i + 1]) for i in range(5)]
    for key in ("logits", "locations", "log_probs", "baselines"):
        torch.testing.assert_close(out[key], torch.cat([s[key] for s in single]), rtol=1e-5, atol=1e-6)


def test_the_context_map_is_a_soft_arg_max_over_the_view_cells():
    """context: map's first glimpse is sum_i p_i c_i over the coarse view's cells (a slow loop
    here), and its scores are local: a bright item moved anywhere moves the glimpse with it."""
    from zoo.models.ram import ContextMap

    torch.manual_seed(0)
    net = ContextMap(1, 6, [3])
    images = torch.rand(3, 1, 24, 24)
    view = torch.nn.functional.adaptive_avg_pool2d(images, 6)
    scores = net.convs(view)[:, 0]  # [B, 6, 6]
    for b in range(3):
        p = scores[b].flatten().softmax(0).view(6, 6)
        expected = torch.zeros(2)
        for row in range(6):
            for col in range(6):
                expected += p[row, col] * torch.tensor([(2 * col + 1) / 6 - 1, (2 * row + 1) / 6 - 1])
        torch.testing.assert_close(net(images)[b], expected)
    sharp = ContextMap(1, 6, [3], temperature=0.25)
    sharp.load_state_dict(net.state_dict())
    torch.testing.assert_close(sharp.probs(images), (scores.flatten(1) * 4).softmax(-1))
    detector = ContextMap(1, 10, [])  # one 3x3 convolution: score = 50 x the cell's brightness
    with torch.no_grad():
        detector.convs[0].weight.zero_()
        detector.convs[0].weight[0, 0, 1, 1] = 50.0
        detector.convs[0].bias.zero_()
    for row, col in [(0, 0), (3, 7), (9, 2), (5, 5)]:
        canvas = torch.zeros(1, 1, 40, 40)
        canvas[..., 4 * row:4 * row + 4, 4 * col:4 * col + 4] = 1.0  # one bright cell
        torch.testing.assert_close(detector(canvas)[0], torch.tensor([(2 * col + 1) / 10 - 1, (2 * row + 1) / 10 - 1]),
                                   atol=1e-3, rtol=0)


@pytest.mark.parametrize("policy", ["mean", "sample"])
def test_with_step_pixels_each_later_glimpse_moves_at_most_that_far_from_the_last(policy):
    """mu_t = l_{t-1} + s tanh(f_l(r2_t)): each later mean lies within s pixels of where the last
    glimpse looked (the read location, a constant), whatever the weights."""
    model = tiny(**{**DRAM, "context": "map", "step_pixels": 2.5}).eval()
    with torch.no_grad():
        model.locator.weight.mul_(100)  # saturate the tanh: moves of the full step
    images, _ = batch(6)
    out = model.rollout(images, policy, generator=torch.Generator().manual_seed(0))
    moves = (out["means"][:, 1:] - out["locations"][:, :-1]) * 20 / 2  # [B, T-1, 2] in pixels (20 px canvas)
    assert moves.abs().max() <= 2.5 + 1e-5 and moves.abs().max() > 2.4
    absolute = tiny(**{**DRAM, "context": "map"}).eval()
    assert absolute._step_scale.abs().sum() == 0  # the paper's absolute means by default


def test_location_supervision_trains_only_the_location_network_and_needs_boxes():
    model = tiny(location_supervision=1.0, **DRAM)
    images, labels = batch(4)
    boxes = torch.tensor([[0.0, 0.0, 20.0, 20.0], [0, 0, 10, 10], [10, 10, 20, 20], [5, 0, 15, 10]])
    torch.testing.assert_close(model.item_centres(boxes), torch.tensor([[0.0, 0.0], [-0.5, -0.5], [0.5, 0.5], [0.0, -0.5]]))
    inputs = model.train_inputs((images, labels, boxes))
    out = model.rollout(inputs["images"], "sample", noise=inputs["noise"])
    terms = model.losses(out, labels, inputs["targets"])
    assert reached(model, terms["location_mse"]) == {"locator", "where", "context"}
    torch.testing.assert_close(terms["location_mse"], ((out["means"] - inputs["targets"][:, None]) ** 2).sum(-1).mean())
    with pytest.raises(UserError, match="with_boxes"):
        model.losses(out, labels)
    assert model.train_inputs((images, labels, boxes)) and tiny().train_inputs((images, labels, boxes))["targets"] is None


@pytest.mark.parametrize("args,message", [
    ({"context": "conv"}, "needs remedies.where_layer"),
    ({"context": "map"}, "needs remedies.where_layer"),
    ({**DRAM, "context": "map", "context_size": 0}, "context view is empty"),
    ({**DRAM, "context": "map", "context_temperature": 0.0}, "context_temperature must be positive"),
    ({**DRAM, "step_pixels": -1.0}, "step_pixels must be >= 0"),
    ({**DRAM, "step_pixels": float("inf")}, "step_pixels must be >= 0"),
    ({**DRAM, "context": "map", "context_temperature": float("nan")}, "context_temperature must be positive"),
    ({**DRAM, "context_size": 0}, "context view is empty"),
    ({**DRAM, "context_channels": [3, 0]}, "context view is empty"),
    ({**DRAM, "context_size": -3}, "sane range"),
    ({"train_samples": 10 ** 6}, "train_samples: 1000000 is outside the sane range"),
    ({"std": -0.1}, "positive"),
    ({"std": float("nan")}, "positive"),
    ({"reward": "accuracy"}, "reward must be one of"),
    ({"baseline": "mlp"}, "baseline must be one of"),
    ({"location_supervision": -1.0}, "location_supervision"),
])
def test_absurd_estimator_settings_are_refused_in_one_line(args, message):
    with pytest.raises(UserError, match=message) as info:
        tiny(**args)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_train_py_refuses_an_absurd_estimator_setting_before_training(tmp_path):
    """A recipe asking for 10^6 paths per image is one line and exit 2 before any data is read."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "train.py", "fit", "--config", "configs/ram/fmnist_cluttered60_4glimpses.yaml",
                             "--model.init_args.policy.train_samples", "1000000", "--trainer.default_root_dir", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "train_samples" in result.stderr
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("script", sorted(p.name for p in (Path(__file__).resolve().parent.parent / "scripts")
                                           .glob("gpu_runs_*.sh")))
def test_the_gpu_run_list_names_recipes_that_exist_and_refuses_an_unknown_tier(script):
    """scripts/gpu_runs_<prefix>.sh: every line is `results_run.py RECIPE --seeds N` of a committed
    recipe of configs/<prefix>, whose registry name is the results' name, each (recipe, seed) once; a
    tier it does not have is one line and exit 2."""
    from zoo import registry

    repo = Path(__file__).resolve().parent.parent
    for last in (3, 2, 1):  # every tier the script has (it has at least one)
        listed = subprocess.run(["bash", f"scripts/{script}", "list", *map(str, range(1, last + 1))], cwd=repo,
                                capture_output=True, text=True, timeout=60)
        if listed.returncode != 2 or "no tier" not in listed.stderr:  # only a missing tier retries with fewer
            break
    assert listed.returncode == 0, listed.stderr
    runs = [line.split()[-3::2] for line in listed.stdout.splitlines()]  # [recipe, seed]
    assert runs and len({tuple(r) for r in runs}) == len(runs)
    assert all((repo / recipe).is_file() and seed.isdigit() for recipe, seed in runs)
    prefix = script.removeprefix("gpu_runs_").removesuffix(".sh")
    for recipe, _ in runs:  # results/<prefix>_<recipe stem>_seed<N>.json is the registry name's
        assert registry.get_entry(f"{prefix}_{Path(recipe).stem}").metadata["recipe_file"] == recipe
    bad = subprocess.run(["bash", f"scripts/{script}", "list", "9"], cwd=repo, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_gpu_run_list_resumes_only_lines_a_time_limit_stopped(tmp_path):
    """`gpu_runs_ram.sh resume`: a line whose results JSON exists is done; a line with a last.ckpt
    continues from it (`--ckpt_path last`, same seed and run folder) and is then evaluated with
    `results_run.py --eval-only`; a line never started is left alone."""
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "scripts").mkdir()
    for script in ("gpu_runs_ram.sh", "gpu_lines.sh"):  # the script and the stages it shares
        (tmp_path / "scripts" / script).write_text((repo / "scripts" / script).read_text())
    (tmp_path / "results").mkdir()
    (tmp_path / "results/ram_fmnist_cluttered60_dram_seed0.json").write_text("{}")
    stopped = tmp_path / "runs/results/ram_fmnist_cluttered60_dram/seed1/checkpoints"
    stopped.mkdir(parents=True)
    (stopped / "last.ckpt").write_bytes(b"")
    (stopped.parents[1] / "seed0/checkpoints").mkdir(parents=True)
    (stopped.parents[1] / "seed0/checkpoints/last.ckpt").write_bytes(b"")  # finished: not resumed
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "fake_python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", "scripts/gpu_runs_ram.sh", "resume", "1"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PY": str(fake), "JOBS": "1"})
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines() == [
        "train.py fit --config configs/ram/fmnist_cluttered60_dram.yaml --seed_everything 1 "
        "--trainer.default_root_dir runs/results/ram_fmnist_cluttered60_dram/seed1 --ckpt_path last",
        "scripts/results_run.py configs/ram/fmnist_cluttered60_dram.yaml --seeds 1 --eval-only"]
    assert "ram_fmnist_cluttered60_dram seed 0: done already" in result.stdout


@pytest.mark.parametrize("shape, expected", [((1, 1, 28, 28), r"images are \(1, 28, 28\), the model expects \(1, 60, 60\)"),
                                             ((1, 3, 60, 60), r"images are \(3, 60, 60\), the model expects \(1, 60, 60\)")])
def test_rollout_checks_its_images_as_forward_does(shape, expected):
    model = zoo.create_model("ram_fmnist_cluttered60", pretrained=False)
    for run in (lambda x: model.rollout(x, "mean"), model, lambda x: model.attention_record(x)):
        with pytest.raises(UserError, match=expected):
            run(torch.rand(*shape))


def test_a_run_of_a_recipe_with_blocks_resumes_and_a_changed_field_is_refused():
    """--ckpt_path compares the recipe's blocks (parsed as Namespaces) with the checkpoint's (dicts)."""
    from jsonargparse import ArgumentParser

    from zoo.training import runs

    recipe = {"class_path": "zoo.models.ram.RAM",
              "init_args": {"retina": {"patch_size": 4, "num_scales": 2}, "policy": {"std": 0.3}}}
    parser = ArgumentParser()
    parser.add_subclass_arguments(RAM, "model")
    init_args = parser.parse_object({"model": recipe}).model.init_args
    saved = {"hyper_parameters": dict(RAM(**recipe["init_args"]).hparams)}
    runs.check_resume_model(saved, recipe["class_path"], init_args, Path("last.ckpt"))
    init_args.policy.std = 0.2
    with pytest.raises(UserError, match=r"model.init_args.policy.std differs \(0.2 here, 0.3 in the checkpoint\)"):
        runs.check_resume_model(saved, recipe["class_path"], init_args, Path("last.ckpt"))
