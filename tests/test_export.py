"""zoo export: every exportable family's programs, through ONNX Runtime and torch.export, give the
eager model's outputs at a batch size other than the one they were traced with."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.commands import cli
from zoo.models.card import families
from zoo.weights.export import export, programs

#: every registered family that answers an image with logits (one images -> outputs program)
EXPORTING = [name for name, cls in families().items() if cls.card.output == "logits" and "export" not in cls.card.skip]
CAPTIONING = [name for name, cls in families().items() if cls.card.output == "caption"]


def _tiny(family: str, variant: int = 0):
    cls = families()[family]
    torch.manual_seed(0)
    return cls(**list(cls.card.tiny.values())[variant]).eval()


def _onnx_run(path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


@pytest.mark.slow
@pytest.mark.parametrize("family", EXPORTING)
def test_every_family_exports_to_onnx_and_torch(family, tmp_path):
    """Its card's `exports` (RAM: logits and where it looked), at a batch size other than traced."""
    model = _tiny(family)
    images, _ = model.example_images(3)
    with torch.no_grad():
        expected = model.export_forward(images)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(expected) == len(model.card.exports)
    (onnx_path,) = export(model, tmp_path / "onnx", "onnx")
    outputs = _onnx_run(onnx_path, {"images": images})
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)
    (pt2,) = export(model, tmp_path / "torch", "torch")
    program = torch.export.load(pt2).module()(images)
    for got, want in zip(program if isinstance(program, tuple) else (program,), expected):
        np.testing.assert_allclose(got.detach().numpy(), want.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("family", CAPTIONING)
@pytest.mark.slow
def test_captioner_programs_reproduce_greedy_captions(family, variant, tmp_path):
    model = _tiny(family, variant)
    images, _ = model.example_images(3)
    vocab = model.itos
    paths = {p.stem: p for p in export(model, tmp_path, "onnx")}
    assert set(paths) == {"encoder", "decoder_step", "greedy"}
    tokens, alphas = _onnx_run(paths["greedy"], {"images": images})
    reference = model.caption(images, beam_size=1)
    for row, ref, alpha in zip(tokens, reference, alphas):
        n = len(ref["words"])
        assert [vocab[i] for i in row[:n]] == ref["words"]
        if ref["finished"]:
            assert row[n] == 2  # <end>
        np.testing.assert_allclose(alpha[:n], ref["alpha"].view(n, -1).numpy(), atol=1e-5)
    # the encoder and one decoder step, as a serving loop would call them
    annotations, projected, h, c = _onnx_run(paths["encoder"], {"images": images})
    token = torch.full((3,), 1, dtype=torch.long)  # <start>
    log_probs, *_ = _onnx_run(paths["decoder_step"], {"token": token, "h": torch.from_numpy(h),
                                                       "c": torch.from_numpy(c), "projected": torch.from_numpy(projected),
                                                       "annotations": torch.from_numpy(annotations)})
    assert [vocab[i] for i in log_probs.argmax(-1)] == [r["words"][0] for r in reference]


def test_what_cannot_be_exported_is_one_line(tmp_path, capsys):
    from zoo.guards.errors import UserError

    with pytest.raises(UserError, match=r"DRAW \(draw\) is a generator"):
        programs(_tiny("draw"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", "--model", "sat_soft_scenes", "--out", str(tmp_path), "--format", "tflite"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert cli.main(["export", "--model", "draw_fmnist_t16", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("zoo export: error: DRAW (draw) is a generator: it has no images -> "
                                               "outputs program to export")


@pytest.mark.slow
def test_the_torch_free_onnx_example_captions_as_zoo_caption_does(tmp_path, capsys):
    """docs/examples/onnx_caption.py (onnxruntime, numpy, PIL and the torch-free zoo.weights.export_set; torch
    made unimportable) reads only the export folder and gives zoo caption's beam-search captions word
    for word, on opaque scenes and on transparent ones whose hidden pixels are white (export.json's
    alpha rule: composite on black)."""
    import subprocess
    import sys

    from PIL import Image

    import zoo
    from conftest import REPO, cli_env
    from zoo import registry

    model = zoo.create_model("sat_soft_scenes", pretrained=True)
    images = registry.build_datamodule(model).boxed_examples("test", 3)["images"]
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"scene{i}.png")
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(paths[-1])
    pixels = np.asarray(Image.open(paths[0]).convert("RGB")).copy()
    alpha = np.where(pixels.max(-1) < 40, 0, 255).astype(np.uint8)  # the dark background: see-through
    for hidden in (0, 255):
        pixels[alpha == 0] = hidden
        paths.append(tmp_path / f"transparent{hidden}.png")
        Image.fromarray(np.dstack([pixels, alpha]), "RGBA").save(paths[-1])
    assert cli.main(["export", "--model", "sat_soft_scenes", "--out", str(tmp_path / "exported")]) == 0
    capsys.readouterr()
    assert cli.main(["caption", "--model", "sat_soft_scenes", *map(str, paths)]) == 0
    expected = capsys.readouterr().out
    blocked = ("import runpy, sys; sys.modules['torch'] = None; "
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", blocked, str(REPO / "docs/examples/onnx_caption.py"),
                             str(tmp_path / "exported"), *map(str, paths)], env=cli_env(None), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == expected and len(expected.splitlines()) == 5


def test_export_says_which_program_it_is_exporting(tmp_path, capsys):
    """Each program takes seconds (a captioner's three, ~40 s): a line on stderr before each."""
    assert cli.main(["export", "--model", "vit_fmnist", "--out", str(tmp_path / "exported"), "--format", "torch"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["zoo export: exporting model (1 of 1) to model.pt2"]
    assert captured.out.splitlines()[0] == f"wrote {tmp_path / 'exported' / 'model.pt2'}"
