"""Release weights trained by a committed recipe: weights/<name>.safetensors, its manifest entry
(weights/MANIFEST.json) and its golden output (weights/golden/<name>.json).

    # one command re-makes a release: train with the recipe and seed, select on validation,
    # evaluate val and test (scripts/results_run.py), then release the selected checkpoint
    python scripts/release.py --remake ram_fmnist_centered
    python scripts/release.py --remake my_new_model --recipe configs/ram/fmnist_centered.yaml --seed 0

    # release a checkpoint a results run already produced
    python scripts/release.py --name ram_fmnist_centered --recipe configs/ram/fmnist_centered.yaml --seed 0 \\
        --checkpoint runs/results/ram_fmnist_centered/seed0/checkpoints/best-epoch=019.ckpt \\
        --results results/ram_fmnist_centered_seed0.json

A checkpoint whose hyperparameters differ from the recipe's, or whose results run passed train.py
other arguments, is refused: `train.py fit --config <recipe> --seed_everything <seed>` must
reproduce every release (tools/release.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ".release.lock"  # in the weights folder: one release.py writes there at a time
#: in the weights folder, while a release writes: the files it is about to write and the release it
#: replaces. What a killed release left is swept from this record, never from how names look.
PENDING = ".release.pending.json"
SHA_PREFIX = 8  # hex digits of the weights' sha256 in a release file's name: <name>-<sha8>.safetensors
sys.path.insert(0, str(ROOT))

from tools import release  # noqa: E402
from zoo import registry  # noqa: E402
from zoo.guards.budget import check_environment  # noqa: E402
from zoo.guards.errors import OneLineParser, UserError, report_user_errors  # noqa: E402
from zoo.guards.writes import atomic_write_bytes, held_lock, sweep_folder  # noqa: E402
from zoo.weights import hub  # noqa: E402


def parse_args(argv=None):
    parser = OneLineParser(prog="release.py", description=__doc__.splitlines()[0])
    parser.add_argument("--remake", metavar="NAME", help="train, select, evaluate and release NAME in one go")
    parser.add_argument("--name", help="registry name of the release, e.g. ram_fmnist_centered")
    parser.add_argument("--recipe", help="the committed config that trained it (default: the manifest's)")
    parser.add_argument("--seed", type=int, help="its --seed_everything (default: the manifest's)")
    parser.add_argument("--checkpoint", help="the selected checkpoint (a .ckpt or .safetensors)")
    parser.add_argument("--results", help="the per-seed results JSON of that checkpoint")
    return parser.parse_args(argv)


def _relative(path: str | Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def publish(name: str, recipe: str, seed: int, checkpoint: str, results: str) -> Path:
    recipe, results = _relative(recipe), _relative(results)
    recorded = json.loads((ROOT / results).read_text())
    spec = release.load_recipe(recipe)
    problems = release.override_problems(recorded.get("train_args") or [], spec)
    model = registry.load_checkpoint(checkpoint)
    problems += release.recipe_mismatches(model.zoo_config(), spec)
    problems += release.recipe_drift(recipe, recorded.get("git_commit"), recorded.get("train_args"))
    if recorded.get("seed") != seed:
        problems.append(f"{results} is seed {recorded.get('seed')}, not {seed}")
    if problems:
        raise UserError(f"{checkpoint} is not what `train.py fit --config {recipe} --seed_everything {seed}` "
                        f"trains: {'; '.join(problems)}")
    return write_release(name, model, release.describe(model, name, recipe, seed, results, sha256=""))


def write_release(name: str, model, probe: dict) -> Path:
    """Weights, golden output and manifest entry, written so that a kill at any moment leaves the old
    release or the new one usable: the new weights and golden output go to new files named by the
    weights' content (`<name>-<sha8>.safetensors`), then MANIFEST.json is replaced in one rename (the
    commit point), and only then are the old release's files removed.

    All of it runs under an exclusive lock on the weights folder (`weights/.release.lock`), and the
    manifest is read under it: a second release.py at the same time waits, then builds on the manifest
    the first one committed. Before it writes a file, the release records it (`weights/.release.pending.json`);
    leftovers of a killed run (its temporaries, the files it recorded that no manifest entry names)
    are swept under the lock too, where no live release can own them. A file the zoo did not record,
    whatever its name, is never removed, nor one whose content is not what was recorded."""
    weights = hub.weights_dir()
    weights.mkdir(parents=True, exist_ok=True)
    with held_lock(weights / LOCK, "another release.py writing this weights folder"):
        manifest = hub.manifest()
        _sweep(weights, manifest)
        data = hub.release_bytes(model, probe["config"], probe["metadata"])
        sha256 = hashlib.sha256(data).hexdigest()
        target = weights / f"{name}-{sha256[:SHA_PREFIX]}.safetensors"
        entry = {**probe, "file": target.name, "sha256": sha256}
        previous = manifest.get(name)
        # recorded before anything is written: what a kill from here on leaves is provably this release's
        atomic_write_bytes(weights / PENDING, (json.dumps({"name": name, "writing": entry["file"], "sha256": sha256,
                                                           "replacing": previous}) + "\n").encode())
        atomic_write_bytes(target, data)
        golden = release.golden_output(registry.load_checkpoint(target))
        atomic_write_bytes(release.golden_path(name, entry), (json.dumps(golden) + "\n").encode())
        _test_hook("staged")
        atomic_write_bytes(weights / "MANIFEST.json",
                           (json.dumps({**manifest, name: entry}, indent=2, sort_keys=True) + "\n").encode())
        _test_hook("committed")
        if previous and previous.get("file") != target.name:
            _remove_release(weights, name, previous)
        (weights / PENDING).unlink()
    print(f"{target} ({target.stat().st_size / 1e6:.2f} MB, sha256 {sha256[:12]}…) -> {weights / 'MANIFEST.json'}")
    return target


def _generated(name: str, file: str) -> bool:
    """`file` is a name release.py generates for release `name`: `<name>-<8 lowercase hex>.safetensors`."""
    return re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{{SHA_PREFIX}}}\.safetensors", file) is not None


def _remove_release(weights: Path, name: str, record: dict) -> None:
    """Remove the files of release `name`'s manifest record `record` (replaced, or never committed):
    its weights file only while it holds the bytes the record's sha256 names (a file of yours under
    that name is kept, with a warning), and its golden output."""
    file = record.get("file")
    if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
        return  # not a plain name inside the folder: nothing of ours to remove
    path, golden = weights / file, release.golden_path(name, record)
    expected = None  # the golden output these weights answer, worked out while they are still here
    if path.is_file() and not path.is_symlink():
        if hub.sha256_file(path) != record.get("sha256"):
            warnings.warn(f"kept {path}: it is not the file release {name} recorded (its sha256 differs)",
                          UserWarning, stacklevel=2)
            return
        expected = release.golden_output(registry.load_checkpoint(path))
        path.unlink()
    # the golden output goes only while it holds what the removed weights answer: one the user edited
    # or put there, or one whose weights are already gone (nothing left to prove it by), is kept
    if golden.is_file() and not golden.is_symlink():
        try:
            ours = expected is not None and release.golden_mismatch(json.loads(golden.read_bytes()), expected) is None
        except (OSError, ValueError):
            ours = False
        if ours:
            golden.unlink()
        else:
            warnings.warn(f"kept {golden}: it is not the golden output release {name} wrote", UserWarning, stacklevel=2)


def _sweep(weights: Path, manifest: dict) -> None:
    """What a release killed between two steps of `write_release` leaves: its temporaries (of the
    manifest, of each release file), and the files its record (PENDING) names: the new release's
    when the manifest never took it, the replaced one's when it did. Nothing else: a file is the
    zoo's when the zoo recorded it, never because its name looks like one. Called under the
    folder's lock, so no live writer's."""
    sweep_folder(weights)
    sweep_folder(release.golden_dir())
    pending = weights / PENDING
    if not pending.exists():
        return
    try:
        record = json.loads(pending.read_text())
        name, file = record["name"], record["writing"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{pending}: not a release record ({exc}); nothing swept by it", UserWarning, stacklevel=2)
        return
    named = {entry["file"] for entry in manifest.values()}  # a file some release names stays, whoever wrote it
    committed = (manifest.get(name) or {}).get("file") == file
    if not committed and isinstance(name, str) and isinstance(file, str) and _generated(name, file) \
            and file not in named:
        _remove_release(weights, name, {"file": file, "sha256": record.get("sha256")})
    replaced = record.get("replacing")
    if committed and isinstance(replaced, dict) and replaced.get("file") not in named:
        _remove_release(weights, name, replaced)
    pending.unlink()


def _test_hook(point: str) -> None:
    """ZOO_TEST_KILL_RELEASE_AT=staged|committed: the tests' deterministic kill -9 at that point."""
    if os.environ.get("ZOO_TEST_KILL_RELEASE_AT") == point:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def remake(name: str, recipe: str | None, seed: int | None) -> Path:
    entry = hub.manifest().get(name, {}).get("metadata") or {}
    recipe, seed = recipe or entry.get("recipe"), entry.get("seed", 0) if seed is None else seed
    if not recipe:
        raise UserError(f"'{name}' is not released yet: give --recipe (and --seed)")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "results_run.py"), recipe, "--seeds", str(seed),
                    "--name", name], cwd=ROOT, check=True)
    record = ROOT / "results" / f"{name}_seed{seed}.json"
    checkpoint = json.loads(record.read_text())["checkpoint"]
    return publish(name, recipe, seed, str(ROOT / checkpoint), str(record))


def main(argv=None) -> int:
    args = parse_args(argv)

    def run():
        check_environment()  # every setting read from the environment, before any work
        if args.remake:
            remake(args.remake, args.recipe, args.seed)
            return 0
        if not all((args.name, args.recipe, args.checkpoint, args.results)) or args.seed is None:
            raise UserError("give --remake NAME, or --name, --recipe, --seed, --checkpoint and --results")
        publish(args.name, args.recipe, args.seed, args.checkpoint, args.results)
        return 0

    return report_user_errors("release.py", run)


if __name__ == "__main__":
    sys.exit(main())
