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
