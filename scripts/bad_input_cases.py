"""The bad-input cases of memory, export sets, environment and config mistakes and model-supplied text
(scripts/bad_input_report.py runs them with the earlier ones): the files they need and the commands.
Each case is (title, command, extra environment)."""
from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path


def _release(work: Path, name: str, base: str, init_args: dict | None = None, data_args: dict | None = None,
             state: dict | None = None, raw_config: str | None = None) -> Path:
    """A .safetensors whose zoo config is the release `base`'s with `init_args` on top (tiny weights:
    what these cases test happens before any weight loads)."""
    import torch
    from safetensors.torch import save_file

    from zoo.weights import hub

    config = json.loads(json.dumps(hub.manifest()[base]["config"]))
    config["init_args"].update(init_args or {})
    if data_args:
        config["data"]["init_args"].update(data_args)
    path = work / f"{name}.safetensors"
    save_file(state or {"w": torch.zeros(1)}, str(path),
              metadata={"zoo_config": raw_config if raw_config is not None else json.dumps(config)})
    return path


def _own_release(work: Path, name: str, base: str, init_args: dict) -> Path:
    """A whole release of the model `base`'s config with `init_args` on top, built directly (its
    constructor allocates little; what it asks for comes later) with its own random weights."""
    from zoo.classes import resolve_class
    from zoo.weights import hub

    config = json.loads(json.dumps(hub.manifest()[base]["config"]))
    config["init_args"].update(init_args)
    model = resolve_class(config["class_path"])(**config["init_args"])
    path = work / f"{name}.safetensors"
    hub.save_release(model, config, path)
    return path


def _poisoned_release(work: Path, name: str, base: str, init_args: dict, poison=None) -> Path:
    """A whole release of `base` (its real weights) with its config changed (class names, a
    vocabulary) and, with `poison`, every floating tensor filled with that value."""
    import torch
    from safetensors.torch import load_file, save_file

    from zoo.weights import hub

    record = hub.manifest()[base]
    config = json.loads(json.dumps(record["config"]))
    config["init_args"].update(init_args)
    state = load_file(str(hub.fetch_release(base)))
    if poison is not None:
        state = {k: torch.full_like(v, poison) if v.is_floating_point() else v for k, v in state.items()}
    path = work / f"{name}.safetensors"
    save_file(state, str(path), metadata={"zoo_config": json.dumps(config)})
    return path


def _overclaiming_ckpt(good: Path, out: Path) -> Path:
    """`good` (a zip .ckpt) with its largest member's declared size in the central directory and
    local header set to 4 GB."""
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    huge = 0xFFFF0000
    local = info.header_offset
    struct.pack_into("<II", data, local + 18, huge, huge)  # compressed, uncompressed sizes
    # the central directory record of that member
    name = info.filename.encode()
    at = data.rfind(b"PK\x01\x02" + data[local + 4: local + 6])
    while at != -1:
        n = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46: at + 46 + n]) == name:
            struct.pack_into("<II", data, at + 20, huge, huge)
            break
        at = data.rfind(b"PK\x01\x02", 0, at)
    out.write_bytes(bytes(data))
    return out


def build(work: Path, ROOT: Path, trained: Path):
    import torch
    from PIL import Image

    from zoo.weights import hub

    files = {}
    files["wide_sat"] = _release(work, "wide_sat", "sat_soft_scenes",
                                 {"decoder": {**hub.manifest()["sat_soft_scenes"]["config"]["init_args"]["decoder"],
                                              "hidden_dim": 16384}})
    files["wide_draw"] = _release(work, "wide_draw", "draw_fmnist_t16", {"enc_size": 16384, "dec_size": 16384})
    files["mlp_ratio"] = _release(work, "mlp_ratio", "vit_fmnist", {"mlp_ratio": 100000.0})
    files["conv_stem"] = _release(work, "conv_stem", "vit_fmnist", {"conv_stem": [16384, 16384]})
    files["ram_scale"] = _own_release(work, "ram_scale", "ram_fmnist_centered",
                                      {"retina": {"patch_size": 8, "num_scales": 13, "scale_factor": 2, "method": "crop"}})
    files["digits"] = _release(work, "digits", "vit_fmnist", raw_config='{"class_path": "zoo.models.vit.ViTClassifier", '
                               '"init_args": {"depth": 1' + "0" * 5000 + "}}")
    files["hidden_nan"] = _release(work, "hidden_nan", "vit_fmnist", {"embed_dim": 60000})
    tag = '<!--<script>'
    files["html_names"] = _poisoned_release(work, "html_names", "vit_fmnist",
                                            {"class_names": [f"{tag}{i}" for i in range(10)]})
    files["ansi_words"] = _poisoned_release(work, "ansi_words", "sat_soft_scenes", {})
    config = json.loads(json.dumps(hub.manifest()["sat_soft_scenes"]["config"]))
    vocab = config["init_args"]["vocab"]
    config["init_args"]["vocab"] = vocab[:4] + [f"\x1b[31m\x1b]0;pwned\x07{w}" for w in vocab[4:]]
    from safetensors.torch import load_file, save_file
    state = load_file(str(files["ansi_words"]))
    save_file(state, str(files["ansi_words"]), metadata={"zoo_config": json.dumps(config)})
    files["nan_ram"] = _poisoned_release(work, "nan_ram", "ram_fmnist_centered", {}, poison=float("nan"))
    config = json.loads(json.dumps(hub.manifest()["sat_soft_scenes"]["config"]))
    config["init_args"]["vocab"] = [1, 2, None, {"x": 1}, 5.5]
    files["bad_vocab"] = work / "bad_vocab.safetensors"
    save_file(load_file(str(hub.fetch_release("sat_soft_scenes"))), str(files["bad_vocab"]),
              metadata={"zoo_config": json.dumps(config)})
    # a checkpoint of another family without its zoo config or hyperparameters (stripped)
    vit_state = load_file(str(hub.fetch_release("vit_fmnist")))
    torch.save({"state_dict": vit_state, "global_step": 3, "epoch": 0}, work / "stripped_vit.ckpt")
    _overclaiming_ckpt(trained / "checkpoints" / "last.ckpt", work / "overclaim.ckpt")
    # 20,000 boxes for one image (about 320 KB), and --boxes nested 100,000 deep
    canvas = work / "canvas28.png"
    Image.new("L", (28, 28)).save(canvas)
    (work / "boxes20k.json").write_text(json.dumps({str(canvas): [[0, 0, 28, 28]] * 20000}))
    (work / "deep_boxes.json").write_text("[" * 100_000 + "]" * 100_000)
    # folders that are files, or read-only
    (work / "a_file").write_text("not a folder")
    # weights manifests
    for name, text in {"bad_json": "{", "list": "[1, 2]", "wrong_types": '{"sat_soft_scenes": 5}',
                       "deep": "[" * 100_000 + "]" * 100_000}.items():
        folder = work / f"manifest_{name}"
        folder.mkdir()
        (folder / "MANIFEST.json").write_text(text)
    # recipes: the clone's, plus one unparsable
    configs = work / "configs"
    shutil.copytree(ROOT / "configs", configs)
    family_folder = next(p for p in sorted(configs.iterdir()) if p.is_dir() and p.name != "base")
    (family_folder / "broken.yaml").write_text("model: [\n  class_path: x\n")
    return files


def cases(work: Path, ROOT: Path, py: str, files: dict, image: Path, url: str, exports: dict) -> list:
    zoo = [py, "-m", "zoo.commands.cli"]
    ev = [py, str(ROOT / "eval.py")]
    fit = lambda root, *a: [py, str(ROOT / "train.py"), "fit", f"--trainer.default_root_dir={work / root}", *a]
    mlp = ["--config", str(ROOT / "configs/baseline/mlp_centered.yaml"), "--data.init_args.val_size=100",
           "--data.init_args.batch_size=32"]
    canvas = str(work / "canvas28.png")
    onnx = [py, str(ROOT / "docs/examples/onnx_caption.py")]
    # a user's script calling the public zoo.load_export: a UserError is its one line, exit 2
    load = lambda folder: [py, "-c", "import sys, zoo\ntry:\n    zoo.load_export(sys.argv[1]); print('loaded')\n"
                           "except zoo.UserError as exc:\n    print(f'load_export: error: {exc}', file=sys.stderr); sys.exit(2)",
                           str(folder)]
    return [
        # 1. memory
        ("captioner hidden_dim 16384 (4.3 GB): zoo caption", zoo + ["caption", str(image), "--checkpoint", str(files["wide_sat"])], {}),
        ("DRAW enc_size/dec_size 16384: zoo sample", zoo + ["sample", "--checkpoint", str(files["wide_draw"]), "--out", str(work / "s.png")], {}),
        ("FashionScenes num_train 10,000,000: train.py fit", fit("m3", "--config", str(ROOT / "configs/sat/soft_scenes.yaml"),
                                                                  "--data.init_args.num_train=10000000"), {}),
        ("ViT mlp_ratio 100000 (no limit named it): eval.py", ev + ["--checkpoint", str(files["mlp_ratio"])], {}),
        ("ViT conv_stem [16384, 16384]: eval.py", ev + ["--checkpoint", str(files["conv_stem"])], {}),
        ("RAM retina of 13 scales x 2 (crop): zoo attend", zoo + ["attend", canvas, "--checkpoint", str(files["ram_scale"]),
                                                               "--out", str(work / "g")], {}),
        ("--boxes with 20,000 boxes (320 KB): zoo attend", zoo + ["attend", canvas, "--model", "vit_fmnist", "--out",
                                                                  str(work / "a1"), "--boxes", str(work / "boxes20k.json")], {}),
        ("--beam-size 1000000: zoo caption", zoo + ["caption", str(image), "--beam-size", "1000000"], {}),
        ("zoo export --max-len 1000000", zoo + ["export", "--model", "sat_soft_scenes", "--max-len", "1000000", "--out",
                                                str(work / "x1")], {}),
        ("ZOO_LIMITS=embed_dim=nan, embed_dim 60000 in a weights file: eval.py", ev + ["--checkpoint", str(files["hidden_nan"])],
         {"ZOO_LIMITS": "embed_dim=nan"}),
        (".ckpt whose zip record declares 4 GB: eval.py", ev + ["--checkpoint", str(work / "overclaim.ckpt")], {}),
        # 2. export sets
        ("onnx_caption.py with decoder_step.onnx of another model", onnx + [str(exports["mixed"]), str(image)], {}),
        ("onnx_caption.py with a cut vocabulary", onnx + [str(exports["cut_vocab"]), str(image)], {}),
        ("onnx_caption.py with a 60000 px input size", onnx + [str(exports["huge_size"]), str(image)], {}),
        ("onnx_caption.py --beam-size 3000000", onnx + [str(exports["good"]), str(image), "--beam-size", "3000000"], {}),
        ("load_export: a file named ../outside", load(exports["dotdot"]), {}),
        ("load_export: an absolute file name", load(exports["absolute"]), {}),
        ('load_export: "files": {}', load(exports["empty"]), {}),
        ("load_export: export.json is a list", load(exports["list"]), {}),
        ("load_export: export.json is null", load(exports["null"]), {}),
        ("load_export: export.json nested 100,000 deep", load(exports["deep"]), {}),
        # 3. one line
        ("ZOO_DOWNLOAD_TIMEOUT=soon: zoo caption --checkpoint URL", zoo + ["caption", str(image), "--checkpoint",
                                                                          f"{url}/w.safetensors"], {"ZOO_DOWNLOAD_TIMEOUT": "soon"}),
        ("ZOO_DOWNLOAD_TIMEOUT=nan", zoo + ["caption", str(image), "--checkpoint", f"{url}/w.safetensors"], {"ZOO_DOWNLOAD_TIMEOUT": "nan"}),
        ("ZOO_DOWNLOAD_TIMEOUT=-1", zoo + ["caption", str(image), "--checkpoint", f"{url}/w.safetensors"], {"ZOO_DOWNLOAD_TIMEOUT": "-1"}),
        ("ZOO_MAX_DOWNLOAD_MB=inf", zoo + ["caption", str(image), "--checkpoint", f"{url}/w.safetensors"], {"ZOO_MAX_DOWNLOAD_MB": "inf"}),
        ("ZOO_MAX_DOWNLOAD_MB=nan", zoo + ["caption", str(image), "--checkpoint", f"{url}/w.safetensors"], {"ZOO_MAX_DOWNLOAD_MB": "nan"}),
        ("ZOO_MAX_DOWNLOAD_MB=-5", zoo + ["caption", str(image), "--checkpoint", f"{url}/w.safetensors"], {"ZOO_MAX_DOWNLOAD_MB": "-5"}),
        ("ZOO_CACHE_DIR is a file: zoo caption --checkpoint URL", zoo + ["caption", str(image), "--checkpoint",
                                                                         f"{url}/w.safetensors"], {"ZOO_CACHE_DIR": str(work / "a_file")}),
        ("ZOO_CACHE_DIR read-only (/sys): zoo caption --checkpoint URL", zoo + ["caption", str(image), "--checkpoint",
                                                                                f"{url}/w.safetensors"], {"ZOO_CACHE_DIR": "/sys/zoo-cache"}),
        ("ZOO_DATA_DIR is a file: eval.py --model sat_soft_scenes", ev + ["--model", "sat_soft_scenes", "--data", "num_test=8"],
         {"ZOO_DATA_DIR": str(work / "a_file")}),
        ("ZOO_DATA_DIR read-only (/sys): eval.py --model sat_soft_scenes", ev + ["--model", "sat_soft_scenes", "--data", "num_test=8"],
         {"ZOO_DATA_DIR": "/sys/zoo-data"}),
        ("WANDB_MODE=ofline: train.py fit", fit("w1", *mlp, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
                                                "--trainer.limit_val_batches=1"), {"WANDB_MODE": "ofline"}),
        ("ZOO_LIMITS=hidden_size: zoo list", zoo + ["list"], {"ZOO_LIMITS": "hidden_size"}),
        ("malformed weights MANIFEST.json: zoo list", zoo + ["list"], {"ZOO_WEIGHTS_DIR": str(work / "manifest_bad_json")}),
        ("MANIFEST.json a list: zoo list", zoo + ["list"], {"ZOO_WEIGHTS_DIR": str(work / "manifest_list")}),
        ("MANIFEST.json with a number as a record: zoo list", zoo + ["list"], {"ZOO_WEIGHTS_DIR": str(work / "manifest_wrong_types")}),
        ("MANIFEST.json nested 100,000 deep: zoo list", zoo + ["list"], {"ZOO_WEIGHTS_DIR": str(work / "manifest_deep")}),
        ("one unparsable recipe in configs/: zoo list", zoo + ["list"], {"ZOO_CONFIG_DIR": str(work / "configs")}),
        ("one unparsable recipe in configs/: zoo caption", zoo + ["caption", str(image)], {"ZOO_CONFIG_DIR": str(work / "configs")}),
        ("5000-digit integer in a weights config: eval.py", ev + ["--checkpoint", str(files["digits"])], {}),
        ("--boxes nested 100,000 deep: zoo attend", zoo + ["attend", canvas, "--model", "vit_fmnist", "--out", str(work / "a2"),
                                                           "--boxes", str(work / "deep_boxes.json")], {}),
        ("--init_vocab release with a vocabulary of non-strings", fit("v1", "--config", str(ROOT / "configs/sat/soft_scenes.yaml"),
                                                                     "--init_from", str(files["bad_vocab"]), "--init_vocab", "release"), {}),
        ("another family's stripped checkpoint to --ckpt_path", fit("s1", *mlp, "--ckpt_path", str(work / "stripped_vit.ckpt")), {}),
        # 4. model-supplied text
        ("class names '<!--<script>': zoo attend --html", zoo + ["attend", canvas, "--checkpoint", str(files["html_names"]),
                                                                 "--out", str(work / "h"), "--html", str(work / "h" / "report.html")], {}),
        ("terminal escapes in a checkpoint's words: zoo caption", zoo + ["caption", str(image), "--checkpoint", str(files["ansi_words"])], {}),
        ("NaN weights: zoo attend", zoo + ["attend", canvas, "--checkpoint", str(files["nan_ram"]), "--out", str(work / "n")], {}),
        ("NaN weights: zoo attend --json", zoo + ["attend", canvas, "--checkpoint", str(files["nan_ram"]), "--out",
                                                  str(work / "n3"), "--json"], {}),
    ]


def exports(work: Path, ROOT: Path, py: str, env: dict):
    """A captioner export and its damaged neighbours."""
    import subprocess

    out = {}
    for name in ("sat_soft_scenes", "sat_hard_scenes"):
        subprocess.run([py, "-m", "zoo.commands.cli", "export", "--model", name, "--out", str(work / f"export_{name}")],
                       env=env, check=True, capture_output=True)
    good = work / "export_sat_soft_scenes"
    out["good"] = good

    def variant(name, change=None, manifest_text=None):
        folder = work / f"export_{name}"
        shutil.copytree(good, folder)
        if change:
            manifest = json.loads((folder / "export.json").read_text())
            change(manifest, folder)
            (folder / "export.json").write_text(json.dumps(manifest))
        if manifest_text is not None:
            (folder / "export.json").write_text(manifest_text)
        out[name] = folder

    variant("mixed", lambda m, f: shutil.copy(work / "export_sat_hard_scenes" / "decoder_step.onnx", f / "decoder_step.onnx"))
    variant("cut_vocab", lambda m, f: m.update(vocabulary=m["vocabulary"][:5]))
    variant("huge_size", lambda m, f: m["preprocessing"].update(size=[60000, 60000]))
    outside = work / "outside.bin"
    outside.write_bytes(b"x")
    from zoo.weights.hub import sha256_file
    variant("dotdot", lambda m, f: m["files"].update({"../outside.bin": sha256_file(outside)}))
    variant("absolute", lambda m, f: m["files"].update({str(outside): sha256_file(outside)}))
    variant("empty", lambda m, f: m.update(files={}))
    variant("list", manifest_text="[1, 2, 3]")
    variant("null", manifest_text="null")
    variant("deep", manifest_text="[" * 100_000 + "]" * 100_000)
    return out
