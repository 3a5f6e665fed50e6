"""The data decides the image size, channels and label set a model takes (zoo.registry.link_data):
every recipe agrees
with its data, a model left at its class default takes the data's size, and a recipe whose model
and data disagree is refused in one line before anything is built."""
from __future__ import annotations

import inspect

import pytest
import yaml

import zoo
from conftest import REPO, cli_env, run_main
from zoo import registry
from zoo.data.base import as_size
from zoo.guards.errors import UserError
from zoo.hparams import block_defaults
from zoo.registry import link_data, resolve_class


def _with_defaults(cls, init_args: dict) -> dict:
    """init_args as LightningCLI hands them over: every argument, the class defaults filled in."""
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **init_args}


def _recipe(name: str) -> tuple:
    """(data class, data init_args, model class, model init_args) of a registry entry's recipe."""
    recipe = yaml.safe_load(registry.get_entry(name).recipe.read_text())
    data_cls = resolve_class(recipe["data"]["class_path"], "data")
    model_cls = resolve_class(recipe["model"]["class_path"], "model")
    return (data_cls, _with_defaults(data_cls, recipe["data"].get("init_args") or {}),
            model_cls, _with_defaults(model_cls, recipe["model"].get("init_args") or {}))


@pytest.mark.parametrize("name", registry.list_models())
def test_every_recipe_trains_its_model_on_images_of_its_size(name):
    data_cls, data_args, model_cls, model_args = _recipe(name)
    link_data(model_cls, model_args, data_cls, data_args)  # raises if they disagree
    served = data_cls.image_size_for(**data_args)
    if served is not None and "image_size" in model_args:
        assert as_size(model_args["image_size"]) == served


def test_a_model_at_its_default_size_takes_the_datas():
    from zoo.data.fashion_mnist import FashionMNISTDataModule
    from zoo.data.scenes import FashionScenesDataModule
    from zoo.models.captioner import Captioner
    from zoo.models.ram import RAM

    model_args = _with_defaults(RAM, {})
    link_data(RAM, model_args, FashionMNISTDataModule, {"variant": "cluttered60"})
    assert model_args["image_size"] == 60
    model_args = _with_defaults(Captioner, {})
    link_data(Captioner, model_args, FashionScenesDataModule, {"canvas_size": 96})
    assert model_args["image_size"] == [96, 96]


def test_a_model_set_to_another_size_is_refused():
    from zoo.data.scenes import FashionScenesDataModule
    from zoo.models.captioner import Captioner

    with pytest.raises(UserError, match=r"image_size \[128, 128\] disagrees with the data's images "
                                        r"\(canvas_size 96: 96x96 px\)"):
        link_data(Captioner, _with_defaults(Captioner, {"image_size": [128, 128]}), FashionScenesDataModule,
                  {"canvas_size": 96})


@pytest.mark.parametrize("name", registry.list_models())
def test_every_recipe_trains_its_model_on_images_of_its_channels(name):
    data_cls, data_args, model_cls, model_args = _recipe(name)
    given = model_args.get("in_chans")
    link_data(model_cls, model_args, data_cls, data_args)  # raises if they disagree
    served = data_cls.image_chans_for(**data_args)
    assert served is not None  # every data module says what it serves
    if given is not None:
        assert model_args["in_chans"] == served


def test_a_model_at_its_default_channels_takes_the_datas_and_other_channels_are_refused():
    from zoo.data.fashion_mnist import FashionMNISTDataModule
    from zoo.data.imagefolder import ImageFolderDataModule
    from zoo.models.baselines import Classifier

    assert inspect.signature(Classifier.__init__).parameters["in_chans"].default == 1
    model_args = _with_defaults(Classifier, {})
    link_data(Classifier, model_args, ImageFolderDataModule, {"root": "x"})  # RGB folders
    assert model_args["in_chans"] == 3
    model_args = _with_defaults(Classifier, {})
    link_data(Classifier, model_args, ImageFolderDataModule, {"root": "x", "in_chans": 1})
    assert model_args["in_chans"] == 1
    with pytest.raises(UserError, match=r"^--model.init_args.in_chans 3 disagrees with the data's images "
                                        r"\(FashionMNISTDataModule: 1 channel\(s\)\)"):
        link_data(Classifier, _with_defaults(Classifier, {"in_chans": 3}), FashionMNISTDataModule, {})


def test_train_py_refuses_a_disagreeing_recipe_in_one_line(tmp_path):
    code, out, err = run_main(["train.py", "fit", "--config", REPO / "configs/ram/fmnist_cluttered60.yaml",
                               "--model.init_args.image_size", "100", f"--trainer.default_root_dir={tmp_path / 'run'}"],
                              cwd=tmp_path, env=cli_env(None))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert lines[0] == ("train.py: error: --model.init_args.image_size 100 disagrees with the data's images "
                        "(variant cluttered60: 60x60 px); set one of them so they agree, or leave the model's out "
                        "to take the data's")
    assert not (tmp_path / "run").exists()


def test_the_data_names_the_classes_and_a_recipe_copies_none():
    """The label set comes from the data (class names, their count), for a model left at its
    defaults; and zoo.create_model builds a recipe's model with it, as train.py does."""
    from zoo.data.fashion_mnist import CLASS_NAMES, FashionMNISTDataModule
    from zoo.models.ram import RAM

    model_args = {}
    link_data(RAM, model_args, FashionMNISTDataModule, {"variant": "cluttered100"})
    assert model_args == {"image_size": 100, "class_names": CLASS_NAMES}  # num_classes is already 10
    assert zoo.create_model("ram_fmnist_cluttered100").hparams.class_names == CLASS_NAMES


def _restated(recipe: dict) -> list[str]:
    """What a recipe says that it need not: a class default, or a fact its data decides."""
    from zoo.data.base import as_size

    def plain(value):
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    said = []
    for section in ("model", "data"):
        spec = recipe.get(section) or {}
        defaults = _with_defaults(resolve_class(spec["class_path"], section), {})
        said += [f"{section}.init_args.{key}: {value!r} is the default" for key, value in (spec.get("init_args") or {}).items()
                 if key in defaults and not isinstance(value, dict) and plain(value) == plain(defaults[key])]
        fields = block_defaults(resolve_class(spec["class_path"], section))  # a block's (zoo.hparams.Block) too
        said += [f"{section}.init_args.{key}.{field}: {value!r} is the default"
                 for key, block in (spec.get("init_args") or {}).items() if isinstance(block, dict)
                 for field, value in block.items()
                 if f"{key}.{field}" in fields and plain(value) == plain(fields[f"{key}.{field}"])]
    data_cls, model_args = resolve_class(recipe["data"]["class_path"], "data"), recipe["model"].get("init_args") or {}
    data_args = recipe["data"].get("init_args") or {}
    names = data_cls.class_names_for(**data_args)
    decided = {"image_size": data_cls.image_size_for(**data_args), "in_chans": data_cls.image_chans_for(**data_args),
               "class_names": list(names) if names else None, "num_classes": len(names) if names else None}
    for key, value in decided.items():
        given = model_args.get(key)
        if value is not None and given is not None and (as_size(given) if key == "image_size" else given) == value:
            said.append(f"model.init_args.{key}: {given!r} is the data's")
    return said


@pytest.mark.parametrize("name", registry.list_models())
def test_a_recipe_holds_only_what_differs_from_the_defaults_and_its_data(name):
    """A recipe says what it changes: nothing that is a class default, nor what its data decides
    (image size, channels, class names and their count: the data states them, link_data gives them)."""
    assert _restated(yaml.safe_load(registry.get_entry(name).recipe.read_text())) == []


def test_a_recipe_that_restates_a_default_or_copies_class_names_is_refused():
    from zoo.data.fashion_mnist import CLASS_NAMES

    recipe = yaml.safe_load((REPO / "configs/ram/fmnist_cluttered60.yaml").read_text())
    recipe["model"]["init_args"].update(eval_samples=10, image_size=60, class_names=list(CLASS_NAMES),
                                        optimization={"lr": 0.001})
    assert _restated(recipe) == ["model.init_args.eval_samples: 10 is the default",
                                 "model.init_args.optimization.lr: 0.001 is the default",
                                 "model.init_args.image_size: 60 is the data's",
                                 f"model.init_args.class_names: {list(CLASS_NAMES)!r} is the data's"]
