"""The backbone kinds, and a backbone as a typed configuration object: what a `backbone:` block means.

    backbone:
      kind: stem                         # stem | timm_cnn | timm_vit
      pretrained: backbone_fmnist_stem   # a released zoo weight by name (or a .safetensors/.ckpt path)
      trainable: false                   # frozen, as Xu et al. 2015 keep their VGG encoder

`BackboneSpec` is a dataclass, so LightningCLI parses every field with its type and a second
`--config` changes one field, not the whole block. Fields left None take the kind's default (or a
zoo weight's value, which set fields must agree with); a field the kind lacks is refused.
`pretrained`: False, True (timm's hub, timm kinds) or a zoo weight whose model holds a backbone;
`pretrained_file`: a local timm checkpoint. Checkpoints record `spec.self_contained(module)`: no
pretrained source (the weights are in the checkpoint), the input normalisation written out.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from zoo.backbones.stem import ConvStem
from zoo.backbones.timm_cnn import TimmCNN
from zoo.backbones.timm_vit import TimmViT
from zoo.guards.errors import UserError

BACKBONES = {"stem": ConvStem, "timm_cnn": TimmCNN, "timm_vit": TimmViT}  # a spec's `kind`
#: fields the user chooses freely when loading a zoo weight (the rest must agree with the weight)
FREE_FIELDS = ("trainable", "pretrained", "pretrained_file", "kind")


def build_backbone(kind: str, **kwargs) -> nn.Module:
    """Instantiate the backbone `kind` ("stem", "timm_cnn" or "timm_vit") with plain kwargs."""
    if kind not in BACKBONES:
        raise UserError(f"unknown backbone kind '{kind}'; choose one of {', '.join(BACKBONES)}")
    try:
        return BACKBONES[kind](**kwargs)
    except TypeError as exc:
        raise UserError(f"backbone '{kind}': bad arguments ({exc})") from None
    except ValueError as exc:
        raise UserError(f"backbone '{kind}': {exc}") from None


@dataclass
class BackboneSpec:
    """Images [B, C, H, W] -> PatchFeatures, as one typed block (see the module docstring): `kind`
    picks the class (BACKBONES), every other field is a constructor argument of it."""

    kind: Literal["stem", "timm_cnn", "timm_vit"] = "stem"
    pretrained: bool | str = False
    pretrained_file: str | None = None
    trainable: bool | None = None
    in_chans: int | None = None
    # input normalisation inside the backbone: (x - mean) / std on images in [0, 1]
    normalize: bool | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    # stem
    channels: list[int] | None = None
    strides: list[int] | None = None
    blocks_per_stage: int | None = None
    kernel_size: int | None = None
    # timm CNN / ViT
    model_name: str | None = None
    level: int | None = None
    img_size: list[int] | int | None = None
    patch_size: int | None = None
    depth: int | None = None
    embed_dim: int | None = None
    num_heads: int | None = None
    mlp_ratio: float | None = None
    global_pool: str | None = None
    class_token: bool | None = None
    keep_cls: bool | None = None
    dynamic_img_size: bool | None = None
    conv_stem: list[int] | None = None
    conv_stem_blocks: int | None = None
    drop_rate: float | None = None
    drop_path_rate: float | None = None
    attn_drop_rate: float | None = None
    model_kwargs: dict[str, Any] | None = None

    def __post_init__(self):
        # jsonargparse hands a nested `--model.init_args.backbone.FIELD null` over as the string
        # "None": it means unset (for `pretrained`, no pretrained weights)
        for f in dataclasses.fields(self):
            if getattr(self, f.name) == "None":
                setattr(self, f.name, False if f.name == "pretrained" else None)

    @classmethod
    def coerce(cls, value: "BackboneSpec | dict | None", default: dict | None = None) -> "BackboneSpec":
        """A spec from a spec, a plain dict (old checkpoints, Python callers) or None (`default`)."""
        if value is None:
            value = dict(default or {})
        if isinstance(value, cls):
            return dataclasses.replace(value)
        if not isinstance(value, dict):
            raise UserError(f"backbone: expected a mapping of backbone fields, got {type(value).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise UserError(f"backbone: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        spec = cls(**value)
        if spec.kind not in BACKBONES:
            raise UserError(f"unknown backbone kind '{spec.kind}'; choose one of {', '.join(BACKBONES)}")
        return spec

    def to_dict(self) -> dict:
        """The set fields as plain values (kind always), for hparams and checkpoints."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()
                if value is not None or name == "kind"}

    def build(self, **given) -> nn.Module:
        """Instantiate the backbone, loading (and adopting the architecture of) a zoo weight that
        `pretrained` names. `given`: the model's own facts the backbone must take (a ViT classifier's
        `img_size`, `in_chans`, `num_classes`); a field the block sets otherwise is refused."""
        source = None
        if isinstance(self.pretrained, str):
            source = load_zoo_backbone(self.pretrained)
            self._adopt(source)
        kwargs = self.kwargs()
        for name, value in given.items():
            if kwargs.get(name) is not None and _norm(kwargs[name]) != _norm(value):
                raise UserError(f"backbone.{name} {kwargs[name]} disagrees with the model's {value}; leave it out")
            kwargs[name] = tuple(value) if isinstance(value, list) else value
        module = build_backbone(self.kind, **kwargs)
        if source is not None:  # the zoo weight's tensors must fit the backbone it describes
            own = module.state_dict()
            missing = sorted(k for k in own if k not in source.state)
            mismatched = [f"{k} {tuple(source.state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
                          if k in source.state and source.state[k].shape != v.shape]
            if missing or mismatched:
                detail = "; ".join(mismatched[:3]) or f"missing {', '.join(missing[:3])}"
                raise UserError(f"backbone weight '{source.name}' does not fit the backbone it describes "
                                f"({detail})")
            module.load_state_dict({k: source.state[k] for k in own})
            module.pretrained_source = source  # check_input names it and the image size it was trained on
        return module

    def kwargs(self) -> dict:
        """Constructor arguments of the kind's class: the set fields, refusing those that do not apply."""
        cls = BACKBONES[self.kind]
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
        kwargs, refused = {}, []
        for name, value in self.to_dict().items():
            if name == "kind" or (name == "pretrained" and (value is False or isinstance(value, str))):
                continue
            if name not in accepted:
                if name == "pretrained":  # hub weights for a kind without any
                    raise UserError(f"backbone kind '{self.kind}' has no hub weights (pretrained: true); "
                                    "give a released zoo weight by name instead (pretrained: NAME)")
                refused.append(name)
                continue
            kwargs[name] = tuple(value) if name == "img_size" and isinstance(value, list) else value
        if refused:
            raise UserError(f"backbone kind '{self.kind}' takes no {', '.join(refused)} "
                            f"(its fields: {', '.join(sorted(accepted))})")
        return kwargs

    def self_contained(self, module: nn.Module) -> dict:
        """This spec as a checkpoint records it (module docstring)."""
        out = {**self.to_dict(), "pretrained": False}
        out.pop("pretrained_file", None)
        out["normalize"] = normalize = bool(getattr(module, "normalize", False))
        if normalize and not module.mean.is_meta:  # (a model built on the meta device has no values)
            out["mean"] = [float(v) for v in module.mean.flatten().tolist()]
            out["std"] = [float(v) for v in module.std.flatten().tolist()]
        elif not normalize:
            out.pop("mean", None)
            out.pop("std", None)
        return out

    def _adopt(self, source: "ZooBackbone") -> None:
        """Fill unset fields from the zoo weight's spec; set fields must agree with it."""
        theirs = source.spec
        if theirs.kind != self.kind:
            raise UserError(f"backbone weight '{source.name}' is a '{theirs.kind}' backbone, the config says "
                            f"kind '{self.kind}'")
        for f in dataclasses.fields(self):
            mine, other = getattr(self, f.name), getattr(theirs, f.name)
            if f.name in FREE_FIELDS or other is None:
                continue
            if mine is None:
                setattr(self, f.name, other)
            elif _norm(mine) != _norm(other):
                raise UserError(f"backbone weight '{source.name}' was trained with {f.name} {other}, "
                                f"the config asks for {mine}; leave {f.name} out to use the weight's")


@dataclass
class ZooBackbone:
    """A backbone inside a zoo weight file: its spec and its tensors (prefix stripped)."""

    name: str
    spec: BackboneSpec
    state: dict[str, torch.Tensor]
    image_size: list[int] | None  # the input size it was trained on, when recorded


def load_zoo_backbone(source: str) -> ZooBackbone:
    """The backbone in the zoo weight `source`: a released name (weights/MANIFEST.json, through
    zoo.weights.hub) or a path to a .safetensors/.ckpt file written by the zoo."""
    from zoo.weights import hub

    path = Path(os.path.expanduser(source))
    if path.suffix in (".safetensors", ".ckpt") or os.sep in source:
        if not path.is_file():
            raise UserError(f"{path}: no such backbone weights file")
        file = path
    else:
        file = hub.fetch_release(source)
    state, config = hub.load_weights(file)  # its config in current hyperparameter names (zoo.hparams)
    if not config or "init_args" not in config:
        raise UserError(f"{source}: no zoo config inside, so its backbone cannot be found")
    init_args = config["init_args"]
    if not isinstance(init_args.get("backbone"), dict):
        raise UserError(f"{source}: a {config.get('family', '?')} model with no backbone inside")
    spec = BackboneSpec.coerce(dict(init_args["backbone"]))
    prefixes = ("backbone.", "encoder.")
    accepted = set(inspect.signature(BACKBONES[spec.kind].__init__).parameters)
    for field, model_fact in (("img_size", "image_size"), ("in_chans", "in_chans")):  # the model's facts it took
        if field in accepted and getattr(spec, field) is None and init_args.get(model_fact) is not None:
            setattr(spec, field, init_args[model_fact])
    spec.pretrained, spec.pretrained_file, spec.trainable = False, None, None
    prefix = next((p for p in prefixes if any(k.startswith(p) for k in state)), None)
    if prefix is None:
        raise UserError(f"{source}: no backbone tensors inside (looked for {' or '.join(prefixes)})")
    sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    data = (config.get("data") or {}).get("init_args") or {}
    size = init_args.get("image_size") or data.get("image_size") or data.get("canvas_size")
    size = [size, size] if isinstance(size, int) else size
    return ZooBackbone(source, spec, sub, list(size) if size else None)


def check_input(module: nn.Module, in_chans: int, image_size, owner: str) -> None:
    """Refuse, in one line naming both, a backbone that cannot take `owner`'s images [in_chans,
    *image_size]: other channels, another fixed size, or an image smaller than one grid cell."""
    size = [int(s) for s in (image_size if isinstance(image_size, (list, tuple)) else (image_size, image_size))]
    source = getattr(module, "pretrained_source", None)
    what = f"backbone weight '{source.name}'" if source is not None else "the backbone"
    trained = f" (trained on {source.image_size[0]}x{source.image_size[1]} px)" if source and source.image_size else ""
    want = getattr(module, "in_chans", in_chans)
    if want != in_chans and not (want == 3 and in_chans == 1):
        raise UserError(f"{what} takes {want}-channel images{trained}; {owner}'s images are "
                        f"{in_chans}x{size[0]}x{size[1]}")
    vit = getattr(module, "vit", None)
    if vit is not None and not getattr(vit, "dynamic_img_size", False):
        fixed = list(module.img_size)
        if fixed != size:
            raise UserError(f"{what} takes {want}x{fixed[0]}x{fixed[1]} images; {owner}'s images are "
                            f"{in_chans}x{size[0]}x{size[1]}")
    stride = getattr(module, "stride", None)
    if stride is not None and min(size) < stride:
        raise UserError(f"{what} has stride {stride}; {owner}'s {size[0]}x{size[1]} images give no grid")


def _norm(value):
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
