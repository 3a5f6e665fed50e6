"""One way to turn an image into a model's input, for every route (the commands, the data modules'
evaluation transforms, `zoo.get_weights(name).transforms()`, `zoo.preprocessing(model)`): a float
tensor [C, H, W] in [0, 1]. A mean/std normalisation is the model's, inside; `mean/std` record it.

Resize rules: "exact", the image must be H x W already (RAM, DRAW: coordinates are pixels; a colour
image is refused by a 1-channel model); "squash", resized to H x W (bilinear), the small-image
models; "crop", the shorter side to `resize_size`, then the centre H x W (timm's evaluation).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from zoo.guards.errors import UserError
from zoo.guards.files import INTERPOLATION, load_image

RESIZE_RULES = ("exact", "squash", "crop")


@dataclass(frozen=True)
class Preprocessing:
    in_chans: int
    size: tuple[int, int]  # (H, W)
    resize: str = "squash"
    resize_size: int | None = None  # the shorter side before the centre crop ("crop")
    mean: tuple[float, ...] | None = None  # applied by the model, recorded here
    std: tuple[float, ...] | None = None
    class_names: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.resize not in RESIZE_RULES:
            raise UserError(f"unknown resize rule {self.resize!r} (choose from {', '.join(RESIZE_RULES)})")
        if self.in_chans not in (1, 3):
            raise UserError(f"images have 1 or 3 channels here, the model expects {self.in_chans}")
        object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))

    # ------------------------------------------------------------------ transform
    def __call__(self, image) -> torch.Tensor:
        """A PIL image, a numpy array [H, W] / [H, W, C] or a tensor [H, W] / [C, H, W] (uint8, or float
        in [0, 1]) -> float [C, H, W] in [0, 1]."""
        import torchvision.transforms.functional as TF

        image = _as_pil(image)
        H, W = self.size
        if self.resize == "exact":
            if (image.height, image.width) != (H, W):
                raise UserError(f"image is {image.width}x{image.height}, the model expects {W}x{H} "
                                "(its coordinates are tied to its image size)")
            rgb = image_to_tensor(image.convert("RGB"))
            if self.in_chans == 3:
                return rgb
            if not (torch.equal(rgb[0], rgb[1]) and torch.equal(rgb[1], rgb[2])):
                raise UserError("colour image, the model expects 1-channel grayscale")
            return rgb[:1]
        image = image.convert("L" if self.in_chans == 1 else "RGB")
        if self.resize == "crop":
            image = TF.center_crop(TF.resize(image, self.resize_size or min(H, W)), [H, W])
        return image_to_tensor(image, (H, W))

    def transform(self):
        """The transform itself (torchvision's `weights.transforms()` convention)."""
        return self

    def map_boxes(self, boxes: torch.Tensor, original: tuple[int, int]) -> torch.Tensor:
        """Boxes [K, 4] (x0, y0, x1, y1) in an image of size `original` (H, W) -> the same boxes in the
        prepared input's pixels ("crop": cut to the crop, a box wholly outside it has no area)."""
        H, W = self.size
        h, w = original
        if self.resize == "exact":
            return boxes.clone().float()
        if self.resize == "squash":
            return boxes.float() * torch.tensor([W / w, H / h, W / w, H / h])
        short = self.resize_size or min(H, W)  # torchvision's resize of the shorter side, then its centre crop
        rh, rw = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
        top, left = int(round((rh - H) / 2.0)), int(round((rw - W) / 2.0))
        mapped = boxes.float() * torch.tensor([rw / w, rh / h, rw / w, rh / h]) - torch.tensor([left, top, left, top])
        return torch.stack([mapped[:, 0].clamp(0, W), mapped[:, 1].clamp(0, H),
                            mapped[:, 2].clamp(0, W), mapped[:, 3].clamp(0, H)], 1)

    # ------------------------------------------------------------------ records
    def as_dict(self) -> dict[str, Any]:
        record = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}

    @classmethod
    def from_dict(cls, record: dict) -> "Preprocessing":
        def tup(v):
            return tuple(v) if v is not None else None

        return cls(int(record["in_chans"]), tuple(record["size"]), record.get("resize", "squash"),
                   record.get("resize_size"), tup(record.get("mean")), tup(record.get("std")),
                   tup(record.get("class_names")))


def _as_pil(image):
    """A PIL image of any input `__call__` takes, so that every type is prepared by the same code."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu()
        image = (image.permute(1, 2, 0) if image.ndim == 3 else image).numpy()
    if not isinstance(image, np.ndarray):
        raise UserError(f"expected a PIL image, a numpy array or a tensor, got {type(image).__name__}")
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] not in (3, 4)):
        raise UserError(f"image array of shape {image.shape}: expected [H, W], [H, W, 3] or tensors [C, H, W]")
    if image.dtype != np.uint8:
        if image.size and (image.min() < 0 or image.max() > 1):
            raise UserError("a float image must hold values in [0, 1] (or give uint8 in [0, 255])")
        image = np.round(image.astype(np.float64) * 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(image))


def load_batch(paths, spec: Preprocessing, notes: list[str] | None = None, sizes: list | None = None):
    """Image files -> (tensor [N, C, H, W] of the good ones, good paths, one-line errors for the bad);
    `notes` gets a line on how many the rule resized or made grey, `sizes` each original (H, W)."""
    tensors, good, errors = [], [], []
    resized = greyed = 0
    for path in paths:
        try:
            image = load_image(path, channels=3)
            tensors.append(spec(image))
            good.append(str(path))
            if sizes is not None:
                sizes.append((image.size[1], image.size[0]))
            resized += (image.size[1], image.size[0]) != tuple(spec.size)
            if spec.in_chans == 1:
                pixels = np.asarray(image)
                greyed += not ((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all())
        except UserError as exc:
            message = str(exc)
            errors.append(message if message.startswith(str(path)) else f"{path}: {message}")
    if notes is not None and (resized or greyed):
        n = len(good)
        parts = [f"{resized} of {n} resized to {spec.size[1]}x{spec.size[0]} px ({spec.resize})"] * bool(resized)
        parts += [f"{greyed} of {n} made grey"] * bool(greyed)
        notes.append(f"note: images {'; '.join(parts)}, by the model's input rule (README, 'Image sizes')")
    batch = torch.stack(tensors) if tensors else torch.empty(0, spec.in_chans, *spec.size)
    return batch, good, errors


# ----------------------------------------------------------------------------- per model
def _normalisation(model) -> tuple[tuple | None, tuple | None]:
    """The mean/std a model applies to its input inside, if any (a backbone with `normalize`)."""
    for module in model.modules():
        if getattr(module, "normalize", False) and isinstance(getattr(module, "mean", None), torch.Tensor):
            return (tuple(round(float(v), 6) for v in module.mean.flatten()),
                    tuple(round(float(v), 6) for v in module.std.flatten()))
    return None, None


def for_model(model) -> Preprocessing:
    """How images are prepared for `model`: its input facts, and its data module's evaluation crop."""
    from zoo.classes import is_allowed, resolve_class

    config = getattr(model, "_zoo_data_config", None) or {}  # zoo.registry.data_config
    data, data_class = config.get("init_args") or {}, str(config.get("class_path", ""))
    mean, std = _normalisation(model)
    data_module = resolve_class(data_class, "data") if is_allowed(data_class, "data") else None
    names = model.hparams.get("class_names") or getattr(data_module, "class_names", None)
    names = tuple(names) if names else None
    size = tuple(model.input_size)
    crop = data_module.eval_resize_for(size, **data_module.arguments(**data)) if data_module is not None else None
    resize = model.card.resize if crop is None else "crop"
    return Preprocessing(model.input_chans, size, resize, crop, mean, std, names)


def image_rules(in_chans: int) -> dict[str, str]:
    """How a file becomes pixels, as export.json states it for a deployment."""
    return {"alpha": "composite on black",
            "colour": {3: "RGB", 1: "L (PIL's convert('L') of the RGB: ITU-R 601-2 luma)"}[in_chans],
            "orientation": "EXIF orientation applied", "interpolation": INTERPOLATION}


def image_to_tensor(img: Image.Image, size: tuple[int, int] | None = None) -> torch.Tensor:
    """PIL image -> float tensor [C, H, W] in [0, 1], resized to size=(H, W) if given."""
    if size is not None and (img.height, img.width) != tuple(size):
        img = img.resize((size[1], size[0]), Image.Resampling[INTERPOLATION.upper()])
    array = np.asarray(img, dtype=np.float32) / 255.0
    array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(array))
