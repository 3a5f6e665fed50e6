"""`zoo eval` (and the clone's `python eval.py`): evaluate a checkpoint or a registry model on a split.

    python eval.py --checkpoint runs/baseline_cnn_centered/checkpoints/last.ckpt --split test
    python eval.py --model ram_fmnist_centered --split val --json results/x.json

The data module is the one the model was trained with (its config travels in the checkpoint). The
JSON holds the metrics, the config, the weights' sha256, the seed and zoo.results' provenance.
"""
from __future__ import annotations

import sys
import time

from zoo.commands.common import add_model_arguments, key_values, resolve_model
from zoo.guards.errors import OneLineParser, quiet_lightning, report_user_errors


#: `--help`'s description, whole sentences (the docstring's first line was cut into a fragment before)
DESCRIPTION = ("Evaluate a checkpoint or a registry model on a split of the data it was trained with: prints "
               "a table of its metrics and, with --json, writes them with the config, the weights' sha256 and "
               "the seed.")


def parse_args(argv=None, prog: str = "eval.py"):
    parser = OneLineParser(prog=prog, description=DESCRIPTION)
    add_model_arguments(parser)
    parser.add_argument("--split", choices=["val", "test"], default="test",
                        help="the data's split to evaluate on (default: test; select on val)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    parser.add_argument("--seed", type=int, default=0, help="seed for stochastic metrics")
    parser.add_argument("--batch-size", type=int, help="override the data module's batch size")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples")
    parser.add_argument("--accelerator", default="auto",
                        help="Lightning's accelerator: auto (a GPU when there is one), cpu, gpu, ...")
    parser.add_argument("--accel", choices=["auto", "eager", "compile", "reduce-overhead"], default="auto",
                        help="speed (zoo.models.accel): compile the evaluation step, or not")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override a data module argument (YAML value), e.g. --data num_workers=2")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model hyperparameter that does not change its weights, "
                             "e.g. --model-arg iwae_samples=5000")
    return parser.parse_args(argv)


def evaluate(args) -> int:
    import lightning as L

    import zoo
    from zoo.guards.budget import check_environment, check_flags
    from zoo.guards.writes import check_output
    from zoo.results import write_json
    from zoo.weights import hub

    check_environment()  # every setting read from the environment, before any work
    started = time.perf_counter()
    if args.json:
        check_output(args.json, "--json", args.overwrite)
    check_flags({"--batch-size": args.batch_size})
    check_flags({"--limit": args.limit}, limit_name="limit_eval")
    L.seed_everything(args.seed, verbose=False)
    model = resolve_model(args, **key_values(args.model_arg, "--model-arg"))
    weights = hub.fetch(args.checkpoint, args.sha256) if args.checkpoint else hub.fetch_release(args.model)
    weights_sha256 = hub.sha256_file(weights)  # a URL: the cached copy
    data_args = key_values(args.data, "--data")
    if args.batch_size:
        data_args["batch_size"] = args.batch_size
    if args.limit:
        data_args["limit_eval"] = args.limit
    datamodule = zoo.build_datamodule(model, **data_args)
    datamodule.test_split = args.split
    datamodule.prepare_data()  # a missing or unwritable data folder: one line, before the trainer starts
    datamodule.setup("test")
    from zoo.training.callbacks import Accelerate

    trainer = L.Trainer(accelerator=args.accelerator, devices=1, logger=False, callbacks=[Accelerate(args.accel)],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    wall = time.perf_counter() - started
    metrics = {k.replace("test/", f"{args.split}/", 1): float(v) for k, v in sorted(metrics.items())}
    width = max(map(len, metrics), default=10)
    print(f"{'metric':<{width}}  value")
    for k, v in metrics.items():
        print(f"{k:<{width}}  {v:.6g}")
    if args.json:
        data = zoo.data_config(model)
        payload = {"model": args.model, "checkpoint": args.checkpoint, "split": args.split,
                   "checkpoint_sha256": weights_sha256, "seed": args.seed,
                   "metrics": metrics, "parameters": sum(p.numel() for p in model.parameters()),
                   "config": model.zoo_config() | {"data": {**data, "init_args": {**data.get("init_args", {}),
                                                                                    **data_args}}},
                   "wall_time_s": round(wall, 3), "num_examples_limit": args.limit}
        path = write_json(args.json, payload)
        print(f"wrote {path}")
    return 0


def main(argv=None, prog: str = "eval.py") -> int:
    quiet_lightning()
    args = parse_args(argv, prog)
    return report_user_errors(prog, lambda: evaluate(args))


if __name__ == "__main__":  # python -m zoo.commands.evaluate
    sys.exit(main(prog="python -m zoo.commands.evaluate"))
