"""Caption metrics (coco-caption through pycocoevalcap) and attention localisation."""
import math

import numpy as np
import pytest
import torch

from zoo.metrics import METRIC_NAMES, attention_localization, localization_stats, score_captions
from zoo.metrics import captions as C

REFERENCES = {
    0: ["A red shirt left of a blue bag.", "a blue bag right of a red shirt", "a red shirt and a blue bag"],
    1: ["a green sneaker", "there is a green sneaker", "a green sneaker on a black background"],
    2: ["a white coat above a yellow sandal", "a yellow sandal below a white coat"],
    3: ["a pair of cyan trousers", "there is a pair of cyan trousers"],
    4: ["an orange dress left of a purple bag", "a purple bag with an orange dress left of it"],
}
PERFECT = {i: refs[0] for i, refs in REFERENCES.items()}
WRONG = {0: "a dog runs on grass", 1: "two cats sleep", 2: "a man rides a horse", 3: "the sky is blue",
         4: "people at a table"}

# The Java scorers run in a JVM of their own (seconds to start, METEOR to load its tables): `slow`.
def needs_java(test):
    return pytest.mark.slow(pytest.mark.skipif(not C.java_available(), reason="coco-caption metrics need Java")(test))


@pytest.fixture(scope="module")
def perfect_scores():
    # one METEOR JVM serves the whole module (it takes seconds to load its paraphrase table)
    return score_captions(PERFECT, REFERENCES)


@needs_java
def test_perfect_predictions_score_high(perfect_scores):
    s = perfect_scores
    assert set(METRIC_NAMES) <= set(s) and s["num_images"] == 5 and s["notes"] == {}
    for n in (1, 2, 3, 4):
        assert s[f"Bleu_{n}"] == pytest.approx(1.0, abs=1e-6)
    assert s["METEOR"] == pytest.approx(1.0, abs=1e-6)
    assert s["ROUGE_L"] == pytest.approx(1.0)
    assert s["CIDEr"] > 2.0


@needs_java
def test_wrong_predictions_score_low(perfect_scores):
    s = score_captions(WRONG, REFERENCES)
    assert s["Bleu_4"] < 0.01 and s["CIDEr"] < 0.1 and s["ROUGE_L"] < 0.3
    assert s["METEOR"] is not None and s["METEOR"] < 0.2
    partial = score_captions({**WRONG, 1: "a green sneaker", 3: "a pair of cyan trousers"}, REFERENCES, meteor=False)
    assert s["CIDEr"] < partial["CIDEr"] < perfect_scores["CIDEr"]
    assert s["Bleu_1"] < partial["Bleu_1"] < 1.0
    assert partial["METEOR"] is None and "not requested" in partial["notes"]["METEOR"]


@needs_java
def test_tokenisation_matches_coco_caption():
    # case and punctuation do not matter: the PTB tokenizer treats both sides alike
    s = score_captions({0: "A RED SHIRT, LEFT OF A BLUE BAG!"}, {0: ["a red shirt left of a blue bag"]}, meteor=False)
    assert s["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    # an empty caption is scored (zero), not an error
    s = score_captions({0: "", 1: "a green sneaker"}, {0: REFERENCES[0], 1: REFERENCES[1]}, meteor=False)
    assert 0 < s["Bleu_1"] < 1


@needs_java
def test_whole_split_in_one_call(monkeypatch):
    """One tokenizer pass and one CIDEr call over every image: CIDEr's IDF is over the split."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    calls = {"tok": 0, "cider": []}
    tokenize, cider = PTBTokenizer.tokenize, Cider.compute_score

    def count_tok(self, captions):
        calls["tok"] += 1
        return tokenize(self, captions)

    def count_cider(self, gts, res):
        calls["cider"].append(set(gts))
        return cider(self, gts, res)

    monkeypatch.setattr(PTBTokenizer, "tokenize", count_tok)
    monkeypatch.setattr(Cider, "compute_score", count_cider)
    mixed = {**WRONG, 1: "a green sneaker", 3: "a pair of cyan trousers"}
    whole = score_captions(mixed, REFERENCES, meteor=False)
    assert calls["tok"] == 1 and calls["cider"] == [set(REFERENCES)]
    # scoring in chunks gives other numbers, which is why eval scores a split at once
    chunks = [score_captions({i: mixed[i] for i in ids}, {i: REFERENCES[i] for i in ids}, meteor=False)["CIDEr"]
              for ids in ([0, 1, 2], [3, 4])]
    assert not math.isclose(whole["CIDEr"], (3 * chunks[0] + 2 * chunks[1]) / 5, rel_tol=1e-3)


def test_mismatched_ids_are_rejected():
    with pytest.raises(ValueError, match="same images"):
        score_captions({0: "a"}, {0: ["a"], 1: ["b"]})
    with pytest.raises(ValueError, match="no reference"):
        score_captions({0: "a"}, {0: []})
    with pytest.raises(ValueError, match="no captions"):
        score_captions({}, {})


def test_missing_java_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="need Java"):
        score_captions({0: "a b"}, {0: ["a b"]})


@needs_java
def test_failed_meteor_and_spice_are_reported_not_faked(monkeypatch):
    def broken(gts, res):
        raise OSError("jvm died")

    monkeypatch.setattr(C, "_meteor_score", broken)
    monkeypatch.setattr(C, "_spice_jar_ready", lambda: (False, "SPICE skipped: no CoreNLP jars"))
    s = score_captions({0: "a b c d"}, {0: ["a b c d"]}, spice=True)
    assert s["METEOR"] is None and "jvm died" in s["notes"]["METEOR"]
    assert s["SPICE"] is None and "skipped" in s["notes"]["SPICE"]
    assert s["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------- localisation
def one_hot(cells, n=4):
    """Attention maps [T, n] with all weight on the given cells."""
    a = torch.zeros(len(cells), n)
    a[torch.arange(len(cells)), torch.tensor(cells)] = 1.0
    return a


def test_localization_hand_made():
    # 2x2 grid over a 64x64 image: cell centres (16, 16), (48, 16), (16, 48), (48, 48)
    boxes = [torch.tensor([[0.0, 0.0, 30.0, 30.0], [34.0, 34.0, 64.0, 64.0]])]
    box_words = [["shirt", "bag"]]
    words = [["a", "red", "shirt", "left", "of", "a", "blue", "bag"]]
    right = one_hot([1, 1, 0, 1, 1, 1, 1, 3])  # "shirt" -> top-left, "bag" -> bottom-right
    assert attention_localization([right], (2, 2), boxes, box_words, words, 64) == 1.0
    wrong = one_hot([0, 0, 3, 0, 0, 0, 0, 0])  # looks at the bag when saying shirt, and vice versa
    assert attention_localization([wrong], (2, 2), boxes, box_words, words, 64) == 0.0
    half = one_hot([0, 0, 0, 0, 0, 0, 0, 1])  # shirt right, bag at an empty corner
    stats = localization_stats([half], (2, 2), boxes, box_words, words, (64, 64))
    assert stats == {"localization": 0.5, "hits": 1, "scored": 2, "absent": 0,
                     "attention_mass_in_box": 0.5, "box_area": 0.25,
                     "localization_previous_word": 0.5, "previous_hits": 1, "previous_scored": 2}
    # mass in box is soft credit: a map spread evenly puts the box's share of cells inside
    uniform = torch.full((8, 4), 0.25)
    stats = localization_stats([uniform], (2, 2), boxes, box_words, words, 64)
    assert stats["attention_mass_in_box"] == pytest.approx(stats["box_area"]) == pytest.approx(0.25)
    # looking at each item one word early ("red" -> shirt, "blue" -> bag) and elsewhere after
    early = one_hot([1, 0, 1, 1, 1, 1, 3, 0])
    stats = localization_stats([early], (2, 2), boxes, box_words, words, 64)
    assert stats["localization"] == 0.0 and stats["localization_previous_word"] == 1.0
    # extra rows (the <end> step) are ignored; [T, h, w] maps and numpy work too
    extra = torch.cat([right, one_hot([2])]).reshape(-1, 2, 2).numpy()
    assert attention_localization([extra], [(2, 2)], boxes, box_words, words, 64) == 1.0


def test_localization_peak_maps_to_cell_centre_in_pixels():
    # a 4x4 grid over a 32x64 (H x W) image: cell (r=1, c=2) has its centre at x=40, y=12
    alpha = torch.zeros(1, 16)
    alpha[0, 1 * 4 + 2] = 1.0
    inside = [torch.tensor([[36.0, 8.0, 44.0, 16.0]])]
    just_off = [torch.tensor([[40.5, 8.0, 44.0, 16.0]])]
    assert attention_localization([alpha], (4, 4), inside, [["bag"]], [["bag"]], (32, 64)) == 1.0
    assert attention_localization([alpha], (4, 4), just_off, [["bag"]], [["bag"]], (32, 64)) == 0.0


def test_localization_repeated_and_absent_items():
    # two shirts: a word "shirt" counts when the peak is on either shirt
    boxes = [np.array([[0, 0, 30, 30], [34, 34, 64, 64], [34, 0, 64, 30]], dtype=np.float32)]
    box_words = [["shirt", "shirt", "bag"]]
    words = [["shirt", "shirt", "bag", "coat"]]
    alphas = [one_hot([0, 3, 2, 1])]  # shirt at top-left, shirt at bottom-right, bag at bottom-left (miss)
    stats = localization_stats(alphas, (2, 2), boxes, box_words, words, 64, item_words={"shirt", "bag", "coat"})
    # "coat" is not in the image: no box to look at, counted apart
    assert stats == {"localization": 2 / 3, "hits": 2, "scored": 3, "absent": 1,
                     # mass: 1, 1, 0 inside the named boxes; area: either shirt (2 of 4 cells) twice, the bag 1
                     "attention_mass_in_box": pytest.approx(2 / 3), "box_area": pytest.approx((0.5 + 0.5 + 0.25) / 3),
                     "localization_previous_word": 0.5, "previous_hits": 1, "previous_scored": 2}
    # by default the item words are those naming some box in the set: "coat" is then just a word
    assert localization_stats(alphas, (2, 2), boxes, box_words, words, 64)["absent"] == 0
    # several images pool their words; no item word at all gives nan
    two = localization_stats(alphas * 2, (2, 2), boxes * 2, box_words * 2, words * 2, 64)
    assert two["scored"] == 6 and two["hits"] == 4
    assert math.isnan(attention_localization([one_hot([0])], (2, 2), boxes, box_words, [["a"]], 64))
    with pytest.raises(ValueError):
        attention_localization([one_hot([0])], (2, 2), boxes, box_words, [["shirt", "bag"]], 64)
