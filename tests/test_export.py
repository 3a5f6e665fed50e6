"""zoo export: every exportable family's programs, through ONNX Runtime and torch.export, give the
eager model's outputs at a batch size other than the one they were traced with."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo import cli
from zoo.data.vocab import SPECIALS
from zoo.export import export, programs
from zoo.models.baselines import Classifier
from zoo.models.captioner import Captioner
from zoo.models.draw import DRAW, DRAWClassifier
from zoo.models.ram import RAM
from zoo.models.vit import ViTClassifier

VOCAB = [*SPECIALS, "a", "red", "blue", "shirt", "bag"]
CLASSIFIERS = {
    "baseline": lambda: Classifier(arch="cnn", channels=[4, 8], cnn_hidden=8),
    "ram": lambda: RAM(image_size=28, patch_size=4, num_scales=2, num_glimpses=2, glimpse_hidden=8,
                       location_hidden=8, glimpse_dim=16, hidden_size=16),
    "draw_classifier": lambda: DRAWClassifier(image_size=28, T=2, read_n=3, hidden_size=16, glimpse_hidden=8),
    "vit": lambda: ViTClassifier(depth=1, embed_dim=16, num_heads=2, mlp_ratio=1.0, patch_size=7),
}


def _captioner(attention):
    torch.manual_seed(0)
    return Captioner(vocab=VOCAB, attention=attention, image_size=[32, 32], embed_dim=8, hidden_dim=16,
                     attention_dim=8, backbone={"kind": "stem", "in_chans": 3, "channels": [8], "strides": [8]},
                     decode_max_len=4).eval()


def _onnx_run(path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


@pytest.mark.parametrize("family", list(CLASSIFIERS))
def test_classifiers_export_to_onnx_and_torch(family, tmp_path):
    torch.manual_seed(0)
    model = CLASSIFIERS[family]().eval()
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        expected = getattr(model, "export_forward", model)(images)
    expected = expected if isinstance(expected, tuple) else (expected,)  # RAM: logits and locations
    (onnx_path,) = export(model, tmp_path / "onnx", "onnx")
    outputs = _onnx_run(onnx_path, {"images": images})
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)
    (pt2,) = export(model, tmp_path / "torch", "torch")
    program = torch.export.load(pt2).module()(images)
    for got, want in zip(program if isinstance(program, tuple) else (program,), expected):
        np.testing.assert_allclose(got.detach().numpy(), want.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.slow
def test_captioner_programs_reproduce_greedy_captions(attention, tmp_path):
    model = _captioner(attention)
    images = torch.rand(3, 3, 32, 32)
    paths = {p.stem: p for p in export(model, tmp_path, "onnx")}
    assert set(paths) == {"encoder", "decoder_step", "greedy"}
    tokens, alphas = _onnx_run(paths["greedy"], {"images": images})
    reference = model.caption(images, beam_size=1, max_len=4)
    for row, ref, alpha in zip(tokens, reference, alphas):
        n = len(ref["words"])
        assert [VOCAB[i] for i in row[:n]] == ref["words"]
        if ref["finished"]:
            assert row[n] == 2  # <end>
        np.testing.assert_allclose(alpha[:n], ref["alpha"].view(n, -1).numpy(), atol=1e-5)
    # the encoder and one decoder step, as a serving loop would call them
    annotations, projected, h, c = _onnx_run(paths["encoder"], {"images": images})
    token = torch.full((3,), 1, dtype=torch.long)  # <start>
    log_probs, *_ = _onnx_run(paths["decoder_step"], {"token": token, "h": torch.from_numpy(h),
                                                       "c": torch.from_numpy(c), "projected": torch.from_numpy(projected),
                                                       "annotations": torch.from_numpy(annotations)})
    assert [VOCAB[i] for i in log_probs.argmax(-1)] == [r["words"][0] for r in reference]


def test_what_cannot_be_exported_is_one_line(tmp_path, capsys):
    from zoo.errors import UserError

    with pytest.raises(UserError, match="DRAW generator"):
        programs(DRAW(image_size=8, T=1, enc_size=4, dec_size=4, z_size=2, read_n=2, write_n=2))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", "--model", "sat_soft_scenes", "--out", str(tmp_path), "--format", "tflite"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert cli.main(["export", "--model", "draw_fmnist_t16", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("zoo export: error: a DRAW generator has no images -> outputs program to "
                                               "export (export the DRAW classifier, RAM, ViT, a baseline or a captioner)")


@pytest.mark.slow
def test_the_torch_free_onnx_example_captions_as_zoo_caption_does(tmp_path, capsys):
    """docs/examples/onnx_caption.py (onnxruntime, numpy, PIL and the torch-free zoo.export_set; torch
    made unimportable) reads only the export folder and gives zoo caption's beam-search captions word
    for word."""
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
    assert result.stdout == expected and len(expected.splitlines()) == 3
