"""Issue 35: releases are written under a lock on the weights folder. Five processes run
scripts/release.py's write_release at once into one folder, 20 rounds in a row; after every round
each release is in the manifest, its file is there, matches its sha256 and loads, and at the end no
file is left that no release names. (Before the lock, releases were lost in the first rounds.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
from zoo.weights import hub
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
    from zoo.weights import hub

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


# ----------------------------------------------------------------------------- what a release sweep removes
# Issue 42: the sweep removed any `<release>-<any 8 characters>.safetensors` (a user's
# `ram_fmnist_centered-backup01.safetensors`), looking at the suffix's length only. Now it removes
# only what a release recorded (.release.pending.json) before writing it, by its exact generated
# name, and a weights file only while it has the sha256 that was recorded.
NAME = "tiny_release"


@pytest.fixture
def script(tmp_path, monkeypatch):
    import importlib.util

    weights = tmp_path / "weights"
    (weights / "golden").mkdir(parents=True)
    (weights / "MANIFEST.json").write_text("{}")
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(weights))
    spec = importlib.util.spec_from_file_location("release_script", REPO / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Killed(Exception):
    """Stands for a kill -9 at one of write_release's test hooks (the subprocess tests kill for real)."""


def _release(script, seed: int, kill_at: str | None = None) -> str:
    import torch

    from zoo.models.baselines import Classifier

    def hook(point):
        if point == kill_at:
            raise Killed(point)

    torch.manual_seed(seed)
    model = Classifier(arch="mlp", hidden=[4])
    probe = {"config": model.zoo_config(), "metadata": {"recipe": "configs/baseline/mlp_centered.yaml", "seed": 0}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(script, "_test_hook", hook)
        return script.write_release(NAME, model, probe).name


def _listing(weights) -> dict:
    return {str(p.relative_to(weights)): p.read_bytes() for p in sorted(weights.rglob("*")) if p.is_file()}


def test_a_sweep_keeps_every_file_it_did_not_record(script, tmp_path, monkeypatch, capsys):
    weights = tmp_path / "weights"
    first = _release(script, 0)
    mine = {"tiny_release-backup01.safetensors": b"my backup",  # the audit's case: 8 characters, not hex
            "tiny_release-0123abcd.safetensors": b"hex, but no release wrote it",
            "tiny_release-0123ABCD.safetensors": b"upper case",
            "tiny_release-0123abcd0.safetensors": b"nine",
            "golden/tiny_release-0123abcd.json": b"{}",
            "notes.txt": b"mine"}
    for name, data in mine.items():
        (weights / name).write_bytes(data)
    second = _release(script, 1)
    assert second != first and not (weights / first).exists()  # the replaced release went, as recorded
    for name, data in mine.items():
        assert (weights / name).read_bytes() == data, name


def test_what_a_killed_release_recorded_is_swept_and_nothing_else(script, tmp_path, monkeypatch):
    weights = tmp_path / "weights"
    first = _release(script, 0)
    with pytest.raises(Killed):
        _release(script, 1, kill_at="staged")  # written and recorded, not committed
    staged = [p.name for p in weights.glob("tiny_release-*.safetensors") if p.name != first]
    assert len(staged) == 1 and (weights / ".release.pending.json").exists()
    with pytest.raises(Killed):
        _release(script, 2, kill_at="committed")  # committed; the old one not yet removed
    assert not (weights / staged[0]).exists()  # the staged release's files went with its record
    third = json.loads((weights / "MANIFEST.json").read_text())[NAME]["file"]
    assert (weights / first).exists()  # the replaced release is still there ...
    (weights / first).write_bytes(b"a file of mine under the old release's name")  # ... and now it is not the zoo's
    with pytest.warns(UserWarning, match="it is not the file release tiny_release recorded"):
        fourth = _release(script, 3)
    assert (weights / first).read_bytes() == b"a file of mine under the old release's name"
    assert sorted(_listing(weights)) == sorted(["MANIFEST.json", ".release.lock", first, fourth,
                                                f"golden/{Path(first).stem}.json", f"golden/{Path(fourth).stem}.json"])
    assert third != fourth


def test_a_golden_output_the_user_replaced_is_kept_when_its_release_is_replaced(script, tmp_path):
    """The writer fuzz's finding (tests/fuzz_corpus/writers/0ec141810582bd58.json): the replaced
    release's golden output went by its name alone, though the user had put their own file there."""
    weights = tmp_path / "weights"
    first = _release(script, 0)
    mine = weights / "golden" / f"{Path(first).stem}.json"
    mine.write_bytes(b'{"kind": "logits", "values": [1.0]}')  # the user's, under the zoo's name
    with pytest.warns(UserWarning, match="it is not the golden output release tiny_release wrote"):
        second = _release(script, 1)
    assert not (weights / first).exists()  # the replaced weights went, as recorded ...
    assert mine.read_bytes() == b'{"kind": "logits", "values": [1.0]}'  # ... the user's file stayed
    assert (weights / "golden" / f"{Path(second).stem}.json").exists()
    third = _release(script, 2)  # an untouched golden output still goes with its release
    assert not (weights / "golden" / f"{Path(second).stem}.json").exists() and third != second
