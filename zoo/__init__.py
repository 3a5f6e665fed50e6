"""attention-zoo: classic visual attention models behind one API.

    import zoo
    zoo.list_models()                                   # every recipe in configs/
    model = zoo.create_model("ram_fmnist_centered", pretrained=True)
    model = zoo.load_checkpoint("runs/.../last.ckpt")
    datamodule = zoo.build_datamodule(model)            # the data it was trained with
"""
from zoo.errors import UserError
from zoo.registry import build_datamodule, create_model, data_config, list_models, load_checkpoint

__all__ = ["create_model", "list_models", "load_checkpoint", "data_config", "build_datamodule", "UserError"]
__version__ = "0.1.0"
