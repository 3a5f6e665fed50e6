"""eval.py on a checkpoint from the tiny training: the metrics table, the JSON record (documented
keys, checkpoint sha256, provenance), --split val, and user errors as one line with exit code 2."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil

import pytest
import torch
from conftest import REPO, TINY_TEST, TINY_VAL, cli_env, run_main

import zoo
from zoo.data.fashion_mnist import FashionMNISTDataModule
from zoo.weights import hub

DOCUMENTED_KEYS = {"model", "checkpoint", "split", "checkpoint_sha256", "seed", "metrics", "config",
                   "git_commit", "device", "wall_time_s", "parameters"}


def _eval_main():
    from zoo.commands.evaluate import main

    return main


def _accuracy(checkpoint, split: str) -> tuple[float, int]:
    """The accuracy eval.py should report, computed here directly from the data module."""
    model = zoo.load_checkpoint(checkpoint).eval()
    data = {k: v for k, v in zoo.data_config(model)["init_args"].items() if not k.startswith("_")}
    dm = FashionMNISTDataModule(**data)
    dm.setup("test")
    images, labels = dm.datasets[split].tensors
    with torch.no_grad():
        predictions = model(images.float() / 255).argmax(-1)
    return (predictions == labels).float().mean().item(), len(labels)


@pytest.mark.parametrize("split,expected_n", [("test", TINY_TEST), ("val", TINY_VAL)])
def test_eval_writes_json_with_documented_keys(trained_run, tiny_data_dir, tmp_path, monkeypatch, split, expected_n):
    out = tmp_path / "results" / "eval.json"
    rc, stdout, stderr = run_main(["eval.py", "--checkpoint", trained_run["last"], "--split", split,
                                   "--json", out, "--seed", "3"], cwd=tmp_path, env=cli_env(tiny_data_dir))
    assert rc == 0, f"rc {rc}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    record = json.loads(out.read_text())
    assert DOCUMENTED_KEYS <= set(record), f"missing {DOCUMENTED_KEYS - set(record)}"
    assert record["split"] == split and record["seed"] == 3
    assert record["checkpoint"] == str(trained_run["last"]) and record["model"] is None
    assert record["checkpoint_sha256"] == hashlib.sha256(trained_run["last"].read_bytes()).hexdigest()
    assert record["config"]["class_path"] == "zoo.models.baselines.Classifier"
    assert record["config"]["data"]["init_args"]["variant"] == "centered"
    assert record["git_commit"] and record["device"] and record["wall_time_s"] > 0
    assert record["parameters"] == sum(p.numel() for p in zoo.load_checkpoint(trained_run["last"]).parameters())
    metrics = record["metrics"]
    assert {f"{split}/acc", f"{split}/loss"} <= set(metrics)
    assert not any(k.startswith("test/") for k in metrics) or split == "test"
    # the metrics are those of the requested split
    monkeypatch.setenv("ZOO_DATA_DIR", str(tiny_data_dir))
    accuracy, n = _accuracy(trained_run["last"], split)
    assert n == expected_n
    assert metrics[f"{split}/acc"] == pytest.approx(accuracy, abs=1e-6)
    # and the table on stdout, with none of Lightning's adverts or its LeafSpec deprecation
    assert f"{split}/acc" in stdout and "metric" in stdout
    assert not any(noise in stdout + stderr for noise in ("💡", "litlogger", "LeafSpec")), stderr[-2000:]


def test_missing_checkpoint_is_one_line_exit_2(tmp_path, tiny_data_dir):
    rc, stdout, stderr = run_main(["eval.py", "--checkpoint", tmp_path / "nope.ckpt"], cwd=tmp_path,
                                  env=cli_env(tiny_data_dir))
    assert rc == 2
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("eval.py: error:") and "nope.ckpt" in lines[-1]
    assert sum("error" in line for line in lines) == 1


def test_user_errors_in_process(tmp_path, capsys, monkeypatch, tiny_data_dir):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setenv("ZOO_DATA_DIR", str(tiny_data_dir))
    main = _eval_main()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"garbage")
    cases = {("--checkpoint", str(bad)): "bad.ckpt",
             ("--model", "baseline_cnn_centred"): "did you mean",
             ("--model", "baseline_cnn_centered"): "no released weights"}
    for argv, expected in cases.items():
        assert main(list(argv)) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("eval.py: error:") and expected in err and "\n" not in err
    with pytest.raises(SystemExit) as exit_info:  # neither --checkpoint nor --model
        main([])
    assert exit_info.value.code == 2


def test_bad_data_override_is_a_user_error(trained_run, tmp_path, capsys, monkeypatch, tiny_data_dir):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tiny_data_dir))
    main = _eval_main()
    assert main(["--checkpoint", str(trained_run["last"]), "--data", "variant"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["--checkpoint", str(trained_run["last"]), "--data", "variant=rotated"]) == 2
    assert "rotated" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["local", "url"])
def test_eval_registry_model(where, trained_run, tiny_data_dir, tmp_path, monkeypatch, capsys, http_server):
    """--model NAME evaluates the released weights, also when they exist only at their URL."""
    weights = tmp_path / "weights"
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(weights))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ZOO_DATA_DIR", str(tiny_data_dir))
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    model = zoo.load_checkpoint(trained_run["last"])  # released as scripts/release.py writes it
    weights.mkdir()
    sha = hub.save_release(model, model.zoo_config(), weights / "baseline_cnn_centered.safetensors")
    manifest_path = weights / "MANIFEST.json"
    manifest = {"baseline_cnn_centered": {"file": "baseline_cnn_centered.safetensors", "sha256": sha,
                                          "config": model.zoo_config(), "metadata": {}}}
    manifest_path.write_text(json.dumps(manifest))
    record = manifest["baseline_cnn_centered"]
    if where == "url":
        shutil.move(weights / record["file"], http_server["dir"] / record["file"])
        record["url"] = f"{http_server['url']}/{record['file']}"
        manifest_path.write_text(json.dumps(manifest))
    out = tmp_path / "eval.json"
    assert _eval_main()(["--model", "baseline_cnn_centered", "--split", "val", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert DOCUMENTED_KEYS <= set(result)
    assert result["model"] == "baseline_cnn_centered" and result["checkpoint"] is None
    assert result["checkpoint_sha256"] == record["sha256"]
    accuracy, _ = _accuracy(trained_run["last"], "val")
    assert result["metrics"]["val/acc"] == pytest.approx(accuracy, abs=1e-6)
    assert len(http_server["requests"]) == (1 if where == "url" else 0)
