"""attention-zoo: classic visual attention models behind one API.

    import zoo
    zoo.list_models()                                   # every recipe in configs/
    model = zoo.create_model("ram_fmnist_centered", pretrained=True)
    model = zoo.load_checkpoint("runs/.../last.ckpt")
    datamodule = zoo.build_datamodule(model)            # the data it was trained with
    weights = zoo.get_weights("sat_soft_scenes")        # .transforms(), .meta (metrics, recipe, ...)
    image = weights.transforms()(PIL.Image.open("scene.png"))   # float [C, H, W] in [0, 1]
    manifest = zoo.load_export("exported/")             # a `zoo export` set, checked (torch-free)
"""
from zoo.guards.errors import UserError

#: the public names, imported on first use (PEP 562): `import zoo` and `zoo list` stay free of torch
_PUBLIC = {"create_model": "zoo.registry", "list_models": "zoo.registry", "load_checkpoint": "zoo.registry",
           "get_weights": "zoo.registry", "Weights": "zoo.registry", "data_config": "zoo.registry",
           "build_datamodule": "zoo.registry", "preprocessing": "zoo.preprocess:for_model",
           "load_export": "zoo.weights.export_set:check_set"}
__all__ = [*_PUBLIC, "UserError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _PUBLIC:
        module, _, attr = _PUBLIC[name].partition(":")
        value = getattr(importlib.import_module(module), attr or name)
    elif not name.startswith("_") and importlib.util.find_spec(f"zoo.{name}") is not None:
        value = importlib.import_module(f"zoo.{name}")  # a submodule, as `import zoo` used to bring
    else:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
