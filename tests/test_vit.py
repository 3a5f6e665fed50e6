"""ViT family: forward shapes, pretrained loading from a local timm file (head, in_chans and
position-embedding adaptation), attention extraction against a slow reference, rollout, the
`zoo attend` CLI, checkpoint round-trips, the LR schedule and the batch augmentation."""
import dataclasses
import json

import lightning as L
import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

import zoo
from zoo.attention import rollout as rollout_maps
from zoo.backbones.spec import BackboneSpec
from zoo.commands.cli import main as cli
from zoo.data.augment import BatchAugment, mixup, random_erase, random_hflip, random_translate
from zoo.guards.errors import UserError
from zoo.models.vit import ViTClassifier
from zoo.weights import hub

TINY = ViTClassifier.card.tiny[""]  # image_size 28, in_chans 1: the class defaults
TRUNK = {f.name for f in dataclasses.fields(BackboneSpec)}


def tiny(**overrides) -> ViTClassifier:
    """The card's tiny ViT with `overrides`, the trunk's fields (patch_size, pretrained_file, ...) in its backbone."""
    torch.manual_seed(0)
    trunk = {k: overrides.pop(k) for k in list(overrides) if k in TRUNK and k != "in_chans"}
    return ViTClassifier(**{**TINY, **overrides, "backbone": {**TINY["backbone"], **trunk}})


# ----------------------------------------------------------------------------- forward
def test_forward_shapes_and_backbone_tokens():
    model = tiny().eval()
    x = torch.rand(3, 1, 28, 28)
    assert model(x).shape == (3, 10)
    feats = model.backbone(x)
    assert feats.grid == (4, 4) and feats.tokens.shape == (3, 16, 24)
    # the classifier's logits are timm's own head over the same features
    assert torch.allclose(model(x), model.vit.forward_head(model.vit.forward_features(model.backbone.prepare(x))))
    with pytest.raises(UserError, match=r"expects \(1, 28, 28\)"):
        model(torch.rand(1, 1, 32, 32))
    with pytest.raises(UserError, match="expects"):
        model(torch.rand(1, 3, 28, 28))


def test_speed_switches_keep_results_on_cpu(monkeypatch):
    import zoo.models.vit as vit

    x = torch.rand(2, 1, 28, 28)
    ref = tiny().eval()(x)
    assert torch.allclose(tiny(channels_last=True).eval()(x), ref, atol=1e-5)
    # a CPU with bf16 kernels autocasts (emulated here: the same numbers, slower)
    monkeypatch.setattr(vit, "CPU_BF16", True)
    bf16 = tiny(bf16=True).eval()(x)
    assert bf16.dtype == torch.float32 and torch.allclose(bf16, ref, atol=0.1) and not torch.equal(bf16, ref)
    # one without them runs fp32: exactly the reference
    monkeypatch.setattr(vit, "CPU_BF16", False)
    assert torch.equal(tiny(bf16=True).eval()(x), ref)


def test_conv_stem_replaces_patchify_with_the_same_token_grid():
    from timm.layers import HybridEmbed

    model = tiny(patch_size=4, conv_stem=[8, 16]).eval()
    embed = model.vit.patch_embed
    assert isinstance(embed, HybridEmbed) and embed.proj.kernel_size == (1, 1)
    x = torch.rand(2, 1, 28, 28)
    feats = model.backbone(x)
    assert feats.grid == (7, 7) and feats.tokens.shape == (2, 49, 24)
    # token (i, j) is a 1x1 projection of the stem's stride-4 feature map at (i, j)
    stem_map = embed.backbone(model.backbone.prepare(x))  # [2, 16, 7, 7]
    expected = embed.proj(stem_map).flatten(2).transpose(1, 2)
    assert torch.allclose(embed(model.backbone.prepare(x)), expected, atol=1e-6)
    maps = model.attention_maps(x)
    assert maps["rollout"].shape == (2, 7, 7) and torch.allclose(maps["logits"], model(x), atol=1e-5)
    # a coarser grid: the stem's x4 then a 2x2 projection kernel (total stride 8)
    coarse = tiny(image_size=32, patch_size=8, conv_stem=[8, 16]).eval()
    assert coarse.backbone.grid_for(32, 32) == (4, 4) and coarse.vit.patch_embed.proj.kernel_size == (2, 2)
    with pytest.raises(UserError, match="multiple of 4"):
        tiny(patch_size=6, conv_stem=[8, 16])


# ----------------------------------------------------------------------------- pretrained files
def _timm_source(**kw):
    torch.manual_seed(1)
    args = dict(img_size=28, patch_size=7, in_chans=3, num_classes=1000, depth=2, embed_dim=24, num_heads=2,
                mlp_ratio=2.0)
    return timm.create_model("vit_tiny_patch16_224", **{**args, **kw})


def test_local_timm_checkpoint_loads_with_head_and_in_chans_adaptation(tmp_path, caplog):
    source = _timm_source()  # an RGB, 1000-class checkpoint, like a downloaded model.safetensors
    path = tmp_path / "model.safetensors"
    save_file(source.state_dict(), str(path))
    with caplog.at_level("WARNING", logger="zoo"):
        tiny(pretrained_file=str(path))
    assert "model.safetensors: its 1000-class head does not fit 10 classes: the head starts fresh" in caplog.text
    model = tiny(pretrained_file=str(path), image_size=42)  # 1 channel, 10 classes, 6x6 grid
    vit, src = model.vit, source.state_dict()
    assert torch.equal(vit.blocks[1].mlp.fc2.weight, src["blocks.1.mlp.fc2.weight"])
    assert torch.equal(vit.cls_token, src["cls_token"])
    # in_chans 3 -> 1: timm sums the RGB filters
    assert torch.allclose(vit.patch_embed.proj.weight, src["patch_embed.proj.weight"].sum(1, keepdim=True))
    # position embeddings resampled from 4x4 to 6x6 patches (+ cls)
    assert vit.pos_embed.shape == (1, 37, 24)
    # the head is new: 10 classes, freshly initialised
    assert vit.head.weight.shape == (10, 24)
    assert not torch.equal(vit.head.weight, src["head.weight"][:10])
    assert model.backbone.normalize  # the pretrained weights' mean/std are applied
    assert model(torch.rand(2, 1, 42, 42)).shape == (2, 10)


def test_local_checkpoint_of_same_head_keeps_it_and_pth_files_work(tmp_path, caplog):
    source = _timm_source(in_chans=1, num_classes=10)
    path = tmp_path / "mine.pth"
    torch.save(source.state_dict(), path)
    with caplog.at_level("WARNING", logger="zoo"):
        model = tiny(pretrained_file=str(path))
    assert "head starts fresh" not in caplog.text
    assert torch.equal(model.vit.head.weight, source.head.weight)
    assert torch.equal(model.vit.patch_embed.proj.weight, source.patch_embed.proj.weight)


def test_pretrained_file_that_does_not_fit_names_the_tensors(tmp_path):
    path = tmp_path / "wider.safetensors"
    save_file(_timm_source(embed_dim=32).state_dict(), str(path))
    with pytest.raises(UserError, match=r"shapes differ: .*\(32\).* vs model \(24\)") as err:
        tiny(pretrained_file=str(path))
    assert "\n" not in str(err.value) and "wider.safetensors" in str(err.value)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a file")
    with pytest.raises(UserError, match="not a readable weights file"):
        tiny(pretrained_file=str(garbage))


def test_offline_hub_request_fails_with_one_line(monkeypatch):
    from zoo.backbones import common

    monkeypatch.setattr(common, "_hub_reachable", lambda cfg: False)
    monkeypatch.setattr(common, "_cached_hub_file", lambda cfg: None)
    with pytest.raises(UserError, match="pass it as pretrained_file=PATH") as err:
        tiny(pretrained=True)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- attention maps
def _reference_attention(vit, x):
    """Slow reference: run the blocks by hand and compute softmax(q k^T / sqrt(d)) per layer."""
    out = []
    h = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
    for blk in vit.blocks:
        a = blk.attn
        y = blk.norm1(h)
        B, N, C = y.shape
        qkv = a.qkv(y).reshape(B, N, 3, a.num_heads, C // a.num_heads).permute(2, 0, 3, 1, 4)
        q, k = a.q_norm(qkv[0]), a.k_norm(qkv[1])
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / (C // a.num_heads) ** 0.5
        out.append(scores.softmax(-1))
        h = blk(h)
    return torch.stack(out)


def test_recorded_attention_matches_reference_rows_sum_to_one_and_fusing_is_restored():
    model = tiny().eval()
    vit = model.vit
    x = model.backbone.prepare(torch.rand(2, 1, 28, 28))
    assert all(b.attn.fused_attn for b in vit.blocks)  # fused by default: weights never materialised
    with rollout_maps.record_attention(vit) as recorded, torch.no_grad():
        vit.forward_features(x)
    attention = torch.stack(recorded).float()
    assert attention.shape == (2, 2, 2, 17, 17)  # [layers, B, heads, N, N]
    assert torch.allclose(attention.sum(-1), torch.ones(2, 2, 2, 17), atol=1e-5)
    assert torch.allclose(attention, _reference_attention(vit, x), atol=1e-5)
    assert all(b.attn.fused_attn for b in vit.blocks)
    with pytest.raises(RuntimeError):
        with rollout_maps.record_attention(vit):
            assert not any(b.attn.fused_attn for b in vit.blocks)
            raise RuntimeError("boom")
    assert all(b.attn.fused_attn for b in vit.blocks)
    assert all(not b.attn.attn_drop._forward_hooks for b in vit.blocks)


def _reference_rollout(attention, residual):
    layers, B = attention.shape[:2]
    out = []
    for b in range(B):
        joint = np.eye(attention.shape[-1])
        for layer in range(layers):
            a = attention[layer, b].mean(0).numpy().astype(np.float64)
            a = residual * np.eye(a.shape[0]) + (1 - residual) * a
            a = a / a.sum(-1, keepdims=True)
            joint = a @ joint
        out.append(joint)
    return torch.tensor(np.stack(out), dtype=torch.float32)


@pytest.mark.parametrize("residual", [0.5, 0.0])
def test_rollout_equals_slow_reference_and_rows_sum_to_one(residual):
    torch.manual_seed(0)
    attention = torch.rand(3, 2, 4, 10, 10).softmax(-1)  # [layers, B, heads, N, N]
    joint = rollout_maps.rollout(attention, residual=residual)
    assert joint.shape == (2, 10, 10)
    assert torch.allclose(joint, _reference_rollout(attention, residual), atol=1e-5)
    assert torch.allclose(joint.sum(-1), torch.ones(2, 10), atol=1e-5)
    single = rollout_maps.rollout(attention[:1], residual=0.0)
    assert torch.allclose(single, attention[0].mean(1), atol=1e-6)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout_maps.rollout(attention, head_fusion="median")


def test_attention_maps_shapes_sums_and_unchanged_logits():
    model = tiny().eval()
    x = torch.rand(2, 1, 28, 28)
    maps = model.attention_maps(x)
    assert maps["last"].shape == (2, 2, 4, 4) and maps["rollout"].shape == (2, 4, 4)
    # CLS-to-patch mass plus CLS-to-CLS mass is the whole row
    cls_self = maps["attention"][-1, :, :, 0, 0]
    assert torch.allclose(maps["last"].sum((-1, -2)) + cls_self, torch.ones(2, 2), atol=1e-5)
    joint = rollout_maps.rollout(maps["attention"])
    assert torch.allclose(maps["rollout"].sum((-1, -2)) + joint[:, 0, 0], torch.ones(2), atol=1e-5)
    assert torch.allclose(maps["logits"], model(x), atol=1e-5)  # unfused extraction = fused forward
    figures = model.attention_figures((x, torch.tensor([3, 4])))
    assert len(figures) == 2 and all(isinstance(f, Image.Image) for f in figures.values())
    assert len({f.size for f in figures.values()}) == 1  # a logger shows them side by side
    assert "true 3" in next(iter(figures))  # no class names given: indices


# ----------------------------------------------------------------------------- checkpoints
def _fit(model, steps_per_epoch=2, epochs=1, callbacks=()):
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(4 * steps_per_epoch, 1, 28, 28), torch.randint(0, 10, (4 * steps_per_epoch,)))
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))
    trainer.fit(model, DataLoader(data, batch_size=4))
    return trainer


def test_lightning_checkpoint_round_trip_without_the_pretrained_file(tmp_path):
    source_path = tmp_path / "model.safetensors"
    save_file(_timm_source().state_dict(), str(source_path))
    model = tiny(pretrained_file=str(source_path), translate=2, hflip=0.5)
    trainer = _fit(model)
    ckpt = tmp_path / "vit.ckpt"
    trainer.save_checkpoint(ckpt)
    source_path.unlink()  # the user's pretrained file is not needed to rebuild the checkpoint
    loaded = zoo.load_checkpoint(ckpt).eval()
    x = torch.rand(2, 1, 28, 28)
    assert loaded.family == "vit" and "pretrained_file" not in loaded.hparams.backbone
    assert torch.allclose(loaded(x), model.eval()(x), atol=1e-6)
    plain = torch.load(ckpt, map_location="cpu", weights_only=True)  # hparams are plain values
    assert plain["hyper_parameters"]["translate"] == 2


def test_released_weights_load_through_create_model(tmp_path, monkeypatch):
    model = tiny().eval()
    sha = hub.save_release(model, model.zoo_config(), tmp_path / "vit_fmnist.safetensors")
    manifest = {"vit_fmnist": {"file": "vit_fmnist.safetensors", "sha256": sha, "config": model.zoo_config(),
                               "metadata": {"task": "vit", "metrics": {"test/acc": 0.9}}}}
    (tmp_path / "MANIFEST.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path))
    loaded = zoo.create_model("vit_fmnist", pretrained=True).eval()
    x = torch.rand(2, 1, 28, 28)
    assert torch.allclose(loaded(x), model(x))


def test_warmup_then_cosine_schedule_and_no_decay_groups():
    from types import SimpleNamespace

    model = tiny(lr=1e-2, min_lr=1e-4, warmup_epochs=2)
    model._trainer = SimpleNamespace(estimated_stepping_batches=30, max_epochs=6, num_training_batches=5)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    warm, decay = lrs[:10], lrs[10:]
    assert all(a < b for a, b in zip(warm, warm[1:])) and warm[-1] == pytest.approx(1e-2)
    assert all(a > b for a, b in zip(decay, decay[1:])) and decay[0] == pytest.approx(1e-2)
    assert 1e-4 <= decay[-1] < 2e-4
    groups = optimizer.param_groups
    no_decay = {id(p) for p in groups[1]["params"]}
    assert groups[1]["weight_decay"] == 0 and groups[0]["weight_decay"] == 0.05
    assert id(model.vit.pos_embed) in no_decay and id(model.vit.cls_token) in no_decay
    assert id(model.vit.blocks[0].norm1.weight) in no_decay and id(model.vit.blocks[0].attn.qkv.weight) not in no_decay
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(model.parameters()))


# ----------------------------------------------------------------------------- CLI
def _save_images(tmp_path):
    rng = np.random.default_rng(0)
    gray = tmp_path / "a" / "shirt.png"
    gray.parent.mkdir()
    Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8), "L").save(gray)
    colour = tmp_path / "b" / "shirt.jpg"  # same stem, other folder; RGB, other size
    colour.parent.mkdir()
    Image.fromarray(rng.integers(0, 255, (50, 40, 3), dtype=np.uint8), "RGB").save(colour)
    rgba = tmp_path / "boot.png"
    Image.fromarray(rng.integers(0, 255, (30, 30, 4), dtype=np.uint8), "RGBA").save(rgba)
    return [str(gray), str(colour), str(rgba)]


def test_cli_attend_draws_layers_heads_and_rollout_with_exit_codes(tmp_path, capsys):
    """`zoo attend` on a ViT: a step per layer and the rollout; `--record heads=true` adds each head
    of the last layer and `--record head_fusion=max` fuses the rollout's heads otherwise (what the
    old `zoo attention` drew)."""
    model = tiny(class_names=list("ABCDEFGHIJ"))
    ckpt = tmp_path / "vit.safetensors"
    hub.save_release(model, model.zoo_config(), ckpt)
    images = _save_images(tmp_path)
    out = tmp_path / "out"
    assert cli(["attend", "--checkpoint", str(ckpt), *images, "--out", str(out), "--json", "--maps"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in records] == images and records[0]["prediction"]["class_names"] == list("ABCDEFGHIJ")
    assert [s["label"] for s in records[0]["steps"]] == ["layer 1", "layer 2", "rollout"]
    assert sorted(p.name for p in out.iterdir()) == ["boot_attend.png", "shirt_2_attend.png", "shirt_attend.png"]
    assert cli(["attend", "--checkpoint", str(ckpt), images[0], "--out", str(out), "--json", "--maps", "--overwrite",
                "--record", "heads=true", "--record", "head_fusion=max"]) == 0
    steps = json.loads(capsys.readouterr().out)[0]["steps"]
    assert [s["label"] for s in steps] == ["layer 1", "layer 2", "head 1", "head 2", "rollout"]
    assert steps[:2] == records[0]["steps"][:2] and steps[-1]["map"] != records[0]["steps"][-1]["map"]

    bad = tmp_path / "broken.png"
    bad.write_bytes(b"nope")
    assert cli(["attend", "--checkpoint", str(ckpt), images[0], str(bad), "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "broken.png" in err and "Traceback" not in err
    assert cli(["attend", "--checkpoint", str(ckpt), str(bad), "--out", str(out)]) == 2
    assert cli(["attend", "--checkpoint", str(ckpt), images[0], "--out", str(out), "--overwrite",
                "--record", "residual=1.5"]) == 2
    assert "residual in [0, 1)" in capsys.readouterr().err


def test_cli_attend_refuses_unknown_names_models_without_attention_and_odd_channels(tmp_path, capsys):
    images = _save_images(tmp_path)
    assert cli(["attend", "--model", "vit_fmnst", images[0], "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "did you mean vit_fmnist" in err and err.count("\n") == 1

    from zoo.models.baselines import Classifier

    other = Classifier(arch="mlp", hidden=[8])
    path = tmp_path / "mlp.safetensors"
    hub.save_release(other, other.zoo_config(), path)
    assert cli(["attend", "--checkpoint", str(path), images[0], "--out", str(tmp_path / "o")]) == 2
    assert "has no attention to record" in capsys.readouterr().err

    four = tiny(in_chans=4)
    path4 = tmp_path / "four.safetensors"
    hub.save_release(four, four.zoo_config(), path4)
    assert cli(["attend", "--checkpoint", str(path4), images[0], "--out", str(tmp_path / "o")]) == 2
    assert "expects 4" in capsys.readouterr().err


# ----------------------------------------------------------------------------- augmentation
def test_random_translate_equals_per_sample_reference():
    x = torch.rand(5, 2, 6, 7)
    out = random_translate(x, 2, generator=torch.Generator().manual_seed(3))
    offsets = torch.randint(0, 5, (2, 5), generator=torch.Generator().manual_seed(3))
    for b in range(5):
        padded = torch.nn.functional.pad(x[b], (2, 2, 2, 2))
        dy, dx = offsets[:, b].tolist()
        assert torch.equal(out[b], padded[:, dy:dy + 6, dx:dx + 7])


def test_flip_erase_mixup_and_eval_identity():
    x = torch.rand(6, 1, 10, 10) + 0.1
    assert torch.equal(random_hflip(x, 1.0), x.flip(-1))
    erased = random_erase(x, 1.0, 0.16)
    assert ((erased == 0).flatten(1).sum(1) == 16).all()  # one 4x4 square per image
    aug = BatchAugment(translate=2, hflip=0.5, erase=0.5).eval()
    assert torch.equal(aug(x), x)
    labels = torch.arange(6)
    mixed, y, partner, lam = mixup(x, labels, alpha=0.4)
    assert 0 <= lam <= 1 and torch.equal(partner, labels.flip(0))
    assert torch.allclose(mixed, lam * x + (1 - lam) * x.flip(0))


# ----------------------------------------------------------------------------- recipes and data
def test_recipes_build_the_documented_models():
    small = zoo.create_model("vit_fmnist")
    assert small.family == "vit" and 500_000 < sum(p.numel() for p in small.parameters()) < 550_000
    assert small.backbone.grid_for(28, 28) == (7, 7) and small.hparams.backbone["conv_stem"] == [32, 64]
    strides = [m.stride for m in small.vit.patch_embed.backbone if isinstance(m, torch.nn.Conv2d)]
    assert strides == [(2, 2), (1, 1), (2, 2), (1, 1)]  # two convs per stage, the first strided
    cluttered = zoo.create_model("vit_fmnist_cluttered60").eval()
    assert cluttered(torch.rand(1, 1, 60, 60)).shape == (1, 10)
    assert not any([small.hparams.bf16, small.hparams.channels_last])


def test_imagefolder_datamodule_reads_the_torchvision_layout(tmp_path):
    from zoo.data.imagefolder import ImageFolderDataModule

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    dm = ImageFolderDataModule(str(tmp_path), image_size=32, batch_size=2, num_workers=0, test_dir=None)
    assert dm.class_names == ["cat", "dog"] and dm.num_classes == 2
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 32, 32) and 0 <= images.min() and images.max() <= 1
    images, labels = next(iter(dm.test_dataloader()))  # no test/: falls back to val
    assert images.shape == (2, 3, 32, 32) and labels.tolist() == [0, 0]
    with pytest.raises(UserError, match="ImageFolder layout"):
        ImageFolderDataModule(str(tmp_path / "nowhere")).setup("fit")
