"""`python train.py fit --config configs/...`: the clone's `zoo train` (zoo/training/train.py; zoo.commands.cli.script
checks the environment and reports SIGTERM and Ctrl-C in one line from the first import on)."""
import sys

from zoo.commands.cli import script

if __name__ == "__main__":
    sys.exit(script("train", "train.py"))
