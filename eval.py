"""Evaluate a checkpoint or a registry model on a split: prints a table, writes JSON.

    python eval.py --checkpoint runs/baseline_cnn_centered/checkpoints/last.ckpt --split test
    python eval.py --model ram_fmnist_centered --split val --json results/x.json

The data module is the one the model was trained with (its config travels in the checkpoint).
The JSON holds the metrics, the model's config, the checkpoint's sha256, the seed, the git commit,
the device and the wall time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("WANDB_MODE", "offline")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a Lightning .ckpt or a .safetensors release")
    source.add_argument("--model", help="registry name; its released weights are loaded")
    parser.add_argument("--split", choices=["val", "test"], default="test")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--seed", type=int, default=0, help="seed for stochastic metrics")
    parser.add_argument("--batch-size", type=int, help="override the data module's batch size")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override a data module argument (YAML value), e.g. --data num_workers=2")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model hyperparameter that does not change its weights, "
                             "e.g. --model-arg iwae_samples=5000")
    return parser.parse_args(argv)


def _key_values(items: list[str], flag: str) -> dict:
    import yaml

    from zoo.errors import UserError

    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} expects KEY=VALUE, got '{item}'")
        parsed[key] = yaml.safe_load(value)
    return parsed


def main(argv=None) -> int:
    args = parse_args(argv)
    import lightning as L

    import zoo
    from zoo import hub
    from zoo.errors import UserError
    from zoo.registry import instantiate
    from zoo.results import write_json

    try:
        started = time.perf_counter()
        L.seed_everything(args.seed, verbose=False)
        model_args = _key_values(args.model_arg, "--model-arg")
        if args.checkpoint:
            model = zoo.load_checkpoint(args.checkpoint, **model_args)
            weights_sha256 = hub.sha256_file(hub.fetch(args.checkpoint))  # a URL: the cached copy
        else:
            model = zoo.create_model(args.model, pretrained=True, **model_args)
            from zoo.registry import get_entry

            # create_model verified the file (local or downloaded from its URL) against this
            weights_sha256 = get_entry(args.model).weights["sha256"]
        data_config = getattr(model, "_zoo_data_config", None)
        if not data_config:
            raise UserError("the model carries no data config; evaluate a checkpoint written by train.py")
        data_args = {k: v for k, v in (data_config.get("init_args") or {}).items() if not k.startswith("_")}
        if args.batch_size:
            data_args["batch_size"] = args.batch_size
        if args.limit:
            data_args["limit_eval"] = args.limit
        data_args.update(_key_values(args.data, "--data"))
        if args.limit:
            import inspect

            from zoo.registry import import_class

            if "limit_eval" not in inspect.signature(import_class(data_config["class_path"])).parameters:
                raise UserError(f"--limit: {data_config['class_path']} has no limit_eval argument; "
                                "set the split size through --data instead")
        datamodule = instantiate({"class_path": data_config["class_path"], "init_args": data_args})
        datamodule.test_split = args.split
        trainer = L.Trainer(accelerator=args.accelerator, devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        metrics = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    except UserError as exc:
        print(f"eval.py: error: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    metrics = {k.replace("test/", f"{args.split}/", 1): float(v) for k, v in sorted(metrics.items())}
    width = max(map(len, metrics), default=10)
    print(f"{'metric':<{width}}  value")
    for k, v in metrics.items():
        print(f"{k:<{width}}  {v:.6g}")
    if args.json:
        payload = {"model": args.model, "checkpoint": args.checkpoint, "split": args.split,
                   "checkpoint_sha256": weights_sha256, "seed": args.seed,
                   "metrics": metrics, "config": model.zoo_config() | {"data": {**data_config, "init_args": data_args}},
                   "wall_time_s": round(wall, 3), "num_examples_limit": args.limit}
        path = write_json(args.json, payload)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
