"""Issue 35: releases are written under a lock on the weights folder. Five processes run
scripts/release.py's write_release at once into one folder, 20 rounds in a row; after every round
each release is in the manifest, its file is there, matches its sha256 and loads, and at the end no
file is left that no release names. (Before the lock, releases were lost in the first rounds.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, cli_env

WRITERS, ROUNDS = 5, 20

# One process imports scripts/release.py once and forks the writers (importing torch five times over
# would cost more than all the rounds). Each writer makes `ROUNDS` releases of its own name, new
# weights each round, in step with the others: all start a round together, and each checks its own
# release only after every writer has committed that round, so a release that another writer's
# commit dropped would be seen. Each writer takes the folder's lock on its own descriptor, as
# separate release.py runs do.
WRITERS_SCRIPT = """
import contextlib, hashlib, importlib.util, json, multiprocessing, sys, torch
spec = importlib.util.spec_from_file_location("release_script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
from zoo import hub
from zoo.models.baselines import Classifier
writers, rounds = int(sys.argv[2]), int(sys.argv[3])

def writer(me, barrier, results):
    problems = []
    try:
        check_rounds(me, barrier, problems)
    except Exception as exc:  # a crash (or another writer's, breaking the barrier) is a problem too
        barrier.abort()
        problems.append(f"{type(exc).__name__}: {exc}")
    results.put((me, problems))

def check_rounds(me, barrier, problems):
    name = f"baseline_mlp_writer{me}"
    for round in range(rounds):
        barrier.wait()
        torch.manual_seed(1000 * round + me)
        model = Classifier(arch="mlp", hidden=[8])
        probe = {"config": model.zoo_config(), "metadata": {"recipe": "configs/baseline/mlp_centered.yaml", "seed": 0}}
        with contextlib.redirect_stdout(sys.stderr):
            written = script.write_release(name, model, probe).name
        barrier.wait()
        entry = hub.manifest().get(name)
        path = hub.weights_dir() / (entry or {}).get("file", "missing")
        if entry is None or entry["file"] != written:
            problems.append(f"round {round}: {name} is not the release it wrote ({entry and entry['file']})")
        elif not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"round {round}: {entry['file']} is missing or fails its sha256")
        else:
            hub.load_weights(path)

fork = multiprocessing.get_context("fork")
barrier, results = fork.Barrier(writers, timeout=300), fork.Queue()
procs = [fork.Process(target=writer, args=(me, barrier, results)) for me in range(writers)]
for proc in procs:
    proc.start()
found = dict(results.get(timeout=600) for _ in procs)
for proc in procs:
    proc.join()
print(json.dumps({"exit_codes": [proc.exitcode for proc in procs], "problems": found}))
"""


@pytest.mark.slow
def test_concurrent_releases_leave_every_release_loadable_round_after_round(tmp_path, monkeypatch):
    import zoo
    from tools import release
    from zoo import hub

    weights = tmp_path / "weights"
    (weights / "golden").mkdir(parents=True)
    (weights / "MANIFEST.json").write_text("{}")
    run = subprocess.run([sys.executable, "-c", WRITERS_SCRIPT, str(REPO / "scripts" / "release.py"), str(WRITERS),
                          str(ROUNDS)], env=cli_env(None, ZOO_WEIGHTS_DIR=str(weights)), capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["exit_codes"] == [0] * WRITERS, run.stderr[-3000:]
    # every round, each writer's release was whole once all had committed
    assert outcome["problems"] == {str(me): [] for me in range(WRITERS)}
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
