"""Run every bad-input case of the entry points as a user would (a real process each) and print a
table: the case, the exit code, how many lines went to stderr, and the first of them, the seconds and
the peak memory (each case runs under an address-space cap, --cap-gb, so that a regression cannot
take the machine). Each case that names code to run checks that its marker file never appears.
Then a peak-memory table per command (the most any of its cases took, against the budget), and a
short fuzz run of the ten kinds of untrusted input (tools/fuzz.py, --fuzz-seconds) with its summary.

    python scripts/bad_input_report.py [--json results/bad_input_report.json] [--only TEXT]

It writes a tiny Fashion-MNIST (the tests' generator) and its files under a temporary folder; a
few cases need a short training run, made once, and two captioner exports.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the table as JSON")
    parser.add_argument("--only", help="run only the cases whose title contains this text")
    parser.add_argument("--cap-gb", type=float, default=10.0, help="address space each case may map (GB)")
    parser.add_argument("--fuzz-seconds", type=float, default=120.0, help="the fuzz run's length (0: none)")
    args = parser.parse_args(argv)

    import torch
    import yaml
    from PIL import Image
    from safetensors.torch import save_file

    from conftest import write_fashion_mnist
    from zoo.models.baselines import Classifier
    from zoo.weights import hub

    work = Path(tempfile.mkdtemp(prefix="zoo-bad-input-"))
    data = work / "data"
    write_fashion_mnist(data, gz=True)
    env = {**os.environ, "ZOO_DATA_DIR": str(data), "ZOO_CACHE_DIR": str(work / "cache"), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "ZOO_DOWNLOAD_TIMEOUT": "2"}
    py = sys.executable
    recipe = str(ROOT / "configs/baseline/mlp_centered.yaml")
    tiny = ["--data.init_args.val_size=100", "--data.init_args.batch_size=32"]

    def fit(root, *extra):
        return [py, str(ROOT / "train.py"), "fit", "--config", recipe, f"--trainer.default_root_dir={work / root}",
                *tiny, *extra]

    # files the cases need
    marker = work / "MARKER"
    evil = {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}
    save_file({"w": torch.zeros(1)}, str(work / "evil.safetensors"), metadata={"zoo_config": json.dumps(evil)})
    torch.save({"state_dict": {"w": torch.zeros(1)}, "zoo": evil}, work / "evil_config.ckpt")
    model = Classifier(arch="mlp", hidden=[8])
    torch.save({"state_dict": model.state_dict(), "zoo": {**model.zoo_config(), "data": evil}}, work / "evil_data.ckpt")
    served = work / "served"
    served.mkdir()
    torch.save({"state_dict": {}, "epoch": Payload(marker)}, served / "payload.ckpt")
    (served / "page.safetensors").write_text("<!DOCTYPE html><html>sign in</html>")
    image = work / "scene.png"
    Image.new("RGB", (64, 64)).save(image)
    for name, text in {"empty": "", "list": "- a\n", "invalid": "model: [\n",
                       "lots": yaml.safe_dump({**(r := yaml.safe_load(Path(recipe).read_text())), "data": {
                           **r["data"], "init_args": {**(r["data"].get("init_args") or {}), "batch_size": "lots"}}}),
                       "typo_class": Path(recipe).read_text().replace("baselines.Classifier", "baselines.Clasifier")}.items():
        (work / f"{name}.yaml").write_text(text)
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    trained = work / "trained"
    subprocess.run(fit("trained", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                       "--trainer.limit_val_batches=1", "--trainer.logger=false"), env=env, capture_output=True,
                   check=True)
    half = work / "half" / "checkpoints"
    half.mkdir(parents=True)
    good = (trained / "checkpoints" / "last.ckpt").read_bytes()
    (half / "best-epoch=000.ckpt").write_bytes(good)
    (half / "last.ckpt").write_bytes(good[: len(good) // 2])
    # small files that would take gigabytes (issue: limits before work)
    laughs = ["zoo.models.ram.RAM"]
    for _ in range(30):
        laughs = [laughs] * 10  # 10**30 leaves once expanded, 30 lists in the pickle memo
    torch.save({"state_dict": {}, "zoo": {"class_path": laughs}}, work / "memo_bomb.ckpt")
    resume_bomb = work / "resume_bomb" / "checkpoints"
    resume_bomb.mkdir(parents=True)
    torch.save({"state_dict": {}, "hyper_parameters": {"hidden": laughs}}, resume_bomb / "last.ckpt")
    anchors = ["z: ", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    anchors += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]
    (work / "anchor_bomb.yaml").write_text("\n".join(anchors) + "\n" + Path(recipe).read_text())
    (work / "deep.yaml").write_text("model: " + "[" * 200_000 + "]" * 200_000 + "\n")
    save_file({"w": torch.zeros(1)}, str(work / "deep.safetensors"), metadata={"zoo_config": "[" * 200_000 + "]" * 200_000})
    save_file({"w": torch.zeros(1)}, str(work / "long.safetensors"),
              metadata={"zoo_config": json.dumps({"class_path": "zoo." + "x" * 50_000_000})})
    for name, args_, data_ in (("wide", {"hidden": [60000]}, {}), ("billion", {}, {"limit_eval": 10**9})):
        config = model.zoo_config()
        config["init_args"].update(args_)
        config["data"] = {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
                          "init_args": {"variant": "centered", **data_}}
        hub.save_release(model, config, work / f"{name}.safetensors")
    (work / "photos").mkdir()
    (work / "photos" / "holiday.jpg").write_bytes(b"mine")
    cli_bomb = "[" + ", ".join(["&a0 [x, x, x, x, x, x, x, x, x, x]"] +
                               [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]) + "]"

    (work / "coco.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "scene.png"}],
                                                "annotations": [{"id": 1, "image_id": 1, "caption": "a shirt"}]}))
    import bad_input_cases

    files = bad_input_cases.build(work, ROOT, trained)
    exported = bad_input_cases.exports(work, ROOT, py, env)
    (served / "w.safetensors").write_bytes((ROOT / "weights/vit_fmnist.safetensors").read_bytes())
    zoo = [py, "-m", "zoo.commands.cli"]
    cases = [
        ("safetensors config naming os.system: zoo caption", zoo + ["caption", str(image), "--checkpoint", str(work / "evil.safetensors")]),
        ("safetensors config naming os.system: eval.py", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "evil.safetensors")]),
        (".ckpt config naming os.system: eval.py", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "evil_config.ckpt")]),
        ("data config naming os.system: eval.py", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "evil_data.ckpt")]),
        ("pickle payload at a URL: train.py fit --ckpt_path", fit("r1", "--ckpt_path", f"{url}/payload.ckpt", "--sha256",
                                                                    hub.sha256_file(served / "payload.ckpt"))),
        ("pickle payload, local: train.py fit --ckpt_path", fit("r2", "--ckpt_path", str(served / "payload.ckpt"))),
        ("typo'd key --trainer.max_epoch", fit("r3", "--trainer.max_epoch", "1")),
        ("missing config file", fit("r4", "--config", str(work / "nope.yaml"))),
        ("wrong type (batch_size: lots)", fit("r5", "--config", str(work / "lots.yaml"))),
        ("unknown class (Clasifier)", fit("r6", "--config", str(work / "typo_class.yaml"))),
        ("empty YAML", fit("r7", "--config", str(work / "empty.yaml"))),
        ("YAML list", fit("r8", "--config", str(work / "list.yaml"))),
        ("invalid YAML", fit("r9", "--config", str(work / "invalid.yaml"))),
        ("--data.init_args.batch_size -5", fit("r10", "--data.init_args.batch_size", "-5")),
        ("unwritable --trainer.default_root_dir", fit("r11", "--trainer.default_root_dir", "/sys/zoo-run")),
        ("--ckpt_path last, last.ckpt truncated", fit("half", "--ckpt_path", "last")),
        ("--ckpt_path with a changed lr", fit("trained", "--ckpt_path", "last", "--model.init_args.lr", "0.5")),
        ("--ckpt_path a released .safetensors", fit("r12", "--ckpt_path", str(ROOT / "weights/vit_fmnist.safetensors"))),
        ("a second run into an earlier run's dir", fit("trained")),
        ("--init_from another family", fit("r13", "--init_from", str(ROOT / "weights/vit_fmnist.safetensors"))),
        ("eval.py --json unwritable", [py, str(ROOT / "eval.py"), "--checkpoint", str(trained / "checkpoints/last.ckpt"),
                                        "--json", "/sys/zoo/out.json"]),
        ("zoo caption --attention-dir under a file", zoo + ["caption", str(image), "--attention-dir", str(image / "x")]),
        ("zoo attend --out under a file", zoo + ["attend", str(image), "--model", "ram_fmnist_centered", "--out",
                                                 str(image / "x")]),
        ("HTML page as weights (unpinned URL)", zoo + ["caption", str(image), "--checkpoint", f"{url}/page.safetensors"]),
        ("HTML page as weights (pinned URL)", zoo + ["caption", str(image), "--checkpoint", f"{url}/page.safetensors",
                                                     "--sha256", "0" * 64]),
        ("zoo sample with a classifier", zoo + ["sample", "--model", "draw_cluttered100_classifier", "--out",
                                                 str(work / "s.png")]),
        ("zoo sample --n 0", zoo + ["sample", "--model", "draw_fmnist_t16", "--n", "0", "--out", str(work / "s.png")]),
        ("zoo sample --out under a file", zoo + ["sample", "--model", "draw_fmnist_t16", "--out",
                                                  str(image / "s.png")]),
        ("captioner backbone weight of another input size", [py, str(ROOT / "train.py"), "fit", "--config",
                                                             str(ROOT / "configs/sat/soft_scenes.yaml"),
                                                             "--model.init_args.backbone.pretrained", "vit_fmnist",
                                                             "--model.init_args.backbone.kind", "timm_vit",
                                                             f"--trainer.default_root_dir={work / 'r14'}"]),
        ("a COCO captions file given as a Karpathy split", [py, str(ROOT / "train.py"), "fit", "--config",
                                                           str(ROOT / "configs/sat/coco_soft.yaml"),
                                                           "--data.init_args.karpathy_json", str(work / "coco.json"),
                                                           "--data.init_args.image_root", str(work),
                                                           "--model.init_args.backbone.pretrained", "false",
                                                           f"--trainer.default_root_dir={work / 'r15'}"]),
        ("pickle-memo bomb as zoo.class_path (3 KB .ckpt): eval.py", [py, str(ROOT / "eval.py"), "--checkpoint",
                                                                      str(work / "memo_bomb.ckpt")]),
        ("pickle-memo bomb in a resume checkpoint's hyper_parameters", fit("resume_bomb", "--ckpt_path", "last")),
        ("YAML anchor bomb in a recipe", [py, str(ROOT / "train.py"), "fit", "--config", str(work / "anchor_bomb.yaml"),
                                          f"--trainer.default_root_dir={work / 'r20'}"]),
        ("YAML anchor bomb in a command-line value", fit("r21", "--model.init_args.hidden", cli_bomb)),
        ("a recipe nested 200,000 deep", [py, str(ROOT / "train.py"), "fit", "--config", str(work / "deep.yaml")]),
        ("a weights config nested 200,000 deep", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "deep.safetensors")]),
        ("a 50 MB class_path", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "long.safetensors")]),
        ("hidden: [60000] in a weights file", [py, str(ROOT / "eval.py"), "--checkpoint", str(work / "wide.safetensors")]),
        ("limit_eval: 1e9 in a weights file's data config", [py, str(ROOT / "eval.py"), "--checkpoint",
                                                             str(work / "billion.safetensors")]),
        ("file:///dev/zero as a checkpoint URL", [py, str(ROOT / "eval.py"), "--checkpoint", "file:///dev/zero"]),
        ("ftp:// checkpoint URL", [py, str(ROOT / "eval.py"), "--checkpoint", "ftp://example.org/w.safetensors"]),
        ("zoo export into a folder of other files", zoo + ["export", "--model", "vit_fmnist", "--out",
                                                           str(work / "photos")]),
        ("--ckpt_path last with no last.ckpt", fit("r22", "--ckpt_path", "last")),
        ("resume with a changed val_size", fit("trained", "--ckpt_path", "last", "--data.init_args.val_size=50",
                                               "--trainer.logger=false")),
        ("zoo with no command", zoo),
        ("zoo frobnicate", zoo + ["frobnicate"]),
    ]
    cases = [(case, command, {}) for case, command in cases]
    cases += bad_input_cases.cases(work, ROOT, py, files, image, url, exported)
    cap = int(args.cap_gb * 2**30)
    rows = []
    for case, command, extra in cases:
        if args.only and args.only not in case:
            continue
        started = time.perf_counter()
        before = {p.name for p in work.iterdir()}
        # GNU time reports the peak memory (KB) as the last stderr line
        process = subprocess.Popen(["/usr/bin/time", "-f", "%M", *command], env={**env, **extra}, cwd=work,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
        try:
            _, stderr = process.communicate(timeout=600)
            code = process.returncode
        except subprocess.TimeoutExpired:  # the case and everything it started
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            code, stderr = "timeout after 600 s", ""
        seconds = time.perf_counter() - started
        lines = [line for line in stderr.splitlines() if line.strip()]
        peak_kb = int(lines.pop()) if lines and lines[-1].strip().isdigit() else None
        lines = [line for line in lines if not line.startswith(("Command exited with non-zero status",
                                                                "Command terminated by signal"))]
        rows.append({"case": case, "command": _command_name(command), "exit": code, "stderr_lines": len(lines),
                     "first_line": lines[0][:300] if lines else "", "marker": marker.exists(),
                     "seconds": round(seconds, 1), "peak_mb": round(peak_kb / 1024) if peak_kb else None,
                     "created": sorted({p.name for p in work.iterdir()} - before)})
    server.shutdown()
    print("| case | exit code | stderr lines | seconds | peak MB | stderr |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['exit']} | {r['stderr_lines']} | {r['seconds']} | {r['peak_mb']} | "
              f"{r['first_line'][:160]} |")
    print(f"\nmarker file created by any case: {any(r['marker'] for r in rows)}")
    memory = peak_memory_table(rows)
    fuzzed = None
    if args.fuzz_seconds > 0:
        sys.path.insert(0, str(ROOT / "tools"))
        from fuzz import fuzz

        fuzzed = fuzz(args.fuzz_seconds, log=lambda line: None)
        print(f"\nfuzz: {fuzzed['cases']} cases of {len(fuzzed['kinds'])} kinds in {fuzzed['seconds']} s, "
              f"{fuzzed['failures']} failures")
        print("| kind | cases | correct | refused in one line | failures |\n|---|---|---|---|---|")
        for kind, counts in fuzzed["kinds"].items():
            print(f"| {kind} | {counts['cases']} | {counts['ok']} | {counts['refused']} | {len(counts['failures'])} |")
    if args.json:
        from zoo.results import write_json

        write_json(args.json, {"cases": rows, "peak_memory": memory, "fuzz": fuzzed})
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _command_name(command: list[str]) -> str:
    """The entry point a case runs: `zoo caption`, `eval.py`, `train.py fit`, a script's name."""
    words = [Path(c).name if c.endswith(".py") else c for c in command[1:]]
    if words[:2] == ["-m", "zoo.commands.cli"]:
        return " ".join(["zoo", *words[2:3]])
    if words[:1] == ["-c"]:
        return "python -c (zoo.load_export)"
    return " ".join(words[:2] if words[:1] == ["train.py"] else words[:1])


def peak_memory_table(rows: list[dict]) -> list[dict]:
    """Per command: its cases, the most memory any of them took (peak RSS, MB), and the budget."""
    from zoo.guards.budget import limit

    budget = limit("memory_mb")
    budget = round(budget) if budget != float("inf") else None  # a tree from before the budget
    table = []
    for command in sorted({r["command"] for r in rows}):
        mine = [r for r in rows if r["command"] == command]
        top = max(mine, key=lambda r: r["peak_mb"] or 0)
        table.append({"command": command, "cases": len(mine), "peak_mb": top["peak_mb"], "worst_case": top["case"],
                      "budget_mb": budget})
    print("\n| command | cases | peak MB (any case) | that case | budget MB |\n|---|---|---|---|---|")
    for t in table:
        print(f"| {t['command']} | {t['cases']} | {t['peak_mb']} | {t['worst_case']} | {t['budget_mb']} |")
    return table


if __name__ == "__main__":
    sys.exit(main())
