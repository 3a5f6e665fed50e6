"""Every recipe runs its real Lightning training and validation step: `Trainer(fast_dev_run=1)` on the
recipe's own model and data classes, with its data card's tiny settings (zoo.data.card) on the tests' tiny
Fashion-MNIST. No family or data set is special-cased here; what cannot
run offline or on a tiny budget is excluded below, as data, with the reason and the test that
covers it instead."""
from __future__ import annotations

import lightning as L
import pytest
import torch

import zoo
from zoo import registry

#: recipes this test leaves to another, and why
EXCLUDED = {
    "sat_coco_hard": "COCO files and an ImageNet VGG encoder: tests/test_recipes_e2e.py trains it on tiny COCO files",
    "sat_coco_soft": "COCO files and an ImageNet VGG encoder: tests/test_recipes_e2e.py",
    "sat_flickr8k_hard": "Flickr8k files and an ImageNet VGG encoder: tests/test_recipes_e2e.py (the soft route)",
    "sat_flickr8k_soft": "Flickr8k files and an ImageNet VGG encoder: tests/test_recipes_e2e.py",
    "vit_imagenet_finetune": "an ImageFolder tree and ViT-B/16: tests/test_recipes_e2e.py",
}

#: model settings that only shrink the run's cost (never what is trained): evaluation extras
TINY_MODEL = {"iwae_samples": 2, "iwae_chunk": 2, "iwae_batches": 1, "eval_samples": 2, "beam_size": 1,
              "decode_max_len": 6}


def _offline(init_args: dict) -> dict:
    """Recipes that start from downloaded weights build the same architecture without them."""
    overrides = {}
    for key, value in init_args.items():
        if isinstance(value, dict) and value.get("pretrained") is True and not value.get("pretrained_file"):
            overrides[key] = {**value, "pretrained": False}
    if init_args.get("pretrained") is True:
        overrides["pretrained"] = False
    return overrides


@pytest.mark.parametrize("name", [n for n in zoo.list_models() if n not in EXCLUDED])
def test_every_recipe_runs_its_real_training_and_validation_step(name, tiny_data, tmp_path):
    entry = registry.get_entry(name)
    init_args = entry.model.get("init_args", {})
    tiny = {k: v for k, v in TINY_MODEL.items() if k in init_args}
    torch.manual_seed(0)
    model = zoo.create_model(name, **_offline(init_args), **tiny)
    data_class = registry.resolve_class(entry.data["class_path"], "data")
    data = registry.build_datamodule(model, **data_class.card.tiny)  # the data card's tiny settings
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = L.Trainer(fast_dev_run=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]), sorted(metrics)
    assert torch.isfinite(metrics["val/loss"]), sorted(metrics)  # (a ratio with nothing to count may be NaN)
    changed = [k for k, v in model.state_dict().items()  # (a captioner builds its vocabulary layers in setup)
               if v.is_floating_point() and (k not in before or not torch.equal(v, before[k]))]
    assert changed, "one optimizer step changed no weight"
    frozen = [k for k, v in model.state_dict(keep_vars=True).items()  # by state_dict name, as `changed`
              if isinstance(v, torch.nn.Parameter) and not v.requires_grad]
    assert not set(frozen) & set(changed), "a frozen parameter moved"
