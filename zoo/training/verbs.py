"""The Lightning verbs on a finished run: `validate`, `test` and `predict` read a run, never write it
(no config.yaml, checkpoints or figures; a W&B run of their own); `predict` writes JSON lines to
`--predictions` (zoo.models.predict).

    python train.py predict --config RUN/config.yaml --ckpt_path last --predictions preds.jsonl
"""
from __future__ import annotations

from jsonargparse import ActionYesNo
from lightning.pytorch.callbacks import ModelCheckpoint

from zoo.models.predict import TOP_K, PredictionWriter, check_predicts, check_target
from zoo.training.callbacks import AttentionImageLogger

READ_ONLY = ("validate", "test", "predict")
DESCRIPTION = "Train zoo models from recipes and use a run's checkpoints (LightningCLI; VERB --help for each)."
#: each verb's line in `train.py --help`
SHORT_HELP = {"fit": "Train a model from a recipe.", "validate": "Evaluate a run's checkpoint on the validation split.",
              "test": "Evaluate a run's checkpoint on the test split.",
              "predict": "Write a run's checkpoint's predictions, one JSON line per image."}
#: each verb's `--help` text, whole: Lightning's (the Trainer methods' first docstring lines) cut a
#: sentence short and, with one parser_kwargs dict shared by the verbs, gave all of them fit's
HELP = {
    "fit": "Train a model from a recipe (--config FILE or a registry name): fit on the training split, validate "
           "every epoch, and save config.yaml and checkpoints in trainer.default_root_dir. --ckpt_path continues "
           "the run that wrote it; --init_from starts a new run from other weights.",
    "validate": "Evaluate a run's checkpoint (--config RUN/config.yaml --ckpt_path) once on the validation split "
                "and print its val/ metrics; the run's folder is read, never written.",
    "test": "Evaluate a run's checkpoint (--config RUN/config.yaml --ckpt_path) once on the test split and print "
            "its test/ metrics; the run's folder is read, never written. Select on validation, test once.",
    "predict": "Predict with a run's checkpoint (--config RUN/config.yaml --ckpt_path) on the data's test split: "
               "one JSON line per image (the top classes with their names, or a caption) written to "
               "--predictions FILE; the run's folder is read, never written.",
}
#: callbacks that write into the run folder (checkpoints, attention PNGs): for `fit` only
RUN_WRITERS = (ModelCheckpoint, AttentionImageLogger)


def add_arguments(parser, verb: str) -> None:
    """The options of one verb beyond LightningCLI's: where `predict` writes."""
    if verb != "predict":
        return
    parser.add_argument("--predictions", type=str | None, default=None,
                        help="write the predictions to this file, one JSON line per image (required)")
    parser.add_argument("--overwrite", action=ActionYesNo, default=False, help="replace an existing --predictions file")
    parser.add_argument("--top_k", type=int, default=TOP_K, help="classes written per image, most probable first")


def callbacks(verb: str, run: dict, model, callbacks: list) -> list:
    """The trainer's callbacks for `verb` (`run`: its config): a read-only verb's without the run's
    writers, `predict`'s with its writer (its target checked before the trainer starts)."""
    if verb not in READ_ONLY:
        return callbacks
    kept = [c for c in callbacks if not isinstance(c, RUN_WRITERS)]
    if verb != "predict":
        return kept
    check_predicts(model)
    check_target(run.get("predictions"), bool(run.get("overwrite")))
    if run.get("return_predictions") is None:
        run["return_predictions"] = False  # the file holds them; none kept in memory
    return kept + [PredictionWriter(run["predictions"], bool(run.get("overwrite")), run.get("top_k", TOP_K))]
