"""attention-zoo: classic visual attention models behind one API.

    import zoo
    zoo.list_models()                                   # every recipe in configs/
    model = zoo.create_model("ram_fmnist_centered", pretrained=True)
    model = zoo.load_checkpoint("runs/.../last.ckpt")
    datamodule = zoo.build_datamodule(model)            # the data it was trained with
    weights = zoo.get_weights("sat_soft_scenes")        # .transforms(), .meta (metrics, recipe, ...)
    image = weights.transforms()(PIL.Image.open("scene.png"))   # float [C, H, W] in [0, 1]
"""
from zoo.errors import UserError
from zoo.preprocess import for_model as preprocessing
from zoo.registry import (Weights, build_datamodule, create_model, data_config, get_weights, list_models,
                          load_checkpoint)

__all__ = ["create_model", "list_models", "load_checkpoint", "get_weights", "Weights", "preprocessing",
           "data_config", "build_datamodule", "UserError"]
__version__ = "0.1.0"
