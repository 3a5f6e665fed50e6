"""attention-zoo: classic visual attention models behind one API.

    import zoo
    zoo.list_models()                                   # every recipe in configs/
    model = zoo.create_model("ram_fmnist_centered", pretrained=True)
    model = zoo.load_checkpoint("runs/.../last.ckpt")
"""
from zoo.errors import UserError
from zoo.registry import create_model, list_models, load_checkpoint

__all__ = ["create_model", "list_models", "load_checkpoint", "UserError"]
__version__ = "0.1.0"
