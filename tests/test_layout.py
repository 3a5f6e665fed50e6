"""The layout of zoo/ (issue 44): a few modules at the top, imports that run one way down, and one
room for everything that writes a file.

- The top level of zoo/ holds at most MAX_TOP_LEVEL modules (zoo/__init__.py counts, packages do not).
- Every import between zoo's modules (a lazy one inside a function too) runs down LAYERS or stays
  in its layer, and none closes a cycle.
- The rooms (a top-level module, or a package as one) are tied by at most MAX_LINKS imports.
- Nothing outside zoo/guards/ writes, replaces or sweeps a file, but the calls WRITERS names,
  each with the reason it may.
Read from the source with `ast`: nothing is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

ZOO = REPO / "zoo"
MAX_TOP_LEVEL = 6
MAX_LINKS = 100
#: the rooms of zoo/, lowest first: a module imports its own layer or lower ones. `zoo` is the
#: package's face (zoo/__init__.py: the public API, which hands on the registry's names).
LAYERS = [
    {"guards"},                                       # files, writes, budget, errors, text
    {"classes", "hparams", "preprocess", "results"},  # what all share: the allow-list, names, inputs, provenance
    {"attention", "backbones", "data", "decoding", "metrics", "viz",
     "weights"},                                      # what models are made of, fed and loaded from (as timm's _hub)
    {"models"},                                       # the families
    {"registry", "training", "zoo"},                  # names to models, runs, the public API
    {"commands"},                                     # the `zoo` command
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ZOO.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    """The zoo module an import of `name` loads (its nearest enclosing module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, tree: ast.Module) -> set[str]:
    """The zoo modules `module` imports, anywhere in it (the zoo imports absolutely)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {_target(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: a relative import (from {'.' * node.level}{node.module or ''})"
            base = node.module or ""
            out |= {_target(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _target(base)
                    for alias in node.names}
    if module == "zoo":  # the public names, imported on first use (zoo/__init__.py's _PUBLIC)
        public = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in n.targets))
        out |= {_target(value.value.partition(":")[0]) for value in public.values}
    return {m for m in out if m and m.startswith("zoo") and m != module}


TREES = {module: ast.parse(path.read_text()) for module, path in MODULES.items()}
GRAPH = {module: _imports(module, tree) for module, tree in TREES.items()}


def room(module: str) -> str:
    """zoo.training.runs -> training; zoo.registry -> registry; zoo -> zoo."""
    return module.split(".")[1] if "." in module else module


def layer(module: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room(module) in rooms)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def links() -> set[tuple[str, str]]:
    return {(room(a), room(b)) for a, targets in GRAPH.items() for b in targets if room(a) != room(b)}


# ----------------------------------------------------------------------------- the shape
def test_the_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in ZOO.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"zoo/ holds {len(top)} modules: {', '.join(top)}; give the new one a package"


def test_every_room_has_a_layer():
    rooms = {room(m) for m in MODULES}
    assert rooms <= set().union(*LAYERS), f"rooms without a layer in LAYERS: {sorted(rooms - set().union(*LAYERS))}"


def test_no_import_runs_up_the_layers():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if layer(a) < layer(b))
    assert not upward, upward


def test_no_import_cycle_between_zoo_modules():
    # a package's face importing its own modules is how a package hands on its names, not a cycle
    graph = {a: {b for b in targets if not b.startswith(f"{a}.")} for a, targets in GRAPH.items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_rooms_are_tied_by_at_most_a_hundred_imports():
    found = links()
    print(f"{len(found)} links between {len({r for pair in found for r in pair})} rooms; "
          f"{sum(map(len, GRAPH.values()))} between modules")
    assert len(found) <= MAX_LINKS, sorted(found)


# ----------------------------------------------------------------------------- one room writes
#: calls that write, replace or remove a file: module functions by their dotted name, methods of a
#: path by their name (`str.replace` takes two arguments, `Path.replace` one)
FUNCTIONS = {"os.replace", "os.rename", "os.remove", "os.unlink", "os.rmdir", "shutil.rmtree", "shutil.move",
             "shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.copytree"}
PATH_METHODS = {"unlink": 0, "rename": 1, "replace": 1, "rmdir": 0, "write_bytes": 1, "write_text": 1, "touch": 0}
#: (file, the function that calls) -> why it may: each writes through guards' own primitives
#: (its target is a temporary `zoo.guards.writes.writing` holds, renamed over the target) or
#: removes what the zoo itself made
WRITERS = {
    ("zoo/commands/card.py", "write_card.put_weights"):
        "copies the release into the staging folder `writing(out_dir)` holds, which swap_in_folder puts in place",
    ("zoo/models/predict.py", "PredictionWriter.on_predict_start"):
        "opens the temporary `replacing(path)` holds, for the JSON lines (renamed over --predictions when it closes)",
    ("zoo/training/callbacks.py", "AtomicCheckpointIO.save_checkpoint"):
        "torch.save into the temporary `replacing(path)` holds, synced, then renamed over the checkpoint",
    ("zoo/weights/hub.py", "_download"):
        "streams a download into the `replacing(target, 'part')` temporary that fetch holds",
}


def _writes(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of each writing call in `path`."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    found = []

    def visit(node, where: str):
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            elif isinstance(child, ast.Call) and (call := _writing_call(child, modules)):
                found.append((where or "<module>", child.lineno, call))
            visit(child, inner)

    visit(tree, "")
    return found


def _writing_call(call: ast.Call, modules: set[str] = frozenset({"dataclasses"})) -> str | None:
    """What a call writes (a function of FUNCTIONS, an open for writing, a path's method), or None;
    `modules`: the names the file binds to modules (`dataclasses.replace` is no path's)."""
    func = call.func
    dotted = ast.unparse(func)
    if dotted in FUNCTIONS:
        return dotted
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if dotted == "open" and isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
        return f"open(..., {mode.value!r})"
    if isinstance(func, ast.Attribute):
        if func.attr == "open" and call.args and isinstance(call.args[0], ast.Constant) \
                and set(str(call.args[0].value)) & set("wax+") and dotted != "os.open":
            return f"Path.open({call.args[0].value!r})"
        if func.attr in PATH_METHODS and len(call.args) == PATH_METHODS[func.attr] \
                and not (isinstance(func.value, ast.Name) and func.value.id in modules):
            return f"Path.{func.attr}"
    return None


def test_nothing_outside_guards_writes_replaces_or_sweeps_a_file():
    found = {}
    for module, path in MODULES.items():
        if room(module) == "guards":
            continue
        rel = str(path.relative_to(REPO))
        for where, line, call in _writes(path):
            found.setdefault((rel, where), []).append(f"{rel}:{line} {where}: {call}")
    unexplained = [line for key, lines in sorted(found.items()) if key not in WRITERS for line in lines]
    assert not unexplained, "write through zoo.guards.writes, or say why not in WRITERS:\n" + "\n".join(unexplained)
    stale = sorted(set(WRITERS) - set(found))
    assert not stale, f"WRITERS names calls that are gone: {stale}"


@pytest.mark.parametrize("source, expected", [
    ("os.replace(tmp, path)", "os.replace"), ("path.unlink(missing_ok=True)", "Path.unlink"),
    ("open(tmp, 'wb')", "open(..., 'wb')"), ("(folder / name).write_text(text)", "Path.write_text"),
    ("text.replace('a', 'b')", None), ("open(path)", None), ("path.open('rb')", None),
    ("shutil.rmtree(x)", "shutil.rmtree"), ("dataclasses.replace(spec)", None), ("Path(a).rename(b)", "Path.rename"),
])
def test_the_write_scan_tells_a_write_from_a_read(source, expected):
    assert _writing_call(ast.parse(source).body[0].value) == expected


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# ----------------------------------------------------------------------------- files saved before
OLD_RUN = """\
# a run's config.yaml as train.py saved it before the top level of zoo/ was grouped into packages
model:
  class_path: zoo.models.baselines.Classifier
  init_args: {arch: mlp}
data:
  class_path: zoo.data.fashion_mnist.FashionMNISTDataModule
  init_args: {variant: centered}
trainer:
  logger:
    class_path: zoo.callbacks.ZooWandbLogger
    init_args: {project: attention-zoo, save_dir: ., id: null}
  callbacks:
  - class_path: zoo.callbacks.AttentionImageLogger
  - class_path: zoo.callbacks.EpochSummary
"""


def test_every_old_module_path_names_a_module_of_today():
    import importlib.util

    from zoo.hparams import MOVED_MODULES

    assert MOVED_MODULES and all(importlib.util.find_spec(new) for new in MOVED_MODULES.values())
    stand_ins = [old for old in MOVED_MODULES if (REPO / (old.replace(".", "/") + ".py")).exists()]
    assert not stand_ins  # gone: no module answers to an old path


def test_old_class_paths_read_in_the_current_layout():
    from zoo.hparams import current_class_path, current_class_paths
    from zoo.training.recipe_args import current_flag

    tree = {"trainer": {"callbacks": [{"class_path": "zoo.callbacks.EpochSummary"}, {"class_path": "x.Y"}]},
            "model": {"class_path": "zoo.models.vit.ViTClassifier"}}
    assert current_class_paths(tree) == {**tree, "trainer": {"callbacks": [
        {"class_path": "zoo.training.callbacks.EpochSummary"}, {"class_path": "x.Y"}]}}
    current = {"model": {"class_path": "zoo.models.vit.ViTClassifier"}}
    assert current_class_paths(current) is current  # nothing old: the same tree
    assert current_class_path("zoo.models.ram.RAM") == "zoo.models.ram.RAM"  # families never moved
    assert current_flag("--trainer.logger=zoo.callbacks.ZooWandbLogger") == \
        "--trainer.logger=zoo.training.callbacks.ZooWandbLogger"
    assert current_flag("zoo.callbacks.EpochSummary") == "zoo.training.callbacks.EpochSummary"
    assert current_flag("configs/vit/fmnist.yaml") == "configs/vit/fmnist.yaml"


@pytest.mark.usefixtures("offline_in_tmp")
def test_a_run_saved_before_the_layout_still_validates(tmp_path, capsys, caplog):
    """`fit --config RUN/config.yaml` of a run saved before: its logger and callbacks are read at
    their current module paths, after one warning, and the config validates."""
    import logging

    import yaml

    import zoo.training.train as TRAIN

    (tmp_path / "config.yaml").write_text(OLD_RUN)
    with caplog.at_level(logging.WARNING, logger="zoo"), pytest.raises(SystemExit) as stop:
        TRAIN.main(["fit", "--config", str(tmp_path / "config.yaml"), "--print_config"])
    assert stop.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["logger"]["class_path"] == "zoo.training.callbacks.ZooWandbLogger"
    assert [c["class_path"] for c in printed["trainer"]["callbacks"]] == [
        "zoo.training.callbacks.AttentionImageLogger", "zoo.training.callbacks.EpochSummary"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'config.yaml'}: read with the current module paths of its classes"]
