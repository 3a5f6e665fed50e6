"""A run's whole life, for every registered family, as a user types it (issue 42): `fit` (tiny) ->
`fit --ckpt_path last` with more epochs (the epochs go on, the W&B run is the same) -> `validate`,
`test` and `predict --predictions` on RUN/config.yaml and the checkpoint -> `eval.py --checkpoint`
-> `zoo attend` / `zoo export --checkpoint` where the card says the family attends / exports, with
every file of the run byte-identical afterwards -> a fine-tune with `--init_from` the run's
checkpoint into a new folder, then its resume from its own config.yaml.

Each resume (`--ckpt_path last`) is a process of its own, as a user's is: a new process that finds
its run, its W&B run included. The other commands go through the same entry points in this process
(conftest.run_main: the same command lines, exit codes and output, without an interpreter start and
its imports, seconds each).

Each family trains its card's first tiny configuration on the data of its representative recipe
(the first of the card's `bench_recipes`, else its first recipe), made tiny by the data card's `tiny`
settings (zoo.data.card; no table of data sets here); what the data decides
(image size, channels, label set, a vocabulary) is left to the data, as in the recipes. The family
with the smallest tiny model runs in `make test-fast`; every family in `make test`.

Also here: a run whose training data makes no batch never exits 0 in silence (one line naming
`batch_size`, before the run folder exists), for every data module."""
from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, cli_env, run_cli, run_main, wandb_runs
from PIL import Image

from zoo import registry
from zoo.models.base import class_path
from zoo.models.card import families

SERVING = dict(batch_size=8, eval_batch_size=8, num_workers=0)
#: what a model takes from its data (zoo.registry.link_data), never from a recipe's model block
LINKED = ("image_size", "in_chans", "num_classes", "class_names")
BUDGET = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
          "--trainer.limit_predict_batches=1", "--trainer.enable_model_summary=false",
          "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1"]


def _data_card(path: str | None):
    """The data card (zoo.data.card) of a data module's class path: its `tiny` settings make the
    lifecycle's data cheap, as in every registry-wide test (empty for a path that is not a data set)."""
    from zoo.data.card import DataCard, data_sets

    return getattr(data_sets().get(path), "card", DataCard())


def _recipe(family: str) -> str:
    """The family's representative recipe: the first of its card's `bench_recipes` (else of its
    recipes) whose data a test can make tiny."""
    entries = registry.find_entries()
    mine = sorted(name for name, entry in entries.items() if registry.family_of(entry) == family)
    candidates = [name for name in [*families()[family].card.bench_recipes, *mine] if name in mine]
    usable = [name for name in candidates if _data_card(entries[name].data.get("class_path")).tiny]
    assert usable, f"family {family}: no recipe on a data set whose card has a tiny configuration ({candidates})"
    return usable[0]


def _tiny_config(family: str) -> dict:
    """A user's recipe: the family's first tiny model, its representative recipe's data, tiny."""
    cls = families()[family]
    tiny = next(iter(cls.card.tiny.values()))
    model = {k: v for k, v in tiny.items() if k not in LINKED and k not in cls.card.filled_by_data}
    data = registry.get_entry(_recipe(family)).data
    return {"model": {"class_path": class_path(cls), "init_args": model},
            "data": {"class_path": data["class_path"],
                     "init_args": {**(data.get("init_args") or {}), **_data_card(data["class_path"]).tiny, **SERVING}}}


@functools.cache
def _size(family: str) -> int:
    """Parameters of the family's tiny model at its data's image size (built on the meta device)."""
    config = _tiny_config(family)
    spec = registry.linked(config["model"], config["data"])
    spec["init_args"].update({k: v for k, v in families()[family].card.filled_by_data.items()
                              if spec["init_args"].get(k) is None})
    with torch.device("meta"):
        return sum(p.numel() for p in registry.build(spec).parameters())


def _lifecycle_params():
    names = [name for name, cls in families().items() if cls.card.tiny]
    fast = min(names, key=_size)
    return [pytest.param(name, marks=() if name == fast else pytest.mark.slow, id=name) for name in names]


# ----------------------------------------------------------------------------- helpers
def _hashes(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _ok(args, work, env, what, run=run_cli):
    code, out, err = run(args, cwd=work, env=env) if run is run_main else run(args, cwd=work, env=env, timeout=600)
    assert code == 0, f"{what} failed (rc {code}):\n{out[-2000:]}\n{err[-4000:]}"
    return out, err


def _last(root) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")


def _wandb_runs(work, run_id: str) -> list:
    return [folder for found, folder in wandb_runs(work) if found == run_id]


def _image(config: dict, path) -> None:
    """A random image of the size and channels the run's data serves (what `exact` families take)."""
    data = registry.resolve_class(config["data"]["class_path"], "data")
    arguments = data.arguments(**config["data"]["init_args"])
    height, width = data.image_size_for(**arguments)
    chans = data.image_chans_for(**arguments) or 3
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, chans), dtype=np.uint8)
    Image.fromarray(pixels[..., 0] if chans == 1 else pixels).save(path)


def _resumes(work, env, root, args: list[str], before: dict, what: str) -> dict:
    """`args` resume the run in `root` saved as `before` (its last.ckpt): the epochs go on and the
    W&B run is the same one."""
    _ok(args, work, env, what)
    after = _last(root)
    assert after["epoch"] > before["epoch"] and after["global_step"] > before["global_step"], what
    run_id = before["zoo_run"]["wandb_id"]
    assert after["zoo_run"]["wandb_id"] == run_id, what
    assert len(_wandb_runs(work, run_id)) == 2, f"{what}: the resumed process wrote no W&B run {run_id}"
    return after


# ----------------------------------------------------------------------------- the lifecycle
@pytest.mark.parametrize("family", _lifecycle_params())
def test_a_run_lives_its_whole_life(family, tmp_path, tiny_data_dir):
    cls = families()[family]
    work, env = tmp_path, cli_env(tiny_data_dir)
    config = _tiny_config(family)
    recipe = work / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(config))
    root = work / "run"
    fit = ["train.py", "fit", "--config", recipe, f"--trainer.default_root_dir={root}", *BUDGET]

    # fit, then resume: the epochs go on in the same W&B run
    _ok([*fit, "--trainer.max_epochs=1"], work, env, "fit", run_main)
    first = _last(root)
    assert first["global_step"] == 2 and isinstance(first["zoo_run"]["wandb_id"], str)
    _resumes(work, env, root, [*fit, "--trainer.max_epochs=2", "--ckpt_path", "last"], first, "fit --ckpt_path last")

    # the run is read, never written
    before = _hashes(root)
    on_run = ["--config", root / "config.yaml", "--ckpt_path", root / "checkpoints" / "last.ckpt"]
    _ok(["train.py", "validate", *on_run], work, env, "validate", run_main)
    _ok(["train.py", "test", *on_run], work, env, "test", run_main)
    predictions = work / "predictions.jsonl"
    code, out, err = run_main(["train.py", "predict", *on_run, "--predictions", predictions], cwd=work, env=env)
    if cls.card.output == "sample":  # a generator answers no image: one line, nothing written
        assert code == 2 and len(err.strip().splitlines()) == 1 and "generator" in err, err[-3000:]
        assert not predictions.exists()
    else:
        assert code == 0, err[-4000:]
        lines = [json.loads(line) for line in predictions.read_text().splitlines()]
        assert lines and [line["index"] for line in lines] == list(range(len(lines)))
    checkpoint = root / "checkpoints" / "last.ckpt"
    result = work / "eval.json"
    _ok(["eval.py", "--checkpoint", checkpoint, "--split", "test", "--json", result], work, env, "eval.py", run_main)
    assert json.loads(result.read_text())["metrics"]
    if cls.card.attention:
        image = work / "input.png"
        _image(config, image)
        _ok(["-m", "zoo.commands.cli", "attend", "--checkpoint", checkpoint, "--out", work / "attend", image],
            work, env, "zoo attend", run_main)
        assert list((work / "attend").glob("*.png"))
    if cls.card.output != "sample" and "export" not in cls.card.skip:
        _ok(["-m", "zoo.commands.cli", "export", "--checkpoint", checkpoint, "--out", work / "export"],
            work, env, "zoo export", run_main)
        assert list((work / "export").glob("*.onnx"))
    assert _hashes(root) == before  # every file of the run as it was

    # a fine-tune from the run's weights is a new run (its own W&B run); it resumes from its own config
    tuned = work / "finetune"
    _ok(["train.py", "fit", "--config", recipe, f"--trainer.default_root_dir={tuned}", *BUDGET,
         "--trainer.max_epochs=1", "--init_from", checkpoint], work, env, "fit --init_from", run_main)
    started = _last(tuned)
    assert started["zoo_run"]["wandb_id"] != first["zoo_run"]["wandb_id"]
    _resumes(work, env, tuned, ["train.py", "fit", "--config", tuned / "config.yaml", "--trainer.max_epochs=2",
                                "--ckpt_path", "last"], started, "the fine-tune's fit --ckpt_path last")


# ----------------------------------------------------------------------------- a run that trains nothing
def _image_folder(root, per_class: int, size: int = 28) -> None:
    """An ImageFolder tree: train/ and val/ with two classes of `per_class` grey images each."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("shirt", "bag"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(folder / f"{i}.png")


def _karpathy(tmp_path) -> dict:
    from test_captions_data import write_karpathy

    return dict(karpathy_json=str(write_karpathy(tmp_path)), image_root=str(tmp_path / "images"), min_freq=1,
                image_size=32, resize_size=36)


#: the data sets without a tiny configuration, because they read files that only a test writes (their
#: card.skip["tiny"] says so): those files, made here. Every other data set's training split of a few
#: examples (fewer than a batch of 64) is its card's tiny configuration.
ON_DISK = {
    "zoo.data.imagefolder.ImageFolderDataModule": lambda tmp: (_image_folder(tmp / "images", 12),
                                                               dict(root=str(tmp / "images"), image_size=28))[1],
    "zoo.data.captions.CaptionsDataModule": _karpathy,
}


def _small_split(path: str, tmp) -> dict:
    tiny = _data_card(path).tiny
    assert tiny or path in ON_DISK, f"{path}: a card.tiny configuration, or its files in ON_DISK"
    return dict(tiny) if tiny else ON_DISK[path](tmp)


def _zoo_data_modules() -> list[str]:
    from zoo.classes import registered

    return sorted(path for path in registered("data") if path.startswith("zoo."))


@pytest.mark.parametrize("path", _zoo_data_modules())
def test_a_training_split_smaller_than_a_batch_trains_on_it_or_is_one_line(path, tmp_path, tiny_data):
    """Every data module: a loader that keeps the partial batch trains on it; one that drops it
    would train nothing, and train.py refuses that in one line naming batch_size."""
    from zoo.guards.errors import UserError
    from zoo.training.train import check_batches

    data = registry.instantiate({"class_path": path, "init_args": {**_small_split(path, tmp_path), "batch_size": 64,
                                                                   "num_workers": 0}}, "data")
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    count = len(loader.dataset)
    assert 0 < count < 64
    if getattr(loader.batch_sampler, "drop_last", False):
        with pytest.raises(UserError) as refused:
            check_batches(data)
        assert str(refused.value).startswith(f"data.init_args.batch_size 64 is more than the {count} training")
        assert len(str(refused.value).splitlines()) == 1
    else:
        check_batches(data)
        assert len(loader) == 1  # the partial batch is the epoch


def test_an_empty_training_split_is_one_line(tiny_data):
    from zoo.data.fashion_mnist import FashionMNISTDataModule
    from zoo.guards.errors import UserError
    from zoo.training.train import check_batches

    data = FashionMNISTDataModule(val_size=600, limit_eval=8)  # the tiny set's 600 images all validate
    data.setup("fit")
    with pytest.raises(UserError, match="the training split is empty"):
        check_batches(data)


@pytest.mark.slow
def test_fit_on_fewer_images_than_the_batch_is_refused_before_the_run_folder(tmp_path, tiny_data_dir):
    """docs/finetune.md's route with a 24-image ImageFolder and the recipe's batch of 64 trained
    zero batches and exited 0 without a checkpoint."""
    _image_folder(tmp_path / "images", 12)
    root = tmp_path / "run"
    code, out, err = run_cli(["train.py", "fit", "--config", "vit_fmnist", "--config",
                              REPO / "configs/vit/_fmnist5_imagefolder.yaml", "--data.init_args.root",
                              tmp_path / "images", f"--trainer.default_root_dir={root}"],
                             cwd=tmp_path, env=cli_env(tiny_data_dir))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "data.init_args.batch_size 64 is more than the 24 training example(s)" in lines[0]
    assert not root.exists()
