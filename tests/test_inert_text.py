"""Model-supplied text is inert: a class name or word from a file cannot stop the HTML report's
script, reach the terminal as control sequences, or make --json output that strict parsers refuse;
NaN weights are refused at load time. Before: `<!--<script>` stopped the report's slider, escape
sequences reached the terminal raw, NaN weights gave a traceback in `zoo glimpses` (now `zoo attend`) and bare NaN in
every --json output (issue: Reliability III)."""
from __future__ import annotations

import json
import re

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import zoo
from conftest import REPO
from zoo import cli
from zoo.errors import UserError, printable
from zoo.io import json_text

HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "a&b>c", "\u2028", '"quoted"']


def _release(tmp_path, name: str, release: str, poison=None, **init_args):
    manifest = json.loads((REPO / "weights/MANIFEST.json").read_text())
    config = manifest[release]["config"]
    config["init_args"].update(init_args)
    state = load_file(str(REPO / "weights" / manifest[release]["file"]))
    if poison is not None:
        state = {k: torch.full_like(v, poison) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(tmp_path / f"{name}.safetensors"), metadata={"zoo_config": json.dumps(config)})
    return str(tmp_path / f"{name}.safetensors")


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_html_reports_script_holds_no_markup_whatever_the_class_names(tmp_path, capsys):
    names = [HOSTILE[i % len(HOSTILE)] + str(i) for i in range(10)]
    checkpoint = _release(tmp_path, "names", "vit_fmnist", class_names=names)
    Image.new("L", (28, 28), 90).save(tmp_path / "shirt.png")
    assert cli.main(["attend", str(tmp_path / "shirt.png"), "--checkpoint", checkpoint, "--out", str(tmp_path / "out"),
                     "--html", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1 and page.count("<script") == 1  # no name opened or closed a script
    data = scripts[0].split("const record = ", 1)[1].split(";\n", 1)[0]
    assert "<" not in data and ">" not in data and "&" not in data and "\u2028" not in data
    record = _strict(data)
    assert record["images"][0]["prediction"]["class_names"] == names  # the names, intact, as data


def test_script_json_is_strict_and_escapes_every_unsafe_character():
    from zoo.viz.record import script_json

    text = script_json({"names": HOSTILE, "score": float("nan"), "peak": float("inf")})
    assert not set("<>&\u2028\u2029") & set(text)
    assert _strict(text) == {"names": HOSTILE, "score": None, "peak": None}


def test_control_characters_never_reach_the_terminal(tmp_path, capsys):
    manifest = json.loads((REPO / "weights/MANIFEST.json").read_text())
    vocab = manifest["sat_soft_scenes"]["config"]["init_args"]["vocab"]
    evil = vocab[:4] + [f"\x1b[31m\x1b]0;pwned\x07{w}\u202e" for w in vocab[4:]]
    checkpoint = _release(tmp_path, "words", "sat_soft_scenes", vocab=evil)
    Image.new("RGB", (64, 64), (120, 30, 30)).save(tmp_path / "scene.png")
    assert cli.main(["caption", str(tmp_path / "scene.png"), "--checkpoint", checkpoint]) == 0
    out = capsys.readouterr().out
    assert out.strip() and not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", out.replace("\t", ""))
    assert "\\x1b[31m\\x1b]0;pwned\\x07" in out  # shown, not obeyed
    assert printable("a\x1b[2Jb\nc\u202ed") == "a\\x1b[2Jb\\nc\\u202ed"


def test_nan_weights_are_refused_at_load_time(tmp_path, capsys):
    checkpoint = _release(tmp_path, "nan", "ram_fmnist_centered", poison=float("nan"))
    with pytest.raises(UserError, match="nan.safetensors: refused, tensor .* holds NaN or infinite values"):
        zoo.load_checkpoint(checkpoint)
    Image.new("L", (28, 28)).save(tmp_path / "digit.png")
    assert cli.main(["attend", str(tmp_path / "digit.png"), "--checkpoint", checkpoint, "--out",
                     str(tmp_path / "out"), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "holds NaN or infinite values" in err


def test_every_json_output_writes_non_finite_numbers_as_null(tmp_path):
    from zoo.attention.record import AttentionRecord
    from zoo.results import write_json

    assert _strict(json_text({"a": [float("nan"), 1.5, float("-inf")]})) == {"a": [None, 1.5, None]}
    record = AttentionRecord(family="ram", kind="glimpse", maps=torch.full((1, 1, 4, 4), float("nan")),
                             labels=[["glimpse 1"]], step_mask=torch.ones(1, 1, dtype=torch.bool),
                             prediction={"probs": torch.tensor([[float("nan"), 0.5]]), "label": torch.tensor([1])})
    _strict(record.to_json())
    write_json(tmp_path / "r.json", {"metrics": {"test/acc": float("nan")}})
    assert _strict((tmp_path / "r.json").read_text())["metrics"] == {"test/acc": None}
