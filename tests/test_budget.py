"""The memory budget of a command (zoo.guards.budget.check_memory): what a config, a flag or a file would
allocate is measured before it is allocated (a model on the meta device, a data module's arrays, a
beam search's hypotheses, the boxes scored, a container's declared sizes) and refused above the
budget in one line naming the culprit and how to raise it. Cases each allocated gigabytes, or went
to a traceback, before (issue: Reliability III)."""
from __future__ import annotations

import contextlib
import json
import resource
import struct
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import zoo
from conftest import REPO, cli_env, run_cli
from zoo.commands import cli
from zoo.guards.budget import check_memory, human_bytes, limit
from zoo.guards.errors import UserError
from zoo.models.memory import model_memory
from zoo.weights import hub

RELEASES = json.loads((REPO / "weights" / "MANIFEST.json").read_text())


@contextlib.contextmanager
def allocation_cap(extra_bytes: int = 2**30):
    """While the block runs, the process may map at most `extra_bytes` more than now: a refusal
    measured (not allocated) passes, a real allocation of gigabytes fails."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _weights_file(tmp_path, name: str, release: str, **init_args) -> str:
    """A .safetensors naming the release's config with `init_args` on top (a tiny tensor: the build
    is what is measured)."""
    config = json.loads(json.dumps(RELEASES[release]["config"]))
    for key, value in init_args.items():  # "backbone.x": a field of the backbone block
        block, _, field = key.rpartition(".")
        (config["init_args"][block] if block else config["init_args"])[field] = value
    path = tmp_path / f"{name}.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata={"zoo_config": json.dumps(config)})
    return str(path)


def test_the_budget_message_names_the_culprit_and_how_to_raise_it(monkeypatch):
    check_memory({"small": 2**20}, "fine")
    with pytest.raises(UserError) as info:
        check_memory({"the weights (largest: lstm.weight_hh [65536, 16384], from hidden_dim=16384)": 4.1 * 2**30,
                      "activations": 2**20}, "model x")
    message = str(info.value)
    assert message.startswith("model x: refused, it would need about 4.1 GB of memory, more than the 4.0 GB budget")
    assert "from hidden_dim=16384" in message and "ZOO_LIMITS=memory_mb=N" in message
    monkeypatch.setenv("ZOO_LIMITS", "memory_mb=8192")
    check_memory({"the weights": 4.1 * 2**30}, "model x")
    assert limit("memory_mb") == 8192 and human_bytes(3 * 2**30) == "3.0 GB"


@pytest.mark.parametrize("release, args, culprit", [
    ("sat_soft_scenes", {"decoder.hidden_dim": 16384}, "from decoder.hidden_dim=16384"),  # 4.3 GB before
    ("draw_fmnist_t16", {"enc_size": 16384, "dec_size": 16384}, "dec_size=16384"),
    ("vit_fmnist", {"backbone.mlp_ratio": 100000.0}, "mlp.fc1.weight [9600000, 96]"),  # no limit named mlp_ratio
    ("vit_fmnist", {"backbone.conv_stem": [16384, 16384]}, "conv_stem=[16384, 16384]"),
    ("ram_fmnist_centered", {"retina.num_scales": 13, "retina.method": "crop"}, "activations of a forward pass"),
    # RAM's scale_factor: 3 scales of 12 px x 1000**k (the audit's 57.6 GB); the largest patch named by its shape
    ("ram_fmnist_cluttered60", {"retina.scale_factor": 1000}, "12000001, 12000001] from"),
])
def test_models_that_would_take_gigabytes_are_refused_without_allocating(tmp_path, release, args, culprit):
    path = _weights_file(tmp_path, "wide", release, **args)
    with allocation_cap(), pytest.raises(UserError) as info:  # the cap proves nothing was allocated
        zoo.load_checkpoint(path)
    assert "refused, it would need about" in str(info.value) and culprit in str(info.value)
    assert "\n" not in str(info.value)


def test_every_release_and_recipe_fits_the_budget():
    """The estimate never refuses what the zoo ships: each release's model (weights and one forward
    pass) and data, each far under the budget."""
    from zoo import registry
    from zoo.models.memory import data_memory

    for name in zoo.list_models(pretrained=True):
        config = registry.get_entry(name).weights["config"]
        cls = registry.resolve_class(config["class_path"])
        parts = model_memory(cls, config["init_args"])
        assert parts and sum(parts.values()) < 2**30, (name, parts)
        if config.get("data"):
            data = data_memory(registry.resolve_class(config["data"]["class_path"], "data"), config["data"]["init_args"])
            assert sum(data.values()) < 2**30, (name, data)


def test_a_data_module_of_ten_million_scenes_is_refused_before_generating(monkeypatch):
    from zoo import registry
    from zoo.data import scene_generation, scenes

    def generating(*args, **kwargs):  # before: 81 s of generation, then numpy's MemoryError
        raise AssertionError("scenes were generated before the refusal")

    monkeypatch.setattr(scene_generation, "generate_block", generating)
    monkeypatch.setattr(scenes, "generate_scenes", generating)
    spec = {"class_path": "zoo.data.scenes.FashionScenesDataModule", "init_args": {"num_train": 10_000_000}}
    with allocation_cap(), pytest.raises(UserError, match=r"data\.init_args\.num_train=10,000,000 scenes of 3x64x64 px"):
        registry.instantiate(spec, "data")


@pytest.mark.slow
def test_training_ten_million_scenes_is_refused_before_the_run(tmp_path, tiny_data_dir):
    code, _, err = run_cli(["train.py", "fit", "--config", REPO / "configs/sat/soft_scenes.yaml",
                            f"--trainer.default_root_dir={tmp_path / 'run'}", "--data.init_args.num_train=10000000"],
                           cwd=tmp_path, env=cli_env(tiny_data_dir), timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "this run: refused" in lines[0] and "num_train=10,000,000" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("argv, expected", [
    (["caption", "{image}", "--beam-size", "1000000"], "--beam-size 1000000: outside the sane range 1..100"),
    (["caption", "{image}", "--max-len", "1000000"], "--max-len 1000000: outside the sane range 1..1,000"),
    (["export", "--model", "sat_soft_scenes", "--max-len", "1000000", "--out", "{tmp}/x"],
     "--max-len 1000000: outside the sane range 1..200 (raise it with ZOO_LIMITS=export_max_len=N"),
])
def test_flags_go_through_the_limits(tmp_path, capsys, argv, expected):
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "scene.png")
    argv = [a.format(image=tmp_path / "scene.png", tmp=tmp_path) for a in argv]
    assert cli.main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert lines == [f"zoo {argv[0]}: error: {expected}" + lines[0].split(expected, 1)[1]]
    assert not (tmp_path / "x").exists()


def test_a_beam_search_is_measured_before_it_runs():
    model = zoo.create_model("sat_soft_scenes", pretrained=True)
    images = torch.rand(160, 3, 64, 64)
    parts = model.decoding_memory(images, beam_size=100, max_len=1000)
    assert sum(parts.values()) > 4 * 2**30  # 16,000 hypotheses with their annotations and histories
    with allocation_cap(), pytest.raises(UserError, match=r"caption\(\): refused, .*their history over max_len 1000"):
        model.caption(images, beam_size=100, max_len=1000)
    with pytest.raises(UserError, match=r"caption\(\)\.beam_size: 1000000 is outside"):
        model.caption(images[:1], beam_size=1_000_000)  # 32 GB before


def test_twenty_thousand_boxes_are_scored_in_slices():
    """`--boxes` with 20,000 boxes for an image (a 320 KB file) took 4.9 GB in box_coverage: the
    union is now taken in slices, equal to the whole-tensor reference."""
    from zoo.attention.record import box_coverage
    from zoo.metrics.attention import MASK_CHUNK, mass_in_box, target_mask

    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(3, 50, 2, generator=generator) * 20
    boxes = torch.cat([corners, corners + 1 + torch.rand(3, 50, 2, generator=generator) * 8], -1)
    boxes[:, 7] = -1  # an empty slot
    reference = (box_coverage(boxes, (28, 28)) * (boxes >= 0).all(-1)[..., None, None]).amax(1)
    torch.testing.assert_close(target_mask(boxes, (28, 28)), reference)
    many = torch.tensor([[0.0, 0.0, 28.0, 28.0]]).repeat(20_000, 1)[None].expand(8, -1, -1)
    maps = torch.rand(8, 28, 28)
    with allocation_cap(MASK_CHUNK * 64):
        mass = mass_in_box(maps, many)
    torch.testing.assert_close(mass, maps.flatten(1).sum(1))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "lots", ""])
def test_zoo_limits_cannot_switch_a_limit_off(monkeypatch, capsys, value):
    monkeypatch.setenv("ZOO_LIMITS", f"hidden_dim={value}")
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zoo list: error: ZOO_LIMITS") and "\n" not in err
    monkeypatch.setenv("ZOO_LIMITS", "hiden_dim=5")
    assert cli.main(["list"]) == 2
    assert "did you mean hidden_dim?" in capsys.readouterr().err


def _overclaiming(checkpoint: bytes) -> bytes:
    """`checkpoint` with its largest record declaring 4 GB (local header and central directory)."""
    import io

    data = bytearray(checkpoint)
    with zipfile.ZipFile(io.BytesIO(checkpoint)) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    struct.pack_into("<II", data, info.header_offset + 18, 0xFFFF0000, 0xFFFF0000)
    name = info.filename.encode()
    at = data.find(b"PK\x01\x02")
    while at != -1:
        if bytes(data[at + 46: at + 46 + struct.unpack_from("<H", data, at + 28)[0]]) == name:
            struct.pack_into("<II", data, at + 20, 0xFFFF0000, 0xFFFF0000)
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


def test_a_checkpoints_zip_records_are_checked_before_torch_reads_them(tmp_path, monkeypatch):
    from zoo.models.baselines import Classifier

    model = Classifier(arch="mlp", hidden=[64])
    torch.save({"state_dict": model.state_dict(), "zoo": model.zoo_config()}, tmp_path / "good.ckpt")
    (tmp_path / "forged.ckpt").write_bytes(_overclaiming((tmp_path / "good.ckpt").read_bytes()))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load read a forged checkpoint"))
    with pytest.raises(UserError, match=r"forged\.ckpt: refused, its record .* declares 4,294,901,760 bytes"):
        zoo.load_checkpoint(tmp_path / "forged.ckpt")


@pytest.mark.parametrize("change, expected", [
    (lambda h: h["w"].update(shape=[4096, 4096]), "declares [4096, 4096] F32 in 16 bytes"),
    (lambda h: h["w"].update(data_offsets=[0, 10**12]), "lies outside the file's"),
    (lambda h: h["w"].update(dtype="F128"), "has no valid dtype and shape"),
])
def test_a_safetensors_header_is_checked_against_the_file(tmp_path, change, expected):
    save_file({"w": torch.zeros(4)}, str(tmp_path / "good.safetensors"))
    data = (tmp_path / "good.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    (tmp_path / "bad.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])
    with pytest.raises(UserError, match="not a valid safetensors file") as info:
        hub.load_weights(tmp_path / "bad.safetensors")
    assert expected in str(info.value)


def test_a_cached_array_that_declares_more_than_it_holds_is_rebuilt(tmp_path):
    from numpy.lib import format as npy

    from zoo.guards.files import check_npz

    np.savez_compressed(tmp_path / "good.npz", images=np.zeros((4, 3, 8, 8), np.uint8))
    check_npz(tmp_path / "good.npz")
    header = io_bytes = __import__("io").BytesIO()
    npy.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 3, 64, 64)})
    with zipfile.ZipFile(tmp_path / "forged.npz", "w") as archive:
        archive.writestr("images.npy", io_bytes.getvalue() + bytes(100))
    with pytest.raises(ValueError, match="declares"):
        check_npz(tmp_path / "forged.npz")


def test_an_idx_file_that_inflates_to_gigabytes_is_refused_from_its_header(tmp_path):
    """A .gz of a few KB whose IDX header declares 20 GB: refused before it is inflated."""
    import gzip

    from zoo.data.fashion_mnist import read_idx

    header = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (25_000_000, 28, 28))
    (tmp_path / "bomb-idx3-ubyte.gz").write_bytes(gzip.compress(header + bytes(10_000_000)))
    with allocation_cap(), pytest.raises(UserError, match=r"bomb-idx3-ubyte.gz: refused, .*\(25000000, 28, 28\)"):
        read_idx(tmp_path / "bomb-idx3-ubyte.gz")


# ----------------------------------------------------------------------------- training at the recipe's batch
def _steps(cls, init_args: dict, batch: int) -> dict:
    from zoo.models.memory import _steps_memory

    return _steps_memory(cls, init_args, ((True, "batch_size", batch),), 0)


@pytest.mark.parametrize("family, variant", [(name, variant) for name, cls in sorted(__import__(
    "zoo.models.card", fromlist=["families"]).families().items()) for variant in cls.card.tiny])
def test_a_training_step_measured_on_meta_is_what_the_real_step_allocates(family, variant):
    """The budget's training step (zoo.guards.budget: the family's example batch grown to the batch size,
    forward and backward on the meta device) counts what the same step allocates on the CPU,
    tensor by tensor; each family's own smallest configuration runs whole there (a configuration
    whose step has an op without a meta kernel falls back to its forward pass, named so)."""
    from torch.utils._pytree import tree_map

    from zoo.models.card import families
    from zoo.models.memory import _live_bytes

    cls = families()[family]
    init_args = cls.card.tiny[variant]
    parts = _steps(cls, init_args, 6)
    (what, estimate), = parts.items()
    if not what.startswith("a training step (forward and backward) of batch_size=6"):
        assert variant != next(iter(cls.card.tiny)), what  # the family's own smallest runs on meta
        assert what.startswith("the forward pass of a training step of batch_size=6"), what
        return
    torch.manual_seed(0)
    model = cls(**{**{k: v for k, v in cls.card.filled_by_data.items() if init_args.get(k) is None}, **init_args})
    example = model.example_batch(6)
    counter = _live_bytes()
    model.train()
    with counter:
        batch = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and t.dim() else t, example)
        loss, _ = model.train_loss(**model.train_inputs(batch))
        loss.backward()
    # equal where every op's output is the same on both devices; a few meta kernels return a copy
    # where the CPU's returns a view (a captioner's packed rows): never fewer bytes than the real step
    assert counter.peak <= estimate <= 1.1 * counter.peak, (what, estimate, counter.peak)
    assert sum(_steps(cls, init_args, 60).values()) > sum(_steps(cls, init_args, 12).values()) > estimate


@pytest.mark.parametrize("family", sorted(__import__("zoo.models.card", fromlist=["families"]).families()))
def test_remembered_meta_outputs_count_what_running_every_op_counts(family, monkeypatch):
    """The measure remembers a functional op's outputs by its arguments' shapes (an unrolled model
    repeats them): the training step, the evaluation step and the forward pass measure the bytes,
    and name the largest tensor, exactly as running every op's meta kernel does."""
    from zoo.models import memory
    from zoo.models.card import families

    cls = families()[family]
    init_args = next(iter(cls.card.tiny.values()))
    steps = ((True, "batch_size", 6), (False, "eval_batch_size", 12))
    counters, made = [], memory._live_bytes
    monkeypatch.setattr(memory, "_live_bytes", lambda: counters.append(made()) or counters[-1])

    def measured() -> tuple:
        counters.clear()
        return memory._steps_memory(cls, init_args, steps, 4), memory._model_memory(cls, init_args, 3)

    remembered = measured()
    assert sum(counter.reused for counter in counters) > 0  # outputs were made again, not run

    def unkeyable(value, torch_module):
        raise memory._Unkeyable

    monkeypatch.setattr(memory, "_op_key", unkeyable)  # every op runs its meta kernel
    assert measured() == remembered and not any(counter.reused for counter in counters)


@pytest.mark.parametrize("flag, expected", [
    ("--data.init_args.batch_size=1000000", "a training step (forward and backward) of data.init_args.batch_size=1,000,000"),
    ("--data.init_args.eval_batch_size=1000000", "an evaluation step (forward) of data.init_args.eval_batch_size=1,000,000"),
])
@pytest.mark.usefixtures("offline_in_tmp")
def test_a_batch_of_a_million_is_refused_before_the_run(tmp_path, capsys, tiny_data, flag, expected):
    """Before: the budget measured one input, so a batch of 1,000,000 (inside its own limit) went to
    a 153-line traceback at 3.3 GB. Now the training step is measured at the batch and refused in
    one line naming it and the estimate, before the data, the run folder or W&B exist."""
    import zoo.training.train as TRAIN

    with allocation_cap(), pytest.raises(SystemExit) as info:
        TRAIN.main(["fit", "--config", "vit_fmnist", f"--trainer.default_root_dir={tmp_path / 'run'}", flag])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("train.py: error: this run: refused, it would need about ") and expected in lines[0]
    assert " GB of memory, more than the 4.0 GB budget" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.usefixtures("offline_in_tmp")
def test_an_evaluation_at_a_batch_of_a_million_is_refused_before_reading_data(capsys, tiny_data):
    with allocation_cap():
        assert cli.main(["eval", "--model", "vit_fmnist", "--data", "eval_batch_size=1000000"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("zoo eval: error: this evaluation: refused"), lines
    assert "an evaluation step (forward) of the data's eval_batch_size=1,000,000" in lines[0]


def test_a_split_smaller_than_the_batch_is_measured_at_its_size():
    """`limit_train` / `limit_eval` cap what a step holds: a batch of a million over 10 examples is
    the 10 (the estimate does not refuse what the run would never allocate)."""
    from jsonargparse import Namespace

    from zoo import registry

    recipe = registry.get_entry("vit_fmnist").recipe_config()
    model = Namespace(class_path=recipe["class_path"], init_args=Namespace(**recipe["init_args"]))
    data = Namespace(class_path=recipe["data"]["class_path"],
                     init_args=Namespace(batch_size=1_000_000, eval_batch_size=None, limit_train=10, limit_eval=10))
    registry.check_run_memory(data, model)
    data.init_args.limit_train = None
    with pytest.raises(UserError, match=r"data\.init_args\.batch_size=1,000,000"):
        registry.check_run_memory(data, model)


@pytest.mark.slow
def test_fifty_thousand_classes_parse_and_train(tmp_path):
    """Before: a 50,000-class ImageFolder hung for more than 300 s in argument parsing (the class
    names linked into LightningCLI's config, which jsonargparse validates in time quadratic in a
    list's length). The names now come from the data module when training starts: the run trains,
    and its checkpoint names every class."""
    from PIL import Image

    Image.new("L", (8, 8), 128).save(tmp_path / "one.png")
    train = tmp_path / "folders" / "train"
    for i in range(50_000):  # one image per class: a link to the same file (no disk for 50,000 images)
        (train / f"c{i:05d}").mkdir(parents=True)
        (train / f"c{i:05d}" / "a.png").symlink_to(tmp_path / "one.png")
    root = tmp_path / "run"
    code, _, err = run_cli(["train.py", "fit", "--config", REPO / "configs/baseline/mlp_centered.yaml",
                            "--config", REPO / "configs/vit/_fmnist5_imagefolder.yaml",
                            f"--data.init_args.root={train.parent}", "--data.init_args.val_dir=train",
                            "--data.init_args.test_dir=null", "--data.init_args.batch_size=4",
                            "--data.init_args.eval_batch_size=4", f"--trainer.default_root_dir={root}",
                            "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
                            "--trainer.enable_model_summary=false"], cwd=tmp_path, env=cli_env(None), timeout=240)
    assert code == 0, err[-3000:]
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    names = saved["hyper_parameters"]["class_names"]
    assert len(names) == 50_000 and names[:2] == ["c00000", "c00001"] and names[-1] == "c49999"
