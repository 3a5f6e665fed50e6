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


def test_a_stale_checkpoint_is_never_evaluated_and_the_starting_commit_is_recorded(tmp_path, monkeypatch):
    script = _load_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()
    stale = tmp_path / "runs/results/fam_recipe/seed0/checkpoints"
    stale.mkdir(parents=True)
    (stale / "best-epoch=007.ckpt").write_bytes(b"an earlier run's best")  # sorts after this run's

    calls = []

    def fake_run(cmd):
        calls.append(cmd)
        if cmd[1] == "train.py":
            checkpoints = tmp_path / cmd[cmd.index("--trainer.default_root_dir") + 1] / "checkpoints"
            checkpoints.mkdir(parents=True, exist_ok=True)
            (checkpoints / "best-epoch=002.ckpt").write_bytes(b"this run's best")
        else:
            split = cmd[cmd.index("--split") + 1]
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(
                {"metrics": {f"{split}/acc": 0.5}, "config": {"model": {}}, "parameters": 1234}))

    monkeypatch.setattr(script, "run", fake_run)
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
