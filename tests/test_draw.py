"""DRAW generator and differentiable-attention classifier: the loss terms against
torch.distributions, fresh noise per step, the ELBO/IWAE relations, learning, checkpoints, the
fixed binarization and the `zoo sample` command."""
import math

import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Normal, kl_divergence

import zoo
from zoo.data.binarize import fixed_binarize
from zoo.guards.errors import UserError
from zoo.models.draw import DRAW, DRAWClassifier, kl_std_normal

TINY = dict(image_size=12, T=4, enc_size=16, dec_size=16, z_size=3, read_n=3, write_n=4)


def tiny_draw(attention="filterbank", **kw):
    torch.manual_seed(0)
    return DRAW(attention=attention, **{**TINY, **kw})


def binary_images(n, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.bernoulli(torch.rand(n, 1, size, size, generator=g) * 0.6, generator=g)


# ----------------------------------------------------------------------------- loss terms
def test_kl_closed_form_matches_torch_distributions():
    mu, logsigma = torch.randn(7, 5) * 2, torch.randn(7, 5)
    expected = kl_divergence(Normal(mu, logsigma.exp()), Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(kl_std_normal(mu, logsigma), expected)
    # the constant: q = prior gives exactly 0 (a wrong -1/2 per step, not per dimension, would not)
    torch.testing.assert_close(kl_std_normal(torch.zeros(2, 9), torch.zeros(2, 9)), torch.zeros(2))


@pytest.mark.parametrize("attention", ["filterbank", "none"])
def test_loss_terms_match_torch_distributions(attention):
    model = tiny_draw(attention)
    x = binary_images(5)
    torch.manual_seed(1)
    out = model(x, record=True)
    torch.manual_seed(1)
    terms = model.negative_elbo(x)
    mu, sigma, z = out["mu"], out["logsigma"].exp(), out["z"]  # [T, B, Z]
    kl = kl_divergence(Normal(mu, sigma), Normal(0.0, 1.0)).sum(-1)  # [T, B]
    torch.testing.assert_close(out["kl"], kl)
    log_lik = Bernoulli(logits=out["logits"]).log_prob(x).flatten(1).sum(1)
    torch.testing.assert_close(terms["rec"], -log_lik)
    torch.testing.assert_close(terms["nelbo"], -log_lik + kl.sum(0))
    log_pq = (Normal(0.0, 1.0).log_prob(z) - Normal(mu, sigma).log_prob(z)).sum((0, 2))
    torch.testing.assert_close(terms["log_w"], log_lik + log_pq, rtol=1e-5, atol=1e-4)
    # the canvas is the sum of T writes: c_T is what the likelihood sees
    torch.testing.assert_close(out["canvas"][-1], out["logits"])


def test_fresh_noise_every_step():
    model = tiny_draw(T=5)
    x = binary_images(1).expand(512, -1, -1, -1)
    out = model(x, record=True)
    eps = (out["z"] - out["mu"]) / out["logsigma"].exp()  # [T, B, Z] the standard draws used
    flat = eps.reshape(5, -1)
    corr = torch.corrcoef(flat)
    off_diagonal = corr[~torch.eye(5, dtype=torch.bool)]
    # one draw reused across steps gives correlation 1; fresh draws are independent
    assert off_diagonal.abs().max() < 0.15, corr
    assert flat.std(1).min() > 0.8
    # and a second pass draws anew
    eps2 = (lambda o: (o["z"] - o["mu"]) / o["logsigma"].exp())(model(x, record=True))
    assert not torch.allclose(eps, eps2)


def test_given_noise_is_used_as_is():
    model = tiny_draw()
    x = binary_images(3)
    noise = torch.randn(TINY["T"], 3, TINY["z_size"])
    a, b = model(x, noise=noise, record=True), model(x, noise=noise, record=True)
    torch.testing.assert_close(a["logits"], b["logits"])
    torch.testing.assert_close((a["z"] - a["mu"]) / a["logsigma"].exp(), noise, rtol=1e-4, atol=1e-5)


def test_iwae_relations():
    model = tiny_draw()
    model.eval()
    x = binary_images(3, seed=4)
    reps = 1500
    with torch.no_grad():
        terms = model.negative_elbo(x.repeat_interleave(reps, 0))
    nelbo = terms["nelbo"].view(3, reps)
    minus_log_w = -terms["log_w"].view(3, reps)
    # K = 1: -log w has the negative ELBO as expectation (the MC KL averages to the closed form)
    diff = (minus_log_w - nelbo)
    stderr = diff.std(1) / math.sqrt(reps)
    assert (diff.mean(1).abs() < 4 * stderr + 1e-3).all(), (diff.mean(1), stderr)
    # K = 1 bound through iwae_bound itself is an unbiased estimate of the same
    with torch.no_grad():
        k1 = torch.stack([model.iwae_bound(x, samples=1) for _ in range(300)])
    assert ((k1.mean(0) - nelbo.mean(1)).abs() < 4 * k1.std(0) / math.sqrt(300) + 0.05).all()
    # bound ordering: the K-sample bound is tighter (lower NLL) than the negative ELBO
    iwae = model.iwae_bound(x, samples=200, chunk=64)
    assert (iwae < nelbo.mean(1)).all()
    assert (iwae > 0).all()


def test_iwae_matches_reference_with_chunks():
    model = tiny_draw()
    x = binary_images(2, seed=5)
    K, chunk = 7, 3
    torch.manual_seed(11)
    got = model.iwae_bound(x, samples=K, chunk=chunk)
    torch.manual_seed(11)
    log_w = []
    with torch.no_grad():
        for k in (3, 3, 1):  # the same chunks, drawn in the same order
            log_w.append(model.negative_elbo(x.repeat_interleave(k, 0))["log_w"].view(2, k))
    log_w = torch.cat(log_w, 1)
    expected = torch.stack([-(torch.logsumexp(log_w[b], 0) - math.log(K)) for b in range(2)])
    torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------- gradients, learning
def test_gradients_reach_attention_and_every_parameter():
    model = tiny_draw()
    model.negative_elbo(binary_images(4))["nelbo"].mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.read_attn.linear.weight.grad.abs().sum() > 0


def test_no_attention_is_the_same_code_with_full_reads():
    model = tiny_draw("none")
    assert not hasattr(model, "read_attn")
    assert model.encoder.input_size == 2 * 12 * 12 + TINY["dec_size"]  # eq. 17: [x, x^]
    assert model.write_patch.out_features == 12 * 12  # eq. 18


@pytest.mark.parametrize("attention", ["filterbank", "none"])
def test_tiny_fit(attention):
    model = tiny_draw(attention)
    x = torch.zeros(16, 1, 12, 12)  # four squares to memorise
    for i, (r, c) in enumerate([(1, 1), (1, 6), (6, 1), (6, 6)]):
        x[i::4, :, r:r + 5, c:c + 5] = 1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.no_grad():
        torch.manual_seed(0)
        before = model.negative_elbo(x)["nelbo"].mean()
    for _ in range(80):
        optimizer.zero_grad()
        model.negative_elbo(x)["nelbo"].mean().backward()
        optimizer.step()
    with torch.no_grad():
        torch.manual_seed(0)
        after = model.negative_elbo(x)["nelbo"].mean()
    assert after < 0.8 * before, (before, after)


# ----------------------------------------------------------------------------- binarization
def test_fixed_binarization_is_a_function_of_the_image():
    images = torch.randint(0, 256, (6, 1, 28, 28)).float() / 255
    a = fixed_binarize(images, seed=0)
    assert set(a.unique().tolist()) <= {0.0, 1.0}
    # same result for an image whatever batch it is in, and in whatever order
    torch.testing.assert_close(fixed_binarize(images[[4, 1]], 0), a[[4, 1]])
    torch.testing.assert_close(fixed_binarize(images, 0), a)
    assert not torch.equal(fixed_binarize(images, 1), a)
    # stochastic binarization: P(on) = intensity
    many = torch.randint(0, 256, (50, 1, 28, 28)).float() / 255
    on = fixed_binarize(many, 0)
    assert abs(on.mean().item() - many.mean().item()) < 0.01
    bright = many > 0.8
    assert abs(on[bright].mean().item() - many[bright].mean().item()) < 0.02
    assert fixed_binarize(torch.zeros(2, 1, 5, 5), 0).sum() == 0
    assert fixed_binarize(torch.ones(2, 1, 5, 5), 0).mean() == 1


def test_training_binarization_is_dynamic_and_eval_fixed():
    model = tiny_draw()
    images = torch.rand(4, 1, 12, 12)
    assert not torch.equal(model.binarize(images, train=True), model.binarize(images, train=True))
    torch.testing.assert_close(model.binarize(images, train=False), model.binarize(images, train=False))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [dict(T=0), dict(read_n=0), dict(write_n=13), dict(T=2.5),
                                 dict(attention="spatial"), dict(train_binarization="none"),
                                 dict(z_size=0)])
def test_invalid_config_is_a_user_error(bad):
    with pytest.raises(UserError):
        DRAW(**{**TINY, **bad})


@pytest.mark.parametrize("bad", [dict(T=0), dict(read_n=0), dict(read_n=101), dict(num_classes=1)])
def test_invalid_classifier_config_is_a_user_error(bad):
    with pytest.raises(UserError):
        DRAWClassifier(**{**dict(image_size=100, T=2, read_n=4, hidden_size=8, glimpse_hidden=8), **bad})


def test_wrong_image_size_and_wrong_use_are_user_errors():
    model = tiny_draw()
    with pytest.raises(UserError, match="expects"):
        model.negative_elbo(torch.zeros(2, 1, 28, 28))
    classifier = DRAWClassifier(image_size=20, T=2, read_n=4, hidden_size=8, glimpse_hidden=8)
    with pytest.raises(UserError, match="expects"):
        classifier(torch.zeros(2, 1, 28, 28))


# ----------------------------------------------------------------------------- sampling, figures
def test_sample_shapes_and_canvas_accumulates():
    model = tiny_draw()
    out = model.sample(5, generator=torch.Generator().manual_seed(0))
    assert out["images"].shape == (5, 1, 12, 12) and out["canvases"].shape == (4, 5, 1, 12, 12)
    torch.testing.assert_close(out["canvases"][-1], out["images"])
    again = model.sample(5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again["images"], out["images"])
    assert len(out["write"]) == 4 and out["write"][0].gx.shape == (5,)


def test_attention_figures_and_gif_colours():
    from zoo.viz import draw as viz

    model = tiny_draw()
    figures = model.attention_figures((torch.rand(3, 1, 12, 12), torch.zeros(3)))
    assert figures and all(f.size[0] > 12 for f in figures.values())
    out = model.sample(2)
    frames = viz.canvas_frames(out["canvases"], write=out["write"], write_n=TINY["write_n"], scale=4)
    assert len(frames) == TINY["T"]
    pixels = {tuple(p) for p in frames[0].getdata()}
    assert viz.WRITE_COLOUR in pixels and viz.READ_COLOUR not in pixels


def test_grey_gif_keeps_the_box_colours_in_few_colours():
    import io

    from PIL import Image

    from zoo.viz import draw as viz

    model = tiny_draw()
    out = model.sample(4, generator=torch.Generator().manual_seed(0))
    frames = viz.canvas_frames(out["canvases"], write=out["write"], write_n=TINY["write_n"], scale=4)
    small, full = viz.gif_bytes(frames, greys=16), viz.gif_bytes(frames)
    with Image.open(io.BytesIO(small)) as gif:
        assert gif.n_frames == TINY["T"]
        colours = {tuple(p) for p in gif.convert("RGB").getdata()}
    assert viz.WRITE_COLOUR in colours and len(colours) <= 16 + 4
    assert all(c in (viz.WRITE_COLOUR, viz.FIGURE_GREY, viz.CELL_GREY) or len(set(c)) == 1 for c in colours)
    assert len(small) < len(full)


def test_box_width_proportional_to_sigma():
    from zoo.attention.filterbank import FilterParams
    from zoo.viz.draw import _box

    def params(sigma):
        one = torch.ones(1)
        return FilterParams(one * 6, one * 6, one * sigma ** 2, one, one)

    (_, w1), (_, w4) = _box(params(1.0), 0, 3, 4), _box(params(4.0), 0, 3, 4)
    assert w4 == 4 * w1


# ----------------------------------------------------------------------------- classifier
def test_classifier_learns_through_its_glimpses():
    torch.manual_seed(0)
    model = DRAWClassifier(image_size=16, num_classes=2, T=3, read_n=4, hidden_size=16, glimpse_hidden=16,
                           lr=1e-2)
    # class = which half of the image holds a bright blob
    images = torch.zeros(32, 1, 16, 16)
    labels = torch.arange(32) % 2
    images[labels == 0, :, 4:8, 2:6] = 1
    images[labels == 1, :, 8:12, 10:14] = 1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(60):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        if step == 0:  # plain backprop reaches where the classifier looks
            assert model.attn.linear.weight.grad.abs().sum() > 0
        optimizer.step()
    assert (model.classify(images).argmax(-1) == labels).float().mean() == 1.0


# ----------------------------------------------------------------------------- checkpoints, CLI
def _save_ckpt(model, path):
    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=0)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(path)


def test_checkpoint_round_trip(tmp_path):
    model = tiny_draw()
    path = tmp_path / "draw.ckpt"
    _save_ckpt(model, path)
    loaded = zoo.load_checkpoint(path)
    assert type(loaded) is DRAW and loaded.family == "draw" and loaded.hparams.read_n == TINY["read_n"]
    x, noise = binary_images(2), torch.randn(TINY["T"], 2, TINY["z_size"])
    torch.testing.assert_close(loaded(x, noise=noise)["logits"], model(x, noise=noise)["logits"])


@pytest.fixture
def checkpoints(tmp_path):
    generator, classifier = tmp_path / "gen.ckpt", tmp_path / "cls.ckpt"
    _save_ckpt(tiny_draw(), generator)
    _save_ckpt(DRAWClassifier(image_size=20, T=2, read_n=4, hidden_size=8, glimpse_hidden=8), classifier)
    return generator, classifier


def test_cli_sample(tmp_path, checkpoints, capsys):
    from PIL import Image

    from zoo.commands.cli import main

    generator, classifier = checkpoints
    out = tmp_path / "s.png"
    assert main(["sample", "--checkpoint", str(generator), "--n", "6", "--out", str(out), "--gif"]) == 0
    with Image.open(out) as img:
        assert img.size[0] > 24
    with Image.open(out.with_suffix(".gif")) as gif:
        assert gif.n_frames == TINY["T"]
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(classifier), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "draw_classifier" in err[0] and "generator" in err[0]
    assert main(["sample", "--checkpoint", str(generator), "--n", "0", "--out", str(tmp_path / "z.png")]) == 2
    assert main(["sample", "--checkpoint", str(generator), "--out", str(tmp_path / "z.txt")]) == 2
    assert main(["sample", "--checkpoint", str(tmp_path / "missing.ckpt"), "--out", str(out)]) == 2
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "z.png").exists()


# ----------------------------------------------------------------------------- recipes
def test_recipes_are_registered_and_compare_like_with_like():
    import yaml

    from zoo.registry import REPO_ROOT

    names = zoo.list_models("draw_*")
    for name in ("draw_fmnist", "draw_fmnist_noattn", "draw_cluttered100_classifier",
                 "draw_cluttered100_classifier_t4"):
        assert name in names
    recipes = {stem: yaml.safe_load((REPO_ROOT / "configs" / "draw" / f"{stem}.yaml").read_text())
               for stem in ("fmnist", "fmnist_noattn", "cluttered100_classifier", "cluttered100_classifier_t4")}
    hparams = {stem: dict(zoo.create_model(f"draw_{stem}").hparams) for stem in recipes}
    # attention vs no attention: equal T, sizes, data, budget and seed; only the switch differs
    a, b = recipes["fmnist"], recipes["fmnist_noattn"]
    assert hparams["fmnist"].pop("attention") == "filterbank" and hparams["fmnist_noattn"].pop("attention") == "none"
    assert hparams["fmnist"] == hparams["fmnist_noattn"] and a["data"] == b["data"] and a.get("checkpoint") == b.get("checkpoint")
    assert {k: v for k, v in a["trainer"].items() if k != "default_root_dir"} == \
        {k: v for k, v in b["trainer"].items() if k != "default_root_dir"}
    assert hparams["fmnist"]["T"] == 64 and hparams["fmnist"]["read_n"] == 2
    # the paper's classifier: 12x12 glimpses on cluttered 100x100, T=8 and T=4
    c8, c4 = hparams["cluttered100_classifier"], hparams["cluttered100_classifier_t4"]
    assert c8["read_n"] == 12 and c8["T"] == 8 and c4["T"] == 4 and c8["image_size"] == 100
    assert recipes["cluttered100_classifier"]["data"] == recipes["cluttered100_classifier_t4"]["data"]
    assert recipes["cluttered100_classifier"]["data"]["init_args"]["variant"] == "cluttered100"
    model = zoo.create_model("draw_cluttered100_classifier")
    assert isinstance(model, DRAWClassifier) and model.family == "draw_classifier"


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zoo sample: "), err
    return err[0]


def test_cli_sample_bad_input_is_one_line_and_exit_2(tmp_path, checkpoints, capsys):
    from zoo.commands.cli import main

    generator, classifier = checkpoints
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(classifier), "--out", str(tmp_path / "c.png")]) == 2
    line = _one_error_line(capsys)
    assert "draw_classifier" in line and "generator" in line
    for n in ("0", "-3"):
        assert main(["sample", "--checkpoint", str(generator), "--n", n, "--out", str(tmp_path / "n.png")]) == 2
        assert "--n must be between 1 and" in _one_error_line(capsys)
    (tmp_path / "file").write_text("x")
    assert main(["sample", "--checkpoint", str(generator), "--out", str(tmp_path / "file" / "s.png")]) == 2
    assert "not a directory" in _one_error_line(capsys)
    assert main(["sample", "--checkpoint", str(generator), "--out", str(tmp_path / "s.png"),
                 "--reconstruct", str(tmp_path / "a.png"), "--n", "2"]) == 2
    assert "--n does not apply" in _one_error_line(capsys)
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.gif"))


def test_cli_sample_creates_a_missing_out_folder(tmp_path, checkpoints):
    from zoo.commands.cli import main

    missing = tmp_path / "no" / "such" / "s.png"  # like every other command's outputs
    assert main(["sample", "--checkpoint", str(checkpoints[0]), "--n", "2", "--out", str(missing)]) == 0
    assert missing.is_file()


def _png(path, array):
    from PIL import Image

    Image.fromarray(array).save(path)
    return str(path)


def test_cli_sample_reconstructs_images_with_read_and_write_boxes(tmp_path, checkpoints, capsys):
    from PIL import Image

    from zoo.commands.cli import main
    from zoo.viz import draw as viz

    generator, _ = checkpoints
    rng = np.random.default_rng(0)
    good = [_png(tmp_path / f"in{i}.png", rng.integers(0, 256, (12, 12), dtype=np.uint8)) for i in range(3)]
    out = tmp_path / "recon.png"
    assert main(["sample", "--checkpoint", str(generator), "--reconstruct", *good, "--out", str(out), "--gif"]) == 0
    with Image.open(out) as strip:
        colours = {tuple(p) for p in strip.convert("RGB").getdata()}
        assert viz.READ_COLOUR in colours and viz.WRITE_COLOUR in colours
    with Image.open(out.with_suffix(".gif")) as gif:
        assert gif.n_frames == TINY["T"]
        colours = {tuple(p) for p in gif.convert("RGB").getdata()}
        assert viz.READ_COLOUR in colours and viz.WRITE_COLOUR in colours
    # a wrong-size image: reported, the others still drawn (exit 1); only bad ones: exit 2
    bad = _png(tmp_path / "big.png", np.zeros((20, 20), np.uint8))
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(generator), "--reconstruct", good[0], bad,
                 "--out", str(tmp_path / "mixed.png")]) == 1
    assert "expects 12x12" in _one_error_line(capsys) and (tmp_path / "mixed.png").exists()
    assert main(["sample", "--checkpoint", str(generator), "--reconstruct", bad,
                 "--out", str(tmp_path / "none.png")]) == 2
    assert "expects 12x12" in _one_error_line(capsys) and not (tmp_path / "none.png").exists()


def test_cli_sample_reconstructs_a_split_of_the_models_data(tmp_path, tiny_data, capsys):
    from PIL import Image

    from conftest import TINY_VAL
    from zoo.commands.cli import main

    torch.manual_seed(0)
    model = DRAW(image_size=28, T=3, enc_size=8, dec_size=8, z_size=2, read_n=2, write_n=3)
    model._zoo_data_config = {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
                              "init_args": {"variant": "centered", "val_size": TINY_VAL, "batch_size": 4}}
    ckpt = tmp_path / "m.ckpt"
    _save_ckpt(model, ckpt)
    out = tmp_path / "split.png"
    assert main(["sample", "--checkpoint", str(ckpt), "--reconstruct-split", "test", "--n", "5",
                 "--out", str(out), "--scale", "1"]) == 0
    assert "5 reconstructions" in capsys.readouterr().out
    with Image.open(out) as strip:
        assert strip.size[1] > 5 * 28  # five rows (a batch of 4 and one more)
    # without a data config there is no split to take
    bare = tmp_path / "bare.ckpt"
    _save_ckpt(tiny_draw(), bare)
    assert main(["sample", "--checkpoint", str(bare), "--reconstruct-split", "val",
                 "--out", str(tmp_path / "b.png")]) == 2
    assert "no data config" in _one_error_line(capsys)


def test_two_items_recipes_equal_size_budget_and_data():
    """two_items60: attention vs none at equal parameter counts (within 10%), so the sizes differ;
    everything else (data, budget, T, optimiser, evaluation) is the same."""
    import re

    import yaml

    from zoo.registry import REPO_ROOT

    texts = {stem: (REPO_ROOT / "configs" / "draw" / f"{stem}.yaml").read_text()
             for stem in ("two_items60", "two_items60_noattn")}
    recipes = {stem: yaml.safe_load(text) for stem, text in texts.items()}
    a, b = recipes["two_items60"], recipes["two_items60_noattn"]
    assert a["data"] == b["data"] and a["data"]["init_args"]["variant"] == "two_items60"
    assert a.get("checkpoint") == b.get("checkpoint")
    assert {k: v for k, v in a["trainer"].items() if k != "default_root_dir"} == \
        {k: v for k, v in b["trainer"].items() if k != "default_root_dir"}
    sizes = ("enc_size", "dec_size", "attention", "read_n", "write_n")
    hparams = {stem: dict(zoo.create_model(f"draw_{stem}").hparams) for stem in texts}
    assert {k: v for k, v in hparams["two_items60"].items() if k not in sizes} == \
        {k: v for k, v in hparams["two_items60_noattn"].items() if k not in sizes}
    assert hparams["two_items60"]["attention"] == "filterbank" and hparams["two_items60_noattn"]["attention"] == "none"
    assert hparams["two_items60"]["image_size"] == 60
    counts = {}
    for stem in texts:
        model = zoo.create_model(f"draw_{stem}")
        counts[stem] = sum(p.numel() for p in model.parameters())
        # the count the recipe's comment states is the model's
        stated = re.search(r"parameters: ([\d,]+)", texts[stem]).group(1)
        assert int(stated.replace(",", "")) == counts[stem], (stem, stated, counts[stem])
    assert abs(counts["two_items60"] / counts["two_items60_noattn"] - 1) < 0.10, counts


def _draw_windows_script():
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("draw_windows", REPO / "scripts" / "draw_windows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_draw_windows_analysis():
    from zoo.attention.filterbank import FilterParams

    script = _draw_windows_script()
    one = torch.ones(3)
    # 1-based centres 3.0 (continuous 2.5: inside [2, 6)), 6.5 (6.0: outside) and 10 (9.5: in the second box)
    params = FilterParams(torch.tensor([3.0, 6.5, 10.0]), torch.tensor([3.0, 3.0, 3.0]), one, one, one)
    boxes = np.array([[[2, 2, 6, 6], [8, 0, 12, 4]]] * 3)
    assert script.centre_inside(params, boxes).tolist() == [True, False, True]
    model = tiny_draw()
    images = torch.zeros(4, 1, 12, 12)
    images[:, :, 2:6, 2:6] = 1
    stats = script.analyse(model, images, np.array([[[2, 2, 6, 6]]] * 4))
    assert stats["items_share"] == 16 / 144 and len(stats["steps"]) == TINY["T"]
    for row in stats["steps"]:
        assert 0 <= row["write_in_items"] <= 1 and 0 <= row["write_centre_in_items"] <= 1 and row["kl"] >= 0
    # a no-attention model has no windows, only where its canvas changes
    plain = script.analyse(tiny_draw("none"), images, np.array([[[2, 2, 6, 6]]] * 4))
    assert "write_side" not in plain["steps"][0] and 0 <= plain["steps"][0]["write_in_items"] <= 1
