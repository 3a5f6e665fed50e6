"""Caption metrics (coco-caption via pycocoevalcap) and attention localisation."""
from zoo.metrics.captions import METRIC_NAMES, score_captions
from zoo.metrics.localization import attention_localization, localization_stats

__all__ = ["METRIC_NAMES", "score_captions", "attention_localization", "localization_stats"]
