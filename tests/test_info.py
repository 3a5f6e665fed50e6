"""`zoo info NAME` answers without torch from the manifest, the recipe and the model index
(zoo/model_index.json); the index holds what takes torch or results/ to know and is current: every
stored fact equals what tools/model_index.py computes now, so a model, recipe or results change
that moves a parameter count, a GMAC figure or an attention score fails here until
`python scripts/model_index.py` is run. `zoo list --json` reads the same index."""
from __future__ import annotations

import json

import pytest

from conftest import REPO, cli_env, run_cli
from tools import model_index
from zoo import registry
from zoo.commands import cli, info
from zoo.weights import hub

STORED = json.loads(registry.INDEX_PATH.read_text())
MANIFEST = json.loads((REPO / "weights" / "MANIFEST.json").read_text())


@pytest.fixture(autouse=True)
def shipped(monkeypatch):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(REPO / "weights"))
    monkeypatch.delenv("ZOO_CONFIG_DIR", raising=False)


def test_the_index_covers_every_registered_model_and_class():
    entries = registry.find_entries()
    assert sorted(STORED["entries"]) == sorted(entries), f"stale: run {info.REGENERATE}"
    assert STORED["families"] == model_index.build_families(entries, STORED["entries"])


@pytest.mark.parametrize("name", sorted(registry.list_models()))
def test_the_index_holds_what_is_computed_now(name):
    fresh = json.loads(model_index.serialise({"entries": {name: model_index.entry_record(name)}}))["entries"][name]
    assert model_index.differences(STORED["entries"][name], fresh, name) == [], f"stale: run {info.REGENERATE}"


def test_a_stale_fact_is_named():
    stored = json.loads(json.dumps(STORED["entries"]["ram_fmnist_centered"]))
    fresh = {**stored, "num_params": stored["num_params"] + 1}
    (line,) = model_index.differences(stored, fresh, "ram_fmnist_centered")
    assert line.startswith("ram_fmnist_centered.num_params: stored 209422, now 209423")


def test_a_config_the_index_does_not_know_is_computed_not_shown_stale(monkeypatch):
    entry = registry.get_entry("baseline_cnn_centered")
    assert info.stored_facts(entry) is not None
    changed = {**STORED, "entries": {**STORED["entries"], "baseline_cnn_centered": {
        **STORED["entries"]["baseline_cnn_centered"], "config_digest": "0" * 16, "num_params": 1}}}
    monkeypatch.setattr(info, "index", lambda: changed)
    record = info.describe("baseline_cnn_centered")
    assert record["num_params"] == STORED["entries"]["baseline_cnn_centered"]["num_params"]  # not the stale 1
    assert "computed now" in record["notes"][0]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_info_of_a_release_has_its_card(name):
    record = info.describe(name)
    meta, pre = MANIFEST[name]["metadata"], MANIFEST[name]["metadata"]["preprocessing"]
    assert record["input_size"] == [pre["in_chans"], *pre["size"]]
    assert (record["mean"], record["std"], record["resize"]) == (pre["mean"], pre["std"], pre["resize"])
    assert record["alpha"] and record["interpolation"]
    if meta.get("class_names"):
        assert record["num_classes"] == len(meta["class_names"]) and record["class_names"] == meta["class_names"]
    elif meta.get("vocab"):
        assert record["vocab_size"] == len(meta["vocab"])
    else:  # the backbone's item classes per grid cell
        assert record["num_classes"] > 0
    assert record["num_params"] == meta["num_params"]
    assert record["gmacs"] > 0 and record["inference"]
    assert record["file_size"] == (REPO / "weights" / MANIFEST[name]["file"]).stat().st_size
    assert record["sha256"] == MANIFEST[name]["sha256"] == hub.sha256_file(REPO / "weights" / MANIFEST[name]["file"])
    assert record["recipe"] == meta["command"] and record["seed"] == meta["seed"]
    assert {k: v["value"] for k, v in record["metrics"].items()} == meta["metrics"]
    summary = REPO / meta["results_file"].replace(f"_seed{meta['seed']}.json", ".json")
    if summary.is_file() and len(json.loads(summary.read_text()).get("seeds") or []) > 1:
        spread = record["metrics"][next(k for k in meta["metrics"] if k.startswith("test/"))]["seeds"]
        assert spread["n"] > 1 and spread["std"] >= 0
    if (REPO / "results" / f"attention_{name}.json").is_file():
        assert {"pointing", "pointing_centre"} <= set(record["attention"])
    text = info.render(record)
    for line in ("input", "resize", "alpha", "parameters", "GMACs", "sha256", "recipe", "seed", "metrics"):
        assert f"\n{line:12s} " in text, line


def test_info_of_a_recipe_without_release(capsys):
    assert cli.main(["info", "sat_coco_soft", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["pretrained"] is False and record["description"].startswith("Show, Attend and Tell")
    assert record["input_size"] == [3, 224, 224] and record["resize"] == "crop"
    assert record["num_params"] > 1e7 and "vocabulary" in record["num_params_note"]
    assert record["gmacs"] is None and "vocabulary" in record["gmacs_note"]
    assert record["recipe"] == "python train.py fit --config configs/sat/coco_soft.yaml"


def test_a_glimpse_family_shows_its_cost_per_step_from_its_card(capsys):
    """Every registry entry whose family card has glimpse steps: MACs per step x steps, plus the
    once-per-image part, add up to the MACs per image."""
    from zoo import registry
    from zoo.models.card import families

    stepped = {name for name, cls in families().items() if cls.card.steps is not None}
    first = {}  # one entry per such family
    for name in registry.list_models():
        first.setdefault(registry.family_of(registry.get_entry(name)), name)
    names = [first[family] for family in sorted(stepped)]
    assert names
    for name in names:
        assert cli.main(["info", name, "--json"]) == 0
        record = json.loads(capsys.readouterr().out)
        steps = record["steps"]
        total = steps["per_step"] * steps["count"] + steps["once_per_image"]
        assert abs(total - record["gmacs"] * 1e9) < steps["count"], (name, steps, record["gmacs"])
        assert cli.main(["info", name]) == 0
        assert f"x {steps['count']} ({steps['name']})" in capsys.readouterr().out


def test_info_of_an_unknown_name_is_exit_2_with_did_you_mean(capsys):
    assert cli.main(["info", "ram_fmnist_centerd"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean ram_fmnist_centered" in err


def test_zoo_list_json_has_a_command_a_description_and_parameters_for_every_entry(capsys):
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert sorted(listing) == registry.list_models()
    for name, entry in listing.items():
        assert entry["recipe"].startswith("python train.py fit --config configs/"), name
        assert entry["recipe_file"] in entry["recipe"]
        assert entry["description"] and entry["num_params"] > 0 and entry["family"], name
    assert listing["ram_fmnist_centered"]["recipe"].endswith("--seed_everything 0")


def test_zoo_list_says_where_each_release_looks(capsys):
    """A release's line carries its stored attention scores: pointing beside the centre prior's and
    the deletion gap, so a user sees which releases look where they should; a release on centred
    data (the target box is the whole image) says nothing, since every map points at it there."""
    from zoo.commands.info import stored_facts
    from zoo.commands.list_models import attention_brief

    assert cli.main(["list", "--pretrained"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for name in MANIFEST:
        scores = (stored_facts(registry.get_entry(name)) or {}).get("attention") or {}
        if scores.get("pointing") is None or scores.get("pointing_uniform", 0) >= 1:
            assert "pointing" not in lines[name], name
            continue
        shown = f"pointing {100 * scores['pointing']:.1f}% (centre prior {100 * scores['pointing_centre']:.1f}%)"
        assert shown in lines[name], name
        if scores.get("deletion_gap") is not None:  # a generator predicts nothing to delete from
            assert f"deletion gap {scores['deletion_gap']:+.3f}" in lines[name], name
    assert attention_brief({"pointing": 0.5, "pointing_uniform": 0.2}) == "pointing 50.0%"
    assert attention_brief({"pointing": 1.0, "pointing_uniform": 1.0, "pointing_centre": 1.0}) == ""


@pytest.mark.slow  # a fresh interpreter: the one place torch is not imported yet
def test_zoo_info_and_zoo_list_do_not_import_torch(tmp_path):
    releases = sorted(MANIFEST)
    script = ("import json, sys, time\nfrom zoo.commands import cli\ntimes = {}\n"
              f"for name in {releases!r} + ['vit_imagenet_finetune']:\n"
              "    start = time.perf_counter(); assert cli.main(['info', name]) == 0\n"
              "    times[name] = time.perf_counter() - start\n"
              "assert cli.main(['list', '--json']) == 0\n"
              "print('RESULT', json.dumps({'torch': [m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'lightning', 'timm')], 'times': times}))\n")
    code, out, err = run_cli(["-c", script], cwd=tmp_path, env=cli_env(None, ZOO_WEIGHTS_DIR=str(REPO / "weights")))
    assert code == 0, err[-2000:]
    result = json.loads(out.split("RESULT", 1)[1])
    assert result["torch"] == []
