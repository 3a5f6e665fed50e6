"""An export set is checked wherever it is read (zoo.weights.export_set.check_set): by zoo.load_export and
by the torch-free ONNX example. Before, the example read export.json unchecked (a decoder_step.onnx
of another model captioned differently with exit code 0; a cut vocabulary, a 60000 px size or a
beam of 3,000,000 gave tracebacks or 3 GB) and load_export verified names outside the folder, passed
an empty set and gave tracebacks on a list, null or deeply nested manifest."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

import zoo
from conftest import REPO, TESTS, cli_env
from zoo.guards.errors import UserError
from zoo.weights.export import load_export
from zoo.weights.export_set import check_set

SEED = TESTS / "fuzz_seeds" / "export_set"  # a tiny captioner's real `zoo export` (fuzzing.make_export_seed)


@pytest.fixture
def exported(tmp_path):
    folder = tmp_path / "exported"
    shutil.copytree(SEED, folder)
    return folder


def _edit(folder, change):
    manifest = json.loads((folder / "export.json").read_text())
    change(manifest)
    (folder / "export.json").write_text(json.dumps(manifest))


def _rehash(folder, name):
    _edit(folder, lambda m: m["files"].update({name: hashlib.sha256((folder / name).read_bytes()).hexdigest()}))


def test_a_whole_set_loads_through_every_reader(exported):
    manifest = check_set(exported)
    assert manifest == load_export(exported) == zoo.load_export(exported)
    assert set(manifest["files"]) == {"encoder.onnx", "decoder_step.onnx", "greedy.onnx"}


@pytest.mark.parametrize("name, expected", [
    ("../outside.bin", "is not a plain file name inside the folder"),
    ("/etc/hostname", "is not a plain file name inside the folder"),
    ("sub/encoder.onnx", "is not a plain file name inside the folder"),
])
def test_names_outside_the_folder_are_refused(exported, name, expected):
    (exported.parent / "outside.bin").write_bytes(b"x")
    _edit(exported, lambda m: m["files"].update({name: hashlib.sha256(b"x").hexdigest()}))
    with pytest.raises(UserError, match=expected):
        zoo.load_export(exported)


@pytest.mark.parametrize("text, expected", [
    ('{"files": {}, "format": "onnx"}', "names no files"),
    ("[1, 2, 3]", "expected an object, got list"),
    ("null", "expected an object, got null"),
    ("[" * 100_000 + "]" * 100_000, "refused, nested too deep"),
    ("{", "not valid JSON"),
])
def test_empty_and_malformed_manifests_are_one_line(exported, text, expected):
    (exported / "export.json").write_text(text)
    with pytest.raises(UserError, match=expected) as info:
        load_export(exported)
    assert "\n" not in str(info.value)


def test_a_program_of_another_model_is_refused_even_when_the_manifest_names_its_hash(exported, tmp_path):
    """A mixed set whose export.json was rewritten with the swapped program's sha256: the program's
    own embedded description is another model's."""
    other = tmp_path / "other"
    shutil.copytree(SEED, other)
    _edit(other, lambda m: None)
    import onnx

    proto = onnx.load(str(other / "decoder_step.onnx"))
    for prop in proto.metadata_props:
        if prop.key == "attention_zoo":
            info = json.loads(prop.value)
            info["vocabulary"][-1] = "bag"
            prop.value = json.dumps(info)
    onnx.save(proto, str(exported / "decoder_step.onnx"))
    with pytest.raises(UserError, match="decoder_step.onnx is not the file this export's export.json names"):
        check_set(exported)
    _rehash(exported, "decoder_step.onnx")
    with pytest.raises(UserError, match="decoder_step.onnx was exported from another model"):
        check_set(exported)


@pytest.mark.parametrize("change, expected", [
    (lambda m: m.update(vocabulary=m["vocabulary"][:5]), "scores 7 words but export.json's vocabulary has 5"),
    (lambda m: m["preprocessing"].update(size=[60000, 60000]), "preprocessing size [60000, 60000] is not [H, W]"),
    (lambda m: m["decoding"].update(beam_size=3_000_000), "decoding beam_size 3000000 is outside 1..100"),
    (lambda m: m["special_tokens"].update(end=99), "special_tokens must give"),
    (lambda m: m.update(vocabulary=[1, 2, 3, 4, 5, 6, 7]), "vocabulary is not a list of words"),
])
def test_sizes_and_the_vocabulary_are_checked(exported, change, expected):
    _edit(exported, change)
    with pytest.raises(UserError) as info:
        check_set(exported)
    assert expected in str(info.value)


def test_check_set_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None; import zoo; "
            "from zoo.weights.export_set import check_set; print(zoo.load_export.__module__)")
    result = subprocess.run([sys.executable, "-c", code], env=cli_env(None), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "zoo.weights.export_set", result.stderr[-500:]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mixed", "cut vocabulary", "huge size", "huge beam"])
def test_the_torch_free_example_refuses_a_bad_set_in_one_line(exported, tmp_path, case):
    from PIL import Image

    Image.new("RGB", (16, 16)).save(tmp_path / "scene.png")
    extra = []
    if case == "mixed":
        (exported / "decoder_step.onnx").write_bytes((exported / "greedy.onnx").read_bytes())
    elif case == "cut vocabulary":
        _edit(exported, lambda m: m.update(vocabulary=m["vocabulary"][:5]))
    elif case == "huge size":
        _edit(exported, lambda m: m["preprocessing"].update(size=[60000, 60000]))
    else:
        extra = ["--beam-size", "3000000"]
    blocked = ("import runpy, sys; sys.modules['torch'] = None; "
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", blocked, str(REPO / "docs/examples/onnx_caption.py"), str(exported),
                             str(tmp_path / "scene.png"), *extra], env=cli_env(None), capture_output=True, text=True,
                            timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "error:" in lines[0], result.stderr[-1000:]
    assert result.stdout == ""
