"""scripts/results_run.py's bookkeeping, with train.py and eval.py replaced by fakes that write
what the real ones write (a best checkpoint; an eval JSON)."""
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("results_run", REPO / "scripts" / "results_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_run(tmp_path, best: str, calls: list | None = None, **record):
    """results_run.run without processes: train.py leaves the checkpoint `best` in its run folder,
    eval.py writes an accuracy of 0.5 for its split (plus `record`); each command joins `calls`."""
    def run(cmd):
        if calls is not None:
            calls.append(cmd)
        if cmd[1] == "train.py":
            checkpoints = tmp_path / cmd[cmd.index("--trainer.default_root_dir") + 1] / "checkpoints"
            checkpoints.mkdir(parents=True, exist_ok=True)
            (checkpoints / best).write_bytes(f"this run's {best}".encode())
        else:
            split = cmd[cmd.index("--split") + 1]
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(
                {"metrics": {f"{split}/acc": 0.5}, "config": {"model": {}}, **record}))
    return run


def test_a_stale_checkpoint_is_never_evaluated_and_the_starting_commit_is_recorded(tmp_path, monkeypatch):
    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()
    stale = tmp_path / "runs/results/fam_recipe/seed0/checkpoints"
    stale.mkdir(parents=True)
    (stale / "best-epoch=007.ckpt").write_bytes(b"an earlier run's best")  # sorts after this run's

    calls = []
    monkeypatch.setattr(script, "run", _fake_run(tmp_path, "best-epoch=002.ckpt", calls, parameters=1234))
    commits = iter(["commit-at-start", "commit-later"])
    monkeypatch.setattr(script, "git_commit", lambda: next(commits))
    assert script.main(["configs/fam/recipe.yaml", "--seeds", "0", "--", "--trainer.max_epochs", "1"]) == 0
    evaluated = [c[c.index("--checkpoint") + 1] for c in calls if c[1] == "eval.py"]
    assert len(evaluated) == 2 and all(p.endswith("best-epoch=002.ckpt") for p in evaluated)
    record = json.loads((tmp_path / "results/fam_recipe_seed0.json").read_text())
    assert record["checkpoint"].endswith("best-epoch=002.ckpt") and record["train_args"] == ["--trainer.max_epochs", "1"]
    summary = json.loads((tmp_path / "results/fam_recipe.json").read_text())
    assert summary["metrics"]["test/acc"]["per_seed"] == [0.5]
    assert record["parameters"] == summary["parameters"] == 1234  # eval.py counts them
    assert summary["train_wall_time_s"]["per_seed"] == [record["train_wall_time_s"]]
    # provenance names the code the run was started with, not HEAD when it ended
    assert record["git_commit"] == summary["git_commit"] == "commit-at-start"
    # the earlier run's folder is kept aside whole (a fit refuses a folder that holds another run)
    kept = tmp_path / "runs/results/fam_recipe/seed0.earlier1/checkpoints/best-epoch=007.ckpt"
    assert kept.read_bytes() == b"an earlier run's best"


@pytest.mark.slow
def test_outputs_docs_and_tests_do_not_make_a_commit_dirty(tmp_path, monkeypatch):
    """A results run started while earlier runs' results JSON (or the docs) are uncommitted
    trained from clean code; an edit to code or configs is what "-dirty" must report."""
    import subprocess

    from zoo import results

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for path in ("results/a.json", "docs/a.md", "tests/test_a.py", "zoo/a.py", "configs/a.yaml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("0\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    monkeypatch.setattr(results, "REPO_ROOT", tmp_path)
    for path in ("results/a.json", "docs/a.md", "tests/test_a.py"):
        (tmp_path / path).write_text("1\n")
    assert not results.git_commit().endswith("-dirty")
    for path in ("zoo/a.py", "configs/a.yaml"):
        git("checkout", "--", ".")
        (tmp_path / path).write_text("1\n")
        assert results.git_commit().endswith("-dirty"), path


@pytest.mark.slow
def test_the_committed_results_tables_are_what_the_results_say():
    """README.md and docs/results.md carry tables generated from results/*.json: editing a number
    by hand, or a results file without regenerating, fails here."""
    from conftest import REPO, run_cli

    rc, out, err = run_cli(["scripts/results_tables.py", "--check"], cwd=REPO)
    assert rc == 0, out + err


def test_a_summary_of_seeds_from_different_machines_says_so_and_keeps_their_training_notes(tmp_path, monkeypatch):
    """Seeds trained elsewhere (copied into results/) and seeds run here: --summarise rewrites the
    summary from the per-seed JSON alone, naming each seed's device and carrying each seed's own
    account of its training (a run stopped and resumed), and trains or evaluates nothing."""
    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()

    def seed_json(seed, device, acc, training=None):
        record = {"name": "fam_recipe", "recipe": "configs/fam/recipe.yaml", "train_args": [], "seed": seed,
                  "metrics": {"test/acc": acc}, "config": {}, "parameters": 7, "train_wall_time_s": None,
                  "git_commit": "abc", "device": {"device": device}, **({"training": training} if training else {})}
        (tmp_path / f"results/fam_recipe_seed{seed}.json").write_text(json.dumps(record))

    seed_json(0, "NVIDIA H200", 0.75, {"note": "stopped by SIGTERM at epoch 22, resumed once"})
    seed_json(1, "cpu (2 cores)", 0.70)
    seed_json(2, "cpu (2 cores)", 0.72)
    monkeypatch.setattr(script, "recipe_drift", lambda recipe, commit, train_args: [])
    monkeypatch.setattr(script, "run", lambda cmd: pytest.fail(f"--summarise ran {cmd}"))
    assert script.main(["configs/fam/recipe.yaml", "--summarise"]) == 0
    summary = json.loads((tmp_path / "results/fam_recipe.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and summary["metrics"]["test/acc"]["per_seed"] == [0.75, 0.70, 0.72]
    assert summary["device"]["device"] == "mixed: NVIDIA H200 (seed 0), cpu (2 cores) (seeds 1, 2)"
    assert summary["per_seed_device"] == ["NVIDIA H200", "cpu (2 cores)", "cpu (2 cores)"]
    assert summary["training"] == {"0": {"note": "stopped by SIGTERM at epoch 22, resumed once"}}
    assert summary["wall_time_s"] is None and summary["train_wall_time_s"] is None

    seed_json(0, "cpu (2 cores)", 0.75)  # one machine: its device, as before
    assert script.main(["configs/fam/recipe.yaml", "--summarise"]) == 0
    summary = json.loads((tmp_path / "results/fam_recipe.json").read_text())
    assert summary["device"] == {"device": "cpu (2 cores)"} and "training" not in summary


def test_a_per_seed_verdict_says_for_each_seed_what_its_interval_allows():
    """A multi-seed attention summary's margin over a control: each seed's value, its bootstrap
    interval and the verdict that interval allows; no interval, no verdict."""
    spec = importlib.util.spec_from_file_location("results_tables_script", REPO / "scripts" / "results_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    record = {"name": "attention_x", "metrics": {"pointing_minus_centre": {
        "per_seed": [0.289, 0.047, -0.021], "per_seed_ci95": [[0.25, 0.33], [-0.01, 0.10], [-0.05, -0.002]]}}}
    assert tables.verdict_cell(record, "pointing_minus_centre", 100, 1, per_seed=True) == (
        "+28.9 [+25.0, +33.0] above / +4.7 [-1.0, +10.0] unresolved / -2.1 [-5.0, -0.2] below")
    record["metrics"]["pointing_minus_centre"]["per_seed_ci95"][1] = None
    with pytest.raises(SystemExit, match="no verdict without one"):
        tables.verdict_cell(record, "pointing_minus_centre", 100, 1, per_seed=True)


def test_an_earlier_seed_joins_the_summary_only_if_its_recipe_then_is_the_recipe_now(tmp_path, monkeypatch, capsys):
    """Seeds added in a later invocation are summarised with the earlier ones when the recipe file
    at their training commit trains the same thing (defaults since left out are fine), never when it
    was edited since; the summary names each seed's commit."""
    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()
    for seed, commit, acc in ((0, "same-recipe", 0.25), (1, "edited-since", 0.75)):
        (tmp_path / f"results/fam_recipe_seed{seed}.json").write_text(json.dumps(
            {"name": "fam_recipe", "recipe": "configs/fam/recipe.yaml", "train_args": [], "seed": seed,
             "metrics": {"test/acc": acc}, "config": {"model": {}}, "git_commit": commit}))
    asked = []

    def fake_drift(recipe, commit, train_args):
        asked.append(commit)
        return ["model.init_args.lr: 0.1 when trained, 0.01 in the recipe now"] if commit == "edited-since" else []

    monkeypatch.setattr(script, "recipe_drift", fake_drift)

    monkeypatch.setattr(script, "run", _fake_run(tmp_path, "best-epoch=001.ckpt"))
    monkeypatch.setattr(script, "git_commit", lambda: "now")
    assert script.main(["configs/fam/recipe.yaml", "--seeds", "2"]) == 0
    summary = json.loads((tmp_path / "results/fam_recipe.json").read_text())
    assert summary["seeds"] == [0, 2]
    assert summary["metrics"]["test/acc"]["per_seed"] == [0.25, 0.5]
    assert summary["seed_commits"] == {"0": "same-recipe", "2": "now"}
    assert sorted(asked) == ["edited-since", "same-recipe"]  # the seed just run is not checked against itself
    assert "seed 1 left out of the summary" in capsys.readouterr().out
