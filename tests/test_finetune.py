"""Fine-tuning (--init_from) is a new run from released or checkpointed weights with the command's
own hyperparameters; resuming (--ckpt_path) continues a run. Plus the figures' honesty."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import zoo
from conftest import REPO, TINY_VAL
from zoo.models.baselines import Classifier
from zoo.weights import hub


from zoo.training.train import main as TRAIN  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def _fit(root, *extra):
    return ["fit", "--config", str(REPO / "configs/baseline/cnn_centered.yaml"), f"--trainer.default_root_dir={root}",
            f"--data.init_args.val_size={TINY_VAL}", "--data.init_args.batch_size=32", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1", "--trainer.logger=false",
            "--trainer.enable_model_summary=false", "--trainer.enable_progress_bar=false", *extra]


def test_init_from_a_release_starts_a_new_run_with_new_hyperparameters(trained_run, tmp_path, tiny_data):
    release = tmp_path / "release.safetensors"
    source = zoo.load_checkpoint(trained_run["last"])
    hub.save_release(source, source.zoo_config(), release)
    TRAIN(_fit(tmp_path / "ft", "--init_from", str(release), "--model.init_args.lr", "0.0001"))
    tuned = torch.load(tmp_path / "ft" / "checkpoints" / "last.ckpt", weights_only=True)
    assert tuned["hyper_parameters"]["lr"] == 0.0001  # the command's value, not the source's
    assert tuned["optimizer_states"][0]["param_groups"][0]["initial_lr"] == pytest.approx(0.0001)  # the schedule's base
    assert tuned["global_step"] == 3  # a new run: it starts at step 0
    # it started from the release: after 3 small steps it is still close to it, unlike a fresh init
    start = source.state_dict()
    moved = max((tuned["state_dict"][k] - v).abs().max().item() for k, v in start.items() if v.is_floating_point())
    fresh = Classifier(**{k: v for k, v in source.hparams.items() if not k.startswith("_")}).state_dict()
    apart = max((fresh[k] - v).abs().max().item() for k, v in start.items() if v.is_floating_point())
    assert moved < apart / 10


def test_init_from_another_family_is_one_line(trained_run, tmp_path, tiny_data, capsys):
    from zoo.models.draw import DRAWClassifier

    other = DRAWClassifier(image_size=28, T=1, read_n=2, hidden_size=8, glimpse_hidden=0)
    path = tmp_path / "other.safetensors"
    hub.save_release(other, other.zoo_config(), path)
    with pytest.raises(SystemExit) as exit_info:
        TRAIN(_fit(tmp_path / "ft", "--init_from", str(path)))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert "holds a draw_classifier model" in err[0] and "this run trains zoo.models.baselines.Classifier" in err[0]
    with pytest.raises(SystemExit):
        TRAIN(_fit(tmp_path / "ft2", "--init_from", "no_such_release"))
    assert "no such file or release" in capsys.readouterr().err


def test_caption_figure_uses_one_scale(tmp_path):
    """A uniform map must look dark next to a peaked one (each map used to be stretched to full
    brightness, so a flat map looked as sharp as any)."""
    from zoo.viz.record import attention_panels

    alpha = torch.full((2, 8, 8), 1 / 64)
    alpha[1] = 0
    alpha[1, 3, 4] = 1.0
    panels, bars, _ = attention_panels(torch.zeros(3, 64, 64), alpha, ["flat", "sharp"], size=64)
    flat, sharp = (np.asarray(picture).astype(float) for picture, _ in panels)
    assert len(bars) == 1 and flat.max() < 40 and sharp.max() > 80  # uint8 brightness on a black image
