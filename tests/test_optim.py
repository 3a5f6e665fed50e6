"""The one optimizer + learning-rate schedule factory (zoo.models.optim): every family's recipe
keeps its optimizer; the schedules equal the ones they replace on a fresh run and stretch when a
run is resumed with a longer horizon (also end to end through train.py); a restored optimizer
runs the kernel of the current mode."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

import yaml

from conftest import cli_env, run_main, tiny_fit_args
from helpers import read_wandb_records
from zoo.guards.errors import UserError
from zoo.models import optim
from zoo.models.baselines import Classifier
from zoo.models.draw import DRAW, DRAWClassifier
from zoo.models.ram import RAM

RAM_TINY = dict(image_size=20, retina=dict(patch_size=4, num_scales=2), num_glimpses=2, num_classes=4,
                network=dict(glimpse_hidden=8, location_hidden=8, glimpse_dim=8, hidden_size=8))


def _optimizer(configured):
    return configured["optimizer"] if isinstance(configured, dict) else configured


def _attach(model, max_epochs=10, steps=100, batches=10):
    model._trainer = SimpleNamespace(max_epochs=max_epochs, estimated_stepping_batches=steps,
                                     num_training_batches=batches)
    return model


# ----------------------------------------------------------------------------- the recipes' optimizers
def test_each_family_keeps_its_optimizer():
    sgd = _optimizer(_attach(RAM(**RAM_TINY, optimization=dict(optimizer="sgd", lr=0.1, momentum=0.8, weight_decay=1e-4)))
                     .configure_optimizers())
    assert type(sgd) is torch.optim.SGD
    assert sgd.defaults["momentum"] == 0.8 and sgd.defaults["weight_decay"] == 1e-4
    assert sgd.param_groups[0]["initial_lr"] == 0.1  # under the cosine schedule
    ram = _attach(RAM(**RAM_TINY, policy=dict(std_mode="fixed")))
    adam = _optimizer(ram.configure_optimizers())
    assert type(adam) is torch.optim.Adam and adam.defaults["betas"] == (0.9, 0.999)
    assert not ram.log_std.requires_grad and all(p is not ram.log_std for p in adam.param_groups[0]["params"])
    draw = DRAW(image_size=12, T=2, enc_size=8, dec_size=8, z_size=2, read_n=2, write_n=2, lr=3e-4, betas=[0.5, 0.9])
    configured = draw.configure_optimizers()  # no schedule: the optimizer alone, as before
    assert type(configured) is torch.optim.Adam and configured.defaults["betas"] == (0.5, 0.9)
    assert configured.defaults["lr"] == 3e-4 and configured.defaults["fused"] is None  # eager: torch's default
    classifier = _attach(DRAWClassifier(image_size=16, T=2, read_n=4, hidden_size=8, glimpse_hidden=8))
    configured = classifier.configure_optimizers()
    assert configured["lr_scheduler"]["interval"] == "epoch"
    assert type(configured["optimizer"]) is torch.optim.Adam


def test_unknown_names_are_user_errors():
    with pytest.raises(UserError, match="optimizer must be one of"):
        optim.build_optimizer([torch.zeros(1, requires_grad=True)], "lamb", lr=1.0)
    opt = optim.build_optimizer([torch.zeros(1, requires_grad=True)], "adam", lr=1.0)
    with pytest.raises(UserError, match="lr schedule must be one of"):
        optim.build_schedule(opt, None, "step")


# ----------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("epochs", [1, 3, 10, 30])
def test_cosine_equals_cosine_annealing_on_a_fresh_run(epochs):
    """The learning rates the old CosineAnnealingLR gave, as the optimizer uses them (float32)."""
    model = _attach(Classifier(arch="mlp", hidden=[4], lr=2e-3), max_epochs=epochs)
    sched = model.configure_optimizers()
    ours, ours_sched = sched["optimizer"], sched["lr_scheduler"]["scheduler"]
    ref = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=2e-3)
    ref_sched = torch.optim.lr_scheduler.CosineAnnealingLR(ref, T_max=epochs)
    for _ in range(epochs):
        a, b = ours.param_groups[0]["lr"], ref.param_groups[0]["lr"]
        assert torch.tensor(a, dtype=torch.float32) == torch.tensor(b, dtype=torch.float32), (a, b)
        ours.step()
        ref.step()
        ours_sched.step()
        ref_sched.step()


def test_cosine_stretches_when_the_run_gets_longer():
    model = _attach(Classifier(arch="mlp", hidden=[4], lr=1e-2), max_epochs=1)
    configured = model.configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    state = sched.state_dict()
    assert opt.param_groups[0]["lr"] == 1e-2
    # resumed with max_epochs 2: a fresh module and scheduler restored from the checkpoint state
    resumed = _attach(Classifier(arch="mlp", hidden=[4], lr=1e-2), max_epochs=2)
    configured = resumed.configure_optimizers()
    opt2, sched2 = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()  # the end of epoch 0: epoch 1 is the extra one
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5e-2)
    # the old schedule kept T_max = 1 from the checkpoint: the extra epoch at learning rate 0
    old_opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=1e-2)
    old = torch.optim.lr_scheduler.CosineAnnealingLR(old_opt, T_max=1)
    old_opt.step()
    old.step()
    assert old_opt.param_groups[0]["lr"] == 0.0


def test_warmup_cosine_reads_the_horizon_when_it_steps():
    from zoo.models.vit import ViTClassifier

    model = ViTClassifier(backbone={"kind": "timm_vit", "model_name": "vit_tiny_patch16_224", "patch_size": 7, "depth": 1,
                                    "embed_dim": 16, "num_heads": 2, "mlp_ratio": 2.0},
                          lr=1e-2, min_lr=1e-4, warmup_epochs=1)
    _attach(model, max_epochs=2, steps=20, batches=10)
    configured = model.configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    for _ in range(20):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)  # the end of a 20-step run
    model._trainer.max_epochs, model._trainer.estimated_stepping_batches = 4, 40  # resumed, twice as long
    sched.step()
    lr = opt.param_groups[0]["lr"]
    assert 1e-4 < lr < 1e-2 and lr == pytest.approx(1e-4 + (1e-2 - 1e-4) * 0.5 * (1 + torch.cos(
        torch.tensor(torch.pi * 11 / 30)).item()))


# ----------------------------------------------------------------------------- kernels
def test_the_kernel_follows_the_device(monkeypatch):
    """CPU: torch's default kernels (what the CPU releases trained with); an accelerator with fused
    kernels: the fused one, for the optimizers torch has it for."""
    cpu = optim.build_optimizer([torch.zeros(3, requires_grad=True)], "adam", lr=1e-3)
    assert not cpu.param_groups[0]["fused"] and not cpu.param_groups[0]["capturable"]
    assert not optim.fused_kernel([torch.zeros(3)], "adam")
    cuda = torch.zeros(3, device="meta")
    import torch.optim.optimizer as kernels

    monkeypatch.setattr(kernels, "_get_fused_kernels_supported_devices", lambda: ["cpu", "meta"])
    assert optim.fused_kernel([cuda], "adamw") and not optim.fused_kernel([cuda], "rmsprop")
    assert not optim.fused_kernel([cuda, torch.zeros(3)], "adam")  # every parameter on the device
    assert not optim.fused_kernel([torch.zeros(3, dtype=torch.long, device="meta")], "adam")


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_resume_with_more_epochs_trains_at_a_positive_learning_rate(tmp_path, trained_run, tiny_data_dir):
    """Issue 18: 1 epoch, then --ckpt_path with max_epochs 2: the extra epoch learns."""
    root = tmp_path / "runs" / "cnn"
    shutil.copytree(trained_run["root"], root)
    before = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    rc, out, err = run_main(tiny_fit_args("configs/baseline/cnn_centered.yaml", root, "--trainer.max_epochs=2",
                                         "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
                                         "--ckpt_path=last"),
                            cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, err[-4000:]
    after = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert after["epoch"] == 1 and after["global_step"] == before["global_step"] + 3
    base = before["optimizer_states"][0]["param_groups"][0]["initial_lr"]
    # the checkpoint of the 1-epoch run holds the rate its schedule ended at
    assert before["optimizer_states"][0]["param_groups"][0]["lr"] == 0.0
    # the rate the extra epoch trained at, as the recipe's LearningRateMonitor logged it
    run = next((tmp_path / "wandb").glob("offline-run-*"))
    logged = [yaml.safe_load(item.value_json) for r in read_wandb_records(next(run.glob("*.wandb")))
              if r.WhichOneof("record_type") == "history" for item in r.history.item
              if (item.key or "/".join(item.nested_key)).startswith("lr-")]
    assert logged == [pytest.approx(base / 2)]  # half-way down the cosine of a 2-epoch run
    changed = [k for k, v in before["state_dict"].items()
               if v.is_floating_point() and not torch.equal(v, after["state_dict"][k])]
    assert changed, "the extra epoch left the weights unchanged"
