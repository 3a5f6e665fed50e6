"""scripts/sat_word_attention.py: the per-word attention analysis on a hand-made scene."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sat_word_attention.py"
spec = importlib.util.spec_from_file_location("sat_word_attention", SCRIPT)
swa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(swa)


class FakeCaptioner:
    """caption() returns fixed words, maps over a 2x2 grid and gates."""

    def __init__(self, words, peaks, betas):
        self.words, self.peaks, self.betas = words, peaks, betas

    def caption(self, images, beam_size):
        alpha = torch.zeros(len(self.words), 2, 2)
        for t, (r, c) in enumerate(self.peaks):
            alpha[t, r, c] = 1.0
        return [{"words": self.words, "alpha": alpha, "beta": torch.tensor(self.betas)}]


class FakeScenes:
    def test_dataloader(self):
        # 64x64 image, 2x2 grid: cell centres at 16 and 48; a shirt top-left, a bag bottom-right
        yield {"images": torch.zeros(1, 3, 64, 64), "boxes": [torch.tensor([[0., 0., 32., 32.], [32., 32., 64., 64.]])],
               "box_words": [["shirt", "bag"]]}


def test_referent_of_colour_is_the_next_item():
    words = ["a", "red", "shirt", "left", "of", "a", "blue", "bag"]
    assert [swa.referent(words, t) for t in range(len(words))] == \
        [None, "shirt", "shirt", None, None, None, "bag", "bag"]
    assert swa.referent(["a", "red"], 1) is None  # a colour with no item after it


def test_peaks_mass_entropy_and_gate_by_kind_of_word():
    words = ["a", "red", "shirt", "left", "of", "a", "blue", "bag", "coat"]
    # red -> shirt's cell (own), shirt -> bag's cell (other), blue -> empty corner (bg),
    # bag -> bag (own); "coat" is not in the scene and is skipped
    peaks = [(0, 1), (0, 0), (1, 1), (0, 1), (0, 1), (0, 1), (0, 1), (1, 1), (0, 0)]
    betas = [0.5, 0.9, 0.1, 0.5, 0.5, 0.5, 0.7, 0.3, 0.5]
    table, cells = swa.analyse(FakeCaptioner(words, peaks, betas), FakeScenes(), beam_size=3)
    assert cells == 4
    colour, item = table["colour/2"], table["item/2"]
    assert colour["words"] == 2 and item["words"] == 2
    assert (colour["peak_own"], colour["peak_other"], colour["peak_bg"]) == (0.5, 0.0, 0.5)
    assert (item["peak_own"], item["peak_other"], item["peak_bg"]) == (0.5, 0.5, 0.0)
    assert colour["mass_in_box"] == 0.5 and item["mass_in_box"] == 0.5
    assert colour["box_area"] == pytest.approx(0.25)
    assert colour["entropy"] == pytest.approx(0.0, abs=1e-6)  # one-hot maps
    assert colour["beta_median"] == pytest.approx(0.8) and item["beta_median"] == pytest.approx(0.2)
    assert table["item/all"] == item and "item/1" not in table
    assert not math.isnan(table["colour/all"]["mass_in_box"])
