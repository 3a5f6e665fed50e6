"""Issue 35: releases are written under a lock on the weights folder. Five scripts/release.py
processes release at once into one folder, round after round; after every round each release is
in the manifest, its file is there, matches its sha256 and loads, and no file is left that no
release names."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, cli_env

WRITERS, ROUNDS = 5, 20

# One writer: `ROUNDS` releases of its own name (new weights each round), in step with the others:
# all start a round together (a file barrier), and each checks its own release only once every
# writer has committed that round, so a release another writer's commit dropped would be seen.
WRITER = """
import hashlib, importlib.util, json, sys, time, torch, traceback
from pathlib import Path
spec = importlib.util.spec_from_file_location("release_script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
from zoo import hub
from zoo.models.baselines import Classifier
barriers, me, writers, rounds = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
name = f"baseline_mlp_writer{me}"

def barrier(tag):
    (barriers / f"{tag}.{me}").touch()
    deadline = time.monotonic() + 300
    while len(list(barriers.glob(f"{tag}.*"))) < writers:
        if list(barriers.glob("failed.*")):
            sys.exit(1)  # another writer crashed: it says why
        assert time.monotonic() < deadline, f"the other writers never reached {tag}"
        time.sleep(0.005)

def one_round(round):
    barrier(f"start{round}")
    torch.manual_seed(1000 * round + me)
    model = Classifier(arch="mlp", hidden=[8])
    probe = {"config": model.zoo_config(), "metadata": {"recipe": "configs/baseline/mlp_centered.yaml", "seed": 0}}
    written = script.write_release(name, model, probe).name
    barrier(f"written{round}")
    entry = hub.manifest().get(name)
    path = hub.weights_dir() / (entry or {}).get("file", "missing")
    if entry is None or entry["file"] != written:
        return f"round {round}: {name} is not the release it wrote ({entry and entry['file']})"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
        return f"round {round}: {entry['file']} is missing or fails its sha256"
    hub.load_weights(path)

try:
    problems = [problem for round in range(rounds) if (problem := one_round(round))]
except Exception:
    (barriers / f"failed.{me}").write_text(traceback.format_exc().strip().splitlines()[-1])
    raise
print(json.dumps(problems))
"""


@pytest.mark.slow
def test_concurrent_releases_leave_every_release_loadable_round_after_round(tmp_path, monkeypatch):
    import zoo
    from tools import release
    from zoo import hub

    weights, barriers = tmp_path / "weights", tmp_path / "barriers"
    (weights / "golden").mkdir(parents=True)
    barriers.mkdir()
    (weights / "MANIFEST.json").write_text("{}")
    env = cli_env(None, ZOO_WEIGHTS_DIR=str(weights))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(REPO / "scripts" / "release.py"), str(barriers),
                               str(me), str(WRITERS), str(ROUNDS)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for me in range(WRITERS)]
    results = [proc.communicate(timeout=900) for proc in procs]
    crashed = {p.name: p.read_text() for p in barriers.glob("failed.*")}
    assert not crashed and all(proc.returncode == 0 for proc in procs), (crashed, results[0][1][-2000:])
    for out, _ in results:
        assert json.loads(out.strip().splitlines()[-1]) == []  # every round, this writer's release was whole
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(weights))
    manifest = hub.manifest()
    names = [f"baseline_mlp_writer{me}" for me in range(WRITERS)]
    assert sorted(manifest) == names
    for name in names:  # loads through the zoo (sha256 checked) and gives its own golden output
        model = zoo.load_checkpoint(str(hub.fetch_release(name)))
        expected = json.loads(release.golden_path(name, manifest[name]).read_text())
        assert release.golden_mismatch(expected, release.golden_output(model)) is None
    assert sorted(p.name for p in weights.iterdir()) == sorted(
        [".release.lock", "MANIFEST.json", "golden", *(manifest[name]["file"] for name in names)])
    assert sorted(p.name for p in (weights / "golden").iterdir()) == sorted(
        manifest[name]["file"].replace(".safetensors", ".json") for name in names)
