"""Train any zoo model from a recipe: `python train.py fit --config configs/...`, the same as
`zoo train fit --config ...` after `pip install`. The code is zoo/training/train.py; zoo.commands.cli.script checks
the environment and reports SIGTERM and Ctrl-C in one line from the first import on."""
import sys

from zoo.commands.cli import script

if __name__ == "__main__":
    sys.exit(script("train", "train.py"))
