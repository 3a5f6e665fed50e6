"""Train any zoo model from a recipe: `python train.py fit --config configs/...`, the same as
`zoo train fit --config ...` after `pip install`. The code is zoo/train.py."""
import sys

from zoo.train import main

if __name__ == "__main__":
    sys.exit(main())
