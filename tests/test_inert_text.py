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
from zoo.commands import cli
from zoo.guards.errors import UserError, printable
from zoo.guards.writes import json_text

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


# ----------------------------------------------------------------------------- a manifest's text, everywhere
#: class names that try each way out: a fence (backticks longer than three), markup, an ESC
#: sequence, a line break with a fake heading, a link, a bidirectional override, a table row
BREAKOUT = ["`````\n</code><script>alert(1)</script>", "\x1b[31mred\x1b]0;pwned\x07", "shirt\n# Fake heading",
            "[click](http://evil.example)", "a|b,c\"d", "<b>bold</b>", "\u202eevil", "`x`", "- item", "=cmd()"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """A weights folder whose manifest gives vit_fmnist hostile class names, a description-like
    dataset name, a metric that is a word with an ESC in it and one that is a mapping."""
    import shutil

    manifest = json.loads((REPO / "weights/MANIFEST.json").read_text())
    record = manifest["vit_fmnist"]
    record["metadata"]["class_names"] = BREAKOUT
    record["metadata"]["dataset"] = "Fashion\x1b[2J\n# MNIST"
    record["metadata"]["metrics"] = {**record["metadata"]["metrics"], "test/acc": "ninety\x1b[2J percent",
                                     "test/loss": {"x": 1}}
    record["metadata"]["command"] = "python train.py ``` <script>x</script>"
    folder = tmp_path / "weights"
    folder.mkdir()
    shutil.copyfile(REPO / "weights" / record["file"], folder / record["file"])
    (folder / "MANIFEST.json").write_text(json.dumps({"vit_fmnist": record}))
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(folder))
    return record


def test_zoo_info_shows_a_manifests_text_escaped_and_words_where_numbers_belong(hostile, capsys):
    """Before: `zoo info` printed raw ESC and newlines, and a metric that is a word was a traceback."""
    assert cli.main(["info", "vit_fmnist"]) == 0
    out = capsys.readouterr().out
    assert not CONTROL.search(out)
    labels = [line[:12].strip() for line in out.splitlines()[2:]]
    assert "Fake heading" not in labels and all(label.isidentifier() or not label for label in labels), labels
    assert "shirt\\n# Fake heading" in out and "\\x1b[31mred\\x1b]0;pwned\\x07" in out  # shown, not obeyed
    assert "test/acc ninety\\x1b[2J percent" in out and "test/loss {'x': 1}" in out
    assert cli.main(["info", "vit_fmnist", "--json"]) == 0
    record = _strict(capsys.readouterr().out)
    assert record["class_names"] == BREAKOUT and record["metrics"]["test/loss"]["value"] == {"x": 1}  # as data


def test_zoo_card_keeps_a_manifests_text_inside_its_fence_and_out_of_the_html(hostile, tmp_path, capsys):
    """Before: class names closed the card's code fence (a fake heading, a raw <script>, an ESC
    byte in the README) and a metric that is a word was a traceback. Parsed as Markdown now: the
    card's own headings only, no HTML, the Facts one fenced block holding the names as text; the
    front matter's model-index holds only numbers."""
    import yaml
    from markdown_it import MarkdownIt

    assert cli.main(["card", "vit_fmnist", "--out", str(tmp_path / "card")]) == 0
    text = (tmp_path / "card" / "README.md").read_text()
    assert not CONTROL.search(text)
    _, front, body = text.split("---\n", 2)
    metrics = yaml.safe_load(front)["model-index"][0]["results"][0]["metrics"]
    assert [(m["type"], m["name"]) for m in metrics if not m["type"].startswith("attention_")] == [
        ("error_rate", "Top-1 error (%)")]  # the words in test/acc and test/loss stay out
    assert all(isinstance(m["value"], float) for m in metrics)
    tokens = MarkdownIt("commonmark").parse(body)
    headings = ["".join(c.content for c in tokens[i + 1].children) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["vit_fmnist", "Use", "Facts", "Attention", "Training"]
    assert not [t for t in tokens if t.type.startswith("html")]
    inline_html = [c for t in tokens if t.children for c in t.children if c.type.startswith("html")]
    assert inline_html == []
    (facts,) = [t for t in tokens if t.type == "fence" and "classes" in t.content]
    assert "</code><script>alert(1)</script>" in facts.content and "shirt\\n# Fake heading" in facts.content
    assert "test/acc ninety\\x1b[2J percent" in facts.content
    training = next(t for i, t in enumerate(tokens) if t.type == "inline" and "trains these weights" in t.content)
    assert [c.content for c in training.children if c.type == "code_inline"][0] == "python train.py ``` <script>x</script>"


def test_zoo_list_shows_a_metric_that_is_not_a_number_as_text(hostile, capsys):
    assert cli.main(["list", "--pretrained"]) == 0
    out = capsys.readouterr().out
    assert "vit_fmnist" in out and "test/acc=ninety\\x1b[2J percent" in out and not CONTROL.search(out)


@pytest.mark.parametrize("text", ["plain", "`x`", "``a`b```", "\x1b[31m\n```\n# h", " `edge` "])
def test_a_fence_and_a_code_span_are_longer_than_any_backtick_run_in_their_text(text):
    from markdown_it import MarkdownIt

    from zoo.guards.text import code_fence, code_span

    (block,) = [t for t in MarkdownIt("commonmark").parse("\n".join(code_fence(text))) if t.type == "fence"]
    assert block.content == "\n".join(printable(line) for line in text.split("\n")) + "\n"
    (paragraph,) = [t for t in MarkdownIt("commonmark").parse(f"see {code_span(text)} here") if t.type == "inline"]
    assert [c.content for c in paragraph.children if c.type == "code_inline"] == [printable(text)]


@pytest.mark.parametrize("text", ["# heading", "- item", "12. numbered", "<script>x</script>", "[a](http://b)",
                                  "a\n# b", "*em* _em_ ~~s~~ | t |", "x & y > z"])
def test_markdown_text_renders_as_the_characters_it_holds(text):
    from markdown_it import MarkdownIt

    from zoo.guards.text import markdown_text

    tokens = MarkdownIt("commonmark").parse(markdown_text(text))
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"]
    (inline,) = [t for t in tokens if t.type == "inline"]
    assert [c.type for c in inline.children] == ["text"] * len(inline.children)
    assert "".join(c.content for c in inline.children) == printable(text)


def test_numbers_are_formatted_only_when_they_are_numbers_and_csv_cells_are_not_formulas():
    from zoo.guards.text import csv_cell, number_text

    assert number_text(0.12345) == "0.1235" and number_text(None) == "-" and number_text(float("nan")) == "nan"
    assert number_text("ninety\x1b[2J") == "ninety\\x1b[2J" and number_text({"x": 1}) == "{'x': 1}"
    assert number_text(True) == "True" and number_text(7, "+.3f") == "+7.000"
    assert csv_cell("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0" and csv_cell("@x") == "'@x"
    assert csv_cell("a\x1bb") == "a\\x1bb" and csv_cell(1.5) == 1.5 and csv_cell("vit_fmnist") == "vit_fmnist"


def test_the_html_report_shows_hostile_class_names_as_text(tmp_path):
    checkpoint = _release(tmp_path, "names", "vit_fmnist", class_names=BREAKOUT)
    Image.new("L", (28, 28), 90).save(tmp_path / "shirt.png")
    assert cli.main(["attend", str(tmp_path / "shirt.png"), "--checkpoint", checkpoint, "--out", str(tmp_path / "out"),
                     "--html", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert page.count("<script") == 1 and "<b>bold" not in page and "\x1b" not in page and "\u202e" not in page


def test_the_benchmark_csv_writes_a_manifests_names_as_text_not_formulas(tmp_path):
    import csv
    import sys

    sys.path.insert(0, str(REPO))
    from benchmarks.releases import write_csv

    columns = ["model", "infer_samples_per_sec", "infer_step_time", "infer_batch_size"]
    rows = [{"model": "=HYPERLINK(\"http://evil\")", "infer_samples_per_sec": 1.5, "infer_step_time": 0.1,
             "infer_batch_size": 8},
            {"model": "a\x1b[31m,b\nc", "infer_samples_per_sec": 2.0, "infer_step_time": 0.2, "infer_batch_size": 8}]
    write_csv(tmp_path / "b.csv", columns, rows)
    read = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert [r["model"] for r in read] == ["'=HYPERLINK(\"http://evil\")", "a\\x1b[31m,b\\nc"]
    assert [float(r["infer_samples_per_sec"]) for r in read] == [1.5, 2.0]
