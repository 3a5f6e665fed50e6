"""Write a class subset of Fashion-MNIST as a torchvision ImageFolder tree (PNG files), the layout
`zoo.data.imagefolder.ImageFolderDataModule` reads: a small "your own data" task for fine-tuning.

    python scripts/fmnist_imagefolder.py OUT --classes 0 2 4 6 8 --train-per-class 100 --val-per-class 100 \
        --test-per-class 500

OUT/train/<class>/ takes the first images of each class from Fashion-MNIST train, OUT/val/<class>/
the next ones (no image in both), OUT/test/<class>/ the first from Fashion-MNIST test."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist  # noqa: E402
from zoo.guards.errors import UserError  # noqa: E402


def export(out: Path, classes: list[int], per_class: dict[str, int]) -> None:
    skip = {"train": 0, "val": per_class["train"], "test": 0}  # val: the train images after train's
    for split, count in per_class.items():
        images, labels = load_fashion_mnist("test" if split == "test" else "train")
        for label in classes:
            folder = out / split / CLASS_NAMES[label].replace("/", "-")
            folder.mkdir(parents=True, exist_ok=True)
            for i in (labels == label).nonzero().flatten()[skip[split]:skip[split] + count].tolist():
                Image.fromarray(images[i].numpy()).save(folder / f"{i:05d}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--classes", type=int, nargs="+", default=[0, 2, 4, 6, 8])
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=100)
    parser.add_argument("--test-per-class", type=int, default=500)
    args = parser.parse_args(argv)
    try:
        if any(not 0 <= c < len(CLASS_NAMES) for c in args.classes):
            raise UserError(f"--classes: Fashion-MNIST labels are 0..{len(CLASS_NAMES) - 1}")
        export(args.out, sorted(set(args.classes)), {"train": args.train_per_class, "val": args.val_per_class,
                                                              "test": args.test_per_class})
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/train, val and test ({len(set(args.classes))} classes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
