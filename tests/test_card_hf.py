"""`zoo card` writes a release as a Hugging Face hub repository and `hf-hub:ORG/NAME` (or a local
folder in that layout) loads it back: for every release the card's model gives the release's own
outputs; loading stays allow-listed and sha256-checked; a refused repository leaves nothing in the
cache; the card's folder is written whole or not at all. The hub is a loopback server here
(HF_ENDPOINT), serving the layout huggingface_hub downloads from."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import yaml

import zoo
from conftest import REPO
from tools import release
from zoo.commands import card as hf, cli
from zoo.guards.errors import UserError
from zoo.weights import hub as zoo_hub

MANIFEST = json.loads((REPO / "weights" / "MANIFEST.json").read_text())


@pytest.fixture(autouse=True)
def shipped_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(REPO / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def hub(monkeypatch):
    """A loopback Hugging Face hub: {"repos": {"org/name": folder}, "requests": [(method, path)]};
    it answers /ORG/NAME/resolve/REVISION/FILE as the hub does (X-Repo-Commit, ETag, 404 with
    X-Error-Code for a missing repository or file)."""
    repos: dict[str, Path] = {}
    requests: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            requests.append((self.command, self.path))
            match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
            path = repos[match.group(1)] / match.group(3) if match and match.group(1) in repos else None
            if path is None or not path.is_file():
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound" if path is None else "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", "0" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self):
            self._answer(False)

        def do_GET(self):
            self._answer(True)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        yield {"repos": repos, "requests": requests}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def cached_files(tmp_path) -> list[Path]:
    root = tmp_path / "hf-home"
    return sorted(p for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts
                  and p.name not in ("CACHEDIR.TAG",) and "refs" not in p.parts) if root.exists() else []


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_every_release_round_trips_through_its_card(name, tmp_path):
    out = tmp_path / "card"
    paths = hf.write_card(name, out, repo_id=f"my-lab/{name}")
    assert sorted(p.name for p in out.iterdir()) == sorted(hf.CARD_FILES) == sorted(p.name for p in paths)
    config = json.loads((out / "config.json").read_text())
    assert config["files"]["model.safetensors"]["sha256"] == MANIFEST[name]["sha256"]  # the release's file itself
    assert config["architecture"] == MANIFEST[name]["config"]["class_path"]
    front = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    (result,) = front["model-index"][0]["results"]
    assert front["model-index"][0]["name"] == name and result["metrics"]
    assert all(isinstance(m["value"], (int, float)) and m["type"] for m in result["metrics"])
    # the hub's names: a data set's id and title, metric types such as `accuracy` with a readable name
    data = MANIFEST[name]["config"]["data"]
    data_class = zoo.classes.resolve_class(data["class_path"], "data")
    dataset_id, dataset_name = data_class.dataset_for(**data_class.arguments(**data["init_args"]))
    assert result["dataset"] == {"type": dataset_id, "name": dataset_name, "split": "test"}
    assert re.fullmatch(r"[a-z][a-z0-9_]*", dataset_id) and "DataModule" not in dataset_name
    logged = {m: v["value"] if isinstance(v, dict) else v for m, v in
              (MANIFEST[name].get("metadata") or {}).get("metrics", {}).items()}
    named = {(m["type"], m["name"]): m["value"] for m in result["metrics"]}
    if "test/acc" in logged:
        assert named[("accuracy", "Top-1 accuracy")] == logged["test/acc"]
    assert not any(m["type"] in ("acc", "error_pct") or "/" in m["name"] for m in result["metrics"])
    assert f'zoo.create_model("hf-hub:my-lab/{name}")' in (out / "README.md").read_text()

    card_model = zoo.load_checkpoint(out).eval()
    released = zoo.create_model(name, pretrained=True).eval()
    assert type(card_model) is type(released) and same_weights(card_model, released)
    assert release.golden_output(card_model) == release.golden_output(released)  # identical, not close


@pytest.mark.parametrize("name", ["ram_fmnist_centered", "sat_soft_scenes"])
def test_hf_hub_name_loads_the_card_through_huggingface_hub(name, hub, tmp_path):
    hf.write_card(name, tmp_path / "card")
    hub["repos"][f"my-lab/{name}"] = tmp_path / "card"
    model = zoo.create_model(f"hf-hub:my-lab/{name}").eval()
    released = zoo.create_model(name, pretrained=True).eval()
    assert same_weights(model, released)
    assert model.pretrained_cfg["hf_hub_id"] == f"my-lab/{name}" and model.pretrained_cfg["name"] == name
    assert release.golden_output(model) == release.golden_output(released)
    assert any(p.name == "model.safetensors" for p in cached_files(tmp_path))  # huggingface_hub's cache
    # the commands' --checkpoint takes it too (zoo.load_checkpoint), and a --sha256 pin must agree
    again = zoo.load_checkpoint(f"hf-hub:my-lab/{name}", sha256=MANIFEST[name]["sha256"][:12])
    assert same_weights(again, released)
    with pytest.raises(UserError, match="not the pinned file"):
        zoo.load_checkpoint(f"hf-hub:my-lab/{name}", sha256="0" * 12)


def test_a_command_takes_an_hf_hub_checkpoint(hub, tmp_path, capsys):
    hf.write_card("ram_fmnist_centered", tmp_path / "card")
    hub["repos"]["my-lab/ram"] = tmp_path / "card"
    image = tmp_path / "shirt.png"
    from PIL import Image

    Image.new("L", (28, 28), 128).save(image)
    assert cli.main(["attend", str(image), "--checkpoint", "hf-hub:my-lab/ram", "--out", str(tmp_path / "out"),
                     "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["prediction"]


def _tampered_card(tmp_path, change) -> Path:
    card = tmp_path / "card"
    hf.write_card("ram_fmnist_centered", card)
    change(card)
    return card


def _edit_config(card: Path, edit) -> None:
    config = json.loads((card / "config.json").read_text())
    edit(config)
    (card / "config.json").write_text(json.dumps(config))


BAD_REPOS = {
    "class outside the allow-list": (
        lambda card: _edit_config(card, lambda c: c["zoo_config"].update(class_path="os.system")),
        "refused: the file names model class 'os.system'"),
    "missing weights": (lambda card: (card / "model.safetensors").unlink(), "has no model.safetensors"),
    "sha256 mismatch": (
        lambda card: _edit_config(card, lambda c: c["files"]["model.safetensors"].update(sha256="ab" * 32)),
        "fails its sha256 check"),
    "no sha256": (lambda card: _edit_config(card, lambda c: c.pop("files")), "records no sha256"),
    "config not the weights'": (
        lambda card: _edit_config(card, lambda c: c["zoo_config"]["init_args"].update(num_glimpses=3)),
        "does not describe the model"),
}


@pytest.mark.parametrize("case", sorted(BAD_REPOS))
def test_a_bad_hub_repository_is_one_line_exit_2_and_nothing_is_cached(case, hub, tmp_path, capsys):
    change, message = BAD_REPOS[case]
    hub["repos"]["my-lab/bad"] = _tampered_card(tmp_path, change)
    with pytest.raises(UserError, match=re.escape(message)) as error:
        zoo.create_model("hf-hub:my-lab/bad")
    assert "\n" not in str(error.value) and str(error.value).startswith("hf-hub:my-lab/bad")
    assert cached_files(tmp_path) == []  # neither the config nor the weights stay behind
    if case == "class outside the allow-list":  # refused before the weights were asked for
        assert not any("model.safetensors" in path for method, path in hub["requests"])
    assert cli.main(["export", "--checkpoint", "hf-hub:my-lab/bad", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.split(":")[0] in err
    assert cached_files(tmp_path) == []


def test_an_unknown_repository_or_an_unreachable_hub_is_one_line(hub, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no such repository"):
        zoo.create_model("hf-hub:my-lab/nothing")
    with pytest.raises(UserError, match="give a hub repository as hf-hub:ORG/NAME"):
        zoo.create_model("hf-hub:../../etc")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline, and nothing in the cache
    with pytest.raises(UserError, match="cannot reach the hub"):
        zoo.create_model("hf-hub:my-lab/nothing")


def _refusing_endpoint() -> str:
    """A loopback address nothing listens on: every connection is refused at once."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_an_unreachable_hub_is_one_line_after_one_try_and_a_cached_card_still_loads(hub, tmp_path, monkeypatch):
    import huggingface_hub.utils._http as hf_http

    hf.write_card("ram_fmnist_centered", tmp_path / "card")
    hub["repos"]["my-lab/ram"] = tmp_path / "card"
    zoo.create_model("hf-hub:my-lab/ram")  # now in huggingface_hub's cache
    monkeypatch.setenv("HF_ENDPOINT", _refusing_endpoint())
    attempts = []
    real_request = hf_http.get_session().request
    monkeypatch.setattr(hf_http.get_session(), "request", lambda *a, **k: attempts.append(a) or real_request(*a, **k))
    # huggingface_hub's backoff sleeps between retries (1+2+4+8+8 s): no retry loop may run
    monkeypatch.setattr(hf_http.time, "sleep", lambda s: pytest.fail(f"a retry loop ran (slept {s} s)"))
    with pytest.raises(UserError) as error:
        zoo.create_model("hf-hub:my-lab/nothing")
    message = str(error.value)
    assert "\n" not in message and message.startswith("hf-hub:my-lab/nothing: cannot reach the hub (")
    assert "refused" in message and "not in the cache" in message
    assert len(attempts) == 1  # one HEAD, then the cache
    attempts.clear()
    released = zoo.create_model("ram_fmnist_centered", pretrained=True)
    assert same_weights(zoo.create_model("hf-hub:my-lab/ram"), released)  # offline, from the cache
    assert len(attempts) == 2  # config.json and model.safetensors: one try each


def test_create_model_takes_a_local_card_folder(tmp_path, monkeypatch):
    hf.write_card("vit_fmnist", tmp_path / "card" / "vit")
    monkeypatch.chdir(tmp_path)
    model = zoo.create_model("./card/vit").eval()
    released = zoo.create_model("vit_fmnist", pretrained=True).eval()
    assert type(model) is type(released) and same_weights(model, released)
    assert same_weights(zoo.create_model(tmp_path / "card" / "vit"), released)  # a Path too
    # timm's pretrained_cfg names where the weights came from: the release, or the card
    record = MANIFEST["vit_fmnist"]
    assert {k: released.pretrained_cfg[k] for k in ("name", "file", "sha256", "hf_hub_id")} == {
        "name": "vit_fmnist", "file": record["file"], "sha256": record["sha256"], "hf_hub_id": None}
    assert released.pretrained_cfg["url"].endswith("/" + record["file"])
    assert {k: model.pretrained_cfg[k] for k in ("name", "sha256", "url")} == {
        "name": "vit_fmnist", "sha256": record["sha256"], "url": None}
    assert model.pretrained_cfg["input_size"] == released.pretrained_cfg["input_size"] == (1, 28, 28)
    assert model.num_classes == released.num_classes == len(model.pretrained_cfg["label_names"]) == 10
    weights = tmp_path / "card" / "vit" / "model.safetensors"
    assert {k: zoo.load_checkpoint(weights).pretrained_cfg[k] for k in ("name", "file", "url")} == {
        "name": None, "file": str(weights), "url": None}  # a weights file: no release name
    with pytest.raises(UserError, match="a whole model with its weights"):
        zoo.create_model("./card/vit", checkpoint="x.ckpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="a folder, but not a model card"):
        zoo.create_model("./empty")
    with pytest.raises(UserError, match="a weights file loads with zoo.load_checkpoint"):
        zoo.create_model(tmp_path / "card" / "vit" / "model.safetensors")
    with pytest.raises(UserError, match="unknown model 'vit_fmnst'; did you mean vit_fmnist"):
        zoo.create_model("vit_fmnst")


def test_a_tampered_local_card_is_refused(tmp_path):
    card = _tampered_card(tmp_path, lambda card: (card / "model.safetensors").write_bytes(b"x" * 100))
    with pytest.raises(UserError, match="fails its sha256 check"):
        zoo.load_checkpoint(card)


def test_zoo_card_bad_names_and_folders_exit_2(tmp_path, capsys):
    assert cli.main(["card", "ram_fmnist_centerd", "--out", str(tmp_path / "a")]) == 2
    assert "did you mean ram_fmnist_centered" in capsys.readouterr().err
    assert cli.main(["card", "baseline_cnn_centered", "--out", str(tmp_path / "a")]) == 2
    assert "has no released weights" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert cli.main(["card", "ram_fmnist_centered", "--out", str(mine)]) == 2
    assert "not an earlier model card" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "a").exists()


def test_an_earlier_card_is_replaced_whole_and_a_failed_write_keeps_it(tmp_path, monkeypatch):
    out = tmp_path / "card"
    hf.write_card("ram_fmnist_centered", out)
    hf.write_card("vit_fmnist", out)  # an earlier card (of another release) is replaced
    assert json.loads((out / "config.json").read_text())["name"] == "vit_fmnist"
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(hf, "card_readme", broken)
    with pytest.raises(RuntimeError):
        hf.write_card("ram_fmnist_centered", out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old card, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["card"]  # no staging folder left
    (out / "extra.txt").write_text("mine")  # a card the user added to is no longer only a card
    with pytest.raises(UserError, match="not an earlier model card"):
        hf.write_card("ram_fmnist_centered", out)


def test_a_checkpoint_of_your_own_becomes_a_card_that_loads_back(trained_run, tmp_path, monkeypatch, capsys):
    """fine-tune -> card -> zoo.create_model("./card/ft"): the card's model is the checkpoint's; its
    README names no metric it did not measure."""
    out = tmp_path / "card" / "ft"
    assert cli.main(["card", "--checkpoint", str(trained_run["last"]), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(hf.CARD_FILES)
    assert capsys.readouterr().out.count("wrote ") == 3
    monkeypatch.chdir(tmp_path)
    card_model = zoo.create_model("./card/ft").eval()
    trained = zoo.load_checkpoint(trained_run["last"]).eval()
    assert type(card_model) is type(trained) and same_weights(card_model, trained)
    x = torch.rand(3, *trained.pretrained_cfg["input_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(card_model(x), trained(x))
    # the weights file is a release's: its zoo config in the safetensors metadata, as config.json's
    config = json.loads((out / "config.json").read_text())
    state, embedded = zoo_hub.load_weights(out / "model.safetensors")
    assert embedded == zoo_hub.current_config(config["zoo_config"])
    assert embedded["class_path"] == config["architecture"]
    assert config["name"] == "ft" and card_model.pretrained_cfg["name"] == "ft"
    assert config["num_classes"] == trained.num_classes == card_model.num_classes > 0
    assert config["label_names"] == trained.class_names == card_model.class_names
    assert tuple(config["pretrained_cfg"]["input_size"]) == trained.pretrained_cfg["input_size"]
    assert config["recipe"] is None and config["seed"] is None
    readme = (out / "README.md").read_text()
    front = yaml.safe_load(readme.split("---")[1])
    assert "model-index" not in front and front["tags"][-1] == trained.family  # no results it did not measure
    assert "Not measured" in readme and "last.ckpt" in readme and "accuracy" not in readme.lower()
    assert 'zoo.create_model("hf-hub:attention-zoo/ft")' in readme and "weights of a checkpoint" in readme
    # named by --repo-id; an earlier card of it is replaced only with --overwrite
    args = ["card", "--checkpoint", str(trained_run["last"]), "--out", str(out), "--repo-id", "my-lab/ft"]
    assert cli.main(args) == 2 and "--overwrite" in capsys.readouterr().err
    assert cli.main([*args, "--overwrite"]) == 0
    assert 'zoo.create_model("hf-hub:my-lab/ft")' in (out / "README.md").read_text()


def test_zoo_card_takes_exactly_one_of_a_name_or_a_checkpoint(trained_run, tmp_path, capsys):
    out = tmp_path / "card"
    for argv in (["ram_fmnist_centered", "--checkpoint", str(trained_run["last"])], [],
                 ["--checkpoint", str(tmp_path / "missing.ckpt")], ["ram_fmnist_centered", "--sha256", "ab" * 6]):
        try:
            code = cli.main(["card", *argv, "--out", str(out)])
        except SystemExit as stopped:  # argparse's usage errors stop the process (the console script: exit 2)
            code = stopped.code
        assert code == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert not out.exists()


# ----------------------------------------------------------------------------- fuzzing the loader's inputs
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=20)
CARD_KEYS = ["library_name", "zoo_config", "files", "architecture", "name"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(CARD_KEYS + ["zoo_config.class_path", "zoo_config.data", "files.model.safetensors"]),
       value=JSON, whole=st.one_of(st.none(), JSON))
def test_a_card_config_is_read_or_refused_in_one_line(tmp_path_factory, key, value, whole):
    """Any config.json (a random tree, or a real card's with one field replaced) is either a card
    whose class is the zoo's and whose weights are pinned, or one UserError line; nothing else."""
    folder = tmp_path_factory.mktemp("fuzz")
    config = json.loads(json.dumps(CARD_CONFIG))
    if whole is not None:
        config = whole
    else:
        *parents, last = key.split(".", 1) if key != "files.model.safetensors" else ["files", "model.safetensors"]
        target = config
        for parent in parents:
            target = target[parent]
        target[last] = value
    (folder / "config.json").write_text(json.dumps(config))
    try:
        read = zoo_hub.read_card_config(folder / "config.json", str(folder))
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(folder))
        return
    assert read["zoo_config"]["class_path"] in zoo.registry.ALLOWED_CLASSES["model"]
    assert re.fullmatch(r"[0-9a-f]{64}", read["files"]["model.safetensors"]["sha256"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_a_weights_header_is_read_or_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(data)
    try:
        assert isinstance(zoo_hub.safetensors_metadata(path, "card"), dict)
    except UserError as exc:
        assert "\n" not in str(exc)


#: a card's config.json as `zoo card` writes it (the fields the loader reads)
CARD_CONFIG = {"library_name": zoo_hub.LIBRARY, "zoo_card": 1, "name": "x", "architecture": "zoo.models.ram.RAM",
               "family": "ram", "files": {"model.safetensors": {"sha256": "ab" * 32, "size": 1}},
               "zoo_config": MANIFEST["ram_fmnist_centered"]["config"]}
