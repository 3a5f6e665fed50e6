"""Registry and hub: names, building every recipe, releases (safetensors + MANIFEST.json) and their
sha256 checks, safe loading (no pickle code runs), clear refusals, and URL downloads from a
loopback HTTP server into the cache."""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil

import pytest
import torch

import zoo
from conftest import release_main
from helpers import OtherModel
from zoo import registry
from zoo.guards.errors import UserError
from zoo.models.base import ZooModule
from zoo.models.baselines import Classifier
from zoo.models.card import families, tiny_models
from zoo.weights import hub


@pytest.fixture(autouse=True)
def isolated_weights(tmp_path, monkeypatch):
    """Empty weights and cache directories of our own: the repo's releases do not leak in."""
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "weights"


def _outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


X28 = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- names
def test_list_models_patterns():
    everything = zoo.list_models()
    baselines = zoo.list_models("baseline_*")
    assert "baseline_mlp_centered" in baselines and "baseline_cnn_cluttered60" in baselines
    assert all(n.startswith("baseline_") for n in baselines) and set(baselines) < set(everything)
    centered = zoo.list_models("*_centered")
    assert "baseline_mlp_centered" in centered and "baseline_mlp_translated" not in centered
    for arch in ("mlp", "cnn"):  # every Fashion-MNIST variant has a recipe for both baselines
        assert {f"baseline_{arch}_{v}" for v in ("centered", "translated", "cluttered60", "cluttered100")} <= set(baselines)
    assert zoo.list_models("no_such_thing*") == []
    assert zoo.list_models(pretrained=True) == []  # nothing released in our empty weights dir
    assert everything == sorted(everything)
    assert "base_trainer" not in everything  # the shared trainer part is not a model


def test_list_models_takes_timms_signature(monkeypatch):
    everything = zoo.list_models()
    assert zoo.list_models(filter="baseline_*") == zoo.list_models("baseline_*")  # the older positional use
    assert zoo.list_models(pattern="baseline_*") == zoo.list_models("baseline_*")  # and its keyword
    both = zoo.list_models(filter=["baseline_mlp_*", "*_cluttered60"])
    assert set(both) == set(zoo.list_models("baseline_mlp_*")) | set(zoo.list_models("*_cluttered60"))
    assert both == sorted(both)
    kept = zoo.list_models("baseline_*", exclude_filters=["*_mlp_*", "*translated"])
    assert kept and all("_mlp_" not in n and not n.endswith("translated") for n in kept)
    assert set(kept) == {n for n in zoo.list_models("baseline_*") if n not in zoo.list_models(
        ["*_mlp_*", "*translated"])}
    assert zoo.list_models("", "", False, "", False, None) == everything  # timm's defaults, positionally
    for family in {registry.family_of(registry.get_entry(n)) for n in everything}:
        mine = zoo.list_models(module=family)
        assert mine and all(registry.family_of(registry.get_entry(n)) == family for n in mine)
    assert zoo.list_models(module="no_such_family") == []
    assert zoo.list_models("*", name_matches_cfg=True, include_tags=True) == everything  # no tags, no aliases
    assert zoo.list_models("baseline_*", True) == []  # the older list_models(pattern, pretrained)
    with pytest.raises(UserError, match="filter=3: give a wildcard pattern"):
        zoo.list_models(filter=3)
    # pretrained: only the names with weights, in both spellings
    record = {"file": "x.safetensors", "sha256": "0" * 64, "config": registry.get_entry("baseline_mlp_centered").model}
    monkeypatch.setattr(registry.hub, "manifest", lambda: {"baseline_mlp_centered": record})
    assert zoo.list_models(pretrained=True) == zoo.list_models("vit*", "", True) + ["baseline_mlp_centered"] \
        == zoo.list_models("baseline_*", True) == ["baseline_mlp_centered"]


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UserError, match="did you mean.*baseline_cnn_centered"):
        zoo.create_model("baseline_cnn_centred")
    with pytest.raises(UserError, match="unknown model 'zzzz'.*zoo list"):
        zoo.create_model("zzzz")


def test_pretrained_without_release_is_clear():
    with pytest.raises(UserError, match="no released weights"):
        zoo.create_model("baseline_mlp_centered", pretrained=True)


def _offline_overrides(entry) -> dict:
    """Recipes that start from ImageNet weights (e.g. a VGG encoder with `pretrained: true`) cannot
    fetch them offline; build the same architecture without them."""
    overrides = {}
    for key, value in entry.model.get("init_args", {}).items():
        if isinstance(value, dict) and value.get("pretrained") and not value.get("pretrained_file"):
            overrides[key] = {**value, "pretrained": False}
    if entry.model.get("init_args", {}).get("pretrained") is True:
        overrides["pretrained"] = False
    return overrides


@pytest.mark.parametrize("name", zoo.list_models())
def test_every_recipe_builds(name):
    entry = registry.get_entry(name)
    overrides = _offline_overrides(entry)
    # the architecture first, without memory or initialisation (ImageNet-sized encoders are big)
    # registry.build, as create_model does: its own `pretrained` keyword would take a ViT's timm flag
    spec = entry.recipe_config()
    with torch.device("meta"):
        model = registry.build(spec, **overrides)
    if sum(p.numel() for p in model.parameters()) < 5_000_000:
        model = registry.build(spec, **overrides)  # small ones for real, initialisation included
        assert all(p.device.type == "cpu" for p in model.parameters())
    assert isinstance(model, ZooModule) and model.family != ZooModule.family
    assert sum(p.numel() for p in model.parameters()) > 0
    config = model.zoo_config()  # plain hyperparameters (weights_only checkpoints rely on it)
    json.dumps(config)
    assert config["class_path"] == entry.model["class_path"]
    assert entry.metadata["recipe"].startswith("python train.py fit --config configs/")
    assert zoo.data_config(model) == entry.data


@pytest.mark.parametrize("name", zoo.list_models())
def test_every_recipe_trains_a_step(name):
    """Every recipe's model (those under 5 M parameters: the ImageNet-sized COCO and ViT-B recipes
    train a step in tests/test_recipes_e2e.py) runs its training loss forward and backward on a
    tiny batch: the loss is finite, trainable parameters get gradients, frozen ones none."""
    entry = registry.get_entry(name)
    overrides = _offline_overrides(entry)
    filled = registry.resolve_class(entry.model["class_path"]).card.filled_by_data  # e.g. a vocabulary
    overrides.update({k: v for k, v in filled.items() if entry.model["init_args"].get(k) is None})
    with torch.device("meta"):
        size = sum(p.numel() for p in registry.build(entry.recipe_config(), **overrides).parameters())
    if size >= 5_000_000:
        pytest.skip(f"{size / 1e6:.0f} M parameters: trained a step end to end in test_recipes_e2e.py")
    torch.manual_seed(0)
    model = registry.build(entry.recipe_config(), **overrides).train()
    model.accel.force("eager")
    batch = model.example_batch()
    loss = model.train_loss(**model.train_inputs(batch))[0]
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_overrides_replace_recipe_values():
    model = zoo.create_model("baseline_mlp_centered", hidden=[16, 8], dropout=0.0)
    assert model.hparams.hidden == [16, 8]
    assert model.net[1].out_features == 16
    with pytest.raises(UserError, match="bad arguments"):
        zoo.create_model("baseline_mlp_centered", no_such_argument=1)


# ----------------------------------------------------------------------------- releases
def test_release_script_refuses_what_its_recipe_did_not_train(trained_run, tmp_path, isolated_weights, capsys):
    """The tiny training overrides the recipe's data (val_size, batch_size) and budget, so its
    checkpoint may not be released as baseline_cnn_centered."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"seed": 0, "metrics": {"test/acc": 0.25}, "train_args": []}))
    rc = release_main(["--checkpoint", str(trained_run["last"]), "--name", "baseline_cnn_centered",
                       "--recipe", "configs/baseline/cnn_centered.yaml", "--seed", "0", "--results", str(results)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "is not what `train.py fit --config configs/baseline/cnn_centered.yaml --seed_everything 0` trains" in err[0]
    assert "data.init_args.val_size: weights 100, recipe 5000" in err[0]
    assert not (isolated_weights / "baseline_cnn_centered.safetensors").exists()


@pytest.fixture
def released(trained_run, tmp_path, isolated_weights):
    """baseline_cnn_centered released from the tiny training's last.ckpt into the tmp weights dir."""
    model = zoo.load_checkpoint(trained_run["last"])
    target = isolated_weights / "baseline_cnn_centered.safetensors"
    sha = hub.save_release(model, model.zoo_config(), target)
    manifest = {"baseline_cnn_centered": {"file": target.name, "sha256": sha, "config": model.zoo_config(),
                                          "metadata": {"metrics": {"test/acc": 0.25}}}}
    (isolated_weights / "MANIFEST.json").write_text(json.dumps(manifest))
    return {"ckpt": trained_run["last"], "file": isolated_weights / "baseline_cnn_centered.safetensors",
            "manifest": isolated_weights / "MANIFEST.json"}


def test_release_roundtrip_gives_identical_outputs(released):
    manifest = json.loads(released["manifest"].read_text())
    record = manifest["baseline_cnn_centered"]
    assert record["sha256"] == hashlib.sha256(released["file"].read_bytes()).hexdigest()
    assert zoo.list_models(pretrained=True) == ["baseline_cnn_centered"]
    metadata = registry.get_entry("baseline_cnn_centered").metadata
    assert metadata["sha256"] == record["sha256"]
    assert metadata["family"] == "baseline" and metadata["metrics"] == {"test/acc": 0.25}
    reference = zoo.load_checkpoint(released["ckpt"])
    pretrained = zoo.create_model("baseline_cnn_centered", pretrained=True)
    assert torch.equal(_outputs(reference, X28), _outputs(pretrained, X28))
    for key, value in reference.state_dict().items():
        assert torch.equal(value, pretrained.state_dict()[key])
    # the data config rides along for eval.py
    assert zoo.data_config(pretrained)["init_args"]["variant"] == "centered"
    # the recipe's fresh model differs: the weights really came from the release
    assert not torch.equal(_outputs(zoo.create_model("baseline_cnn_centered"), X28), _outputs(reference, X28))


def test_tampered_release_refused(released):
    data = bytearray(released["file"].read_bytes())
    data[-5] ^= 0x01  # one bit in the last tensor's bytes: still a valid safetensors file
    released["file"].write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256"):
        zoo.create_model("baseline_cnn_centered", pretrained=True)


def test_local_fetch_checks_sha(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"weights")
    assert hub.fetch(path, hashlib.sha256(b"weights").hexdigest()) == path
    with pytest.raises(UserError, match="sha256 mismatch"):
        hub.fetch(path, hashlib.sha256(b"other").hexdigest())
    with pytest.raises(UserError, match="no such weights file"):
        hub.fetch(tmp_path / "missing.safetensors")


# ----------------------------------------------------------------------------- safe loading
class Payload:
    """Unpickling this runs code: it writes `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_pickle_payload_checkpoint_refused_and_never_runs(tmp_path):
    model = zoo.create_model("baseline_mlp_centered")
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": model.state_dict(), "zoo": model.zoo_config(), "extra": Payload(marker)}, path)
    with pytest.raises(UserError, match="refused"):
        zoo.load_checkpoint(path)
    with pytest.raises(UserError, match="refused"):
        zoo.create_model("baseline_mlp_centered", checkpoint=path)
    assert not marker.exists()
    # the payload is live: a plain unpickle of it does write a marker
    live = tmp_path / "LIVE"
    pickle.loads(pickle.dumps(Payload(live)))
    assert live.read_text() == "pwned"


def test_wrong_model_checkpoint_refused(tmp_path):
    other = OtherModel()
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": other.state_dict(), "zoo": other.zoo_config()}, path)
    with pytest.raises(UserError, match=r"other model \(helpers.OtherModel\), not zoo.models.baselines.Classifier"):
        zoo.create_model("baseline_mlp_centered", checkpoint=path)
    release = tmp_path / "other.safetensors"
    hub.save_release(other, other.zoo_config(), release)
    with pytest.raises(UserError, match="helpers.OtherModel"):
        zoo.create_model("baseline_mlp_centered", checkpoint=release)


def test_shape_mismatch_names_the_tensors(tmp_path):
    small = Classifier(arch="paper_cnn", channels=[4], kernel_size=10, stride=5)
    path = tmp_path / "small.ckpt"
    torch.save({"state_dict": small.state_dict(), "zoo": small.zoo_config()}, path)
    with pytest.raises(UserError) as err:
        zoo.create_model("baseline_cnn_centered", checkpoint=path)
    message = str(err.value)
    assert "net.0.weight (4, 1, 10, 10) vs model (8, 1, 10, 10)" in message
    assert "net.3.weight" in message and str(path) in message and "\n" not in message


def test_missing_and_unexpected_tensors_named(tmp_path):
    mlp = zoo.create_model("baseline_mlp_centered")
    path = tmp_path / "mlp.ckpt"
    torch.save({"state_dict": mlp.state_dict(), "zoo": mlp.zoo_config()}, path)
    with pytest.raises(UserError, match=r"missing \d+ tensors .*unexpected \d+ tensors"):
        zoo.create_model("baseline_smallcnn_centered", checkpoint=path)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04garbage"])
def test_garbage_files_refused(tmp_path, content):
    for suffix in (".ckpt", ".safetensors"):
        path = tmp_path / f"bad{suffix}"
        path.write_bytes(content)
        with pytest.raises(UserError, match="bad"):
            zoo.load_checkpoint(path)


def test_plain_tensor_dict_without_config(tmp_path):
    model = zoo.create_model("baseline_mlp_centered")
    path = tmp_path / "plain.pt"
    torch.save(model.state_dict(), path)
    with pytest.raises(UserError, match="no zoo config"):
        zoo.load_checkpoint(path)
    # but it loads into a named model
    loaded = zoo.create_model("baseline_mlp_centered", checkpoint=path)
    assert torch.equal(_outputs(loaded, X28), _outputs(model, X28))


def test_load_checkpoint_lightning_ckpt_and_safetensors(trained_run, tmp_path):
    raw = torch.load(trained_run["last"], map_location="cpu", weights_only=True)
    from_ckpt = zoo.load_checkpoint(trained_run["last"])
    assert type(from_ckpt) is Classifier and from_ckpt.hparams.arch == raw["zoo"]["init_args"]["arch"]
    for key, value in raw["state_dict"].items():
        assert torch.equal(from_ckpt.state_dict()[key], value)
    release = tmp_path / "m.safetensors"
    hub.save_release(from_ckpt, from_ckpt.zoo_config(), release)
    from_release = zoo.load_checkpoint(release)
    assert torch.equal(_outputs(from_ckpt, X28), _outputs(from_release, X28))
    assert zoo.data_config(from_release) == zoo.data_config(from_ckpt)
    # a safetensors file without metadata takes its config from a sidecar JSON
    from safetensors.torch import save_file

    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in from_ckpt.state_dict().items()}, str(bare))
    with pytest.raises(UserError, match="no zoo config"):
        zoo.load_checkpoint(bare)
    bare.with_suffix(".json").write_text(json.dumps(from_ckpt.zoo_config()))
    assert torch.equal(_outputs(zoo.load_checkpoint(bare), X28), _outputs(from_ckpt, X28))


# ----------------------------------------------------------------------------- URL downloads
def _cache_files(tmp_path):
    cache = tmp_path / "cache"
    return sorted(p for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_url_download_verified_cached_once(http_server, tmp_path):
    payload = bytes(range(256)) * 64
    (http_server["dir"] / "w.safetensors").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    url = f"{http_server['url']}/w.safetensors"
    first = hub.fetch(url, sha)
    assert first.read_bytes() == payload
    assert (tmp_path / "cache") in first.parents
    assert len(http_server["requests"]) == 1
    second = hub.fetch(url, sha)
    assert second == first and len(http_server["requests"]) == 1  # served from the cache
    assert _cache_files(tmp_path) == [first]  # no temporary files left behind


def test_url_download_with_wrong_hash_leaves_nothing(http_server, tmp_path):
    (http_server["dir"] / "w.safetensors").write_bytes(b"not what the manifest promised")
    url = f"{http_server['url']}/w.safetensors"
    with pytest.raises(UserError, match="sha256"):
        hub.fetch(url, hashlib.sha256(b"the real weights").hexdigest())
    assert len(http_server["requests"]) == 1
    assert _cache_files(tmp_path) == []  # no partial or unverified file in the cache


def test_url_download_failure_is_clear(http_server, tmp_path):
    with pytest.raises(UserError, match="could not download"):
        hub.fetch(f"{http_server['url']}/missing.safetensors", "0" * 64)
    assert _cache_files(tmp_path) == []


def test_pretrained_from_url(released, http_server, tmp_path):
    manifest = json.loads(released["manifest"].read_text())
    shutil.move(released["file"], http_server["dir"] / released["file"].name)  # only on the "web" now
    manifest["baseline_cnn_centered"]["url"] = f"{http_server['url']}/{released['file'].name}"
    released["manifest"].write_text(json.dumps(manifest))
    model = zoo.create_model("baseline_cnn_centered", pretrained=True)
    reference = zoo.load_checkpoint(released["ckpt"])
    assert torch.equal(_outputs(model, X28), _outputs(reference, X28))
    assert len(http_server["requests"]) == 1
    zoo.create_model("baseline_cnn_centered", pretrained=True)
    assert len(http_server["requests"]) == 1  # second time from the cache
    # a tampered file on the server is refused
    cached = _cache_files(tmp_path)
    assert len(cached) == 1
    cached[0].unlink()
    served = http_server["dir"] / released["file"].name
    data = bytearray(served.read_bytes())
    data[-3] ^= 0x10
    served.write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256"):
        zoo.create_model("baseline_cnn_centered", pretrained=True)
    assert _cache_files(tmp_path) == []


# ----------------------------------------------------------------------------- family cards
def test_a_family_without_its_hooks_is_refused_when_the_class_is_defined():
    from zoo.models.card import FamilyCard

    known = families()
    with pytest.raises(TypeError, match=r"Nameless \(family 'nameless'\) must write train_loss, eval_metrics, "
                                        r"example_batch: the family contract"):
        class Nameless(ZooModule):
            card = FamilyCard("nameless")
    with pytest.raises(TypeError, match="must write attention_record"):
        class Blind(Classifier):
            card = FamilyCard("blind", attention="soft")
    with pytest.raises(TypeError, match="family name 'ram' is taken by zoo.models.ram.RAM"):
        class Impostor(Classifier):
            card = FamilyCard("ram")
    assert families() == known


def test_a_family_registers_by_its_card_and_files_may_name_it(tmp_path, monkeypatch):
    """Declaring a card is the one registration: the allow-list, the registry-wide tests and the
    commands find the class; a subclass without a card of its own is no new family."""
    from zoo.models.card import FamilyCard, _FAMILIES

    monkeypatch.setattr("zoo.models.card._FAMILIES", dict(_FAMILIES))
    monkeypatch.setitem(registry.ALLOWED_CLASSES, "model", set(registry.ALLOWED_CLASSES["model"]))

    class Wider(Classifier):
        card = FamilyCard("wider", tiny={"": {"arch": "mlp", "hidden": [8]}})

    class Instrumented(Wider):
        pass

    assert families()["wider"] is Wider and Wider.family == "wider" and Instrumented.family == "wider"
    assert f"{__name__}.{Wider.__qualname__}" in registry.ALLOWED_CLASSES["model"]
    assert not any("Instrumented" in path for path in registry.ALLOWED_CLASSES["model"])


@pytest.mark.parametrize("path, why", [("os.system", "not a zoo module"), ("zoo.models.optim.build_optimizer", "no family"),
                                       ("zoo.models.nosuchfile.Model", "no such file"), ("zoo.models.base.ZooModule", "no card"),
                                       ("zoo.models..ram.RAM", "not a module path")])
def test_a_file_names_only_registered_classes(path, why):
    with pytest.raises(UserError, match="refused: the file names model class"):
        registry.resolve_class(path)


def test_every_zoo_class_a_file_may_name_is_registered_by_its_own_module():
    from zoo.classes import registered

    models, data = registered("model"), registered("data")
    assert {cls.__module__ + "." + cls.__qualname__ for cls in families().values()} <= models
    own = {path for path in data if path.startswith("zoo.")}
    assert own and all(path.startswith("zoo.data.") and path.endswith("DataModule") for path in own)
    assert not own & {"zoo.data.base.SplitDataModule", "zoo.data.caption_base.CaptionDataModule"}  # abstract


#: files that must not name a family (its card's name) as a string: what reads the families reads the cards
FAMILY_FREE = ["zoo/commands/*.py", "zoo/*.py", "zoo/guards/*.py", "zoo/training/*.py", "zoo/weights/*.py",
               "benchmarks/*.py", "scripts/*.py", "tests/helpers.py",
               "tests/conftest.py", "tools/*.py"]
#: files that may, and why
MAY_NAME = {"scripts/ram_policy_probe.py": "the RAM-only policy probe says it is RAM-only",
            "benchmarks/draw.py": "DRAW's own speed benchmark (the paper's MNIST model) names itself"}
#: family names that are also another fact's name
ALSO = {"backbone": "a model's backbone block (a hyperparameter)",
        "baseline": "a REINFORCE baseline's kind (a field of RAM's and the captioner's blocks, zoo/hparams.py)"}


def test_no_family_is_named_outside_its_own_file_and_recipes():
    from conftest import REPO

    names = set(families()) - set(ALSO)
    offenders = []
    for pattern in FAMILY_FREE:
        for path in sorted(REPO.glob(pattern)):
            if str(path.relative_to(REPO)) in MAY_NAME:
                continue
            text = path.read_text()
            offenders += [f"{path.relative_to(REPO)}: {name!r}" for name in names
                          if f'"{name}"' in text or f"'{name}'" in text]
    assert not offenders, offenders


@pytest.mark.parametrize("name, cls, hparams", tiny_models(), ids=[m[0] for m in tiny_models()])
def test_every_family_refuses_integer_and_unnormalised_images_in_one_line(name, cls, hparams):
    """ZooModule.check_images, which every family's image face runs: uint8 pixels and images
    normalised twice are one line each (a wrong shape too), not a caption or logits of nonsense."""
    torch.manual_seed(0)
    model = cls(**hparams).eval()
    face = model.caption if model.card.output == "caption" else model.export_forward  # what `zoo export` runs
    images, _ = model.example_images(2)
    for bad, message in (((images * 255).to(torch.uint8), r"^images are torch.uint8, the model takes float images"),
                         ((images - 0.5) / 0.25,
                          r"^images hold values from -[\d.]+ to [\d.]+, the model takes images in \[0, 1\]"),
                         (images[0], r"^images are \(.*\), the model expects a batch \[B, ")):
        with pytest.raises(UserError, match=message) as info:
            face(bad)
        assert "\n" not in str(info.value)
    with torch.no_grad():
        face(images.clamp(0, 1))  # the images it takes


@pytest.mark.parametrize("name, cls, hparams", tiny_models(), ids=[t[0] for t in tiny_models()])
def test_every_family_has_timms_num_classes_and_pretrained_cfg(name, cls, hparams):
    """timm's faces: `num_classes` an int (0 without a class head), `pretrained_cfg` the input facts
    that timm's own data config and transform read, giving the zoo's preprocessing of an image."""
    import timm.data
    from PIL import Image

    model = cls(**hparams)
    expected = hparams.get("num_classes", model.hparams.get("num_classes"))
    assert type(model.num_classes) is int and model.num_classes == (expected if isinstance(expected, int) else 0)
    cfg = model.pretrained_cfg
    channels, (height, width) = model.input_chans, model.input_size
    assert cfg["input_size"] == (channels, height, width) and cfg["num_classes"] == model.num_classes
    assert cfg["architecture"] == f"{cls.__module__}.{cls.__qualname__}" and cfg["family"] == cls.card.name
    assert all(cfg[key] is None for key in ("name", "url", "hf_hub_id", "file", "sha256"))  # a fresh model
    spec = zoo.preprocessing(model)
    assert cfg["label_names"] == (list(spec.class_names) if spec.class_names else None)
    assert (cfg["inner_mean"], cfg["inner_std"]) == (spec.mean, spec.std)  # applied inside, not by the transform
    data_config = timm.data.resolve_data_config(model=model)
    assert data_config["input_size"] == (channels, height, width)
    assert data_config["mean"] == (0.0,) * channels and data_config["std"] == (1.0,) * channels
    pixels = torch.randint(0, 256, (height, width, channels), generator=torch.Generator().manual_seed(0),
                           dtype=torch.uint8).numpy()
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
    timm_input = timm.data.create_transform(**data_config)(image)  # the model's size: nothing to resize
    assert torch.allclose(timm_input, zoo.preprocessing(model)(image), atol=1e-6)
