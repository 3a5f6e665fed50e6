"""Evaluate a checkpoint or a released model on a split: `python eval.py --checkpoint PATH`, the
same as `zoo eval --checkpoint PATH` after `pip install`. The code is zoo/evaluate.py."""
import sys

from zoo.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
