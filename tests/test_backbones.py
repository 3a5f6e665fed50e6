"""zoo.backbones: PatchFeatures shapes for every kind, equality with timm's own outputs, freezing,
local pretrained files and the errors users see."""
import pytest
import timm
import torch

from zoo.backbones import PatchFeatures, build_backbone, common
from zoo.guards.errors import UserError

TINY_VIT = dict(model_name="vit_tiny_patch16_224", img_size=32, patch_size=8, in_chans=1, depth=2,
                embed_dim=24, num_heads=2)


def _grads(module):
    return [p.grad for p in module.parameters()]


@pytest.mark.parametrize("size,strides,grid", [(28, [2, 2], (7, 7)), (60, [2, 2, 3], (5, 5)), (28, [1], (28, 28))])
def test_stem_shapes_and_row_major_tokens(size, strides, grid):
    torch.manual_seed(0)
    stem = build_backbone("stem", in_chans=1, channels=[8] * (len(strides) - 1) + [16], strides=strides)
    x = torch.rand(3, 1, size, size)
    out = stem(x)
    assert isinstance(out, PatchFeatures)
    assert out.grid == grid and out.tokens.shape == (3, grid[0] * grid[1], 16) and stem.out_dim == 16
    fmap = stem.body(x)  # [B, D, h, w]: token r * w + c is pixel (r, c)
    r, c = grid[0] - 1, 0
    assert torch.allclose(out.tokens[:, r * grid[1] + c], fmap[:, :, r, c])


def test_stem_blocks_per_stage_adds_depth():
    one = build_backbone("stem", channels=[8, 8], strides=[2, 2])
    two = build_backbone("stem", channels=[8, 8], strides=[2, 2], blocks_per_stage=2)
    n = lambda m: sum(isinstance(l, torch.nn.Conv2d) for l in m.modules())
    assert (n(one), n(two)) == (2, 4)
    assert two(torch.rand(1, 1, 28, 28)).grid == (7, 7)


def test_timm_cnn_tokens_equal_timm_features_at_chosen_level():
    torch.manual_seed(0)
    enc = build_backbone("timm_cnn", model_name="resnet18", level=2, in_chans=3).eval()
    ref = timm.create_model("resnet18", features_only=True, pretrained=False).eval()
    ref.load_state_dict({k.replace("net.", "", 1): v for k, v in enc.state_dict().items()}, strict=False)
    x = torch.rand(2, 3, 64, 64)
    out = enc(x)
    want = ref(x)[2]  # [B, 128, 8, 8], stride 8
    assert out.grid == (8, 8) and enc.out_dim == 128
    assert torch.allclose(out.tokens, want.flatten(2).transpose(1, 2), atol=1e-6)


def test_timm_cnn_vgg19_conv5_4_grid():
    enc = build_backbone("timm_cnn", model_name="vgg19", level=4, trainable=False)
    out = enc(torch.rand(1, 3, 64, 64))
    # conv5_4 (after ReLU, before the last pool): stride 16, 512 channels -> 14x14 at 224 px
    assert enc.net.feature_info.module_name() == ["features.35"]
    assert out.grid == (4, 4) and out.tokens.shape == (1, 16, 512)


def test_timm_vit_tokens_equal_forward_features_minus_prefix():
    torch.manual_seed(0)
    enc = build_backbone("timm_vit", **TINY_VIT).eval()
    x = torch.rand(2, 1, 32, 32)
    out = enc(x)
    full = enc.vit.forward_features(x)  # [B, 1 + 16, D]: cls first
    assert enc.vit.num_prefix_tokens == 1
    assert out.grid == (4, 4) and out.tokens.shape == (2, 16, 24) and enc.out_dim == 24
    assert torch.equal(out.tokens, full[:, 1:])
    kept = build_backbone("timm_vit", keep_cls=True, **TINY_VIT).eval()
    kept.load_state_dict(enc.state_dict())
    both = kept(x)
    assert both.tokens.shape == (2, 17, 24) and kept.num_prefix_tokens == 1
    assert torch.equal(both.tokens, full)


def test_timm_vit_with_register_tokens_drops_all_prefix_tokens():
    enc = build_backbone("timm_vit", model_kwargs={"reg_tokens": 4}, **TINY_VIT).eval()
    x = torch.rand(1, 1, 32, 32)
    assert enc.vit.num_prefix_tokens == 5  # cls + 4 registers
    out = enc(x)
    assert torch.equal(out.tokens, enc.vit.forward_features(x)[:, 5:]) and out.tokens.shape[1] == 16


def test_timm_vit_dynamic_grid_follows_input_size():
    enc = build_backbone("timm_vit", dynamic_img_size=True, **TINY_VIT).eval()
    out = enc(torch.rand(1, 1, 48, 32))
    assert out.grid == (6, 4) and out.tokens.shape == (1, 24, 24)


@pytest.mark.parametrize("kind,kwargs", [("stem", dict(channels=[8], strides=[2])),
                                         ("timm_cnn", dict(model_name="resnet18", level=1)),
                                         ("timm_vit", TINY_VIT)])
def test_freezing_stops_gradients_and_keeps_eval_mode(kind, kwargs):
    size = 32
    chans = kwargs.get("in_chans", 1)
    frozen = build_backbone(kind, trainable=False, **kwargs)
    frozen.train()  # the model around it trains; a frozen backbone must not
    assert not frozen.training and not any(m.training for m in frozen.modules())
    assert not any(p.requires_grad for p in frozen.parameters())
    stats = {k: v.clone() for k, v in frozen.state_dict().items() if "running" in k}
    out = frozen(torch.rand(2, chans, size, size))
    assert not out.tokens.requires_grad
    for k, v in stats.items():  # BatchNorm statistics unchanged by a training-mode forward
        assert torch.equal(frozen.state_dict()[k], v)

    live = build_backbone(kind, trainable=True, **kwargs).train()
    head = torch.nn.Parameter(torch.ones(()))
    (live(torch.rand(2, chans, size, size)).tokens.sum() * head).backward()
    assert all(g is not None for g in _grads(live))


def test_grayscale_into_rgb_backbone_repeats_channel_and_wrong_channels_refused():
    enc = build_backbone("timm_cnn", model_name="resnet18", level=1, in_chans=3).eval()
    gray = torch.rand(1, 1, 32, 32)
    assert torch.equal(enc(gray).tokens, enc(gray.expand(-1, 3, -1, -1)).tokens)
    with pytest.raises(UserError, match="2 channels"):
        enc(torch.rand(1, 2, 32, 32))


def test_timm_cnn_local_pretrained_file_loads_and_misfit_names_tensors(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = timm.create_model("resnet18", num_classes=7)  # a user's own fine-tuned checkpoint
    path = tmp_path / "model.safetensors"
    save_file(source.state_dict(), str(path))
    enc = build_backbone("timm_cnn", model_name="resnet18", level=-1, pretrained_file=str(path), trainable=False)
    assert torch.equal(enc.net.conv1.weight, source.conv1.weight)
    assert torch.equal(enc.net.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    assert enc.normalize  # pretrained weights expect their mean/std

    state = dict(source.state_dict())
    state["conv1.weight"] = torch.zeros(32, 3, 7, 7)  # another architecture's stem: 32 vs 64 filters
    bad = tmp_path / "other.safetensors"
    save_file(state, str(bad))
    with pytest.raises(UserError, match=r"shapes differ: conv1\.weight"):
        build_backbone("timm_cnn", model_name="resnet18", pretrained_file=str(bad))


def test_user_errors_unknown_names_missing_file_offline_hub(monkeypatch, tmp_path):
    with pytest.raises(UserError, match="did you mean.*vit_tiny_patch16_224"):
        build_backbone("timm_vit", model_name="vit_tiny_patch16_244")
    with pytest.raises(UserError, match="unknown backbone kind"):
        build_backbone("transformer")
    with pytest.raises(UserError, match="no such pretrained weights file"):
        build_backbone("timm_vit", pretrained_file=str(tmp_path / "absent.safetensors"), **TINY_VIT)
    monkeypatch.setattr(common, "_hub_reachable", lambda cfg: False)
    monkeypatch.setattr(common, "_cached_hub_file", lambda cfg: None)
    with pytest.raises(UserError, match="offline.*pretrained_file=PATH") as err:
        build_backbone("timm_vit", pretrained=True, **TINY_VIT)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- typed specs (BackboneSpec)
def test_spec_from_dict_refuses_unknown_and_inapplicable_fields():
    from zoo.backbones import BackboneSpec

    spec = BackboneSpec.coerce({"kind": "stem", "in_chans": 3, "channels": [8], "strides": [2]})
    assert spec.to_dict() == {"kind": "stem", "pretrained": False, "in_chans": 3, "channels": [8], "strides": [2]}
    assert spec.build().out_dim == 8
    with pytest.raises(UserError, match="unknown field.*chanels"):
        BackboneSpec.coerce({"kind": "stem", "chanels": [8]})
    with pytest.raises(UserError, match="kind 'stem' takes no level"):
        BackboneSpec.coerce({"kind": "stem", "level": 3}).build()
    with pytest.raises(UserError, match="no hub weights.*pretrained: NAME"):
        BackboneSpec.coerce({"kind": "stem", "pretrained": True}).build()
    with pytest.raises(UserError, match="unknown backbone kind"):
        BackboneSpec.coerce({"kind": "transformer"})


def test_offline_error_names_the_backbone_flag_that_exists(monkeypatch):
    from zoo.backbones import BackboneSpec

    monkeypatch.setattr(common, "_hub_reachable", lambda cfg: False)
    monkeypatch.setattr(common, "_cached_hub_file", lambda cfg: None)
    spec = BackboneSpec.coerce({"kind": "timm_vit", "pretrained": True, **TINY_VIT})
    with pytest.raises(UserError) as err:
        spec.build()
    assert "--model.init_args.backbone.pretrained_file PATH" in str(err.value) and "\n" not in str(err.value)


def _stem_release(tmp_path, in_chans=3):
    """A zoo weight holding a trained-looking stem under `encoder.`, as a captioner's release does."""
    from zoo.backbones import BackboneSpec
    from zoo.weights import hub

    torch.manual_seed(0)
    spec = BackboneSpec.coerce({"kind": "stem", "in_chans": in_chans, "channels": [8, 16], "strides": [2, 2]})
    holder = torch.nn.Module()
    holder.encoder = spec.build()
    with torch.no_grad():
        for p in holder.encoder.parameters():
            p.add_(torch.randn_like(p))
        holder.encoder.body[1].running_mean.add_(0.5)
    config = {"family": "captioner", "class_path": "zoo.models.captioner.Captioner",
              "init_args": {"backbone": spec.self_contained(holder.encoder), "image_size": [32, 32]}}
    path = tmp_path / f"stem{in_chans}.safetensors"
    hub.save_release(holder, config, path)
    return holder, path


def test_zoo_weight_fills_the_architecture_and_loads_its_tensors(tmp_path):
    from zoo.backbones import BackboneSpec

    source, path = _stem_release(tmp_path)
    spec = BackboneSpec.coerce({"kind": "stem", "pretrained": str(path), "trainable": False})
    enc = spec.build()
    assert spec.channels == [8, 16] and spec.strides == [2, 2] and spec.in_chans == 3
    assert not enc.trainable and not any(p.requires_grad for p in enc.parameters())
    for k, v in source.encoder.state_dict().items():
        assert torch.equal(enc.state_dict()[k], v), k
    with pytest.raises(UserError, match=r"trained with channels \[8, 16\], the config asks for \[8, 32\]"):
        BackboneSpec.coerce({"kind": "stem", "pretrained": str(path), "channels": [8, 32]}).build()
    with pytest.raises(UserError, match="is a 'stem' backbone"):
        BackboneSpec.coerce({"kind": "timm_cnn", "pretrained": str(path)}).build()
    with pytest.raises(UserError, match="no such backbone weights file"):
        BackboneSpec.coerce({"kind": "stem", "pretrained": str(tmp_path / "gone.safetensors")}).build()
    with pytest.raises(UserError, match="no released weights named 'nope'"):
        BackboneSpec.coerce({"kind": "stem", "pretrained": "nope"}).build()


def test_backbone_weight_that_does_not_fit_the_images_is_refused_naming_both(tmp_path):
    from zoo.models.captioner import Captioner

    _, gray = _stem_release(tmp_path, in_chans=1)
    with pytest.raises(UserError) as err:
        Captioner(vocab=None, image_size=[64, 64], backbone={"kind": "stem", "pretrained": str(gray)})
    message = str(err.value)
    assert "takes 1-channel images (trained on 32x32 px)" in message and "3x64x64" in message and "\n" not in message
    vit = {"kind": "timm_vit", **{**TINY_VIT, "in_chans": 3}}  # a fixed 32 px input
    with pytest.raises(UserError, match=r"takes 3x32x32 images; the captioner's images are 3x64x64"):
        Captioner(vocab=None, image_size=[64, 64], backbone=vit)


def test_cli_backbone_fields_are_typed_and_a_second_config_merges_field_wise(tmp_path):
    import yaml
    from conftest import REPO, cli_env, run_main

    recipe = REPO / "configs/sat/coco_soft.yaml"
    second = tmp_path / "fine_tune.yaml"
    second.write_text("model:\n  init_args:\n    backbone:\n      trainable: true\n")
    rc, out, err = run_main(["train.py", "fit", "--config", recipe, "--config", second,
                             "--model.init_args.backbone.pretrained", "false",
                             "--model.init_args.backbone.level", "3", "--print_config"], cwd=tmp_path, env=cli_env())
    assert rc == 0, err[-2000:]
    backbone = yaml.safe_load(out)["model"]["init_args"]["backbone"]
    written = yaml.safe_load(recipe.read_text())["model"]["init_args"]["backbone"]
    assert backbone["pretrained"] is False and backbone["level"] == 3  # a bool and an int, not strings
    assert backbone["trainable"] is True  # from the second config ...
    assert backbone["model_name"] == written["model_name"] and backbone["normalize"] is written["normalize"]  # ... kept
    rc, out, err = run_main(["train.py", "fit", "--config", recipe, "--model.init_args.backbone.pretrained",
                             "backbone_fmnist_stem", "--print_config"], cwd=tmp_path, env=cli_env())
    assert rc == 0 and yaml.safe_load(out)["model"]["init_args"]["backbone"]["pretrained"] == "backbone_fmnist_stem"


def test_a_released_vit_classifier_is_a_backbone_by_name():
    import zoo
    from zoo.backbones import BackboneSpec
    from zoo.models.captioner import Captioner

    if "vit_fmnist" not in zoo.list_models(pretrained=True):
        pytest.skip("vit_fmnist is not released here")
    classifier = zoo.create_model("vit_fmnist", pretrained=True).eval()
    spec = BackboneSpec.coerce({"kind": "timm_vit", "pretrained": "vit_fmnist", "trainable": False})
    encoder = spec.build().eval()
    x = torch.rand(2, 1, 28, 28)
    assert torch.equal(encoder(x).tokens, classifier.backbone(x).tokens)
    assert spec.img_size == 28 and spec.in_chans == 1
    with pytest.raises(UserError, match=r"'vit_fmnist' takes 1-channel images \(trained on 28x28 px\); the captioner's images are 3x64x64"):
        Captioner(vocab=None, image_size=[64, 64], backbone={"kind": "timm_vit", "pretrained": "vit_fmnist"})
