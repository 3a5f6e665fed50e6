"""The Show-Attend-Tell captioner: the paper's pieces (scalar gate, deep output, doubly stochastic
term, pads out of the loss), gradient paths, a tiny fit, caption() output, checkpoint round-trips
through Lightning and safetensors, and the `zoo caption` CLI's exit codes."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import structured_images
from helpers import SHIFT_INVARIANT, trainable_through_softmax
from PIL import Image

from zoo.commands.cli import main as zoo_main
from zoo.guards.errors import UserError
from zoo.hparams import block_types
from zoo.models.captioner import Captioner

SPECIALS = ["<pad>", "<start>", "<end>", "<unk>"]
VOCAB = [*SPECIALS, "a", "red", "blue", "shirt", "bag", "left", "of", "right"]
TINY = dict(decoder=dict(embed_dim=16, hidden_dim=24, attention_dim=12, dropout=0.0), image_size=[32, 32],
            decode_max_len=6, backbone={"kind": "stem", "in_chans": 3, "channels": [8, 16], "strides": [4, 2]})
HIDDEN = TINY["decoder"]["hidden_dim"]
#: block -> its fields (zoo.hparams.Block): `tiny` places an argument by its field name
FIELDS = {block: set(cls.__dataclass_fields__) for block, cls in block_types(Captioner).items()}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(attention="soft", **kw):
    """The tiny captioner with `kw`, each a top-level argument or a field of its block."""
    args = {key: dict(value) if key in FIELDS else value for key, value in TINY.items()}
    for key, value in kw.items():
        block = next((b for b, fields in FIELDS.items() if key in fields), None)
        if block is None:
            args[key] = value
        else:
            args.setdefault(block, {})[key] = value
    torch.manual_seed(0)
    return Captioner(vocab=VOCAB, attention=attention, **args)


def batch_of(B=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    captions = torch.zeros(B, T, dtype=torch.long)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    lengths[0] = T
    for b in range(B):
        n = int(lengths[b])
        captions[b, 0], captions[b, n - 1] = 1, 2
        captions[b, 1:n - 1] = torch.randint(4, len(VOCAB), (n - 2,), generator=g)
    return {"images": torch.rand(B, 3, 32, 32, generator=g), "captions": captions, "lengths": lengths}


# ----------------------------------------------------------------------------- the paper's pieces
def test_gate_is_one_scalar_per_step():
    model = tiny()
    assert model.net.f_beta.weight.shape == (1, HIDDEN)
    batch = batch_of()
    out = model(batch["images"], batch["captions"])
    B, T = batch["captions"].shape
    assert out["beta"].shape == (B, T - 1)
    assert out["alpha"].shape[:2] == (B, T - 1)
    # beta = sigmoid(f_beta(h_{t-1})) multiplies the context: a gate shut by its bias zeroes it.
    annotations, _ = model.net.encode(batch["images"])
    projected = model.net.attend.score.project_keys(annotations)
    h, c = model.net.init_state(annotations)
    with torch.no_grad():
        model.net.f_beta.bias.fill_(-1e4)
    shut = model.net.step(batch["captions"][:, 0], h, c, projected, annotations, "soft")
    other = model.net.step(batch["captions"][:, 0], h, c, projected, torch.randn_like(annotations) * 5, "soft")
    assert torch.all(shut["beta"] == 0)
    torch.testing.assert_close(shut["logits"], other["logits"])


def test_deep_output_uses_previous_word_hidden_and_context():
    model = tiny(gate=False)
    batch = batch_of()
    annotations, _ = model.net.encode(batch["images"])
    projected = model.net.attend.score.project_keys(annotations)
    h, c = model.net.init_state(annotations)
    prev = batch["captions"][:, 0]
    out = model.net.step(prev, h, c, projected, annotations, "soft")
    context = torch.einsum("bl,bld->bd", out["alpha"], annotations)
    expected = model.net.L_o(torch.tanh(model.net.embed(prev) + model.net.L_h(out["h"]) + model.net.L_z(context)))
    torch.testing.assert_close(out["logits"], expected)


def test_pads_are_masked_from_the_loss():
    model = tiny()
    model.eval()
    batch = batch_of()
    losses = model.loss_terms(batch)
    # More padding columns change nothing.
    padded = dict(batch, captions=F.pad(batch["captions"], (0, 3), value=0))
    losses_padded = model.loss_terms(padded)
    for key in ("nll", "nll_word", "doubly_stochastic", "loss"):
        torch.testing.assert_close(losses[key], losses_padded[key])
    # And the NLL is the per-caption sum over the real words only, computed one image at a time.
    out = losses["out"]
    manual = []
    for b in range(batch["captions"].shape[0]):
        n = int(batch["lengths"][b])
        targets = batch["captions"][b, 1:n]
        manual.append(F.cross_entropy(out["logits"][b, :n - 1], targets, reduction="sum"))
    torch.testing.assert_close(losses["nll"], torch.stack(manual).mean())


def test_doubly_stochastic_regularisation():
    model = tiny(alpha_c=0.7)
    model.eval()
    batch = batch_of()
    losses = model.loss_terms(batch)
    alpha = losses["out"]["alpha"]  # [B, T-1, L]
    expected = []
    for b in range(alpha.shape[0]):
        steps = int(batch["lengths"][b]) - 1  # real steps: the words and <end>
        expected.append(((1 - alpha[b, :steps].sum(0)) ** 2).sum())
    torch.testing.assert_close(losses["doubly_stochastic"], torch.stack(expected).mean())
    torch.testing.assert_close(losses["loss"], losses["nll"] + 0.7 * losses["doubly_stochastic"])


def test_init_layers_zero_leaves_attention_as_the_only_route_for_the_image():
    batch = batch_of()
    captions = batch["captions"][:2]
    images = torch.stack([batch["images"][0], 1 - batch["images"][0]])  # two different images

    def first_word_logits(model):
        with torch.no_grad():
            model.net.f_beta.bias.fill_(-1e4)  # gate shut: z_t = 0
            return model(images, captions)["logits"][:, 0]  # [2, V]

    paper = tiny().eval()  # h_0, c_0 from the mean annotation: the image shows through the gate
    assert not torch.allclose(*first_word_logits(paper))
    ablation = tiny(init_layers=0).eval()
    assert ablation.net.init_h is None and not any("init_" in n for n, _ in ablation.named_parameters())
    h0, c0 = ablation.net.init_state(torch.rand(3, 5, 16))
    assert h0.shape == (3, HIDDEN) and not h0.any() and not c0.any()
    assert torch.allclose(*first_word_logits(ablation))  # ... and here it does not
    with pytest.raises(UserError, match="init_layers"):
        tiny(init_layers=-1)


# ----------------------------------------------------------------------------- gradients
def test_gradients_reach_every_parameter_soft():
    model = tiny()
    model.train()
    model.loss_terms(batch_of())["loss"].backward()
    ignored_by_softmax = {f"attend.score.{name}" for name in SHIFT_INVARIANT}  # zero up to rounding
    missing = [n for n, p in model.named_parameters()
               if n not in ignored_by_softmax and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not missing, missing


def test_frozen_backbone_gets_no_gradient():
    model = tiny(backbone={**TINY["backbone"], "trainable": False})
    model.train()
    model.loss_terms(batch_of())["loss"].backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert model.net.init_h[0].weight.grad is not None
    assert not any(p is q for p in model.encoder.parameters() for g in
                   model.configure_optimizers().param_groups for q in g["params"])


def test_hard_attention_trains_attention_only_through_reinforce():
    model = tiny("hard")
    model.train()
    batch = batch_of()
    score_params = list(model.net.attend.score.parameters())
    model.loss_terms(batch, "sample")["nll"].backward()
    assert all(p.grad is None or torch.all(p.grad == 0) for p in score_params)
    model.zero_grad()
    torch.manual_seed(1)
    with torch.no_grad():
        model.net.baseline.value.fill_(1.0)
    with pytest.MonkeyPatch.context() as mp:  # force a sampled minibatch
        mp.setattr(torch, "rand", lambda *a, **k: torch.ones(()))
        loss = model.training_step(batch, 0)
    loss.backward()
    trained = trainable_through_softmax(model.net.attend.score)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trained)
    assert float(model.net.baseline.value) != 1.0  # b <- 0.9 b + 0.1 mean(cost)


# ----------------------------------------------------------------------------- fit and caption
def test_tiny_fit_memorises_captions():
    model = tiny(hidden_dim=48, attention_dim=24)
    model.train()
    batch = batch_of(B=4, T=6, seed=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(80):
        loss = model.loss_terms(batch)["nll"]
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < 0.1 * first
    results = model.caption(batch["images"], beam_size=3)
    expected = [[VOCAB[i] for i in c[1:int(n) - 1]] for c, n in zip(batch["captions"].tolist(), batch["lengths"])]
    assert sum(r["words"] == e for r, e in zip(results, expected)) >= 3


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_caption_output_format_and_batching(attention):
    model = tiny(attention)
    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    results = model.caption(images, beam_size=3, max_len=6)
    assert len(results) == 5
    for r in results:
        n = len(r["words"])
        assert all(isinstance(w, str) and w not in ("<pad>", "<start>", "<end>") for w in r["words"])
        assert r["alpha"].shape == (n, 4, 4) and r["beta"].shape == (n,)
        torch.testing.assert_close(r["alpha"].sum((1, 2)), torch.ones(n))
        assert torch.all((r["beta"] > 0) & (r["beta"] < 1))
        assert isinstance(r["score"], float) and isinstance(r["finished"], bool)
        if attention == "hard":
            assert r["locations"].shape == (n, 2)
            flat = r["alpha"].flatten(1).argmax(1)
            assert torch.equal(r["locations"][:, 0] * 4 + r["locations"][:, 1], flat)
        else:
            assert "locations" not in r
    one_by_one = [model.caption(images[i:i + 1], beam_size=3, max_len=6)[0]["words"] for i in range(5)]
    assert [r["words"] for r in results] == one_by_one
    assert model.training  # caption() restores the mode it found


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_batched_captions_equal_the_obvious_reference_search(attention):
    # benchmarks/beam.py times caption() against this reference through decoder(); both must agree.
    from test_decoding import reference_beam
    from types import SimpleNamespace

    model = tiny(attention).eval()
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    step_fn, state, static, grid = model.net.decoder(images)
    assert grid == (4, 4) and state[0].shape == (4, HIDDEN)
    adapter = SimpleNamespace(init=lambda: (state, static), step=step_fn)
    results = model.caption(images, beam_size=3, max_len=6)
    for b, r in enumerate(results):
        tokens, score, finished, extras = reference_beam(adapter, b, 3, 6, model.hparams.length_penalty)
        assert r["words"] == [model.itos[i] for i in tokens]
        assert r["finished"] == finished and r["score"] == pytest.approx(score, abs=1e-4)


def test_model_without_vocabulary_refuses_to_caption():
    model = Captioner(vocab=None, **TINY)
    with pytest.raises(UserError, match="vocabulary"):
        model.caption(torch.rand(1, 3, 32, 32))
    with pytest.raises(UserError, match="empty vocabulary"):
        Captioner(vocab=SPECIALS, **TINY)


# ----------------------------------------------------------------------------- Lightning + checkpoints
def scene_datamodule(tmp_path):
    from zoo.data.scenes import FashionScenesDataModule

    def items(split):
        return structured_images(300, 0 if split == "train" else 1)

    return FashionScenesDataModule(num_train=48, num_val=8, num_test=8, batch_size=16, canvas_size=32,
                                   item_sizes=[12], max_items=2, item_loader=items, cache_dir=str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two training steps + one validation epoch through Lightning, vocab taken from the data."""
    import lightning as L

    tmp_path = tmp_path_factory.mktemp("captioner")
    torch.set_num_threads(1)
    dm = scene_datamodule(tmp_path)
    model = Captioner(vocab=None, beam_size=2, **TINY)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=str(tmp_path), accelerator="cpu", gradient_clip_val=5.0)
    trainer.fit(model, datamodule=dm)
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    return {"model": model, "dm": dm, "trainer": trainer, "ckpt": ckpt, "tmp": tmp_path}


def test_vocab_from_datamodule_and_validation_metrics(trained):
    model, dm, trainer = trained["model"], trained["dm"], trained["trainer"]
    assert model.hparams.vocab == list(dm.vocab.itos)
    assert all(isinstance(w, str) for w in model.hparams.vocab)
    metrics = trainer.callback_metrics
    for name in ("val/loss", "val/Bleu_4", "val/CIDEr", "val/ROUGE_L", "val/localization"):
        assert name in metrics, sorted(metrics)
    assert model.last_eval["stage"] == "val" and len(model.last_eval["predictions"]) == 8


def test_checkpoint_round_trip(trained, tmp_path):
    import zoo
    from zoo.weights import hub

    model = trained["model"].eval()
    images = trained["dm"].datasets["val"].__getitems__([0, 1, 2])["images"]
    reference = model.caption(images, beam_size=2)
    loaded = zoo.load_checkpoint(trained["ckpt"]).eval()
    assert loaded.family == "captioner" and loaded.hparams.vocab == model.hparams.vocab
    again = loaded.caption(images, beam_size=2)
    assert [r["words"] for r in again] == [r["words"] for r in reference]
    torch.testing.assert_close(again[0]["alpha"], reference[0]["alpha"])
    # released weights: safetensors + config
    path = tmp_path / "sat.safetensors"
    hub.save_release(model, model.zoo_config(), path)
    released = zoo.load_checkpoint(path).eval()
    assert [r["words"] for r in released.caption(images, beam_size=2)] == [r["words"] for r in reference]


# ----------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli_files(trained, tmp_path_factory):
    from zoo.models.baselines import Classifier
    from zoo.weights import hub

    root = tmp_path_factory.mktemp("cli")
    model = trained["model"]
    weights = root / "captioner.safetensors"
    hub.save_release(model, model.zoo_config(), weights)
    other = Classifier(arch="mlp", image_size=28, hidden=[8])
    other_path = root / "classifier.safetensors"
    hub.save_release(other, other.zoo_config(), other_path)
    empty_config = model.zoo_config()
    empty_config["init_args"]["vocab"] = SPECIALS
    empty = root / "empty_vocab.safetensors"
    hub.save_release(model, empty_config, empty)
    rgb = (np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)
    good = root / "scene.png"
    Image.fromarray(rgb).save(good)
    gray16 = root / "gray16.png"
    Image.fromarray((np.random.default_rng(1).random((20, 20)) * 60000).astype(np.uint16)).save(gray16)
    rgba = root / "rgba.png"
    Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)]), "RGBA").save(rgba)
    text = root / "notes.png"
    text.write_text("not an image")
    truncated = root / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:60])
    return {"weights": weights, "other": other_path, "empty": empty, "good": good, "gray16": gray16,
            "rgba": rgba, "text": text, "truncated": truncated, "root": root}


def run_zoo(args, capsys):
    code = zoo_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_captions_to_stdout_and_json_with_overlays(cli_files, capsys):
    f = cli_files
    code, out, err = run_zoo(["caption", f["good"], f["gray16"], f["rgba"], "--checkpoint", f["weights"],
                              "--beam-size", "2"], capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(f["good"]), str(f["gray16"]), str(f["rgba"])]
    overlays = f["root"] / "overlays"
    code, out, err = run_zoo(["caption", f["good"], f["rgba"], "--checkpoint", f["weights"], "--json",
                              "--attention-dir", overlays], capsys)
    assert code == 0, err
    payload = json.loads(out)
    assert [r["image"] for r in payload["results"]] == [str(f["good"]), str(f["rgba"])]
    for record in payload["results"]:
        n = len(record["words"])
        assert record["caption"] == " ".join(record["words"])
        assert len(record["beta"]) == n and np.asarray(record["alpha"]).shape == (n, *record["grid"])
        assert Image.open(record["attention_png"]).size[0] > 0
    assert sorted(p.name for p in overlays.iterdir()) == ["rgba.png", "scene.png"]


@pytest.mark.parametrize("bad", ["missing", "directory", "text", "truncated"])
def test_cli_bad_images_exit_2_with_one_line(cli_files, capsys, bad):
    f = cli_files
    (f["root"] / "no_images").mkdir(exist_ok=True)  # a folder stands for its images (zoo.commands.common): none
    path = {"missing": f["root"] / "nope.png", "directory": f["root"] / "no_images", "text": f["text"],
            "truncated": f["truncated"]}[bad]
    code, out, err = run_zoo(["caption", path, "--checkpoint", f["weights"]], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "Traceback" not in err


@pytest.mark.parametrize("which, message", [("other", "not a captioner"), ("empty", "empty vocabulary"),
                                            ("missing", "no such")])
def test_cli_bad_checkpoints_exit_2(cli_files, capsys, which, message):
    f = cli_files
    path = f.get(which, f["root"] / "missing.safetensors")
    code, out, err = run_zoo(["caption", f["good"], "--checkpoint", path], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_cli_partly_bad_batch_captions_the_good_ones(cli_files, capsys):
    f = cli_files
    code, out, err = run_zoo(["caption", f["good"], f["text"], f["root"] / "nope.png", f["rgba"],
                              "--checkpoint", f["weights"]], capsys)
    assert code == 1
    assert [line.split("\t")[0] for line in out.strip().splitlines()] == [str(f["good"]), str(f["rgba"])]
    problems = [line for line in err.strip().splitlines() if "note:" not in line]  # (the resize note)
    assert len(problems) == 2 and str(f["text"]) in err and "nope.png" in err


def test_cli_bad_beam_size(cli_files, capsys):
    code, _, err = run_zoo(["caption", cli_files["good"], "--checkpoint", cli_files["weights"],
                            "--beam-size", "0"], capsys)
    assert code == 2 and "--beam-size" in err


# ----------------------------------------------------------------------------- self-contained checkpoints
def _fit_and_save(model, tmp_path):
    import lightning as L

    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=str(tmp_path), accelerator="cpu", enable_checkpointing=False)
    trainer.fit(model, datamodule=scene_datamodule(tmp_path))
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt


@pytest.mark.parametrize("source", ["timm_file", "zoo_weight"])
def test_checkpoint_rebuilds_without_the_pretrained_file(tmp_path, source):
    """Train with a local backbone weights file, delete the file: the checkpoint and its release
    still load (no network, no file), normalise the same way and caption identically."""
    import timm
    from safetensors.torch import save_file

    import zoo
    from zoo.weights import hub

    torch.manual_seed(0)
    if source == "timm_file":
        weights = tmp_path / "resnet.safetensors"
        save_file(timm.create_model("test_resnet").state_dict(), str(weights))
        backbone = {"kind": "timm_cnn", "model_name": "test_resnet", "level": 1, "pretrained_file": str(weights),
                    "trainable": False}
    else:
        donor = tiny()  # a captioner's release is a zoo weight with a backbone inside
        weights = tmp_path / "donor.safetensors"
        hub.save_release(donor, donor.zoo_config(), weights)
        backbone = {"kind": "stem", "pretrained": str(weights), "trainable": False}
    model = Captioner(vocab=None, **{**TINY, "backbone": backbone})
    assert model.encoder.normalize == (source == "timm_file")  # timm weights bring their mean/std
    ckpt = _fit_and_save(model, tmp_path)
    release = tmp_path / "release.safetensors"
    hub.save_release(model, model.zoo_config(), release)
    weights.unlink()

    recorded = torch.load(ckpt, map_location="cpu", weights_only=True)["zoo"]["init_args"]["backbone"]
    assert recorded["pretrained"] is False and "pretrained_file" not in recorded
    assert recorded["normalize"] is model.encoder.normalize
    if model.encoder.normalize:
        assert recorded["mean"] == pytest.approx(model.encoder.mean.flatten().tolist())
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model.eval()
    expected = model.caption(images, beam_size=2)
    for path in (ckpt, release):
        loaded = zoo.load_checkpoint(path).eval()
        assert torch.equal(loaded.net.encode(images)[0], model.net.encode(images)[0])
        got = loaded.caption(images, beam_size=2)
        assert [r["words"] for r in got] == [r["words"] for r in expected]
        torch.testing.assert_close(got[0]["alpha"], expected[0]["alpha"])


# ----------------------------------------------------------------------------- the fused teacher-forced pass
def step_by_step(model, images, captions, mode):
    """The obvious reference: `step()` once per time step, all outputs stacked."""
    annotations, _ = model.net.encode(images)
    projected = model.net.attend.score.project_keys(annotations)
    h, c = model.net.init_state(annotations)
    outs = []
    for t in range(captions.shape[1] - 1):
        out = model.net.step(captions[:, t], h, c, projected, annotations, mode)
        h, c = out.pop("h"), out.pop("c")
        outs.append(out)
    return {k: torch.stack([o[k] for o in outs], 1) for k in outs[0]}


@pytest.mark.parametrize("kw", [dict(), dict(attention="hard"), dict(gate=False, annotation_coords=True),
                                dict(score="dot", deep_output=False), dict(score="general", init_layers=0),
                                dict(attention="hard", attention_query="current", feed_context=False),
                                dict(attention_query="current", feed_context=False, gate=False)])
def test_teacher_forced_pass_equals_the_step_by_step_reference(kw):
    model = tiny(**kw).eval()
    batch = batch_of(B=5, T=7, seed=2)
    fast = model(batch["images"], batch["captions"])  # eval: hard attention uses the expected context
    slow = step_by_step(model, batch["images"], batch["captions"], "expected")
    for key in ("logits", "alpha", "beta"):
        torch.testing.assert_close(fast[key], slow[key], rtol=1e-5, atol=1e-5)
    if kw.get("attention") == "hard":
        torch.testing.assert_close(fast["log_alpha"], slow["log_alpha"], rtol=1e-5, atol=1e-5)


def test_hard_samples_follow_the_gumbel_noise_and_the_coin_picks_the_expected_context():
    model = tiny("hard").eval()
    batch = batch_of(B=3, T=5, seed=1)
    annotations, _ = model.net.encode(batch["images"])
    B, T1, L = 3, 4, annotations.shape[1]
    gumbel = -torch.empty(B, T1, L).exponential_(generator=torch.Generator().manual_seed(0)).log()
    sampled = model.net.teacher_forced(annotations, batch["captions"], gumbel, torch.tensor(False))
    torch.testing.assert_close(sampled["location"], (sampled["log_alpha"] + gumbel).argmax(-1), rtol=0, atol=0)
    # the first step's context is the sampled annotation: its logits differ from the expected-context pass
    expected = model.net.teacher_forced(annotations, batch["captions"], gumbel, torch.tensor(True))
    assert not torch.allclose(sampled["logits"], expected["logits"])
    torch.testing.assert_close(expected["logits"], model.net.teacher_forced(annotations, batch["captions"])["logits"])
    # after the first step the states differ, so the samples' maps do too; the first map cannot
    torch.testing.assert_close(sampled["alpha"][:, 0], expected["alpha"][:, 0])


def test_reinforce_term_vanishes_on_expected_minibatches_and_word_costs_discount():
    model = tiny("hard", entropy_coef=0.0, reinforce_cost="word", reinforce_discount=0.5, baseline="learned")
    model.train()
    batch = batch_of()
    with pytest.MonkeyPatch.context() as mp:  # the coin says: expected context
        mp.setattr(torch, "rand", lambda *a, **k: torch.zeros(()))
        terms = model.loss_terms(batch, "sample", coin=True)
    assert float(terms["reinforce"]) == 0.0
    with pytest.MonkeyPatch.context() as mp:  # ... and now: the sample
        mp.setattr(torch, "rand", lambda *a, **k: torch.ones(()))
        terms = model.loss_terms(batch, "sample", coin=True)
    assert float(terms["reinforce"]) != 0.0
    # step t pays sum_{t' >= t} 0.5^(t' - t) nll_t'
    out = terms["out"]
    nll = F.cross_entropy(out["logits"].flatten(0, 1), batch["captions"][:, 1:].flatten(), reduction="none")
    nll = (nll.view(terms["step_mask"].shape) * terms["step_mask"]).detach()
    want = torch.stack([sum(0.5 ** (u - t) * nll[:, u] for u in range(t, nll.shape[1])) for t in range(nll.shape[1])], 1)
    torch.testing.assert_close(terms["cost"], want)
    # the learned baseline is trained by its regression only, and the attention by REINFORCE
    terms["baseline_loss"].backward()
    assert model.net.baseline_net.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.net.attend.score.parameters())


# ----------------------------------------------------------------------------- hard attention's estimators (issue 33)
@pytest.mark.parametrize("kw", [dict(gate=True), dict(gate=False), dict(feed_context=False),
                                dict(attention_query="current"), dict(attention_query="current", gate=False)])
def test_exact_marginal_equals_an_explicit_sum_over_cells(kw):
    """log p(y_t) = log sum_i alpha_ti p(y_t | a_i): one deep output per cell, with the LSTM fed the
    expected context (or none). The fused pass, the step-by-step decoder and a slow loop over cells
    agree; with `attention_query: current` the word's alpha_t reads h_t, and the LSTM's input is the
    previous word's expected context."""
    model = tiny("hard", estimator="marginal", test_mode="marginal", annotation_coords=True, **kw).eval()
    batch = batch_of(B=3, T=6, seed=6)
    fast = model(batch["images"], batch["captions"])  # eval: the scoring mode, the marginal
    slow = step_by_step(model, batch["images"], batch["captions"], "marginal")
    torch.testing.assert_close(fast["logits"], slow["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast["alpha"], slow["alpha"], rtol=1e-5, atol=1e-5)
    expected = step_by_step(model, batch["images"], batch["captions"], "expected")  # the same recurrence and maps
    torch.testing.assert_close(fast["alpha"], expected["alpha"], rtol=1e-5, atol=1e-5)
    current = kw.get("attention_query") == "current"
    annotations, _ = model.net.encode(batch["images"])
    captions = batch["captions"]
    h, c = model.net.init_state(annotations)
    projected = model.net.attend.score.project_keys(annotations)
    for t in range(captions.shape[1] - 1):
        emb = model.net.embed(captions[:, t])
        out = model.net.step(captions[:, t], h, c, projected, annotations, "marginal")
        reads = out["h"] if current else h
        torch.testing.assert_close(out["alpha"], model.net.attend(projected, annotations, reads, mode="expected").alpha)
        beta = out["beta"].unsqueeze(-1)
        for b in range(captions.shape[0]):
            mixture = sum(out["alpha"][b, i] * torch.softmax(
                model.net.output(emb[b:b + 1], out["h"][b:b + 1], beta[b:b + 1] * annotations[b:b + 1, i]), -1)[0]
                for i in range(annotations.shape[1]))
            torch.testing.assert_close(fast["logits"][b, t].exp(), mixture, rtol=1e-5, atol=1e-6)
        h, c = out["h"], out["c"]


def test_without_the_context_fed_the_state_knows_the_image_only_through_h0():
    """feed_context: false, init_layers: 0: the LSTM's states are those of a language model (the
    same for every image); the image reaches each word only through that step's attention."""
    model = tiny("hard", estimator="marginal", test_mode="marginal", feed_context=False, init_layers=0).eval()
    batch = batch_of(B=2, T=6, seed=7)
    captions = batch["captions"][:1].expand(2, -1)
    out = model(batch["images"], captions)
    torch.testing.assert_close(out["h_prev"][0], out["h_prev"][1])
    assert not torch.allclose(out["logits"][0], out["logits"][1])  # the attended cells differ


@pytest.mark.parametrize("estimator", ["reinforce", "straight_through"])
def test_with_nothing_fed_back_a_word_s_sample_reaches_that_word_alone(estimator):
    """attention_query: current, feed_context: false: step t's cell s_t ~ Cat(alpha_t(h_t)) is drawn
    after the recurrence and enters only the deep output of word t: logits = output(E y_{t-1}, h_t,
    beta_t a_{s_t}), with the states of the context-free LSTM."""
    model = tiny("hard", attention_query="current", feed_context=False, estimator=estimator).eval()
    batch = batch_of(B=3, T=6, seed=8)
    captions = batch["captions"]
    annotations = model.net.encode(batch["images"])[0]
    gumbel = -torch.empty(3, 5, annotations.shape[1]).exponential_(generator=torch.Generator().manual_seed(1)).log()
    fast = model.net.teacher_forced(annotations, captions, gumbel, torch.tensor(False))
    projected = model.net.attend.score.project_keys(annotations)
    h, c = model.net.init_state(annotations)
    for t in range(5):
        out = model.net.step(captions[:, t], h, c, projected, annotations, "expected")
        h, c = out["h"], out["c"]
        log_alpha = model.net.attend(projected, annotations, h, mode="expected").log_alpha
        cell = (log_alpha + gumbel[:, t]).argmax(-1)
        assert torch.equal(fast["location"][:, t], cell)
        z = torch.sigmoid(model.net.f_beta(h)) * annotations[torch.arange(3), cell]
        torch.testing.assert_close(fast["logits"][:, t], model.net.output(model.net.embed(captions[:, t]), h, z),
                                   rtol=1e-5, atol=1e-5)


def test_exact_marginal_trains_the_attention_by_backprop_and_decodes_with_the_marginal():
    model = tiny("hard", estimator="marginal", test_mode="marginal", entropy_coef=0.0).train()
    batch = batch_of()
    assert model.net._draws(batch["captions"], 4, batch["images"], "sample") == (None, None)  # nothing is sampled
    terms = model.loss_terms(batch, "sample", coin=True)
    assert "reinforce" not in terms
    terms["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(model.net.attend.score))
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    model.eval()
    step_fn, state, static, _ = model.net.decoder(images)
    log_probs, _, _ = step_fn(torch.full((2,), 1), state, static)
    want = model.net.step(torch.full((2,), 1), *state, *static, "marginal")["logits"]
    want = torch.log_softmax(want.index_fill(-1, model.net.never_emitted, float("-inf")), -1)
    torch.testing.assert_close(log_probs, want)


def test_straight_through_samples_as_reinforce_does_and_trains_the_attention_through_the_relaxation():
    """The same Gumbel noise gives the same cells and the same forward pass as REINFORCE's sample;
    the attention network's gradient comes from the NLL itself (no score-function term)."""
    model = tiny("hard", estimator="straight_through", gumbel_temperature=0.5, entropy_coef=0.0).train()
    reference = tiny("hard").train()
    batch = batch_of(B=3, T=5, seed=1)
    annotations = model.net.encode(batch["images"])[0].detach()
    gumbel = -torch.empty(3, 4, annotations.shape[1]).exponential_(generator=torch.Generator().manual_seed(0)).log()
    st = model.net.teacher_forced(annotations, batch["captions"], gumbel, torch.tensor(False))
    sampled = reference.net.teacher_forced(annotations, batch["captions"], gumbel, torch.tensor(False))
    assert torch.equal(st["location"], sampled["location"])
    torch.testing.assert_close(st["logits"], sampled["logits"])
    sampled["logits"].sum().backward()  # REINFORCE's sample blocks the path into the attention
    assert all(p.grad is None or torch.all(p.grad == 0) for p in reference.net.attend.score.parameters())
    st["logits"].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(model.net.attend.score))
    batch = batch_of()
    with pytest.MonkeyPatch.context() as mp:  # a sampled minibatch: the loss is the NLL (+ doubly), no REINFORCE
        mp.setattr(torch, "rand", lambda *a, **k: torch.ones(()))
        terms = model.loss_terms(batch, "sample", coin=True)
    assert "reinforce" not in terms
    torch.testing.assert_close(terms["loss"], terms["nll"] + model.hparams.alpha_c * terms["doubly_stochastic"])


@pytest.mark.parametrize("estimator", ["vimco", "leave_one_out"])
def test_multi_sample_estimators_draw_k_paths_per_caption_and_train_the_attention_only_by_their_score(estimator):
    K = 3
    kw = dict(estimator="vimco") if estimator == "vimco" else dict(baseline="leave_one_out", reinforce_cost="word")
    model = tiny("hard", samples=K, entropy_coef=0.0, semi_sampling_p=0.0, **kw).train()
    batch = batch_of(B=4, T=6, seed=3)
    batch["host_lengths"] = None
    torch.manual_seed(0)
    terms = model.loss_terms(batch, "sample", coin=True)
    out = terms["out"]
    assert out["location"].shape[0] == 4 * K  # K rows per caption, side by side
    rows = out["location"].view(4, K, -1)
    assert any(not torch.equal(rows[b, 0], rows[b, 1]) for b in range(4))  # the paths differ
    # the attention network learns from the score-function term only, the decoder from the fit only
    fit = -terms["vimco_bound"] if estimator == "vimco" else terms["nll"]
    fit.backward(retain_graph=True)
    assert all(p.grad is None or torch.all(p.grad == 0) for p in model.net.attend.score.parameters())
    model.zero_grad()
    terms["reinforce"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(model.net.attend.score))
    assert model.net.L_o.weight.grad is None or torch.all(model.net.L_o.weight.grad == 0)
    # the score term, by a loop over captions and paths
    step_mask, out = terms["step_mask"], {k: v.detach() for k, v in out.items()}
    nll = F.cross_entropy(out["logits"].flatten(0, 1), batch["captions"].repeat_interleave(K, 0)[:, 1:].flatten(),
                          reduction="none").view(step_mask.shape) * step_mask
    log_q = (out["log_alpha"].gather(-1, out["location"].unsqueeze(-1)).squeeze(-1) * step_mask).sum(1)
    want = 0.0
    for b in range(4):
        for j in range(K):
            row, others = b * K + j, [b * K + k for k in range(K) if k != j]
            if estimator == "vimco":
                log_f = [-float(nll[r].sum()) for r in range(b * K, b * K + K)]
                bound = math.log(sum(math.exp(v) for v in log_f) / K)
                fhat = math.exp(sum(log_f[k] for k in range(K) if k != j) / (K - 1))
                signal = bound - math.log((sum(math.exp(log_f[k]) for k in range(K) if k != j) + fhat) / K)
                want -= signal * float(log_q[row]) / 4
            else:
                baseline = sum(nll[r] for r in others) / (K - 1)  # per word
                per_step = out["log_alpha"][row].gather(-1, out["location"][row].unsqueeze(-1)).squeeze(-1)
                want += float(((nll[row] - baseline) * per_step * step_mask[row]).sum()) / (4 * K)
    assert float(terms["reinforce"].detach()) == pytest.approx(model.hparams.hard["reward_scale"] * want, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("kw, message", [
    (dict(samples=10 ** 6), "hard.samples: 1000000 is outside the sane range"),
    (dict(estimator="straight_through", gumbel_temperature=-1.0), "hard.gumbel_temperature: -1.0 is outside"),
    (dict(estimator="straight_through", gumbel_temperature=0.0), "gumbel_temperature must be > 0"),
    (dict(estimator="vimco"), "vimco needs hard.samples >= 2"),
    (dict(baseline="leave_one_out"), "leave_one_out needs hard.samples >= 2"),
    (dict(estimator="marginal", deep_output=False), "needs decoder.deep_output: true"),
    (dict(estimator="marginal", samples=2), "the exact marginal draws no samples"),
    (dict(estimator="bogus"), "hard.estimator must be one of"),
    (dict(attention_query="current"), "attention_query: current feeds the LSTM a context only for the exact marginal"),
])
def test_absurd_estimator_settings_are_refused_in_one_line(kw, message):
    with pytest.raises(UserError, match=message) as info:
        tiny("hard", **kw)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="apply to attention: hard"):
        tiny("soft", estimator="marginal")


# ----------------------------------------------------------------------------- supervised attention
def test_supervised_attention_loss_equals_a_per_word_reference():
    model = tiny(supervised_attention=0.7)
    batch = batch_of(B=3, T=6, seed=4)
    # image 0: a shirt in the top-left quarter named at tokens 1-2; image 1: a bag, token 3; image 2: none
    batch["item_boxes"] = torch.tensor([[[0, 0, 16, 16], [-1] * 4], [[16, 8, 32, 32], [0, 0, 8, 8]],
                                        [[-1] * 4, [-1] * 4]], dtype=torch.float32)
    batch["word_items"] = torch.full_like(batch["captions"], -1)
    batch["word_items"][0, 1:3] = 0
    batch["word_items"][1, 3] = 0
    batch["word_items"][1, 1] = 1
    model.eval()
    for target in ("box", "mass"):
        model.hparams.supervised_attention_target = target
        terms = model.loss_terms(batch)
        log_alpha = torch.log(terms["out"]["alpha"])  # [B, T-1, 16] over a 4x4 grid of 8 px cells
        total = 0.0
        for b in range(3):
            for t in range(batch["captions"].shape[1] - 1):
                slot = int(batch["word_items"][b, t + 1])
                if slot < 0 or batch["captions"][b, t + 1] == 0:
                    continue
                x0, y0, x1, y1 = batch["item_boxes"][b, slot].tolist()
                inside = [r * 4 + c for r in range(4) for c in range(4)
                          if x0 <= (c + 0.5) * 8 < x1 and y0 <= (r + 0.5) * 8 < y1]
                if target == "box":
                    total += -log_alpha[b, t, inside].mean()
                else:
                    total += -torch.logsumexp(log_alpha[b, t, inside], 0)
        torch.testing.assert_close(terms["supervised_attention"], total / 3, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(terms["loss"], terms["nll"] + terms["doubly_stochastic"]
                                   + 0.7 * terms["supervised_attention"])


def test_supervised_attention_trains_hard_attention_directly():
    model = tiny("hard", supervised_attention=1.0, entropy_coef=0.0, reward_scale=0.0)
    model.train()
    batch = batch_of()
    batch["item_boxes"] = torch.tensor([[[0, 0, 16, 16]]] * 4, dtype=torch.float32)
    batch["word_items"] = torch.where(batch["captions"] > 3, 0, -1)
    terms = model.loss_terms(batch, "sample")
    terms["supervised_attention"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(model.net.attend.score))


# ----------------------------------------------------------------------------- bad input through train.py
TINY_RECIPE = """
model:
  class_path: zoo.models.captioner.Captioner
  init_args:
    backbone: {kind: stem, in_chans: 3, channels: [8, 16], strides: [4, 2]}
    image_size: [32, 32]
    embed_dim: 8
    hidden_dim: 16
    attention_dim: 8
data:
  class_path: DATA
  init_args: {num_train: 16, num_val: 4, num_test: 4, canvas_size: 32, item_sizes: [12], max_items: 2, batch_size: 8}
trainer:
  max_epochs: 1
  limit_train_batches: 1
  limit_val_batches: 1
"""


@pytest.mark.parametrize("case", ["supervised_without_boxes", "backbone_misfit"])
def test_train_py_refuses_bad_input_with_one_line_and_exit_2(tmp_path, tiny_data_dir, case):
    from conftest import cli_env, run_main

    from zoo.backbones import BackboneSpec
    from zoo.weights import hub

    data = "helpers.BoxlessScenes" if case == "supervised_without_boxes" else "zoo.data.scenes.FashionScenesDataModule"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.replace("DATA", data))
    args = ["train.py", "fit", "--config", recipe, f"--trainer.default_root_dir={tmp_path / 'run'}"]
    if case == "supervised_without_boxes":
        args += ["--model.init_args.supervised_attention", "1.0"]
        expected = ["supervised_attention", "BoxlessScenes has no boxes"]
    else:  # a grayscale backbone weight for RGB scenes
        spec = BackboneSpec.coerce({"kind": "stem", "in_chans": 1, "channels": [8, 16], "strides": [4, 2]})
        holder = torch.nn.Module()
        holder.backbone = spec.build()
        gray = tmp_path / "gray_stem.safetensors"
        hub.save_release(holder, {"family": "backbone", "class_path": "x.Y",
                                  "init_args": {"backbone": spec.self_contained(holder.backbone), "image_size": [28, 28]}},
                         gray)
        recipe.write_text(recipe.read_text().replace("{kind: stem, in_chans: 3, channels: [8, 16], strides: [4, 2]}",
                                                     f"{{kind: stem, pretrained: {gray}, trainable: false}}"))
        expected = ["takes 1-channel images (trained on 28x28 px)", "the captioner's images are 3x32x32"]
    rc, out, err = run_main(args, cwd=tmp_path, env=cli_env(tiny_data_dir))
    lines = [line for line in err.strip().splitlines() if line.startswith("train.py: error")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert all(part in lines[0] for part in expected), lines[0]


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_active_rows_give_the_same_loss_and_gradients_as_all_rows(attention):
    """A batch sorted longest first with plain-int lengths skips finished rows at each step;
    the loss and every gradient are those of the full pass."""
    model = tiny(attention, dropout=0.0, supervised_attention=0.5)
    model.train()
    batch = batch_of(B=6, T=8, seed=5)
    order = torch.argsort(batch["lengths"], descending=True, stable=True)
    batch = {k: v[order] for k, v in batch.items()}
    batch["item_boxes"] = torch.tensor([[[0, 0, 16, 16]]] * 6, dtype=torch.float32)
    batch["word_items"] = torch.where(batch["captions"] > 3, 0, -1)
    assert batch["lengths"].tolist() != [8] * 6
    results = []
    for host in (None, batch["lengths"].tolist()):
        model.zero_grad()
        torch.manual_seed(3)  # the same hard-attention draws
        terms = model.loss_terms({**batch, **({"host_lengths": host} if host else {})}, "sample")
        terms["loss"].backward()
        results.append((terms["loss"].detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                 if p.grad is not None}))
    torch.testing.assert_close(results[0][0], results[1][0])
    assert results[0][1].keys() == results[1][1].keys()
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert model._active_rows({"host_lengths": [5, 4, 4, 2]}, 4) == [4, 3, 3, 1]
    assert model._active_rows({"host_lengths": [2, 4]}, 3) is None  # not sorted: all rows


@pytest.mark.parametrize("estimator", [dict(reinforce_cost="word", baseline="learned"),
                                       dict(estimator="vimco", samples=2),
                                       dict(estimator="marginal", test_mode="marginal"),
                                       dict(estimator="straight_through")])
def test_the_training_loss_captures_as_one_graph(estimator):
    """loss_terms has no host sync, .item() or Python branch on a tensor: dynamo captures the
    whole training loss (hard attention's draws and coin included) as one graph, so a compiled
    step can wrap it, with every estimator. (Active rows need host lengths: off here, as with
    `pad_to_multiple` for a compiled step.)"""
    import torch._dynamo as dynamo

    model = tiny("hard", supervised_attention=1.0, **estimator).train()
    batch = batch_of(B=4, T=8)
    batch["item_boxes"] = torch.tensor([[[0, 0, 16, 16]]] * 4, dtype=torch.float32)
    batch["word_items"] = torch.where(batch["captions"] > 3, 0, -1)
    explanation = dynamo.explain(lambda b: model.loss_terms(b, "sample", coin=True)["loss"])(batch)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons


def test_caption_refuses_images_it_would_caption_as_nonsense():
    model = tiny()
    good = torch.rand(2, 3, 32, 32)
    for bad, message in [((good * 255).to(torch.uint8), "images are torch.uint8, the model takes float images in \\[0, 1\\]"),
                         ((good - 0.5) / 0.25, "images hold values from .* the model takes images in \\[0, 1\\]"),
                         (good[:, :1], "images are \\(1, 32, 32\\), the model expects \\(3, 32, 32\\)"),
                         (good[0], "images are \\(3, 32, 32\\), the model expects a batch \\[B, 3, 32, 32\\]")]:
        with pytest.raises(UserError, match=message):
            model.caption(bad)
    import zoo.models.captioner as captioner

    grad_enabled, real = [], captioner.greedy_decode
    with pytest.MonkeyPatch.context() as mp:  # decoding builds no autograd graph
        mp.setattr(captioner, "greedy_decode", lambda *a, **k: grad_enabled.append(torch.is_grad_enabled())
                   or real(*a, **k))
        model.caption(good, beam_size=1)
    assert grad_enabled == [False]


def test_caption_decodes_with_the_recipes_beam_by_default(monkeypatch):
    import zoo.models.captioner as captioner

    widths, real = [], captioner.beam_search
    monkeypatch.setattr(captioner, "beam_search", lambda *a, **k: widths.append(a[4]) or real(*a, **k))
    model = tiny(beam_size=3)
    model.caption(torch.rand(2, 3, 32, 32))
    model.caption(torch.rand(2, 3, 32, 32), beam_size=1)  # greedy: no beam search
    assert widths == [3]


@pytest.mark.slow
def test_evaluation_gathers_every_image_once_across_two_processes(tmp_path):
    """Under DDP each rank captions its share of the split; before scoring, every rank holds every
    image once, in one order, with the sampler's padding repeat dropped."""
    import torch.multiprocessing as mp

    from helpers import gather_captions_worker

    mp.start_processes(gather_captions_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    merged = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert merged[0] == merged[1]
    assert merged[0]["ids"] == [0, 2, 4, 1, 3]
    assert merged[0]["words"] == [[f"word{i}", "a"] for i in (0, 2, 4, 1, 3)]
    assert merged[0]["references"] == [[f"ref {i}"] for i in (0, 2, 4, 1, 3)]


@pytest.mark.slow
def test_ddp_captioner_run_logs_its_caption_metrics_without_warnings(tmp_path):
    """Two CPU processes (gloo) train and validate the soft captioner: the caption metrics, which
    every rank computes from the gathered captions, log without Lightning's sync_dist advice."""
    from conftest import REPO, cli_env, run_cli

    root = tmp_path / "run"
    rc, out, err = run_cli(["train.py", "fit", "--config", REPO / "configs/sat/soft_scenes.yaml",
                            "--data.init_args.num_train", "32", "--data.init_args.num_val", "8",
                            "--data.init_args.num_test", "8", "--data.init_args.batch_size", "4",
                            "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
                            "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
                            "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu",
                            "--trainer.default_root_dir", root], cwd=tmp_path, env=cli_env(), timeout=600)
    assert rc == 0, err[-3000:]
    assert "sync_dist" not in out + err, [line for line in (out + err).splitlines() if "sync_dist" in line][:2]
    assert (root / "checkpoints" / "last.ckpt").is_file()
