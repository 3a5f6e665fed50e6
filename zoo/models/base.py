"""What every zoo LightningModule shares: the family contract (CONTRIBUTING.md: a `card`, plain
hyperparameters so that checkpoints load with weights_only=True, and the hooks `train_loss`,
`eval_metrics`, `example_batch` and, where the card attends, `attention_record`), a self-describing
checkpoint, the attention figures, and Lightning steps that run the family's pure step functions in
the configured mode (zoo.models.accel) and log what they return.
"""
from __future__ import annotations

import contextlib
import os
from abc import abstractmethod
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from zoo.data.base import as_size
from zoo.guards.budget import check_arguments
from zoo.guards.errors import UserError
from zoo.hparams import current_init_args, current_spec
from zoo.models import optim
from zoo.models.accel import StepAccelerator
from zoo.models.card import FamilyCard, register
from zoo.models.predict import TOP_K, predictions
from zoo.weights.hub import read_checkpoint


#: how far outside [0, 1] an image may stray (float rounding of a resize or a colour conversion)
IMAGE_RANGE_SLACK = 1e-3


def class_path(obj_or_cls: Any) -> str:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}.{cls.__qualname__}"


class ZooModule(L.LightningModule):
    #: the family's facts (zoo.models.card): a subclass that declares its own card is a family
    card: FamilyCard = FamilyCard("zoo")
    #: classes per image that `predict_step` answers (zoo.models.predict.PredictionWriter sets it)
    predict_top_k: int = TOP_K
    #: the card's name (the CLI uses it to refuse a checkpoint of the wrong family clearly)
    family: str = "zoo"
    #: the attribute holding the trunk that a `backbone:` block (`self.backbone_spec`) built
    backbone_attribute: str = "backbone"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "card" in cls.__dict__:
            register(cls, ZooModule)

    def __new__(cls, *args, **kwargs):
        """Absurd sizes are refused in one line before anything is built, whoever builds the model:
        the card's `dimensions`, beside the shared ones of zoo.guards.budget."""
        check_arguments(cls, args, kwargs, "model.init_args", cls.card.dimensions)
        _check_label_set(cls, args, kwargs)
        return super().__new__(cls)

    @property
    def head_keys(self) -> tuple[str, ...]:
        return self.card.head_keys

    # ------------------------------------------------------------------ checkpoints
    def zoo_config(self) -> dict:
        """Everything needed to rebuild this model (and its data) without the training script."""
        config: dict = {"family": self.family, "class_path": class_path(self),
                        "init_args": _init_args(self.hparams)}
        datamodule = getattr(self._trainer, "datamodule", None)
        if datamodule is not None:
            config["data"] = {"class_path": class_path(datamodule),
                              "init_args": _init_args(getattr(datamodule, "hparams", {}))}
        elif getattr(self, "_zoo_data_config", None):
            config["data"] = self._zoo_data_config
        spec = getattr(self, "backbone_spec", None)
        if spec is not None:  # the trunk's weights are in the checkpoint: no pretrained source
            config["init_args"]["backbone"] = spec.self_contained(getattr(self, self.backbone_attribute))
        return config

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["zoo"] = self.zoo_config()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        data = checkpoint.get("zoo", {}).get("data")
        if data:
            self._zoo_data_config = current_spec(data)
            self.take_names_of_data_config()

    # ------------------------------------------------------------------ what the data decides
    @property
    def class_names(self) -> list[str] | None:
        """The names of the classifier head's outputs, in order (None: unnamed, or no head)."""
        names = self.hparams.get("class_names")
        return list(names) if names else None

    def take_class_names(self, names, source: str, replace: bool = False, strict: bool = False) -> bool:
        """Name the head's outputs after the label set `source` (a data module) serves, where the
        family takes `class_names` and has none yet (or `replace`); a label set of another size is
        refused with `strict`, else left. Returns whether the names were taken."""
        if "class_names" not in self.hparams or not names or (self.class_names and not replace):
            return False
        names, outputs = [str(name) for name in names], self.hparams.get("num_classes")
        if outputs is not None and len(names) != outputs:
            if strict:
                raise UserError(f"{source} serves {len(names)} classes; the model's head has {outputs} "
                                f"(give the model num_classes: {len(names)}, or data of {outputs} classes)")
            return False
        self.hparams.class_names = names
        return True

    def take_names_of_data_config(self) -> bool:
        """Class names of the data module in the model's saved config, where the model has none."""
        from zoo.classes import is_allowed, resolve_class

        config = getattr(self, "_zoo_data_config", None) or {}
        if self.class_names or not is_allowed(config.get("class_path"), "data"):
            return False
        data_class = resolve_class(config["class_path"], "data")
        return self.take_class_names(getattr(data_class, "class_names", None), config["class_path"])

    def setup(self, stage: str) -> None:
        """Fitting names the head after the classes of its data; the other verbs name an unnamed head."""
        datamodule = getattr(self._trainer, "datamodule", None)
        if datamodule is not None:
            self.take_class_names(getattr(datamodule, "class_names", None), type(datamodule).__name__,
                                  replace=stage == "fit", strict=True)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's loader, with hyperparameters saved under an old name (zoo.hparams) given under
        the current one (a local file is read for them once more, weights_only=True)."""
        if hparams_file is None and isinstance(checkpoint_path, (str, os.PathLike)) and os.path.isfile(checkpoint_path):
            saved = read_checkpoint(checkpoint_path).get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {}
            current = current_init_args(class_path(cls), saved)
            kwargs = {**{k: v for k, v in current.items() if k not in saved}, **kwargs}
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location, hparams_file=hparams_file,
                                            strict=strict, **kwargs)

    # ------------------------------------------------------------------ visualisation
    @torch.no_grad()
    def attention_figures(self, batch: Any) -> dict[str, Any]:
        """{caption: PIL image}: the attention record of the first `num_figures` images, a strip per
        image (the panels `zoo attend` writes), for `zoo.training.callbacks.AttentionImageLogger`."""
        if not self.card.attention:
            return {}
        from zoo.viz.record import class_name, prediction_text, strip

        named = _named(batch)
        count = self.hparams.get("num_figures", 4)
        images, labels = named["images"][:count], named.get("labels")
        record = self.attention_record(images)
        figures = {}
        for b in range(images.shape[0]):
            caption = f"#{b} pred {prediction_text(record, b)}"
            if labels is not None:
                caption += f" / true {class_name(record, int(labels[b]))}"
            figures[caption] = strip(record, b, images[b])
        return figures

    def attention_record(self, images: torch.Tensor):
        """Where the model looked on images [B, C, H, W]: a `zoo.attention.record.AttentionRecord`."""
        self.check_attends()

    def check_attends(self) -> None:
        """One line for a model without attention (the baselines), before any work is done."""
        if not self.card.attention:
            raise UserError(f"{type(self).__name__} ({self.family}) has no attention to record")

    def evidence(self, record, images: torch.Tensor, steps: torch.Tensor):
        """What faithfulness follows for rows (image `images[s]` of `record`, step `steps[s]`): edited
        images [S, C, H, W] -> the probability of the clean prediction [S], or None."""
        label = record.prediction.get("label")
        if label is None:
            return None
        label = label[images].to(self.device)
        return lambda x: self(x.to(self.device)).float().softmax(-1).gather(1, label[:, None])[:, 0]

    # ------------------------------------------------------------------ acceleration
    @property
    def accel(self) -> StepAccelerator:
        """This module's acceleration state (not an nn.Module: never in the state_dict)."""
        runner = self.__dict__.get("_zoo_accel")
        if runner is None:
            runner = self.__dict__["_zoo_accel"] = StepAccelerator()
        return runner

    @abstractmethod
    def train_loss(self, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A hook of every family: the training loss and its metrics from `train_inputs`' items."""

    @abstractmethod
    def eval_metrics(self, stage: str, **inputs) -> dict[str, torch.Tensor]:
        """A hook of every family: the "val" or "test" metrics from `eval_inputs`' items."""

    def train_inputs(self, batch) -> dict:
        """The batch and every random draw of a training step, by name: `train_loss`'s arguments."""
        return _named(batch)

    def eval_inputs(self, batch, stage: str) -> dict:
        return _named(batch)

    def log_step_metrics(self, stage: str, metrics: dict[str, torch.Tensor], batch_size: int) -> None:
        """Log a step's metrics under `stage/`; validation and test metrics are averaged over DDP ranks."""
        for key, value in metrics.items():
            self.log(f"{stage}/{key}", value, prog_bar=stage != "test" and key in self.card.progress_bar,
                     sync_dist=stage != "train", batch_size=batch_size)

    def training_step(self, batch, batch_idx):
        loss, metrics = self.accel.training_step(self, batch)
        self.log_step_metrics("train", metrics, _batch_size(batch))
        return loss

    def validation_step(self, batch, batch_idx):
        self.log_step_metrics("val", self.accel.eval_step(self, batch, "val"), _batch_size(batch))

    def predict_step(self, batch, batch_idx):
        """One plain record per image (zoo.models.predict: classes with names, a caption); a generator refuses."""
        named = _named(batch)
        records = predictions(self, named["images"], self.predict_top_k)
        ids = named.get("image_ids")
        return records if ids is None else [{"image_id": i, **r} for i, r in zip(ids, records)]

    def test_step(self, batch, batch_idx):
        self.log_step_metrics("test", self.accel.eval_step(self, batch, "test"), _batch_size(batch))

    def on_train_start(self) -> None:
        for config in self.trainer.lr_scheduler_configs:  # resumed with a longer horizon?
            optim.refresh(config.scheduler)

    # ------------------------------------------------------------------ timm's faces
    @property
    def num_classes(self) -> int:
        """The classifier head's outputs, as timm's `model.num_classes` (0: no class head, as a
        captioner's or a generator's)."""
        value = self.hparams.get("num_classes")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def pretrained_cfg(self) -> dict:
        """timm's `model.pretrained_cfg`, so that `timm.data.resolve_data_config(model=model)` and
        `create_transform` prepare its input: `input_size` (C, H, W), the resize as `crop_pct` and
        `crop_mode`, `mean`/`std` for that transform (zeros and ones: the model takes images in
        [0, 1] and applies its own normalisation, recorded as `inner_mean`/`inner_std`),
        `num_classes`, `label_names`, and where its weights came from (the release's `name`, `url`,
        `file`, `sha256`, a card's `hf_hub_id`: zoo.registry sets them; None for a fresh model)."""
        from zoo.guards.files import INTERPOLATION
        from zoo.preprocess import for_model

        spec, source = for_model(self), dict(self.__dict__.get("_zoo_source") or {})
        height, width = spec.size
        # timm resizes the shorter side to size / crop_pct, then crops the centre ("squash": no crop)
        crop_pct = min(height, width) / spec.resize_size if spec.resize == "crop" and spec.resize_size else 1.0
        return {
            "architecture": class_path(self), "family": self.family, "tag": None,
            **{key: source.get(key) for key in ("name", "url", "hf_hub_id", "file", "sha256")},
            "input_size": (self.input_chans, height, width), "fixed_input_size": not self.takes_any_image_size(),
            "resize": spec.resize, "interpolation": INTERPOLATION, "crop_pct": crop_pct,
            "crop_mode": "squash" if spec.resize == "squash" else "center",
            "mean": (0.0,) * self.input_chans, "std": (1.0,) * self.input_chans,
            "inner_mean": spec.mean, "inner_std": spec.std,
            "num_classes": self.num_classes, "label_names": list(spec.class_names) if spec.class_names else None,
            "classifier": self.head_keys[0].rstrip(".") if self.head_keys else None,
        }

    @property
    def input_size(self) -> tuple[int, int]:
        """(height, width) of the images the model takes."""
        return as_size(self.hparams.get("image_size", 28))

    @property
    def input_chans(self) -> int:
        """Channels of the images the model takes (the card's, else the `in_chans` hyperparameter)."""
        return self.card.channels or int(self.hparams.get("in_chans", 3))

    def takes_any_image_size(self) -> bool:
        """True where the model reads images of other sizes than `input_size` (ViT's dynamic size)."""
        return False

    def check_images(self, images: torch.Tensor) -> None:
        """One line for images [B, C, H, W] the model cannot take (rank, channels, size, dtype), or
        values outside [0, 1]: read outside training steps and compiled code (a device sync)."""
        expected = (self.input_chans, *self.input_size)
        if not isinstance(images, torch.Tensor):
            raise UserError(f"images must be a tensor [B, {expected[0]}, H, W], got {type(images).__name__}")
        if images.dim() != 4:
            batch = ", ".join(map(str, expected))
            raise UserError(f"images are {tuple(images.shape)}, the model expects a batch [B, {batch}]")
        if (images.shape[1] != expected[0]
                or (not self.takes_any_image_size() and tuple(images.shape[2:]) != expected[1:])):
            why = (" (its coordinates are tied to its image size)" if self.card.resize == "exact"
                   else " (prepare images with zoo.preprocessing(model))")
            raise UserError(f"images are {tuple(images.shape[1:])}, the model expects {expected}{why}")
        if not images.is_floating_point():
            raise UserError(f"images are {images.dtype}, the model takes float images in [0, 1] (uint8 pixels: "
                            "divide by 255, or prepare them with zoo.preprocessing(model))")
        if ((self.training and torch.is_grad_enabled()) or images.device.type == "meta" or not images.numel()
                or torch.compiler.is_compiling() or torch.jit.is_tracing()):
            return
        low, high = (float(v) for v in images.aminmax())
        if low < -IMAGE_RANGE_SLACK or high > 1 + IMAGE_RANGE_SLACK:
            raise UserError(f"images hold values from {low:.3g} to {high:.3g}, the model takes images in [0, 1] "
                            "(it normalises them itself: do not normalise beforehand)")

    def example_images(self, n: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Generator]:
        """n random images [n, C, H, W] in [0, 1], and the generator the rest of the batch draws from."""
        g = torch.Generator().manual_seed(seed)
        return torch.rand(n, self.input_chans, *self.input_size, generator=g), g

    @abstractmethod
    def example_batch(self, n: int = 2, seed: int = 0) -> Any:
        """A hook of every family: a tiny batch of its data modules' form at the model's input size."""

    def labelled_batch(self, n: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(images [n, C, H, W] in [0, 1], labels [n]): a classifier's example batch."""
        images, g = self.example_images(n, seed)
        return images, torch.randint(0, self.hparams.get("num_classes", 10), (n,), generator=g)

    def export_forward(self, images: torch.Tensor):
        """What `zoo export` runs: the outputs its `card.exports` names, in order."""
        return self(images)


class ClassifierModule(ZooModule):
    """Plain image classifiers: cross-entropy, accuracy, the test error in percent, Adam with the
    hparams `lr`, `weight_decay` and `lr_schedule`; subclasses define `forward(images) -> logits`."""

    example_batch = ZooModule.labelled_batch

    def _metrics(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        wrong = (logits.argmax(-1) != labels).float().mean()
        return {"loss": loss, "acc": 1 - wrong, "wrong": wrong}

    def train_loss(self, images, labels):
        m = self._metrics(images, labels)
        return m["loss"], {"loss": m["loss"].detach(), "acc": m["acc"]}

    def eval_metrics(self, stage, images, labels):
        m = self._metrics(images, labels)
        out = {"loss": m["loss"], "acc": m["acc"]}
        if stage == "test":
            out["error_pct"] = 100 * m["wrong"]
        return out

    def configure_optimizers(self):
        hp = self.hparams
        return optim.configure(self, self.parameters(), "adam", lr=hp.lr, weight_decay=hp.weight_decay,
                               schedule=hp.lr_schedule)


def _check_label_set(cls: type, args: tuple, kwargs: dict) -> None:
    """One line where class names are no list of strings, or not one per output of the head."""
    import inspect

    signature = inspect.signature(cls.__init__)
    if "class_names" not in signature.parameters:
        return
    given = signature.bind_partial(None, *args, **kwargs).arguments
    names = given.get("class_names")
    if names is None:
        return
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise UserError(f"{cls.__name__}: class_names must be a list of strings, got {str(names)[:60]}")
    head = signature.parameters.get("num_classes")
    outputs = given.get("num_classes", head.default if head is not None else None)
    if isinstance(outputs, int) and len(names) != outputs:
        raise UserError(f"{cls.__name__}: {len(names)} class_names for a head of num_classes {outputs}; "
                        "give one name per class (and num_classes for a new label set)")


@contextlib.contextmanager
def evaluating(module: torch.nn.Module):
    """The module in eval mode for the block, then back in the mode it was in."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _named(batch) -> dict:
    """A batch's items by name: a dict as is, a tuple as (images, labels)."""
    if isinstance(batch, dict):
        return dict(batch)
    return dict(zip(("images", "labels"), batch))


def _batch_size(batch) -> int:
    """Examples in a batch: the first tensor's leading size."""
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    return next((len(t) for t in items if isinstance(t, torch.Tensor)), 1)


def _init_args(hparams) -> dict:
    """Constructor arguments from hparams; LightningCLI adds bookkeeping keys like `_class_path`."""
    return _plain({k: v for k, v in dict(hparams).items() if not str(k).startswith("_")})


def _plain(value: Any) -> Any:
    """Hyperparameters as JSON-able plain values (tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"hyperparameter value {value!r} is not a plain value; keep hparams primitive "
                    "so that checkpoints load with weights_only=True")
