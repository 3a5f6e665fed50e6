"""One hyperparameter vocabulary (zoo.hparams): families and data modules name a shared fact one
way, and a checkpoint, release or recipe written under an old name loads to the same model by
every route that reads one (zoo.load_checkpoint, which eval.py and the zoo commands use; Lightning's
load_from_checkpoint; --init_from; train.py's resume; released weights with their manifest;
tools/release's checks). Renaming never touches a class path: the allow-list still decides."""
from __future__ import annotations

import inspect
import json
import logging
import shutil
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from safetensors import safe_open
from torch.utils.data import DataLoader, TensorDataset

import zoo
from conftest import REPO, cli_env, run_cli, run_main, tiny_fit_args
from tools import release
from zoo import hparams, registry
from zoo.classes import registered, resolve_class
from zoo.guards.errors import UserError
from zoo.hparams import (MOVED, MOVED_AS, RENAMED, RENAMED_VALUES, Block, block_types, current_config,
                         current_init_args, current_spec)
from zoo.models.base import class_path as path_of
from zoo.models.card import tiny_models
from zoo.models.vit import ViTClassifier
from zoo.training.callbacks import InitFrom
from zoo.weights import hub

VIT = "zoo.models.vit.ViTClassifier"
BASELINE = "zoo.models.baselines.Classifier"
FMNIST = {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
          "init_args": {"variant": "centered", "val_size": 100, "batch_size": 50}}
# a size other than the class default (28): a loader that dropped the old name would build another model
SIZE = 42
TINY = dict(in_chans=1, num_classes=10, backbone={"kind": "timm_vit", "model_name": "vit_tiny_patch16_224",
                                                  "patch_size": 7, "depth": 2, "embed_dim": 24, "num_heads": 2,
                                                  "mlp_ratio": 2.0, "drop_path_rate": 0.0})
#: a name that is old for one class and the current name of another fact elsewhere
OTHER_FACT = {(BASELINE, "channels"): "the CNN's conv widths, not the images' channels"}


MODELS, DATA = registered("model"), registered("data")


def _arguments(class_path: str) -> set[str]:
    kind = "model" if class_path in MODELS else "data"
    return set(inspect.signature(resolve_class(class_path, kind).__init__).parameters) - {"self"}


def _old_names(init_args: dict, class_path: str) -> dict:
    """`init_args` as the zoo wrote them before the renames (the inverse of the table)."""
    back = {new: old for old, new in RENAMED.get(class_path, {}).items()}
    values = {new: {v: k for k, v in RENAMED_VALUES[old].items()} for new, old in back.items() if old in RENAMED_VALUES}
    return {back.get(k, k): values[k].get(v, v) if k in values else v for k, v in init_args.items()}


def _old_config(config: dict) -> dict:
    old = {**config, "init_args": _old_names(config["init_args"], config["class_path"])}
    if config.get("data"):
        old["data"] = {**config["data"], "init_args": _old_names(config["data"]["init_args"], config["data"]["class_path"])}
    return old


def _tiny_vit(size: int = SIZE) -> ViTClassifier:
    torch.manual_seed(0)
    return ViTClassifier(**TINY, image_size=size, num_figures=3).eval()


def _old_vit_checkpoint(tmp_path) -> tuple[ViTClassifier, object]:
    """A Lightning checkpoint of a tiny ViT whose hyperparameters carry the pre-rename names."""
    model = _tiny_vit()
    data = TensorDataset(torch.rand(4, 1, SIZE, SIZE), torch.randint(0, 10, (4,)))
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4))
    new = tmp_path / "new.ckpt"
    trainer.save_checkpoint(new)
    checkpoint = torch.load(new, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"] = _old_names(checkpoint["hyper_parameters"], VIT)
    checkpoint["zoo"] = _old_config(checkpoint["zoo"])
    assert checkpoint["hyper_parameters"]["img_size"] == SIZE and "image_size" not in checkpoint["zoo"]["init_args"]
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    return model.eval(), old


def _same_model(loaded, model) -> None:
    x = torch.rand(2, 1, SIZE, SIZE)
    assert loaded.hparams.image_size == SIZE and loaded.hparams.num_figures == 3
    assert not {"img_size", "figure_images"} & set(loaded.hparams)
    assert torch.allclose(loaded.eval()(x), model(x), atol=1e-6)


# ----------------------------------------------------------------------------- the vocabulary
def test_the_table_renames_allow_listed_classes_to_arguments_they_take():
    for class_path, renames in RENAMED.items():
        assert class_path in MODELS | DATA, class_path
        arguments = _arguments(class_path)
        for old, new in renames.items():
            assert old.isidentifier() and new.isidentifier() and "class_path" not in (old, new)
            assert new in arguments and old not in arguments, (class_path, old, new)
    assert set(RENAMED_VALUES) <= {old for renames in RENAMED.values() for old in renames}


def test_a_shared_fact_has_one_name_in_every_family():
    old_names = {old for renames in RENAMED.values() for old in renames}
    for class_path in sorted(MODELS | DATA):
        arguments = _arguments(class_path)
        for old in sorted(old_names & arguments):
            assert (class_path, old) in OTHER_FACT, f"{class_path} still takes '{old}'"
        if class_path in MODELS:
            assert "image_size" in arguments, class_path


def test_current_init_args_renames_converts_and_leaves_the_rest():
    given = {"img_size": SIZE, "figure_images": 3, "lr": 0.1}
    assert current_init_args(VIT, given) == {"image_size": SIZE, "num_figures": 3, "lr": 0.1}
    assert given == {"img_size": SIZE, "figure_images": 3, "lr": 0.1}  # the file's dict is not changed
    assert current_init_args(BASELINE, {"cosine_schedule": True})["lr_schedule"] == "cosine"
    assert current_init_args(BASELINE, {"cosine_schedule": False})["lr_schedule"] == "none"
    assert current_init_args(VIT, {"img_size": SIZE, "image_size": SIZE}) == {"image_size": SIZE}
    for untouched in ({"channels": [8, 16]}, {"image_size": SIZE}):  # the baseline's `channels` is its own
        assert current_init_args(BASELINE, untouched) is untouched
    assert current_init_args("some.other.Class", given) is given and current_init_args(["x"], given) is given
    config = {"class_path": VIT, "init_args": {"img_size": SIZE},
              "data": {"class_path": "zoo.data.imagefolder.ImageFolderDataModule", "init_args": {"channels": 1}}}
    assert current_config(config) == {"class_path": VIT, "init_args": {"image_size": SIZE},
                                      "data": {"class_path": "zoo.data.imagefolder.ImageFolderDataModule",
                                               "init_args": {"in_chans": 1}}}


def test_an_old_and_a_new_name_that_disagree_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"gives img_size \(the old name of image_size\) and image_size, with "
                                        r"different values \(42, 28\); keep image_size only$"):
        registry.build({"class_path": VIT, "init_args": {**TINY, "img_size": SIZE, "image_size": 28}})


def test_an_old_switch_value_the_table_does_not_know_is_refused_by_the_class():
    with pytest.raises(UserError, match=r"^baseline: lr_schedule must be one of none, cosine, got 'yes'$"):
        registry.build({"class_path": BASELINE, "init_args": {"cosine_schedule": "yes"}})
    scheduled = registry.build({"class_path": BASELINE, "init_args": {"arch": "mlp", "cosine_schedule": True}})
    assert scheduled.hparams.lr_schedule == "cosine" and "lr_scheduler" in scheduled.configure_optimizers()


def test_an_alias_never_chooses_a_class():
    """The untrusted-file rule holds with old names: the class path is the file's, refused off the list."""
    for kind, spec in (("model", {"class_path": "os.system", "init_args": {"img_size": SIZE}}),
                       ("data", {"class_path": "subprocess.Popen", "init_args": {"channels": 1}})):
        assert current_config(spec) is spec
        with pytest.raises(UserError, match=f"refused: the file names {kind} class"):
            registry.instantiate(spec, kind)
    data_off_the_list = {"class_path": VIT, "init_args": {**TINY, "img_size": SIZE},
                         "data": {"class_path": "os.system", "init_args": {"channels": 1}}}
    renamed = current_config(data_off_the_list)
    assert renamed["class_path"] == VIT and renamed["data"] == data_off_the_list["data"]


def test_old_names_are_noted_once_at_info_level(caplog, monkeypatch):
    monkeypatch.setattr(hparams, "_noted", set())
    with caplog.at_level(logging.INFO, logger="zoo"):
        for _ in range(3):
            current_init_args(VIT, {"img_size": SIZE})
    lines = [r.getMessage() for r in caplog.records if r.name == "zoo"]
    assert lines == ["ViTClassifier: hyperparameters saved under old names read as img_size -> image_size"]


# ----------------------------------------------------------------------------- every load path
def test_an_old_lightning_checkpoint_loads_through_the_zoo_and_through_lightning(tmp_path):
    model, old = _old_vit_checkpoint(tmp_path)
    _same_model(zoo.load_checkpoint(old), model)  # eval.py --checkpoint and the zoo commands
    # Lightning drops a name the class no longer takes: without the alias it builds the 28 px default
    _same_model(ViTClassifier.load_from_checkpoint(old), model)
    assert ViTClassifier.load_from_checkpoint(old, num_figures=5).hparams.num_figures == 5  # kwargs still win


def test_init_from_an_old_checkpoint_reads_its_config_in_current_names(tmp_path):
    model, old = _old_vit_checkpoint(tmp_path)
    fresh = _tiny_vit()
    torch.manual_seed(1)
    fresh.backbone.vit.head.reset_parameters()  # another start than the checkpoint's
    start = InitFrom.prepare(str(old), fresh)
    assert start.config["init_args"]["image_size"] == SIZE and "img_size" not in start.config["init_args"]
    assert InitFrom.source_config(str(old))["init_args"]["num_figures"] == 3
    start.on_fit_start(SimpleNamespace(datamodule=None), fresh)
    _same_model(fresh, model)


def test_an_old_release_and_manifest_load_to_the_same_model(tmp_path, monkeypatch):
    model = _tiny_vit()
    old = _old_config(model.zoo_config())
    assert old["init_args"]["img_size"] == SIZE
    sha = hub.save_release(model, old, tmp_path / "vit_old.safetensors")  # the file keeps the names it has
    manifest = {"vit_old": {"file": "vit_old.safetensors", "sha256": sha, "config": old,
                            "metadata": {"task": "vit", "metrics": {"test/acc": 0.5}}}}
    (tmp_path / "MANIFEST.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path))
    assert hub.manifest()["vit_old"]["config"]["init_args"]["image_size"] == SIZE
    _same_model(zoo.create_model("vit_old", pretrained=True), model)
    _same_model(zoo.load_checkpoint(tmp_path / "vit_old.safetensors"), model)
    assert zoo.get_weights("vit_old").transforms().size == (SIZE, SIZE)
    # and a ViT release is a captioner's backbone by name: timm's img_size comes from its image_size
    from zoo.backbones import BackboneSpec

    spec = BackboneSpec.coerce({"kind": "timm_vit", "pretrained": "vit_old"})
    encoder = spec.build().eval()
    assert spec.img_size == SIZE and torch.equal(encoder(torch.ones(1, 1, SIZE, SIZE)).tokens,
                                                 model.backbone(torch.ones(1, 1, SIZE, SIZE)).tokens)


def test_eval_py_evaluates_an_old_file_as_the_new_one(tmp_path, tiny_data, capsys):
    from zoo.commands.evaluate import main

    model = _tiny_vit(28)  # Fashion-MNIST's size
    config = {**model.zoo_config(), "data": FMNIST}
    records = {}
    for name, written in (("new", config), ("old", _old_config(config))):
        path = tmp_path / f"{name}.safetensors"
        hub.save_release(model, written, path)
        assert main(["--checkpoint", str(path), "--json", str(tmp_path / f"{name}.json"), "--accelerator", "cpu"]) == 0
        records[name] = json.loads((tmp_path / f"{name}.json").read_text())
    capsys.readouterr()
    assert records["old"]["config"]["init_args"]["image_size"] == 28 and "img_size" not in records["old"]["config"]["init_args"]
    assert records["old"]["metrics"] == records["new"]["metrics"]
    assert records["old"]["config"] == records["new"]["config"]


def test_release_checks_read_old_recipes_and_command_lines_in_current_names(monkeypatch):
    recipe = "configs/vit/fmnist.yaml"
    now = release.load_recipe(recipe)
    then = {**now, "model": {**now["model"], "init_args": _old_names({**now["model"]["init_args"], "image_size": 28}, VIT)}}
    assert then["model"]["init_args"]["img_size"] == 28
    monkeypatch.setattr(release, "recipe_at", lambda path, commit: then)
    assert release.recipe_drift(recipe, "f20d3c307959aece3e54212120a2e5e59fe3e0d9",
                                ["--model.init_args.img_size", "28"]) == []
    assert release.recipe_drift(recipe, "f20d3c307959aece3e54212120a2e5e59fe3e0d9",
                                ["--model.init_args.img_size", "32"]) == \
        ["model.init_args.image_size: 32 when trained, None in the recipe now"]
    assert release.override_problems(["--model.init_args.img_size", "28"], now) == []
    assert release.override_problems(["--model.init_args.img_size", "32"], now) == \
        ["trained with --model.init_args.img_size 32, which the recipe does not say"]
    config = zoo.create_model("vit_fmnist").zoo_config()
    assert release.recipe_mismatches(_old_config({**config, "data": now["data"]}), then) == []


def test_the_shipped_manifest_and_recipes_use_current_names():
    """The repository's own files were rewritten; the released weight files were not (their
    embedded configs keep the old names, read through the table: tests/test_releases.py)."""
    texts = [(REPO / "weights" / "MANIFEST.json").read_text(),
             *(p.read_text() for p in sorted((REPO / "configs").glob("*/*.yaml")))]
    manifest = json.loads(texts[0])
    for record in manifest.values():
        assert current_config(record["config"]) == record["config"]
    for path in sorted((REPO / "configs").glob("*/*.yaml")):
        recipe = yaml.safe_load(path.read_text()) or {}
        for section in ("model", "data"):
            assert current_spec(recipe.get(section)) == recipe.get(section), path
    path = REPO / "weights" / manifest["vit_fmnist"]["file"]
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()[hub.CONFIG_KEY])["init_args"]["img_size"] == 28
    _, embedded = hub.load_weights(path)
    assert embedded["init_args"]["image_size"] == 28 and "img_size" not in embedded["init_args"]


# ----------------------------------------------------------------------------- train.py
def _as_old_run(trained_run, tmp_path, schedule: bool):
    """A copy of the shared tiny training whose last.ckpt was written before `lr_schedule`."""
    work = tmp_path / "work"
    shutil.copytree(trained_run["work"], work)
    root = work / "runs" / "cnn"
    last = root / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["lr_schedule"] == "cosine"
    checkpoint["hyper_parameters"] = {**_old_names(checkpoint["hyper_parameters"], BASELINE), "cosine_schedule": schedule}
    checkpoint["zoo"] = _old_config(checkpoint["zoo"])
    checkpoint["zoo"]["init_args"]["cosine_schedule"] = schedule
    torch.save(checkpoint, last)
    return work, root


@pytest.mark.slow
def test_train_py_resumes_an_old_checkpoint_and_refuses_one_that_differs(trained_run, tiny_data_dir, tmp_path):
    for schedule, expected in ((False, 2), (True, 0)):
        work, root = _as_old_run(trained_run, tmp_path / str(schedule), schedule)
        args = tiny_fit_args("configs/baseline/cnn_centered.yaml", root, "--trainer.max_epochs=2",
                             "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2", "--ckpt_path", "last")
        code, out, err = run_main(args, cwd=work, env=cli_env(tiny_data_dir))
        assert code == expected, err[-3000:]
        if not schedule:  # saved as cosine_schedule: false, i.e. lr_schedule 'none'; the recipe says 'cosine'
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and "model.init_args.lr_schedule differs ('cosine' here, 'none' in the " \
                                       "checkpoint)" in lines[0], err[-3000:]


@pytest.mark.slow
def test_train_py_reads_an_old_recipe_in_current_names_after_one_warning(tmp_path):
    recipe = yaml.safe_load((REPO / "configs/vit/fmnist.yaml").read_text())
    # the size written out (the recipe leaves it to the data), under its old name
    recipe["model"]["init_args"] = {**_old_names({**recipe["model"]["init_args"], "image_size": 28}, VIT),
                                    "accel": "compile"}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(recipe))
    # a process of its own: the one warning line must not depend on what earlier tests in this
    # process did to the warning filters
    code, out, err = run_cli(["train.py", "fit", "--config", tmp_path / "old.yaml", "--print_config",
                               f"--trainer.default_root_dir={tmp_path / 'run'}"], cwd=tmp_path, env=cli_env(None))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 0 and len(lines) == 1, err[-2000:]
    assert lines[0] == f"{tmp_path / 'old.yaml'}: read in current hyperparameter names (its model's accel is the run's --accel compile)"
    printed = yaml.safe_load(out)
    assert printed["accel"] == "compile" and printed["model"]["init_args"]["image_size"] == recipe["model"]["init_args"]["img_size"]
    assert not {"img_size", "accel"} & set(printed["model"]["init_args"])


# ----------------------------------------------------------------------------- retired arguments
def test_speed_left_the_hyperparameters_and_old_files_still_load(caplog):
    """`accel` (and ViT's older `compile`) is the run's option now: a file that carries it loses
    it, silently where it asked for nothing ("auto", false), else after one warning."""
    ram = "zoo.models.ram.RAM"
    assert current_init_args(ram, {"accel": "auto", "num_glimpses": 3}) == {"num_glimpses": 3}
    assert current_init_args(VIT, {"compile": False, "img_size": SIZE}) == {"image_size": SIZE}
    with caplog.at_level(logging.WARNING, logger="zoo"):
        for _ in range(3):
            assert current_init_args(ram, {"accel": "reduce-overhead"}) == {}
    warned = [r.getMessage() for r in caplog.records if "accel" in r.getMessage()]
    assert warned == ["RAM: accel: reduce-overhead is not applied; speed is a run option now "
                      "(zoo train fit --accel MODE)"]


def test_an_old_recipe_trains_with_its_accel_as_the_runs_option(tmp_path, caplog):
    from zoo.training.recipe_args import with_current_names

    recipe = yaml.safe_load((REPO / "configs/baseline/mlp_centered.yaml").read_text())
    recipe["model"]["init_args"].update(accel="compile", cosine_schedule=False)
    recipe["model"]["init_args"].pop("lr_schedule", None)
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(recipe))
    with caplog.at_level(logging.WARNING, logger="zoo"):
        argv = with_current_names(["fit", "--config", str(old), "--model.init_args.accel=eager"])
    assert argv[:2] == ["fit", "--config"] and argv[-2:] == ["--accel", "eager"]
    current = yaml.safe_load(argv[2])
    assert current["accel"] == "compile" and current["model"]["init_args"]["lr_schedule"] == "none"
    assert not {"accel", "cosine_schedule"} & set(current["model"]["init_args"])
    assert len(caplog.records) == 2  # one line for the recipe, one for the flag
    unchanged = str(REPO / "configs/baseline/mlp_centered.yaml")
    assert with_current_names(["fit", "--config", unchanged]) == ["fit", "--config", unchanged]


# ----------------------------------------------------------------------------- blocks (zoo.hparams.Block)
def _flat(class_path: str, init_args: dict) -> dict | None:
    """`init_args` as the zoo wrote them before their blocks (the inverse of MOVED and MOVED_AS); a
    field added to a block since never was an argument: left out at its default, and a config that
    sets it has no flat form (None)."""
    back = {field: old for old, field in MOVED_AS.get(class_path, {}).items()}
    out = dict(init_args)
    for block, then in MOVED.get(class_path, {}).items():
        if isinstance(out.get(block), dict):
            fields = {back.get(k, k): v for k, v in out.pop(block).items()}
            newer = {k: v for k, v in fields.items() if k not in then}
            defaults = block_types(registry.resolve_class(class_path))[block].__dataclass_fields__
            if any(v != defaults[k].default for k, v in newer.items()):
                return None
            out.update({k: v for k, v in fields.items() if k in then})
    return out


#: the tiny configurations of every family whose arguments come in Blocks, where a flat config could
#: say them (none sets a field added to a block since)
BLOCKED = [(name, cls, hp) for name, cls, hp in tiny_models() if block_types(cls)
           and _flat(path_of(cls), {k: v for k, v in hp.items() if k in MOVED.get(path_of(cls), {})}) is not None]


def test_the_moved_table_names_fields_of_the_blocks_with_their_defaults():
    """Each moved argument is one field of its block, whose default is the argument's then (a field
    added since, such as a new estimator's, never was an argument); no class still takes it."""
    assert BLOCKED
    for _, cls, _ in BLOCKED:
        then = MOVED[path_of(cls)]
        moved_as = MOVED_AS.get(path_of(cls), {})
        assert set(then) == set(block_types(cls)), cls
        for block, block_cls in block_types(cls).items():
            assert issubclass(block_cls, Block)
            fields = [moved_as.get(old, old) for old in then[block]]
            assert len(set(fields)) == len(fields) and set(fields) <= set(block_cls.__dataclass_fields__), block
            for old, default in then[block].items():  # the defaults then are the block's now
                assert default == block_cls.__dataclass_fields__[moved_as.get(old, old)].default, (block, old)
        assert set(inspect.signature(cls.__init__).parameters) & {old for b in then.values() for old in b} == set()


@pytest.mark.parametrize("name, cls, hp", BLOCKED, ids=[b[0] for b in BLOCKED])
def test_a_config_from_before_the_blocks_builds_the_same_model(name, cls, hp):
    """A release, checkpoint or recipe written with the flat names: the same hyperparameters, the
    same initialisation from the same seed, the same outputs."""
    model = registry.build({"class_path": path_of(cls), "init_args": hp})
    old = _flat(path_of(cls), dict(model.hparams))
    assert not set(block_types(cls)) & set(old)
    torch.manual_seed(0)
    new = registry.build({"class_path": path_of(cls), "init_args": dict(model.hparams)})
    torch.manual_seed(0)
    flat = registry.build({"class_path": path_of(cls), "init_args": old})
    assert dict(flat.hparams) == dict(new.hparams)
    for (key, a), (key_b, b) in zip(new.state_dict().items(), flat.state_dict().items()):
        assert key == key_b and torch.equal(a, b), key


def test_an_old_field_beside_its_new_block_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"gives patch_size \(now a field of retina\) and the retina block; keep the "
                                        r"retina block only$"):
        registry.build({"class_path": "zoo.models.ram.RAM", "init_args": {"patch_size": 4, "retina": {"num_scales": 2}}})
    with pytest.raises(UserError, match=r"^RAM: retina: unknown field\(s\) patch; known: patch_size, num_scales"):
        registry.build({"class_path": "zoo.models.ram.RAM", "init_args": {"retina": {"patch": 4}}})
    with pytest.raises(UserError, match=r"^RAM: network.core must be one of rnn, lstm, got 'gru'$"):
        registry.build({"class_path": "zoo.models.ram.RAM", "init_args": {"network": {"core": "gru"}}})
    assert hparams.renamed_for("zoo.models.ram.RAM")["retina_method"] == "retina.method"  # train.py's hint


def test_an_old_flat_recipe_trains_the_model_of_its_nested_rewrite(tmp_path, monkeypatch):
    """configs/ram/*.yaml were rewritten into blocks; the recipe as it was (flat names) is read in
    current names by train.py (zoo.training.recipe_args) and by the release checks, to the same model."""
    from zoo.training.recipe_args import with_current_names

    recipe = "configs/ram/fmnist_cluttered60_dram_paths4.yaml"
    now = release.load_recipe(recipe)
    model_path = now["model"]["class_path"]
    then = {**now, "model": {**now["model"], "init_args": _flat(model_path, now["model"]["init_args"])}}
    assert then["model"]["init_args"]["patch_size"] == 12 and "retina" not in then["model"]["init_args"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(then))
    argv = with_current_names(["fit", "--config", str(tmp_path / "old.yaml")])
    current = yaml.safe_load(argv[2])["model"]
    assert current["init_args"]["retina"] == {"patch_size": 12, "num_scales": 2, "scale_factor": 2, "method": "crop",
                                              "subpixel": True}
    torch.manual_seed(0)
    old_model = registry.build(current)
    torch.manual_seed(0)
    new_model = registry.build(now["model"])
    assert dict(old_model.hparams) == dict(new_model.hparams)
    monkeypatch.setattr(release, "recipe_at", lambda path, commit: then)
    assert release.recipe_drift(recipe, "0" * 40) == []  # the release checks see the same recipe
    config = zoo.create_model("ram_fmnist_cluttered60_dram_paths4").zoo_config()
    assert release.recipe_mismatches({**config, "init_args": _flat(model_path, config["init_args"]),
                                      "data": now["data"]}, then) == []


def test_an_old_ram_lightning_checkpoint_loads_through_the_zoo_and_through_lightning(tmp_path):
    from zoo.models.ram import RAM, TINY

    torch.manual_seed(0)
    model = RAM(**{**TINY, "retina": {**TINY["retina"], "method": "filterbank"}, "policy": {"std": 0.2}}).eval()
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": _flat(path_of(RAM), dict(model.hparams)),
                  "zoo": {**model.zoo_config(), "init_args": _flat(path_of(RAM), model.zoo_config()["init_args"])},
                  "pytorch-lightning_version": L.__version__}
    assert checkpoint["hyper_parameters"]["retina_method"] == "filterbank"
    torch.save(checkpoint, tmp_path / "old.ckpt")
    x = torch.rand(2, 1, 20, 20)
    for loaded in (zoo.load_checkpoint(tmp_path / "old.ckpt"), RAM.load_from_checkpoint(tmp_path / "old.ckpt")):
        assert loaded.hparams.retina["method"] == "filterbank" and loaded.hparams.policy["std"] == 0.2
        assert torch.equal(loaded.eval()(x), model(x))
