"""Adapting a release to your own task (issue 24): a new label set keeps every weight but the
classifier head, a new vocabulary keeps the rows of the words the release knows, any other change
is refused in one line; an ImageFolder's class names reach the model and its checkpoint."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import zoo
from conftest import REPO, cli_env, run_cli, run_main, tiny_fit_args
from zoo.guards.errors import UserError


def test_new_label_set_keeps_all_but_the_head():
    release = zoo.create_model("vit_fmnist", pretrained=True).state_dict()
    model = zoo.create_model("vit_fmnist", pretrained=True, num_classes=5)
    state = model.state_dict()
    head = [k for k in state if k.startswith(model.head_keys)]
    assert head and model.hparams.num_classes == 5 and model.hparams.class_names is None
    for key, value in state.items():
        if key in head:
            assert value.shape[0] == 5 and release[key].shape[0] == 10
        else:
            assert torch.equal(value, release[key]), key
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 5)


def test_an_unasked_shape_change_is_refused_in_one_line():
    with pytest.raises(UserError) as info:
        zoo.create_model("vit_fmnist", pretrained=True, backbone={"mlp_ratio": 4.0})
    assert "shapes differ" in str(info.value) and "\n" not in str(info.value)


def test_a_new_vocabulary_keeps_the_rows_of_known_words():
    release = zoo.create_model("sat_soft_scenes", pretrained=True)
    old = list(release.hparams.vocab)
    new = old[:4] + ["zebra", "giraffe"] + old[4:][::-1][:10]  # new words first, then known ones reordered
    model = zoo.create_model("sat_soft_scenes", pretrained=True, vocab=new)
    assert list(model.hparams.vocab) == new
    before, after = release.state_dict(), model.state_dict()
    for key in model.card.vocab_keys:
        for i, word in enumerate(new):
            if word in old:
                assert torch.equal(after[key][i], before[key][old.index(word)]), (key, word)
            else:
                assert all(not torch.equal(after[key][i], row) for row in before[key]), (key, word)
    for key in set(after) - set(model.card.vocab_keys):
        assert torch.equal(after[key], before[key]), key


def _folder(root, classes=("cat", "dog"), size=(28, 28)):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in classes:
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.mark.slow
def test_init_from_a_release_on_an_image_folder_stores_its_class_names(tmp_path):
    data = _folder(tmp_path / "pets")
    root = tmp_path / "run"
    rc, _, err = run_main(["train.py", "fit", "--config", REPO / "configs/vit/fmnist.yaml",
                           "--config", REPO / "configs/vit/_fmnist5_imagefolder.yaml", "--data.init_args.root", data,
                           "--data.init_args.batch_size", "4", "--init_from", "vit_fmnist",
                           "--trainer.max_epochs", "1", "--trainer.logger", "false",
                           "--trainer.default_root_dir", root], cwd=tmp_path, env=cli_env())
    assert rc == 0, err[-3000:]
    assert "new classifier head backbone.vit.head.weight (2, 96)" in err
    checkpoint = sorted((root / "checkpoints").glob("best*.ckpt"))[-1]
    model = zoo.load_checkpoint(checkpoint)
    assert model.hparams.num_classes == 2 and list(model.hparams.class_names) == ["cat", "dog"]
    rc, out, err = run_main(["-m", "zoo.commands.cli", "attend", "--checkpoint", checkpoint, "--out", tmp_path / "maps",
                             data / "val" / "dog" / "0.png"], cwd=tmp_path, env=cli_env())
    assert rc == 0, err[-3000:]
    predicted = out.split(": ", 1)[1].split(" (")[0]  # "IMAGE: NAME (P%) -> ..."
    assert predicted in ("cat", "dog"), out


def test_transforms_take_pil_arrays_and_tensors_alike():
    import torchvision.transforms.functional as TF

    rng = np.random.default_rng(1)
    for name, shape in (("vit_fmnist", (40, 30)), ("sat_soft_scenes", (50, 70, 3))):
        pil = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        transform = zoo.get_weights(name).transforms()
        reference = transform(pil)
        array, tensor = np.asarray(pil), TF.pil_to_tensor(pil)
        for other in (array, tensor, TF.to_tensor(pil)):
            assert torch.allclose(transform(other), reference, atol=1e-6), (name, type(other))
    with pytest.raises(UserError):
        transform([1, 2, 3])


def test_zoo_list_has_a_header_and_no_match_is_a_user_error():
    rc, out, _ = run_main(["-m", "zoo.commands.cli", "list", "vit_*"], cwd=REPO, env=cli_env())
    assert rc == 0 and out.splitlines()[0].split()[:2] == ["name", "weights"] and "vit_fmnist" in out
    rc, out, err = run_main(["-m", "zoo.commands.cli", "list", "sat_soft_coco"], cwd=REPO, env=cli_env())
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no model matches 'sat_soft_coco'" in err and "sat_coco_soft" in err


def test_zoo_caption_names_its_default_model_and_marks_a_cut_caption(tmp_path, capsys):
    from zoo.commands.cli import main

    image = tmp_path / "scene.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    capsys.readouterr()
    assert main(["caption", str(image), "--max-len", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("[cut at 1 words]") and "model sat_soft_scenes (the default" in err


def test_glimpse_json_names_its_boxes(tmp_path, capsys):
    from zoo.commands.cli import main

    image = tmp_path / "item.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(image)
    capsys.readouterr()
    assert main(["attend", "--model", "ram_fmnist_centered", str(image), "--out", str(tmp_path / "g"), "--json"]) == 0
    import json

    (record,) = json.loads(capsys.readouterr().out)
    step = record["steps"][0]
    assert step["label"] == "glimpse 1" and set(step["boxes"]) == {"scale 1"} and len(step["boxes"]["scale 1"]) == 4
    assert len(step["peak"]) == 2  # (x, y)


@pytest.mark.slow
@pytest.mark.parametrize("init_vocab", ["data", "release"])
def test_init_from_a_captioner_on_new_captions_keeps_known_words(tmp_path, init_vocab):
    root = tmp_path / "run"
    rc, _, err = run_main(["train.py", "fit", "--config", REPO / "configs/sat/soft_scenes.yaml",
                           "--init_from", "sat_soft_scenes", "--init_vocab", init_vocab,
                           "--data.init_args.num_train", "64", "--data.init_args.num_val", "16",
                           "--data.init_args.num_test", "16", "--data.init_args.max_vocab", "6",
                           "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
                           "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
                           "--trainer.default_root_dir", root], cwd=tmp_path, env=cli_env())
    assert rc == 0, err[-3000:]
    release = list(zoo.create_model("sat_soft_scenes", pretrained=True).hparams.vocab)
    vocab = list(zoo.load_checkpoint(root / "checkpoints" / "last.ckpt").hparams.vocab)
    if init_vocab == "release":
        assert vocab == release and "keep the release's rows" not in err  # nothing to adapt
        assert re.search(r"\d+ of \d+ training caption words \(\d+ distinct\) are not in the given vocabulary of "
                         rf"{len(release) - 4} words: they read as <unk>", err)
    else:
        assert len(vocab) == 4 + 6 and set(vocab) <= set(release)
        assert "vocabulary of 10 entries: 10 keep the release's rows, 0 new words start fresh" in err


def test_caption_refuses_a_tensor_of_another_size():
    model = zoo.create_model("sat_soft_scenes", pretrained=True)
    assert model.caption(torch.rand(1, 3, 64, 64), beam_size=1, max_len=3)
    with pytest.raises(UserError, match=r"^images are \(3, 256, 256\), the model expects \(3, 64, 64\) \(prepare images "
                                        r"with zoo.preprocessing\(model\)\)$"):
        model.caption(torch.rand(1, 3, 256, 256))


def test_backbone_null_on_the_command_line_means_unset():
    from zoo.backbones.spec import BackboneSpec

    spec = BackboneSpec(kind="stem", pretrained="None", pretrained_file="None", level="None")
    assert spec.pretrained is False and spec.pretrained_file is None and spec.level is None


@pytest.mark.slow
def test_a_plain_training_run_prints_no_noise_and_one_data_line(tmp_path, tiny_data_dir):
    """Nothing on a plain run contradicts the README or is ours to silence: no cloud advert, no
    save-side 'weights_only ... False' under our safety promise, no W&B 'anonymous' notice, no empty
    jsonargparse deprecation; and one line says what data it trains on. A process of its own: what a
    library says once per process (on import, on a first warning) is what a user sees."""
    rc, out, err = run_cli(tiny_fit_args("configs/baseline/cnn_centered.yaml", tmp_path / "run", "--trainer.max_epochs=1",
                                         "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"),
                           cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, err[-3000:]
    for noise in ("💡", "`weights_only` was not set", "anonymous setting", "JsonargparseDeprecationWarning",
                  "in eval mode"):
        assert noise not in err, noise
    lines = [line for line in out.splitlines() if line.startswith("data: ")]
    assert len(lines) == 1 and lines[0].startswith("data: FashionMNISTDataModule: train ")


@pytest.mark.parametrize("args, expected", [
    (["--model.init_args.backbone.modelname", "vit"],
     "model.backbone (BackboneSpec): Option 'modelname' is not accepted; did you mean --model.init_args.backbone.model_name?"),
    (["--model.init_args.decoder.hiden", "3"],
     "model.decoder (DecoderSpec): Option 'hiden' is not accepted; did you mean --model.init_args.decoder.hidden_dim?"),
    (["--model.init_args.hidden_dim", "3"], "Option 'hidden_dim' is not accepted; its name is now decoder.hidden_dim"),
    (["--trainer.max_epoch", "3"], "did you mean --trainer.max_epochs?"),
])
def test_command_line_mistakes_name_the_field_with_a_did_you_mean(tmp_path, args, expected):
    code, out, err = run_main(["train.py", "fit", "--config", REPO / "configs/sat/soft_scenes.yaml", *args,
                               "--print_config"], cwd=tmp_path, env=cli_env(None))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], err[-1500:]


@pytest.mark.parametrize("recipe, args, expected", [
    # a block's field given flat: the class's own arguments and its blocks' fields are the choices
    ("configs/ram/fmnist_centered.yaml", ["--model.init_args.glimpse_szie", "8"],
     "model (RAM): Option 'glimpse_szie' is not accepted; did you mean --model.init_args.network.glimpse_dim?"),
    ("configs/ram/fmnist_centered.yaml", ["--model.init_args.num_glimpse", "8"],
     "did you mean --model.init_args.num_glimpses?"),
    # a config file's misspelt section: the config's own sections are the choices
    ("modle", [], "'modle.class_path' is not accepted; did you mean model.class_path?"),
    ("tranier", [], "'tranier.max_epochs' is not accepted; did you mean trainer.max_epochs?"),
])
def test_a_recipe_key_typo_gets_a_did_you_mean_from_the_recipes_own_keys(tmp_path, recipe, args, expected):
    if not recipe.startswith("configs/"):  # a YAML config with one top-level key misspelt
        text = (REPO / "configs/ram/fmnist_centered.yaml").read_text()
        text = text.replace("model:", "modle:") if recipe == "modle" else text.replace("trainer:", "tranier:")
        (tmp_path / "typo.yaml").write_text(text)
    config = REPO / recipe if recipe.startswith("configs/") else tmp_path / "typo.yaml"
    code, out, err = run_main(["train.py", "fit", "--config", config, *args, "--print_config"],
                              cwd=tmp_path, env=cli_env(None))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], err[-1500:]


@pytest.mark.slow
def test_a_folder_without_classes_is_one_line(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
    code, out, err = run_main(["train.py", "fit", "--config", REPO / "configs/vit/imagenet_finetune.yaml",
                               "--data.init_args.root", tmp_path / "data", "--model.init_args.backbone.pretrained", "false",
                               f"--trainer.default_root_dir={tmp_path / 'run'}"], cwd=tmp_path, env=cli_env(None))
    errors = [line for line in err.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1 and "Couldn't find any class folder" in errors[0], err[-1500:]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("args, expected", [
    (["--config", "ram_fmnist_centred"], "--config ram_fmnist_centred: no such file; did you mean "
                                         "ram_fmnist_centered?"),
    (["--config", "configs/ram/fmnist_centered.yaml", "--init_from", "ram_fmnist_centred"],
     "--init_from ram_fmnist_centred: no such file or release; did you mean ram_fmnist_centered?"),
])
def test_a_registry_name_or_a_near_release_name_gets_a_did_you_mean(tmp_path, args, expected):
    args = [str(REPO / a) if a.startswith("configs/") else a for a in args]
    code, out, err = run_main(["train.py", "fit", *args, f"--trainer.default_root_dir={tmp_path / 'run'}"],
                              cwd=tmp_path, env=cli_env(None))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], err[-1500:]


@pytest.mark.parametrize("given", [["--model.init_args.backbone.level", "null"],
                                   ["--model.init_args.backbone.pretrained_file=null"]])
def test_null_unsets_a_backbone_field_on_the_command_line(tmp_path, given):
    """A nested null means unset, for an int field as for a str one; the rest of the recipe's
    backbone block stays."""
    code, out, err = run_main(["train.py", "fit", "--config", REPO / "configs/sat/soft_scenes.yaml", *given,
                               "--model.init_args.backbone.kernel_size", "5", "--print_config"],
                              cwd=tmp_path, env=cli_env(None))
    assert code == 0, err[-2000:]
    backbone = yaml.safe_load(out)["model"]["init_args"]["backbone"]
    field = given[0].split("=")[0].rsplit(".", 1)[-1]
    assert backbone[field] is None and backbone["kernel_size"] == 5
    assert backbone["pretrained"] == "backbone_fmnist_stem" and backbone["channels"] == [32, 64, 128, 128]


def test_nested_nulls_become_one_field_mappings():
    from zoo.training.recipe_args import with_nested_nulls

    assert with_nested_nulls(["fit", "--model.init_args.backbone.level", "null", "--seed_everything", "1"]) == [
        "fit", "--model.init_args.backbone", '{"level": null}', "--seed_everything", "1"]
    assert with_nested_nulls(["--model.init_args.backbone.level=~"]) == ["--model.init_args.backbone", '{"level": null}']
    kept = ["--model.init_args.backbone.level", "3", "--model.init_args.lr", "null"]
    assert with_nested_nulls(kept) == kept
