"""Issue 45, "say when not to trust it": `zoo caption` flags a caption whose attention is near uniform
on most words or whose score is far below the test split's (thresholds calibrated on the release's
test split, zoo/metrics/caption_trust.json); `zoo attend --boxes` scores a caption's item words as
the localisation metric does; one spread unit, exp(H)/N, in every figure and JSON; pointing is
"n/a" where the item fills the input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO, load_script
from zoo.attention.record import maps_from_cells
from zoo.commands.cli import main
from zoo.metrics.trust import THRESHOLDS, caption_stats, distrust, load_thresholds, spread


# ----------------------------------------------------------------------------- the unit
def test_spread_is_one_for_uniform_one_over_n_for_a_cell_and_the_same_at_any_resolution():
    cells = torch.rand(5, 8, 8, generator=torch.Generator().manual_seed(0)) ** 4
    cells /= cells.sum((1, 2), keepdim=True)
    p = cells.flatten(1).double()
    assert torch.allclose(spread(cells).double(), (-(p * p.log()).sum(1)).exp() / 64, atol=1e-6)
    uniform, one = torch.full((8, 8), 1 / 64), torch.zeros(8, 8)
    one[2, 3] = 1.0
    assert spread(uniform).item() == pytest.approx(1.0) and spread(one).item() == pytest.approx(1 / 64)
    # zoo attend's pixel maps of a captioner spread each cell over its pixels: the same number
    assert torch.allclose(spread(maps_from_cells(cells, (64, 64))), spread(cells), atol=1e-5)
    assert torch.isnan(spread(torch.zeros(1, 4, 4))).all()  # a degenerate map has no spread


def test_distrust_names_each_reason_against_the_thresholds():
    thresholds = {"median_spread_max": 0.9, "score_per_word_min": -0.5, "percentile_high": 99.0}
    flat = torch.full((4, 8, 8), 1 / 64)
    peaked = torch.zeros(4, 8, 8)
    peaked[:, 1, 1] = 1.0
    words = ["a", "red", "bag", "here"]
    assert distrust(caption_stats({"words": words, "alpha": peaked, "score": -1.0}), thresholds) == []
    (reason,) = distrust(caption_stats({"words": words, "alpha": flat, "score": -1.0}), thresholds)
    assert "near uniform on most words" in reason and "1.00 > 0.90" in reason
    (reason,) = distrust(caption_stats({"words": words, "alpha": peaked, "score": -5.0}), thresholds)
    assert "log-probability per word -1.00 < -0.50" in reason  # -5 over 4 words and the end token


def test_the_release_calibration_states_its_provenance():
    calibration = load_thresholds("sat_soft_scenes")
    provenance = calibration["provenance"]
    assert provenance["split"] == "test" and provenance["n"] >= 200 and len(provenance["commit"]) == 40
    p = calibration["percentile_high"]
    assert calibration["median_spread_max"] == provenance["median_spread_percentiles"][f"{p:g}"]
    assert calibration["score_per_word_min"] == provenance["score_per_word_percentiles"][f"{100 - p:g}"]
    assert load_thresholds("no_such_release") is None and THRESHOLDS.name in THRESHOLDS.as_posix()


# ----------------------------------------------------------------------------- zoo caption / attend
@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Three FashionScenes test scenes of Fashion-MNIST's items (a scene export: PNGs and
    references.json; the model captions synthetic items as items they are not) and a flat grey
    photo, far outside the scenes."""
    from test_scenes import make_dm

    folder = tmp_path_factory.mktemp("scenes")
    paths = make_dm(folder / "cache", item_loader=None, num_test=3).export_pngs("test", folder, 3)
    grey = folder / "grey.png"
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(grey)
    return paths, grey


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out, captured.err


def test_an_out_of_domain_caption_gets_one_line_and_a_json_field(scenes, capsys):
    paths, grey = scenes
    out, err = _run(["caption", str(grey), "--json"], capsys)
    (record,) = json.loads(out)["results"]
    lines = [line for line in err.splitlines() if "do not trust" in line]
    assert len(lines) == 1 and lines[0].startswith(f"zoo caption: {grey}: do not trust this caption: ")
    trust = record["trust"]
    assert trust["trusted"] is False and trust["reasons"] and trust["calibration"]["split"] == "test"
    assert trust["median_spread"] > load_thresholds("sat_soft_scenes")["median_spread_max"]
    assert record["spread"] == pytest.approx(spread(torch.tensor(record["alpha"])).tolist(), abs=1e-3)
    assert "exp(H) / N" in record["spread_unit"]


def test_the_overlay_of_a_caption_not_to_trust_says_so(scenes, tmp_path, capsys, monkeypatch):
    import zoo.viz.record as pictures

    seen, real = [], pictures.caption_figure
    monkeypatch.setattr(pictures, "caption_figure",
                        lambda image, result, **kw: seen.append(kw.get("warnings")) or real(image, result, **kw))
    paths, grey = scenes
    _run(["caption", str(grey), str(paths[0]), "--attention-dir", str(tmp_path / "maps")], capsys)
    assert seen[0][:2] == ["do not trust this caption:", "attention is near uniform on most words"] and seen[1] == []
    result = {"words": ["a", "bag"], "alpha": torch.full((2, 8, 8), 1 / 64), "beta": torch.ones(2)}
    plain, warned = real(torch.zeros(3, 64, 64), result), real(torch.zeros(3, 64, 64), result, warnings=["x", "y", "z"])
    assert warned.height > plain.height  # under the input, more lines than under any panel


def test_a_checkpoint_without_calibration_is_not_judged(scenes, capsys, monkeypatch):
    import zoo.metrics.trust as trust

    monkeypatch.setattr(trust, "THRESHOLDS", REPO / "no_such_calibration.json")
    _, grey = scenes
    out, err = _run(["caption", str(grey), "--json"], capsys)
    (record,) = json.loads(out)["results"]
    assert record["trust"]["trusted"] is None and "no calibration" in record["trust"]["reasons"][0]
    assert "do not trust" not in err


def test_attend_boxes_scores_a_captions_item_words_as_the_localisation_metric_does(scenes, capsys):
    """Each item word on the boxes its box_words name (the metric behind the documented pointing,
    `zoo.metrics.attention.scored_steps`); "a", "is", "the" are listed apart, never scored; a caption
    and its `zoo attend` record give every word the same spread."""
    import zoo
    from zoo.metrics.attention import pointing_game, scored_steps

    paths, _ = scenes
    folder = paths[0].parent
    references = json.loads((folder / "references.json").read_text())
    out, err = _run(["attend", "--model", "sat_soft_scenes", *map(str, paths), "--out", str(folder / "out"),
                     "--boxes", str(folder / "references.json"), "--json", "--overwrite"], capsys)
    records = json.loads(out)
    model = zoo.create_model("sat_soft_scenes", pretrained=True)
    images = torch.stack([zoo.preprocessing(model)(Image.open(p)) for p in paths])
    record = model.attention_record(images)
    words = [references[p.name]["box_words"] for p in paths]
    width = max(map(len, words))
    boxes = torch.tensor([references[p.name]["boxes"] + [[-1] * 4] * (width - len(references[p.name]["boxes"]))
                          for p in paths], dtype=torch.float32)
    padded = [w + [""] * (width - len(w)) for w in words]
    idx, t, targets, _ = scored_steps(record, boxes, padded)
    expected = {(int(i), int(s)): bool(h) for i, s, h in zip(idx, t, pointing_game(record.maps[idx, t], targets))}
    seen = {(i, k): step["pointing"] for i, r in enumerate(records) for k, step in enumerate(r["steps"])
            if step["pointing"] is not None}
    assert seen == expected and seen  # the same words scored, with the same hits
    for r in records:
        assert all(step["label"] in r["item_words"]["item"] for step in r["steps"] if step["pointing"] is not None)
        assert {"a", "the"} & set(r["item_words"]["other"]) or len(r["steps"]) < 4
    hits = sum(seen.values()) / len(seen)
    assert f"{len(seen)} item word(s): pointing {100 * hits:.1f}% of them" in err
    assert "not scored:" in err and "other words (" in err
    out, err = _run(["caption", *map(str, paths), "--json"], capsys)
    assert "do not trust" not in err  # test scenes: inside the calibration's range
    for caption, r in zip(json.loads(out)["results"], records):
        assert caption["trust"]["trusted"] is True
        assert caption["words"] == [step["label"] for step in r["steps"]]
        assert caption["spread"] == pytest.approx([step["spread"] for step in r["steps"]], abs=2e-3)


def test_item_steps_score_item_words_on_their_own_boxes_and_list_the_rest():
    from zoo.commands.boxes import item_steps

    boxes = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    labels = ["a", "red", "bag", "and", "a", "shirt", "dress"]
    vocab = {"bag", "shirt", "dress"}
    targets, kinds = item_steps(labels, boxes, ["shirt", "bag"], vocab)
    assert kinds == ["other", "other", "item", "other", "other", "item", "absent"]
    assert targets[2].tolist() == [[-1.0] * 4, [20.0, 20, 30, 30]] and targets[5].tolist() == [[0.0, 0, 10, 10], [-1.0] * 4]
    assert all(targets[k] is None for k in (0, 1, 3, 4, 6))
    targets, kinds = item_steps(labels, boxes, None, vocab)  # no box_words: every box of the image
    assert kinds == ["other", "other", "item", "other", "other", "item", "item"] and torch.equal(targets[6], boxes)


def test_box_words_that_do_not_match_the_boxes_are_one_line_exit_2(scenes, tmp_path, capsys):
    paths, _ = scenes
    bad = tmp_path / "boxes.json"
    bad.write_text(json.dumps({paths[0].name: {"boxes": [[1, 1, 9, 9]], "box_words": ["bag", "shirt"]}}))
    code = main(["attend", "--model", "sat_soft_scenes", str(paths[0]), "--out", str(tmp_path / "o"),
                 "--boxes", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and '"box_words" must be one word per box (1)' in err


# ----------------------------------------------------------------------------- pointing where the item fills the input
def test_pointing_where_the_item_fills_the_input_is_not_a_number():
    from zoo.commands.info import FILLS_INPUT, attention_line

    tables = load_script("scripts/results_tables.py", "results_tables_h45")
    paths = ["trained.correctness.pointing", "trained.correctness.pointing_centre"]
    full = {"trained": {"correctness": {"pointing": 1.0, "pointing_uniform": 1.0, "pointing_centre": 1.0}}}
    part = {"trained": {"correctness": {"pointing": 0.5, "pointing_uniform": 0.2, "pointing_centre": 0.7}}}
    assert tables.values_cell(full, paths, scale=100, digits=1) == FILLS_INPUT
    assert tables.values_cell(part, paths, scale=100, digits=1) == "50.0 (70.0)"
    line = attention_line({"pointing": 1.0, "pointing_uniform": 1.0, "pointing_centre": 1.0, "deletion_gap": 0.2})
    assert line.startswith(f"pointing {FILLS_INPUT}; deletion gap +0.200") and "100.0%" not in line
    assert attention_line(part["trained"]["correctness"]).startswith("pointing 50.0% (uniform 20.0%")
