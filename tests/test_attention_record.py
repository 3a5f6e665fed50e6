"""The attention record's coordinates against hand-built cases, and the attention metrics on
synthetic maps whose answers are known."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo import registry
from zoo.attention import filterbank as fb, record
from zoo.attention.glimpse import Retina
from zoo.guards.errors import UserError
from zoo.metrics import attention as am
from zoo.models.card import families

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- pixel maps
def test_one_hot_cell_map_lands_on_its_cell_pixels():
    cells = torch.zeros(1, 1, 4, 4)
    cells[0, 0, 1, 2] = 1.0  # row 1, column 2 of a 4 x 4 grid over 8 x 8 pixels
    maps = record.maps_from_cells(cells, (8, 8))
    expected = torch.zeros(8, 8)
    expected[2:4, 4:6] = 0.25
    assert torch.allclose(maps[0, 0], expected)


def test_cell_maps_keep_their_mass_on_uneven_grids():
    torch.manual_seed(0)
    cells = torch.rand(2, 3, 3, 5).softmax(-1)
    maps = record.maps_from_cells(cells, (10, 11))
    assert torch.allclose(maps.sum((-2, -1)), cells.sum((-2, -1)), atol=1e-6)
    # slow reference: pixel (y, x) takes the cell holding its centre, divided by that cell's pixel count
    H, W, h, w = 10, 11, 3, 5
    owner = [[(int((y + 0.5) * h / H), int((x + 0.5) * w / W)) for x in range(W)] for y in range(H)]
    counts = {}
    for row in owner:
        for cell in row:
            counts[cell] = counts.get(cell, 0) + 1
    for y in range(H):
        for x in range(W):
            r, c = owner[y][x]
            assert torch.allclose(maps[1, 2, y, x], cells[1, 2, r, c] / counts[(r, c)])


def test_glimpse_at_a_known_place_lands_on_the_known_pixels():
    retina = Retina(patch_size=12, num_scales=2)
    centre = torch.tensor([[0.0, 0.0]])  # the centre of a 60 x 60 image
    boxes = retina.boxes(centre, 60, 60)  # [1, 2, 4]
    assert boxes[0, 0].tolist() == [24.0, 24.0, 36.0, 36.0]
    assert boxes[0, 1].tolist() == [18.0, 18.0, 42.0, 42.0]
    maps = record.maps_from_boxes(boxes[None], (60, 60))[0, 0]  # one step, two scales
    assert torch.allclose(maps.sum(), torch.tensor(1.0))
    # half the mass evenly on the 12 x 12 box, half on the 24 x 24 box: the fine box is denser
    assert torch.allclose(maps[30, 30], torch.tensor(0.5 / 144 + 0.5 / 576))
    assert torch.allclose(maps[20, 20], torch.tensor(0.5 / 576))
    assert maps[17, 17] == 0 and maps[42, 42] == 0 and maps[41, 41] > 0


def test_glimpse_partly_outside_the_image_spreads_over_the_pixels_inside():
    boxes = torch.tensor([[[[-6.0, -6.0, 6.0, 6.0]]]])  # a 12-pixel glimpse at the top-left corner
    maps = record.maps_from_boxes(boxes, (28, 28))[0, 0]
    assert torch.allclose(maps[:6, :6], torch.full((6, 6), 1 / 36))
    assert maps[6:].sum() == 0 and maps[:, 6:].sum() == 0


def test_draw_window_map_and_box_sit_where_the_filters_read():
    # one filter (N = 1) centred on the paper's 1-based pixel (gX, gY) = (10, 20): 0-based (9, 19)
    params = fb.FilterParams(gx=torch.tensor([10.0]), gy=torch.tensor([20.0]), sigma2=torch.tensor([0.01]),
                             delta=torch.tensor([3.0]), gamma=torch.tensor([1.0]))
    fx, fy = fb.filterbank(params, 1, 30, 30)
    maps = record.maps_from_filters(fx, fy)[0]
    assert torch.allclose(maps.sum(), torch.tensor(1.0))
    assert maps.argmax().item() == 19 * 30 + 9 and maps[19, 9] > 0.99
    box = record.window_boxes(params.gx, params.gy, params.delta, 1)[0]
    assert box.tolist() == [8.0, 18.0, 11.0, 21.0]  # 1 x delta wide around the pixel centre (9.5, 19.5)


def test_record_validates_shapes_and_serialises_with_named_axes():
    maps = record.maps_from_cells(torch.full((2, 3, 2, 2), 0.25), (4, 4))
    rec = record.AttentionRecord(family="x", kind="soft", maps=maps, labels=[["a", "b", ""], ["c", "d", "e"]],
                                 step_mask=torch.tensor([[True, True, False], [True, True, True]]),
                                 prediction={"words": [["a", "b"], ["c", "d", "e"]]})
    data = json.loads(rec.to_json())
    assert data["axes"]["maps"] == "[image, step, y, x]" and "x is the column" in data["axes"]["coordinates"]
    assert [len(image["steps"]) for image in data["images"]] == [2, 3]
    assert data["images"][1]["prediction"]["words"] == ["c", "d", "e"]
    assert rec.to("cpu").maps.shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="step_mask"):
        record.AttentionRecord(family="x", kind="soft", maps=maps, labels=[], step_mask=torch.ones(2, 2, dtype=torch.bool))


def test_all_zero_and_nan_maps_are_reported_degenerate():
    maps = torch.full((1, 3, 4, 4), 1 / 16)
    maps[0, 1] = 0
    maps[0, 2, 0, 0] = float("nan")
    rec = record.AttentionRecord(family="x", kind="soft", maps=maps, labels=[["a", "b", "c"]],
                                 step_mask=torch.ones(1, 3, dtype=torch.bool))
    assert rec.degenerate().tolist() == [[False, True, True]]
    assert [step["degenerate"] for step in rec.as_dict()["images"][0]["steps"]] == [False, True, True]


# ----------------------------------------------------------------------------- metrics
BOX = torch.tensor([[4.0, 2.0, 8.0, 6.0]])  # x0, y0, x1, y1 on a 10 x 10 image: 16 pixels


def test_a_map_inside_the_box_scores_one_and_a_uniform_map_the_box_area():
    inside = torch.zeros(1, 10, 10)
    inside[0, 2:6, 4:8] = 1 / 16
    assert am.pointing_game(inside, BOX).tolist() == [True]
    assert am.mass_in_box(inside, BOX).item() == pytest.approx(1.0)
    uniform = torch.full((1, 10, 10), 0.01)
    assert am.mass_in_box(uniform, BOX).item() == pytest.approx(0.16)
    assert am.box_area(BOX, (10, 10)).item() == pytest.approx(0.16)
    outside = torch.zeros(1, 10, 10)
    outside[0, 9, 9] = 1.0
    assert am.pointing_game(outside, BOX).tolist() == [False]
    assert am.mass_in_box(outside, BOX).item() == 0.0
    assert am.pointing_game(torch.zeros(1, 10, 10), BOX).tolist() == [False]  # no peak, no hit


def test_mass_counts_pixels_not_cells():
    """A coarse cell that straddles the box puts only its inside pixels' share inside."""
    cells = torch.zeros(1, 1, 2, 2)
    cells[0, 0, 0, 0] = 1.0  # the top-left 5 x 5 quadrant of a 10 x 10 image
    maps = record.maps_from_cells(cells, (10, 10))[:, 0]
    box = torch.tensor([[0.0, 0.0, 5.0, 2.0]])  # the quadrant's top two rows
    assert am.mass_in_box(maps, box).item() == pytest.approx(10 / 25)


def test_box_overlap_and_chance_levels():
    a = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    assert am.box_iou(a, torch.tensor([[2.0, 2.0, 6.0, 6.0]])).item() == pytest.approx(4 / 28)
    assert am.centre_in_box(a, torch.tensor([[1.0, 1.0, 3.0, 3.0]])).tolist() == [True]
    maps = torch.zeros(1, 10, 10)
    maps[0, 3, 5] = 1
    out = am.correctness(maps, BOX, windows=torch.tensor([[[4.0, 2.0, 8.0, 6.0], [0.0, 0.0, 2.0, 2.0]]]),
                         window_names=["read", "write"])
    assert out["pointing"] == 1.0 and out["mass_in_box"] == 1.0
    assert out["read_iou"] == pytest.approx(1.0) and out["read_centre_in_box"] == 1.0
    assert out["write_iou"] == 0.0 and out["write_centre_in_box"] == 0.0
    assert out["pointing_uniform"] == pytest.approx(0.16) and out["mass_in_box_uniform"] == pytest.approx(0.16)
    assert 0 <= out["read_iou_random"] < 1 and out["pointing_centre"] in (0.0, 1.0)
    # any of several targets counts; an empty slot (-1s) never does
    two = torch.tensor([[[-1.0, -1.0, -1.0, -1.0], [4.0, 2.0, 8.0, 6.0]]])
    assert am.correctness(maps, two, windows=torch.tensor([[[4.0, 2.0, 8.0, 6.0]]]))["window_1_iou"] == pytest.approx(1.0)


def test_bootstrap_interval_equals_a_slow_reference_over_items():
    """Items are resampled with replacement, all their entries with them (a caption's words go
    together); the interval is the 2.5 and 97.5 percentiles of the resampled means."""
    torch.manual_seed(0)
    groups = torch.tensor([0, 0, 0, 1, 2, 2, 3, 4, 4, 4, 4])
    values = {"hit": torch.rand(11).round(), "mass": torch.rand(11)}
    got = am.bootstrap_ci(values, groups, resamples=200, seed=3)
    generator = torch.Generator().manual_seed(3)
    drawn = torch.randint(5, (200, 5), generator=generator)
    for name, value in values.items():
        means = []
        for draw in drawn.tolist():
            entries = [float(value[n]) for item in draw for n in range(11) if int(groups[n]) == item]
            means.append(sum(entries) / len(entries))
        low, high = torch.quantile(torch.tensor(means, dtype=torch.float64), torch.tensor([0.025, 0.975], dtype=torch.float64))
        assert got[name] == pytest.approx([float(low), float(high)], rel=1e-9)
    # a constant has no spread; many copies of one entry per item are still one item
    assert am.bootstrap_ci({"c": torch.full((11,), 0.3)}, groups)["c"] == pytest.approx([0.3, 0.3])
    one = am.bootstrap_ci({"v": torch.arange(5.0)}, torch.arange(5), seed=1)["v"]
    repeated = am.bootstrap_ci({"v": torch.arange(5.0).repeat_interleave(7)}, torch.arange(5).repeat_interleave(7), seed=1)["v"]
    assert repeated == pytest.approx(one)


def test_correctness_intervals_hold_the_estimate_and_the_paired_differences():
    torch.manual_seed(1)
    maps = torch.rand(40, 10, 10)
    boxes = torch.tensor([[2.0, 2.0, 7.0, 7.0]]).expand(40, 4)
    out = am.correctness(maps, boxes, groups=torch.arange(40) // 2)
    for name in ("pointing", "mass_in_box", "pointing_minus_centre", "mass_in_box_minus_uniform"):
        low, high = out["ci95"][name]
        assert low <= out[name] <= high
    assert out["pointing_minus_centre"] == pytest.approx(out["pointing"] - out["pointing_centre"], abs=1e-6)
    assert "ci95" not in am.correctness(maps, boxes)  # no items, no intervals


def test_deletion_curve_equals_a_slow_reference():
    torch.manual_seed(0)
    images = torch.rand(3, 1, 4, 4)
    maps = torch.rand(3, 4, 4)
    weights = torch.rand(16)
    score = lambda x: (x.flatten(1) * weights).sum(1)
    order = am.order_by(maps)
    fast = am.curve(score, images, order, steps=4, background=0.5)
    for n in range(3):
        ranked = sorted(range(16), key=lambda p: -float(maps[n].flatten()[p]))
        for k in range(5):
            x = images[n].flatten().clone()
            x[ranked[:round(k * 16 / 4)]] = 0.5
            assert torch.allclose(fast[k, n], (x * weights).sum())
    inserted = am.curve(score, images, order, steps=4, background=0.5, insertion=True)
    assert torch.allclose(inserted[0], score(torch.full_like(images, 0.5)))
    assert torch.allclose(inserted[-1], score(images))


def test_faithfulness_prefers_the_map_the_score_uses():
    """A score that reads only the box's pixels: the map on the box deletes the score first."""
    torch.manual_seed(0)
    images = torch.rand(8, 1, 10, 10) + 0.5
    mask = torch.zeros(10, 10)
    mask[2:6, 4:8] = 1
    score = lambda x: (x[:, 0] * mask).flatten(1).sum(1) / 16
    faithful = am.faithfulness_rows(score, images, mask.expand(8, 10, 10) / 16, steps=10)
    unfaithful = am.faithfulness_rows(score, images, (1 - mask).expand(8, 10, 10), steps=10)
    faithful, unfaithful = ({k: v.mean() for k, v in rows.items()} for rows in (faithful, unfaithful))
    assert faithful["deletion_gap"] > 0.3 and faithful["insertion_gap"] > 0.3
    assert unfaithful["deletion_gap"] < 0 and unfaithful["insertion_gap"] < 0


# ----------------------------------------------------------------------------- every family
#: every registered family whose card names an attention kind (exclusions as data: `card.skip`)
ATTENDING = [name for name, cls in families().items() if cls.card.attention and "attention_record" not in cls.card.skip]


def _tiny(family: str):
    """The family's own tiny configuration (its card's first), seeded, in eval mode."""
    cls = families()[family]
    torch.manual_seed(0)
    return cls(**next(iter(cls.card.tiny.values()))).eval()


def _check_record(rec, spec, kind: str | None = None) -> None:
    if kind is not None:
        assert rec.kind == kind
    assert rec.image_size == spec.size and rec.maps.shape[:2] == rec.step_mask.shape and len(rec.labels) == 2
    sums = rec.maps.flatten(2).sum(-1)[rec.step_mask]
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-4) and not rec.degenerate().any()
    assert rec.boxes is None or rec.boxes.shape[-1] == 4 and len(rec.box_labels) == rec.boxes.shape[2]
    json.loads(rec.to_json(maps=False))


@pytest.mark.parametrize("family", ATTENDING)
def test_every_family_that_attends_gives_one_record(family):
    model = _tiny(family)
    spec = zoo.preprocessing(model)
    images = torch.rand(2, spec.in_chans, *spec.size, generator=torch.Generator().manual_seed(0))
    _check_record(model.attention_record(images), spec, model.card.attention)


@pytest.mark.parametrize("name", [n for n in zoo.list_models(pretrained=True)
                                  if families()[registry.get_entry(n).metadata["family"]].card.attention])
def test_every_release_that_attends_gives_one_record(name):
    model = zoo.create_model(name, pretrained=True).eval()
    spec = zoo.preprocessing(model)
    images = torch.rand(2, spec.in_chans, *spec.size, generator=torch.Generator().manual_seed(0))
    _check_record(model.attention_record(images), spec)


@pytest.mark.parametrize("family", [name for name in ATTENDING if "figures" not in families()[name].card.skip])
def test_training_figures_are_drawn_from_the_attention_record(family):
    """The W&B figures are the record's strips (the panels `zoo attend` writes), one per image,
    captioned with the prediction and, where the batch has class labels, the true class. (A family
    whose figures show more, the DRAW generator's canvases and samples, says so in its card.)"""
    from zoo.viz.record import prediction_text, strip

    model = _tiny(family)
    batch = model.example_batch(3)
    images, labels = (batch["images"], batch.get("labels")) if isinstance(batch, dict) else batch[:2]
    figures = model.attention_figures(batch)
    record = model.attention_record(images[:model.hparams.get("num_figures", 4)])
    assert len(figures) == min(3, model.hparams.get("num_figures", 4))
    names = record.prediction.get("class_names") or []  # without class names: indices
    for b, (caption, figure) in enumerate(figures.items()):
        truth = "" if labels is None else f" / true {names[int(labels[b])] if names else int(labels[b])}"
        assert caption == f"#{b} pred {prediction_text(record, b)}{truth}"
        assert np.array_equal(np.asarray(figure), np.asarray(strip(record, b, images[b])))


def test_a_model_without_attention_has_no_training_figures():
    model = zoo.create_model("baseline_mlp_centered")
    assert model.attention_figures((torch.rand(2, 1, 28, 28), torch.tensor([0, 1]))) == {}


def test_a_family_without_attention_refuses_in_one_line():
    model = zoo.create_model("baseline_mlp_centered")
    with pytest.raises(UserError, match="has no attention to record"):
        model.attention_record(torch.rand(1, 1, 28, 28))


# ----------------------------------------------------------------------------- sanity (Adebayo et al. 2018)
def test_randomised_weights_collapse_faithfulness_to_chance():
    """A released RAM's glimpses are faithful (deleting where it looked hurts its prediction more
    than deleting random pixels); with its weights re-initialised the same measure is at chance."""
    import sys

    from zoo import registry

    sys.path.insert(0, str(REPO / "scripts"))
    from attention_results import randomise

    model = zoo.create_model("ram_fmnist_cluttered60", pretrained=True).eval()
    examples = registry.build_datamodule(model).boxed_examples("test", 48)
    trained = am.evaluate(model, examples)["faithfulness"]
    random = am.evaluate(randomise(zoo.create_model("ram_fmnist_cluttered60", pretrained=True).eval(), 0),
                         examples)["faithfulness"]
    assert trained["deletion_gap"] > 0.1
    assert abs(random["deletion_gap"]) < 0.02 and abs(random["insertion_gap"]) < 0.02
    low, high = trained["ci95"]["deletion_gap"]  # over the 48 canvases
    assert 0 < low <= trained["deletion_gap"] <= high


def test_a_results_run_s_seeds_are_summarised_with_their_spread_and_intervals(tmp_path):
    """attention_results --summarise: each headline number's mean, std over seeds, per-seed values
    and per-seed intervals, from the seeds of the same recipe and training arguments only."""
    import statistics
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    from attention_results import summarise_seeds

    def seed_json(seed, pointing, recipe="configs/sat/x.yaml"):
        record = {"recipe": recipe, "train_args": [], "examples": 500, "split": "test", "trained": {
            "correctness": {"pointing": pointing, "ci95": {"pointing": [pointing - 0.03, pointing + 0.03]}},
            "faithfulness": {"deletion_gap": 0.1 * seed, "ci95": {"deletion_gap": [0.0, 0.2]}},
            "hallucination": {"chair_i": float("nan")}}}
        (tmp_path / f"attention_x_seed{seed}.json").write_text(json.dumps(record))

    for seed, pointing in enumerate([0.7, 0.74, 0.72]):
        seed_json(seed, pointing)
    seed_json(3, 0.1, recipe="configs/sat/other.yaml")  # an older recipe under the same name: left out
    (tmp_path / "x.json").write_text(json.dumps({"recipe": "configs/sat/x.yaml", "train_args": []}))  # the results run
    summary = json.loads(summarise_seeds("x", tmp_path).read_text())
    assert summary["seeds"] == [0, 1, 2]
    pointing = summary["metrics"]["pointing"]
    assert pointing["per_seed"] == [0.7, 0.74, 0.72] and pointing["mean"] == pytest.approx(0.72)
    assert pointing["std"] == pytest.approx(statistics.stdev([0.7, 0.74, 0.72]))
    assert pointing["per_seed_ci95"][1] == pytest.approx([0.71, 0.77])
    assert summary["metrics"]["deletion_gap"]["per_seed"] == pytest.approx([0.0, 0.1, 0.2])
    assert "chair_i" not in summary["metrics"]  # not a number on every seed: no summary


def test_seeds_follow_the_results_run_and_never_overwrite_a_release_s_own_record(tmp_path):
    """A seed that results_run left out of its summary (its recipe then was another) is left out of
    the attention summary too; a results run named like a release (release.py --remake) is
    summarised beside the release's own attention_<name>.json, which keeps its randomised control."""
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    from attention_results import summarise_seeds

    release = "sat_soft_scenes"
    for name in ("x", release):
        for seed in (0, 1, 2):
            (tmp_path / f"attention_{name}_seed{seed}.json").write_text(json.dumps(
                {"recipe": "configs/sat/x.yaml", "train_args": [], "trained": {"correctness": {"pointing": 0.5 + seed / 10}}}))
        (tmp_path / f"{name}.json").write_text(json.dumps({"recipe": "configs/sat/x.yaml", "train_args": [], "seeds": [0, 2]}))
    own = {"name": release, "trained": {"correctness": {"pointing": 0.6}}, "randomised": {}}
    (tmp_path / f"attention_{release}.json").write_text(json.dumps(own))
    assert json.loads(summarise_seeds("x", tmp_path).read_text())["metrics"]["pointing"]["per_seed"] == [0.5, 0.7]
    path = summarise_seeds(release, tmp_path)
    assert path.name == f"attention_{release}_seeds.json" and json.loads(path.read_text())["seeds"] == [0, 2]
    assert json.loads((tmp_path / f"attention_{release}.json").read_text()) == own


# ----------------------------------------------------------------------------- zoo attend
@pytest.fixture(scope="module")
def canvases(tmp_path_factory):
    """Three cluttered60 test canvases as PNG files, their target boxes in a --boxes file."""
    import numpy as np
    from PIL import Image

    from zoo import registry

    folder = tmp_path_factory.mktemp("canvases")
    model = zoo.create_model("ram_fmnist_cluttered60", pretrained=True)
    examples = registry.build_datamodule(model).boxed_examples("test", 3)
    paths = []
    for i in range(3):
        path = folder / f"canvas{i}.png"
        Image.fromarray((examples["images"][i, 0].numpy() * 255).round().astype(np.uint8)).save(path)
        paths.append(str(path))
    boxes = folder / "boxes.json"
    boxes.write_text(json.dumps({p: examples["targets"][i].tolist() for i, p in enumerate(paths)}))
    return {"paths": paths, "boxes": str(boxes), "targets": examples["targets"]}


def test_zoo_attend_writes_figures_json_and_scores_known_boxes(canvases, tmp_path, capsys):
    from zoo.commands.cli import main

    out = tmp_path / "out"
    code = main(["attend", "--model", "ram_fmnist_cluttered60", *canvases["paths"], "--out", str(out),
                 "--boxes", canvases["boxes"], "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = json.loads(captured.out)
    assert [Path(r["figure"]).name for r in records] == [f"canvas{i}_attend.png" for i in range(3)]
    assert all(Path(r["figure"]).is_file() for r in records)
    steps = records[0]["steps"]
    assert len(steps) == 8 and set(steps[0]["boxes"]) == {"scale 1", "scale 2", "scale 3"}
    assert all(isinstance(s["pointing"], bool) and 0 <= s["mass_in_box"] <= 1 for s in steps)
    # the step's pointing equals the peak-in-box test done by hand on the printed peak
    x0, y0, x1, y1 = canvases["targets"][0, 0].tolist()
    for s in steps:
        x, y = s["peak"]
        assert s["pointing"] == (x0 <= x < x1 and y0 <= y < y1)


@pytest.mark.parametrize("case, args, message", [
    ("no attention", ["--checkpoint", "BASELINE"], "Classifier (baseline) has no attention to record"),
    ("box outside", ["--model", "ram_fmnist_cluttered60", "--boxes", "OUTSIDE"], "is not inside the 60x60 image"),
    ("html unwritable", ["--model", "ram_fmnist_cluttered60", "--html", "FILE/report.html"], "--html"),
])
def test_zoo_attend_bad_input_is_one_line(canvases, tmp_path, capsys, case, args, message):
    from zoo.commands.cli import main
    from zoo.weights import hub

    baseline = zoo.create_model("baseline_mlp_centered")
    hub.save_release(baseline, baseline.zoo_config(), tmp_path / "baseline.safetensors")
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({canvases["paths"][0]: [[50, 50, 70, 70]]}))
    (tmp_path / "file").write_text("")
    args = [a.replace("OUTSIDE", str(outside)).replace("FILE", str(tmp_path / "file"))
            .replace("BASELINE", str(tmp_path / "baseline.safetensors")) for a in args]
    code = main(["attend", canvases["paths"][0], "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not list(tmp_path.glob("out/*"))  # nothing written


@pytest.mark.slow
def test_html_report_renders_every_step_in_a_real_browser(canvases, tmp_path):
    """The self-contained page in headless Chromium (installed by `make setup`): it loads without
    console errors, every picture decodes, every step of every slider shows, and a screenshot of
    it is not blank."""
    import re
    import shutil
    import subprocess

    import numpy as np
    from PIL import Image

    from zoo.commands.cli import main

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Chromium is missing: `make setup` installs Debian's chromium package"
    report = tmp_path / "report.html"
    assert main(["attend", "--model", "ram_fmnist_cluttered60", *canvases["paths"][:2], "--out",
                 str(tmp_path / "out"), "--boxes", canvases["boxes"], "--html", str(report)]) == 0
    text = report.read_text()
    assert "http://" not in text and "https://" not in text  # nothing fetched from a network
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    dom = subprocess.run([*flags, "--enable-logging=stderr", "--v=0", "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attrs["images"] == attrs["rendered"] == str(2 * (1 + 8))  # an input and 8 glimpses per image
    assert attrs["steps-shown"] == str(2 * 8)
    assert not [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1000,800", report.as_uri()],
                   capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.std() > 10  # text, pictures and overlays, not a blank page


def test_a_plateau_points_at_its_middle():
    """A coarse cell spread over its pixels peaks at the cell's middle, not its top-left pixel; a flat
    map at the image's middle."""
    cells = torch.zeros(1, 1, 2, 2)
    cells[0, 0, 1, 1] = 1.0  # the bottom-right 5 x 5 quadrant of a 10 x 10 image
    maps = record.maps_from_cells(cells, (10, 10))
    rec = record.AttentionRecord(family="x", kind="soft", maps=maps, labels=[["a"]],
                                 step_mask=torch.ones(1, 1, dtype=torch.bool))
    assert rec.peaks()[0, 0].tolist() == [7.5, 7.5]
    assert am.pointing_game(maps[:, 0], torch.tensor([[6.0, 6.0, 9.0, 9.0]])).tolist() == [True]
    flat = torch.full((1, 1, 9, 9), 1 / 81)
    assert record.AttentionRecord(family="x", kind="soft", maps=flat, labels=[["a"]],
                                  step_mask=torch.ones(1, 1, dtype=torch.bool)).peaks()[0, 0].tolist() == [4.5, 4.5]


def test_ram_results_run_seeds_are_scored_one_by_one_and_summarised(tiny_data, tmp_path, monkeypatch, capsys):
    """scripts/attention_results.py --results-run: each seed's best checkpoint (named by its
    results_run JSON) gets its own JSON, and the summary's per-seed values are those files' numbers."""
    import importlib.util

    from zoo.models.ram import RAM
    from zoo.weights import hub

    spec = importlib.util.spec_from_file_location("attention_results_script", REPO / "scripts" / "attention_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()
    data = {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
            "init_args": {"variant": "cluttered60", "val_size": 16, "limit_eval": 16}}
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = RAM(image_size=60, retina=dict(patch_size=12, num_scales=2), num_glimpses=2,
                    network=dict(glimpse_hidden=8, location_hidden=8, glimpse_dim=8, hidden_size=8),
                    remedies=dict(where_layer=True, where_hidden=8, context="conv", context_size=6, context_channels=[2]))
        model._zoo_data_config = data
        checkpoint = tmp_path / f"runs/seed{seed}/best.safetensors"
        checkpoint.parent.mkdir(parents=True)
        hub.save_release(model, model.zoo_config(), checkpoint)
        (tmp_path / f"results/ram_x_seed{seed}.json").write_text(json.dumps(
            {"name": "ram_x", "seed": seed, "checkpoint": f"runs/seed{seed}/best.safetensors",
             "recipe": "configs/ram/x.yaml"}))
    out = str(tmp_path / "results")
    assert script.main(["--results-run", "ram_x", "--seeds", "0", "1", "--n", "6", "--out", out]) == 0
    summary = json.loads((tmp_path / "results/attention_ram_x.json").read_text())
    seeds = [json.loads((tmp_path / f"results/attention_ram_x_seed{s}.json").read_text()) for s in (0, 1)]
    assert [s["recipe"] for s in seeds] == ["configs/ram/x.yaml"] * 2 and seeds[0]["examples"] == 6
    pointing = summary["metrics"]["pointing"]
    assert pointing["per_seed"] == [s["trained"]["correctness"]["pointing"] for s in seeds]
    margins = [s["trained"]["correctness"]["pointing"] - s["trained"]["correctness"]["pointing_centre"] for s in seeds]
    assert summary["metrics"]["pointing_minus_centre"]["per_seed"] == pytest.approx(margins)
    assert summary["metrics"]["per_step_pointing"]["per_seed"] == \
        [[step["pointing"] for step in s["trained"]["per_step"]] for s in seeds]
    assert len(summary["metrics"]["per_step_pointing"]["mean"]) == 2
    capsys.readouterr()
    assert script.main(["--results-run", "ram_y", "--seeds", "0", "--out", out]) == 2
    assert "ram_y_seed0.json: no such results file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- pictures
def _brightness(picture) -> np.ndarray:
    """A panel over a black image is 0.4 x the colour map of its level: its brightness per pixel."""
    return np.asarray(picture, dtype=np.float32).mean(-1)


def test_a_near_uniform_map_looks_near_uniform():
    """An out-of-domain caption's maps (entropy within 1% of ln 64) are drawn dark and flat, a peaked
    map stands out; stretched to its own peak, as figures used to be, the flat map was a pattern."""
    from zoo.viz.common import colormap
    from zoo.viz.record import attention_panels

    flat = 1 + 0.5 * torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0))
    flat /= flat.sum()
    peaked = torch.full((1, 8, 8), 0.2 / 63)
    peaked[0, 3, 4] = 0.8
    assert -(flat * flat.log()).sum() > 0.99 * np.log(64)
    black = torch.zeros(3, 64, 64)
    flat_panel = _brightness(attention_panels(black, flat, ["flat"], size=64)[0][0][0])
    peaked_panel = _brightness(attention_panels(black, peaked, ["peaked"], size=64)[0][0][0])
    stretched = colormap((flat[0] / flat.max()).numpy()).astype(np.float32).mean(-1) * 0.4
    assert flat_panel.std() < 0.2 * peaked_panel.std() and flat_panel.max() < 0.3 * peaked_panel.max()
    assert flat_panel.std() < 0.2 * stretched.std() and stretched.max() > 0.8 * peaked_panel.max()


def test_each_step_prints_its_peak_spread_and_own_scale():
    import re

    from zoo.viz.record import CONTRAST, attention_panels

    maps = torch.rand(3, 5, 7, generator=torch.Generator().manual_seed(1)) ** 3
    maps /= maps.sum((1, 2), keepdim=True)
    panels, bars, bar_of = attention_panels(torch.rand(1, 35, 49), maps, ["a", "b", "c"])
    p = maps.flatten(1).double().numpy()
    for t, (_, lines) in enumerate(panels):
        peak, spread = (float(v) for v in re.fullmatch(r"peak ([\d.]+)x  spread ([\d.]+)", lines[1]).groups())
        assert lines[0] == "abc"[t] and peak == pytest.approx(p[t].max() * 35, abs=0.05)
        assert spread == pytest.approx(np.exp(-(p[t] * np.log(p[t])).sum()) / 35, abs=0.005)
        assert lines[2] == f"scale 0 to {max(CONTRAST, p[t].max() * 35):.1f}x"
    assert bar_of == [0, 0, 0] and len(bars) == 1 and "each map from 0 to its peak" in bars[0][1]


def test_a_sharp_map_beside_a_sharper_one_is_drawn_at_its_own_scale():
    """DRAW's windows peak at 88-332x uniform: a map 4x less sharp than its neighbour reaches full
    brightness too (each map to its own peak), while a near-uniform map stays dark (the scale never
    tops below CONTRAST x uniform); a peak one pixel wide survives a panel smaller than the map."""
    from zoo.viz.record import attention_panels

    maps = torch.full((3, 100, 100), 0.0)
    maps[0, 40:43, 40:43] = 1.0  # 9 px: 1111x uniform
    maps[1, 40:46, 40:46] = 1.0  # 36 px: 278x
    maps[2] = 1 + 0.5 * torch.rand(100, 100, generator=torch.Generator().manual_seed(0))
    maps /= maps.sum((1, 2), keepdim=True)
    black = torch.zeros(1, 100, 100)
    panels, _, _ = attention_panels(black, maps, ["sharpest", "sharp", "flat"], size=100)
    sharpest, sharp, flat = (_brightness(picture).max() for picture, _ in panels)
    assert sharp == pytest.approx(sharpest, rel=0.02) and flat < 0.3 * sharp
    dot = torch.zeros(1, 100, 100)
    dot[0, 51, 37] = 1.0
    small, _, _ = attention_panels(black, dot, ["dot"], size=32)
    assert _brightness(small[0][0]).max() == pytest.approx(sharpest, rel=0.02)


def _rollout_record(headline: str):
    """Two sharp layer maps (60.8 x uniform) and a milder last step (9.6 x) on an 8 x 8 grid."""
    cells = torch.full((1, 3, 8, 8), 0.05 / 63)
    cells[0, :2, 0, 0] = 0.95
    cells[0, 2] = 0.85 / 63
    cells[0, 2, 5, 5] = 0.15
    return record.AttentionRecord(family="x", kind="rollout", maps=record.maps_from_cells(cells, (32, 32)),
                                  labels=[["layer 1", "layer 2", "rollout"]], step_mask=record.full_mask(1, 3),
                                  headline=headline)


def test_a_step_that_sums_up_the_others_is_drawn_at_its_own_scale():
    """The rollout is not drawn near black beside sharper layer maps: every map reaches its own peak."""
    from zoo.viz.record import record_panels

    black = torch.zeros(1, 32, 32)
    panels, bars, bar_of, _ = record_panels(_rollout_record("last"), 0, black)
    assert bar_of == [0, 0, 0] and len(bars) == 1
    layer, rollout = _brightness(panels[0][0]).max(), _brightness(panels[2][0]).max()
    assert rollout == pytest.approx(layer, rel=0.02)


@pytest.mark.parametrize("family", ATTENDING)
def test_every_familys_strip_has_a_panel_per_step_and_one_bar(family):
    from zoo.viz.record import record_panels

    model = _tiny(family)
    spec = zoo.preprocessing(model)
    images = torch.rand(1, spec.in_chans, *spec.size, generator=torch.Generator().manual_seed(0))
    rec = model.attention_record(images)
    panels, bars, bar_of, _ = record_panels(rec, 0, images[0])
    assert len(panels) == int(rec.step_mask[0].sum()) and len(bar_of) == len(panels)
    assert len(bars) == 1 and set(bar_of) == {0}


def test_box_legends_are_named_and_shown_only_where_there_are_boxes():
    """The HTML names each box's colour, says "known target" only for an image given targets, and
    shows a step counter, each step's peak and entropy and the uniform level."""
    from dataclasses import replace

    from zoo.viz.record import html_report, strip

    plain = _rollout_record("last")
    boxed = replace(plain, boxes=torch.tensor([[8.0, 8, 16, 16], [4, 4, 24, 24]]).expand(1, 3, 2, 4).clone(),
                    box_labels=["scale 1", "scale 2"])
    images = torch.rand(2, 1, 32, 32)
    for rec, kinds in ((plain, []), (boxed, ["cyan box: scale 1", "red box: scale 2"])):
        rec = record.concatenate([rec, rec])
        page = html_report(rec, images, ["a.png", "b.png"], "t", None, [None, torch.tensor([[4.0, 4, 12, 12]])])
        first, second = page.split("<section")[1:]
        legends = [re.findall(r'<p class="boxes">([^<]*)</p>', section) for section in (first, second)]
        assert legends == [[", ".join(kinds)] if kinds else [], [", ".join(kinds + ["white box: known target"])]]
        assert "known target" not in page.split("<section")[0]
        labels = re.findall(r'data-label="([^"]*)"', first)
        assert [label.split(":")[0] for label in labels] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
        assert all(re.search(r"; peak [\d.]+x  spread [\d.]+; scale 0 to [\d.]+x; spread exp\(H\)/N: 1 = uniform$",
                             label) for label in labels)
    with_targets = np.asarray(strip(boxed, 0, images[0], torch.tensor([[4.0, 4, 12, 12]])))
    without = np.asarray(strip(boxed, 0, images[0]))
    assert with_targets.shape[0] > without.shape[0]  # one more legend line under the input


def test_wandb_panels_are_drawn_by_the_shared_renderer(monkeypatch):
    """The validation callback logs to W&B the pictures `attention_panels` drew: a renderer that
    paints every panel magenta shows up, panel for panel, in the logged images."""
    import types

    from lightning.pytorch.loggers import WandbLogger
    from PIL import Image

    from zoo.training.callbacks import AttentionImageLogger
    from zoo.viz import record as pictures

    real, areas, magenta = pictures.attention_panels, [], (255, 0, 255)

    def painted(*args, **kwargs):
        panels, bars, bar_of = real(*args, **kwargs)
        areas.append(sum(p.width * p.height for p, _ in panels))
        return [(Image.new("RGB", p.size, magenta), lines) for p, lines in panels], bars, bar_of

    class Logger(WandbLogger):
        def __init__(self):
            self.logged = []

        def log_image(self, key, images, caption, step):
            self.logged.append((key, images[0]))

    monkeypatch.setattr(pictures, "attention_panels", painted)
    family = next(name for name in ATTENDING if "figures" not in families()[name].card.skip)
    model, logger = _tiny(family), Logger()
    trainer = types.SimpleNamespace(sanity_checking=False, is_global_zero=True, current_epoch=0, global_step=3,
                                    loggers=[logger])
    callback = AttentionImageLogger()
    callback.on_validation_batch_end(trainer, model, None, model.example_batch(2), 0)
    callback.on_validation_epoch_end(trainer, model)
    assert [key for key, _ in logger.logged] == ["val/attention/0", "val/attention/1"] and len(areas) == 2
    for (_, image), area in zip(logger.logged, areas):
        assert (np.asarray(image) == magenta).all(-1).sum() == area
