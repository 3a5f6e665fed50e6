"""Small files that would take gigabytes or minutes, refused before any work (zoo.guards.budget), and the
download and cache rules: http(s) only, a size cap, whole files only, paths never from a file.

Each "bomb" runs as a real process under an 8 GB address-space cap (torch itself maps 3.6 GB) (the unrefused cases took 4-5 GB
and 47-78 s): it must end with exit code 2 and one short line, and leave nothing behind."""
from __future__ import annotations

import hashlib
import http.server
import inspect
import json
import resource
import subprocess
import sys
import threading

import warnings

import pytest
import torch
import yaml

import zoo
from conftest import REPO, cli_env
from zoo.guards.budget import check_dimensions, check_tree
from zoo.guards.errors import UserError, shorten
from zoo.hparams import block_types
from zoo.models.baselines import Classifier
from zoo.models.card import families
from zoo.weights import hub

MEMORY_CAP = 8 * 2**30  # address space: importing torch alone maps about 3.6 GB


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run(args: list[str], cwd, **env) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=cli_env(None, **env),
                          capture_output=True, text=True, timeout=120, preexec_fn=_capped)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def _laughs(leaf, levels: int = 30, width: int = 10):
    """`width ** levels` leaves once expanded, `levels` lists in memory."""
    node = [leaf]
    for _ in range(levels):
        node = [node] * width
    return node


def _assert_refused(code, err, *needles):
    assert code == 2 and len(err) == 1, err[-5:]
    assert len(err[0]) < 400, err[0][:400]
    for needle in needles:
        assert needle in err[0], err[0]


# ----------------------------------------------------------------------------- the counter
def test_shared_references_are_counted_without_expanding_them():
    check_tree({"a": _laughs("x", levels=3, width=10)}, "small")  # 1,000 leaves: fine
    with pytest.raises(UserError, match="more than 200,000 values"):
        check_tree({"a": _laughs("x")}, "bomb")  # 10**30 leaves, counted in a blink
    cycle = []
    cycle.append(cycle)
    with pytest.raises(UserError, match="contains itself"):
        check_tree(cycle, "cycle")
    deep = node = []
    for _ in range(1000):
        node.append([])
        node = node[0]
    with pytest.raises(UserError, match="nested more than 64"):
        check_tree(deep, "deep")
    with pytest.raises(UserError, match="a string of 200,000 characters"):
        check_tree({"class_path": "x" * 200_000}, "long")


def test_dimension_limits_name_the_field_and_can_be_raised(monkeypatch):
    with pytest.raises(UserError, match=r"model.init_args.backbone.image_size: .* 0..4,096 .*ZOO_LIMITS=image_size"):
        check_dimensions({"backbone": {"image_size": [60000, 60000]}}, "model.init_args")
    monkeypatch.setenv("ZOO_LIMITS", "image_size=100000")
    check_dimensions({"backbone": {"image_size": [60000, 60000]}}, "model.init_args")
    assert shorten("x" * 10_000).endswith("...") and len(shorten("x" * 10_000)) == 200


@pytest.mark.parametrize("family", sorted(name for name, cls in families().items() if cls.card.dimensions))
def test_every_family_refuses_its_own_absurd_sizes_before_anything_is_built(family, monkeypatch):
    """Each size a family's card declares (`dimensions`) is refused above its limit in one line naming
    it, however the model is built (here: the class itself), before any layer exists; ZOO_LIMITS
    raises it."""
    from zoo.models.card import tiny_models

    cls, hparams = next((c, h) for name, c, h in tiny_models() if name == family)
    blocks = block_types(cls)  # a size may be a field of one of the family's blocks (zoo.hparams.Block)
    monkeypatch.setattr(torch.nn.Module, "__init__", _nothing_may_be_built)
    for name, top in cls.card.dimensions.items():
        block = next((b for b, fields in blocks.items() if name in fields.__dataclass_fields__), None)
        default = (blocks[block].__dataclass_fields__[name].default if block
                   else inspect.signature(cls).parameters[name].default)
        value = [int(top) + 1] if isinstance(default, (list, tuple)) or default is None and "channels" in name \
            else int(top) + 1
        where = f"{block}.{name}" if block else name
        given = {**hparams, block: {**hparams.get(block, {}), name: value}} if block else {**hparams, name: value}
        with pytest.raises(UserError, match=rf"^model.init_args.{where}: .* sane range 0..{top:,.0f} ") as info:
            cls(**given)
        assert "\n" not in str(info.value)


def _nothing_may_be_built(self, *args, **kwargs):
    raise AssertionError("a module was built before its sizes were checked")


# ----------------------------------------------------------------------------- bombs in files
@pytest.mark.slow
def test_pickle_memo_bomb_in_a_checkpoint_is_refused_by_eval(tmp_path):
    torch.save({"state_dict": {}, "zoo": {"class_path": _laughs("zoo.models.ram.RAM")}}, tmp_path / "bomb.ckpt")
    code, err = _run([REPO / "eval.py", "--checkpoint", "bomb.ckpt"], tmp_path)
    _assert_refused(code, err, "eval.py: error: bomb.ckpt: refused, more than")


@pytest.mark.slow
def test_pickle_memo_bomb_in_resume_hyperparameters_is_refused_before_the_run(tmp_path):
    torch.save({"state_dict": {}, "hyper_parameters": {"hidden": _laughs(1)}, "global_step": 1}, tmp_path / "bomb.ckpt")
    code, err = _run([REPO / "train.py", "fit", "--config", REPO / "configs/baseline/mlp_centered.yaml",
                      "--trainer.default_root_dir", tmp_path / "run", "--ckpt_path", "bomb.ckpt"], tmp_path)
    _assert_refused(code, err, "train.py: error: bomb.ckpt: refused, more than")
    assert not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()


def _anchor_bomb(key_path: list[str]) -> str:
    lines = ["z_anchors:", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]
    tree = "*a29"
    for key in reversed(key_path):
        tree = {key: tree}
    return "\n".join(lines) + "\n" + yaml.safe_dump(tree).replace("'*a29'", "*a29")


@pytest.mark.slow
@pytest.mark.parametrize("where", [["unknown_key"], ["model", "init_args", "hidden"],
                                   ["model", "init_args", "model_kwargs"]])
def test_yaml_anchor_bomb_in_a_recipe_is_refused(tmp_path, where):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_anchor_bomb(where))
    code, err = _run([REPO / "train.py", "fit", "--config", recipe, "--trainer.default_root_dir", tmp_path / "run"],
                     tmp_path)
    _assert_refused(code, err, "bomb.yaml: refused, more than")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_yaml_anchor_bomb_on_the_command_line_is_refused(tmp_path):
    bomb = "[" + ", ".join(["&a0 [x, x, x, x, x, x, x, x, x, x]"] +
                           [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]) + "]"
    code, err = _run([REPO / "train.py", "fit", "--config", REPO / "configs/baseline/mlp_centered.yaml",
                      "--model.init_args.hidden", bomb, "--trainer.default_root_dir", tmp_path / "run"], tmp_path)
    _assert_refused(code, err, "command-line value", "refused, more than")


@pytest.mark.slow
def test_deep_nesting_in_a_recipe_and_in_a_weights_config_is_one_line(tmp_path):
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 200_000 + "]" * 200_000 + "\n")
    code, err = _run([REPO / "train.py", "fit", "--config", "deep.yaml"], tmp_path)
    _assert_refused(code, err, "deep.yaml: refused, nested too deep")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "deep.safetensors"),
              metadata={"zoo_config": "[" * 200_000 + "]" * 200_000})
    code, err = _run([REPO / "eval.py", "--checkpoint", "deep.safetensors"], tmp_path)
    _assert_refused(code, err, "deep.safetensors: its zoo config: refused, nested too deep")


@pytest.mark.slow
def test_a_50_mb_class_path_is_refused_in_a_short_line(tmp_path):
    from safetensors.torch import save_file

    config = {"class_path": "zoo." + "x" * 50_000_000, "init_args": {}}
    save_file({"w": torch.zeros(1)}, str(tmp_path / "long.safetensors"), metadata={"zoo_config": json.dumps(config)})
    code, err = _run([REPO / "eval.py", "--checkpoint", "long.safetensors"], tmp_path)
    _assert_refused(code, err, "refused")


def _weights_with(tmp_path, model_args: dict | None = None, data_args: dict | None = None):
    model = Classifier(arch="mlp", hidden=[4])
    config = model.zoo_config()
    config["init_args"].update(model_args or {})
    config["data"] = {"class_path": "zoo.data.fashion_mnist.FashionMNISTDataModule",
                      "init_args": {"variant": "centered", **(data_args or {})}}
    path = tmp_path / "w.safetensors"
    hub.save_release(model, config, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("model_args, data_args, field", [
    ({"hidden": [60000]}, None, "model.init_args.hidden"),
    ({"image_size": 60000}, None, "model.init_args.image_size"),
    (None, {"limit_eval": 1e9}, "data.init_args.limit_eval"),
    (None, {"batch_size": 10**12}, "data.init_args.batch_size"),
])
def test_huge_dimensions_in_a_weights_file_are_refused_before_anything_is_built(tmp_path, model_args, data_args,
                                                                                field):
    path = _weights_with(tmp_path, model_args, data_args)
    code, err = _run([REPO / "eval.py", "--checkpoint", path], tmp_path)
    _assert_refused(code, err, field, "sane range")


@pytest.mark.parametrize("args", [{"beam_size": 10**6}, {"decode_max_len": 10**6}, {"network": {"hidden_size": 60000}},
                                  {"in_chans": -1}])  # in_chans -1: a fuzz finding (a negative Linear width)
def test_huge_decoding_and_model_sizes_are_refused_from_python(args):
    name = "sat_soft_scenes" if set(args) <= {"beam_size", "decode_max_len"} else "ram_fmnist_centered"
    with pytest.raises(UserError, match="sane range"):
        zoo.create_model(name, **args)


def test_scene_data_of_a_billion_canvases_is_refused():
    from zoo import registry

    config = {"class_path": "zoo.data.scenes.FashionScenesDataModule",
              "init_args": {"num_test": 10**9, "canvas_size": 4096}}
    with pytest.raises(UserError, match="data.init_args.num_test"):
        registry.instantiate(config, "data")


# ----------------------------------------------------------------------------- downloads and the cache
class _Endless(http.server.BaseHTTPRequestHandler):
    """/big: a Content-Length of 10 GB; /endless: a body with no length that never ends (bounded by
    the test: the client must stop first); /cut/<bytes>: the first bytes of a file, no length."""

    payload = b""

    def do_GET(self):
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(10 * 2**30))
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        if self.path.startswith("/cut/"):
            self.wfile.write(self.payload[: int(self.path.split("/")[2])])
            return
        block = b"\0" * 65536
        for _ in range(4096):  # at most 256 MB, far past the test's 1 MB cap
            try:
                self.wfile.write(block)
            except OSError:
                return

    def log_message(self, *args):
        pass


@pytest.fixture
def endless(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _cached(tmp_path) -> list:
    cache = tmp_path / "cache"
    return sorted(p for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_downloads_have_a_size_limit(endless, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_MAX_DOWNLOAD_MB", "1")
    with pytest.raises(UserError, match="more than the 1 MB limit"):
        hub.fetch(f"{endless}/big", "0" * 64)
    with pytest.raises(UserError, match="passed the 1 MB limit"):
        hub.fetch(f"{endless}/endless.safetensors", "0" * 64)
    assert _cached(tmp_path) == []


@pytest.mark.parametrize("url", ["file:///dev/zero", "ftp://example.org/w.safetensors", "gopher://x/w"])
def test_only_http_urls_are_downloaded(url):
    with pytest.raises(UserError, match="over http\\(s\\) only"):
        hub.fetch(url)


def test_an_unpinned_body_cut_short_without_a_length_is_never_cached(endless, tmp_path):
    model = Classifier(arch="mlp", hidden=[4])
    hub.save_release(model, model.zoo_config(), tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    _Endless.payload = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused download says only why (no "not pinned" first)
        with pytest.raises(UserError, match=f"{endless}/cut/{len(data) - 10}/w.safetensors: the download is not a whole"):
            hub.fetch(f"{endless}/cut/{len(data) - 10}/w.safetensors")
    assert _cached(tmp_path) == []
    with pytest.warns(UserWarning, match="not pinned"):
        good = hub.fetch(f"{endless}/cut/{len(data)}/w.safetensors")
    assert good.read_bytes() == data


def test_a_damaged_or_linked_cache_entry_is_evicted_and_downloaded_again(endless, tmp_path):
    model = Classifier(arch="mlp", hidden=[4])
    hub.save_release(model, model.zoo_config(), tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    _Endless.payload = data
    url = f"{endless}/cut/{len(data)}/w.safetensors"
    with pytest.warns(UserWarning):
        first = hub.fetch(url)
    first.write_bytes(data[:-10])  # damaged on disk
    with pytest.warns(UserWarning):
        assert hub.fetch(url).read_bytes() == data
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(data)
    first.unlink()
    first.symlink_to(elsewhere)  # a link planted in the cache is not followed
    with pytest.warns(UserWarning):
        again = hub.fetch(url)
    assert not again.is_symlink() and again.read_bytes() == data


def test_a_url_ending_in_dotdot_is_handled(endless, tmp_path):
    with pytest.raises(UserError, match="the download is not a whole"):  # fetched under a name of its own
        hub.fetch(f"{endless}/cut/10/..")
    assert _cached(tmp_path) == []  # refused, so nothing is cached


# ----------------------------------------------------------------------------- paths come from the user
def test_a_weights_files_data_paths_are_ignored(tmp_path):
    """A release whose data config names a cache folder: eval.py writes nothing there and says so."""
    model = zoo.create_model("sat_soft_scenes", pretrained=True)
    target = tmp_path / "attacker" / "cache"
    config = model.zoo_config()
    config["data"]["init_args"].update({"cache_dir": str(target), "num_test": 4, "num_val": 4, "num_train": 8})
    path = tmp_path / "w.safetensors"
    hub.save_release(model, config, path)
    loaded = zoo.load_checkpoint(path)
    from zoo import registry

    with pytest.warns(UserWarning, match="names paths \\(cache_dir\\); paths come from you"):
        data = registry.build_datamodule(loaded, cache=False)
    assert data.hparams.cache_dir is None
    assert not target.exists()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest  # the file itself is untouched


def test_a_data_path_without_a_default_is_asked_for_in_one_line(tmp_path):
    """An ImageFolder run's root is a path, so a checkpoint never chooses it; eval needs --data root=."""
    from zoo import registry

    model = zoo.create_model("vit_fmnist", pretrained=True)
    config = model.zoo_config()
    config["data"] = {"class_path": "zoo.data.imagefolder.ImageFolderDataModule",
                      "init_args": {"root": str(tmp_path / "elsewhere"), "image_size": 28, "in_chans": 1}}
    path = tmp_path / "w.safetensors"
    hub.save_release(model, config, path)
    loaded = zoo.load_checkpoint(path)
    with pytest.raises(UserError) as info:
        registry.build_datamodule(loaded)
    assert str(info.value) == ("the checkpoint's data (ImageFolderDataModule) reads its files from root, which comes "
                               "from you, not from a checkpoint: give it with --data root=PATH")
    data = registry.build_datamodule(loaded, root=str(tmp_path))
    assert data.hparams.root == str(tmp_path)
