"""The attention record's coordinates against hand-built cases, and the attention metrics on
synthetic maps whose answers are known."""
from __future__ import annotations

import json

import pytest
import torch

import zoo
from zoo.attention import filterbank as fb
from zoo.attention import record
from zoo.attention.glimpse import Retina
from zoo.errors import UserError
from zoo.metrics import attention as am


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
    faithful = am.faithfulness(score, images, mask.expand(8, 10, 10) / 16, steps=10)
    unfaithful = am.faithfulness(score, images, (1 - mask).expand(8, 10, 10), steps=10)
    assert faithful["deletion_gap"] > 0.3 and faithful["insertion_gap"] > 0.3
    assert unfaithful["deletion_gap"] < 0 and unfaithful["insertion_gap"] < 0


# ----------------------------------------------------------------------------- every family
ATTENDING = {"ram_fmnist_cluttered60": "glimpse", "draw_cluttered100_classifier": "window",
             "draw_two_items60": "window", "vit_fmnist": "rollout", "sat_soft_scenes": "soft",
             "sat_hard_scenes": "hard"}


@pytest.mark.parametrize("name", sorted(ATTENDING))
def test_every_release_that_attends_gives_one_record(name):
    model = zoo.create_model(name, pretrained=True).eval()
    spec = zoo.preprocessing(model)
    images = torch.rand(2, spec.in_chans, *spec.size, generator=torch.Generator().manual_seed(0))
    rec = model.attention_record(images)
    assert rec.kind == ATTENDING[name] and rec.image_size == spec.size
    assert rec.maps.shape[:2] == rec.step_mask.shape and len(rec.labels) == 2
    sums = rec.maps.flatten(2).sum(-1)[rec.step_mask]
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-4) and not rec.degenerate().any()
    assert rec.boxes is None or rec.boxes.shape[-1] == 4 and len(rec.box_labels) == rec.boxes.shape[2]
    json.loads(rec.to_json(maps=False))


def test_a_family_without_attention_refuses_in_one_line():
    model = zoo.create_model("baseline_mlp_centered")
    with pytest.raises(UserError, match="has no attention to record"):
        model.attention_record(torch.rand(1, 1, 28, 28))
