"""When not to trust a caption: its attention is near uniform on most words, or its score is far
below what the model gives its own test split. Both are measured against thresholds calibrated on
the released captioner's test split (`scripts/caption_trust.py` writes them, with their provenance,
to zoo/metrics/caption_trust.json; docs/captioning.md states them).

The attention unit is the one every figure and JSON of the zoo uses (`spread`): exp(H) / N, H the
map's entropy in nats over its N cells or pixels. It is the share of the input the map spreads
over: 1 for a uniform map, 1/N for one cell; a coarse cell's mass spread evenly over its pixels
leaves it unchanged, so a captioner's 8 x 8 grid and `zoo attend`'s pixel map of it give one number.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

SPREAD_UNIT = ("spread = exp(H) / N, H the map's entropy in nats over its N cells (or pixels): the share of "
               "the input the map spreads over (1 = uniform, 1/N = one cell)")
THRESHOLDS = Path(__file__).with_name("caption_trust.json")


def spread(maps: torch.Tensor) -> torch.Tensor:
    """[..., H, W] probability maps -> [...] exp(entropy) / cells in (0, 1]; NaN/negative mass is
    read as 0 (a degenerate all-zero map gives NaN)."""
    flat = torch.nan_to_num(maps.detach().flatten(-2).double(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
    total = flat.sum(-1, keepdim=True)
    p = flat / total.where(total > 0, torch.full_like(total, float("nan")))
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
    return (entropy.exp() / flat.shape[-1]).float()


def caption_stats(result: dict) -> dict[str, float]:
    """One `Captioner.caption()` entry -> its median word spread and its score per word (the summed
    log-probability over the steps the decoder scored: the words, and the end token when it
    finished)."""
    alpha = torch.as_tensor(result["alpha"], dtype=torch.float32)
    words = len(result["words"])
    median = float(spread(alpha[:words]).median()) if words else float("nan")
    steps = words + int(bool(result.get("finished", True)))
    return {"median_spread": median, "score_per_word": float(result["score"]) / max(1, steps)}


def load_thresholds(model_name: str | None, path: Path | None = None) -> dict | None:
    """The calibration of the named release, or None (a checkpoint or an uncalibrated model)."""
    path = path or THRESHOLDS
    if not model_name or not path.exists():
        return None
    return json.loads(path.read_text()).get(model_name)


def short_reasons(stats: dict[str, float], thresholds: dict) -> list[str]:
    """`distrust`'s reasons in a few words each (a figure's legend)."""
    return [reason.split(" (")[0].replace("its ", "", 1) for reason in distrust(stats, thresholds)]


def distrust(stats: dict[str, float], thresholds: dict) -> list[str]:
    """The reasons not to trust a caption (empty: nothing unusual), against `thresholds`
    {"median_spread_max", "score_per_word_min", ...}."""
    reasons = []
    if not math.isnan(stats["median_spread"]) and stats["median_spread"] > thresholds["median_spread_max"]:
        reasons.append(f"its attention is near uniform on most words (median spread {stats['median_spread']:.2f} > "
                       f"{thresholds['median_spread_max']:.2f}, percentile {thresholds['percentile_high']:g} of the "
                       "test split)")
    if stats["score_per_word"] < thresholds["score_per_word_min"]:
        reasons.append(f"its score is far below the test split's (log-probability per word "
                       f"{stats['score_per_word']:.2f} < {thresholds['score_per_word_min']:.2f}, percentile "
                       f"{100 - thresholds['percentile_high']:g})")
    return reasons
