"""Caption metrics through the coco-caption code (pycocoevalcap): BLEU-1..4, METEOR, ROUGE_L,
CIDEr, and SPICE on request.

Honesty rules (Xu et al. 2015, the coco-caption protocol): free-running decodes, one caption per
image; a whole split in ONE call (CIDEr's IDF weights come from the references passed in); a metric
that cannot run is None with a note, never replaced. Predictions and references go through
coco-caption's PTBTokenizer (Java) in one pass, as the official evaluation does.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

METRIC_NAMES = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")

_meteor_lock = threading.Lock()
_meteor = None  # one METEOR JVM per process: it takes seconds to start and load its tables


@contextlib.contextmanager
def _quiet():
    """Silence prints and the Java tools' chatter at the file-descriptor level (attached to an error)."""
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = []
        try:
            for fd in (1, 2):
                try:
                    saved.append((fd, os.dup(fd)))
                    os.dup2(sink.fileno(), fd)
                except OSError:
                    pass
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        except Exception as exc:
            sink.seek(0)
            chatter = sink.read().decode(errors="replace").strip()
            if chatter:
                exc.add_note(f"tool output: {chatter[-2000:]}")
            raise
        finally:
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)


def java_available() -> bool:
    return shutil.which("java") is not None


def _tokenize(predictions: Mapping, references: Mapping) -> tuple[dict, dict]:
    """PTB-tokenize predictions and references in one Java call -> (gts, res) by image id."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    joint = {("pred", i): [{"caption": str(predictions[i])}] for i in predictions}
    joint.update({("ref", i): [{"caption": str(r)} for r in references[i]] for i in references})
    with _quiet():
        tokenized = PTBTokenizer().tokenize(joint)
    res = {i: [tokenized.get(("pred", i), [""])[0]] for i in predictions}
    gts = {i: tokenized.get(("ref", i), [""] * len(references[i])) for i in references}
    return gts, res


def _meteor_score(gts: dict, res: dict) -> float:
    global _meteor
    from pycocoevalcap.meteor.meteor import Meteor

    with _meteor_lock:
        for attempt in range(2):  # a JVM that died since the last call is restarted once
            if _meteor is None:
                with _quiet():
                    _meteor = Meteor()
            try:
                with _quiet():
                    return float(_meteor.compute_score(gts, res)[0])
            except Exception:
                bad, _meteor = _meteor, None
                with contextlib.suppress(Exception):
                    bad.meteor_p.kill()
                if attempt:
                    raise


def _spice_jar_ready() -> tuple[bool, str]:
    import pycocoevalcap

    jar = Path(list(pycocoevalcap.__path__)[0], "spice", "lib", "stanford-corenlp-3.6.0.jar")
    why = (f"SPICE skipped: it needs the Stanford CoreNLP 3.6.0 jars in {jar.parent} "
           "(pycocoevalcap's spice/get_stanford_models.py downloads them; not possible offline)")
    return jar.is_file(), why


def score_captions(predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]],
                   meteor: bool = True, spice: bool = False) -> dict:
    """Score one split in one call: predictions {image id: caption}, references {image id: raw
    strings} over the same images -> {Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr [, SPICE]: float or
    None, "num_images", "notes": {metric: why it is None}}."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    pred_ids, ref_ids = set(predictions), set(references)
    if pred_ids != ref_ids:
        missing, extra = ref_ids - pred_ids, pred_ids - ref_ids
        raise ValueError(f"predictions and references must cover the same images: {len(missing)} images "
                         f"have no prediction (e.g. {sorted(map(str, missing))[:3]}), {len(extra)} "
                         f"predictions have no references (e.g. {sorted(map(str, extra))[:3]})")
    if not pred_ids:
        raise ValueError("no captions to score")
    empty = [i for i in references if len(references[i]) == 0]
    if empty:
        raise ValueError(f"{len(empty)} images have no reference captions (e.g. {empty[:3]})")
    if not java_available():
        raise RuntimeError("caption metrics need Java (coco-caption's PTBTokenizer and METEOR are Java "
                           "programs): install a JRE, e.g. apt-get install default-jre-headless")

    gts, res = _tokenize(predictions, references)
    notes: dict[str, str] = {}

    def optional(name: str, ready: tuple[bool, str], score) -> float | None:
        """An optional metric's score, or None with a note saying why it is missing."""
        if not ready[0]:
            notes[name] = ready[1]
            return None
        try:
            return score()
        except Exception as exc:
            notes[name] = f"{name} failed: {type(exc).__name__}: {exc}"
            return None

    def spice_score() -> float:
        from pycocoevalcap.spice.spice import Spice

        with _quiet():
            return float(Spice().compute_score(gts, res)[0])

    with _quiet():
        bleu, _ = Bleu(4).compute_score(gts, res)
    result: dict = {f"Bleu_{n}": float(value) for n, value in enumerate(bleu, 1)}
    result["METEOR"] = optional("METEOR", (meteor, "METEOR not requested"), lambda: _meteor_score(gts, res))
    result["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
    result["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    if spice:
        result["SPICE"] = optional("SPICE", _spice_jar_ready(), spice_score)
    result["num_images"] = len(pred_ids)
    result["notes"] = notes
    return result
