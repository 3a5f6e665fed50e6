"""Every line of the README runs as written: the shell blocks after "Install" (the two commands,
the quick start) in order, in one empty folder, then each Python block there, and the Python blocks
of docs/usage.md. A command that trains gets tiny settings appended (LightningCLI: the last value
wins), nothing else is changed. A stale line (a command that exits nonzero, a block that raises, a
release the README names that does not exist) fails here."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, cli_env

import zoo

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: appended to a command that trains: one epoch of two batches, one validation batch
TINY_TRAINING = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                 "--trainer.limit_val_batches", "1", "--trainer.enable_model_summary", "false"]


def blocks(path: Path, skip_sections: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of `path`, in order, outside the `skip_sections`
    (headings)."""
    found, text = [], path.read_text()
    sections = re.split(r"^(?=## )", text, flags=re.M)
    for section in sections:
        if section.splitlines()[0].removeprefix("## ").strip() in skip_sections:
            continue
        found += [(m.group(1), m.group(2)) for m in FENCE.finditer(section)]
    return found


def commands(code: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", "", code)
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def tiny(command: str) -> str:
    words = command.split()
    return command + " " + " ".join(TINY_TRAINING) if words[:3] == ["zoo", "train", "fit"] else command


def test_the_readme_names_only_models_that_exist():
    """Every model name in the README is a registry entry, and the models table's "released
    weights" column names releases only."""
    text = (REPO / "README.md").read_text()
    prefixes = tuple(f"{p.name}_" for p in (REPO / "configs").iterdir() if p.is_dir())
    named = {n for n in re.findall(r"`([a-z][a-z0-9_]*)`", text) if n.startswith(prefixes)}
    assert named, "the README names no model"
    assert not sorted(named - set(zoo.list_models())), "the README names models that do not exist"
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ")]
    released = {n for cells in rows if len(cells) == 4 for n in re.findall(r"`([a-z][a-z0-9_]*)`", cells[2])}
    assert released and released <= set(zoo.list_models(pretrained=True)), sorted(released)


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


@pytest.mark.slow
def test_every_readme_command_and_python_block_runs(tmp_path):
    work = tmp_path / "newcomer"
    work.mkdir()
    shims = tmp_path / "bin"  # `zoo` as installed: the clone's, run by this interpreter
    shims.mkdir()
    (shims / "zoo").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m zoo.commands.cli "$@"\n')
    (shims / "zoo").chmod((shims / "zoo").stat().st_mode | stat.S_IEXEC)
    env = cli_env(ZOO_CACHE_DIR=str(tmp_path / "cache"), WANDB_DIR=str(tmp_path))
    env.pop("ZOO_DATA_DIR", None)  # the real Fashion-MNIST, as a newcomer's
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    ran = {"bash": 0, "python": 0}
    readme = blocks(REPO / "README.md", skip_sections=("Install",))
    usage = [(lang, code) for lang, code in blocks(REPO / "docs" / "usage.md") if lang == "python"]
    assert [lang for lang, _ in readme].count("bash") >= 2 and any(lang == "python" for lang, _ in readme)
    for lang, code in readme + usage:
        if lang == "bash":
            for command in commands(code):
                proc = subprocess.run(["bash", "-c", f"set -euo pipefail; {tiny(command)}"], cwd=work, env=env,
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, f"README: `{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
                ran["bash"] += 1
        elif lang == "python":
            proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, f"README: a Python block raised:\n{code}\n{proc.stderr[-3000:]}"
            ran["python"] += 1
    assert ran["bash"] >= 10 and ran["python"] >= 2, ran
