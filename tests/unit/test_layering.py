"""The import graph keeps its layers, and compress/'s folders are those layers. From the bottom:

0. foundation (``core/``, ``tasks/``, ``data/``): errors, configs, run folders, checkpoints, task data;
1. models (``models/``): finding and loading encoders, the role table, pruned-model loading code;
2. training (``training/``): the loop every stage hooks into, trackers, evaluation;
3. blocks (``pruning/``, ``distill/``, ``measure/``, ``export/``, ``qa/``, ``retrieval/``,
   ``report/``, ``embedding/``, and ``students/`` beside the package);
4. the public API (``compress/__init__.py``, ``api/``, ``integrations/``);
5. recipes (``recipes/``): one end-to-end workflow per command;
6. the CLI (``cli/``, ``__main__.py``).

A module's layer is its folder's: no module lies loose in compress/ and every folder is named in
``LAYERS`` once, so a new folder has to say where it stands. A module imports only from its own
layer or below, counting imports inside functions too; no chain of imports leads back to the module
it starts from (within a layer too); and the library (compress/, students/) never imports
pipelines/: pipelines are workflows built on the library, loaded by path by ``compress run``, never
the other way round. Workflows (``run_*``) live in recipes/ and cli/ only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.append(str(node.args[0].value))
    return names


# compress/'s folders, bottom layer first; compress/__init__.py is the public API, __main__.py the CLI,
# and students/ (beside the package) a block
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("core", "tasks", "data")),
    ("models", ("models",)),
    ("training", ("training",)),
    ("blocks", ("pruning", "distill", "measure", "export", "qa", "retrieval", "report", "embedding")),
    ("public API", ("api", "integrations")),
    ("recipes", ("recipes",)),
    ("CLI", ("cli",)),
)
LAYER_NAMES = tuple(name for name, _ in LAYERS)
LAYER_OF_FOLDER = {folder: i for i, (_, folders) in enumerate(LAYERS) for folder in folders}


def layer_of(module: str) -> int:
    """The layer of a library module, read from its folder: ``compress.pruning.masks`` -> blocks."""
    parts = module.split(".")
    if parts[0] == "students":
        return LAYER_NAMES.index("blocks")
    if module == "compress":
        return LAYER_NAMES.index("public API")
    if module == "compress.__main__":
        return LAYER_NAMES.index("CLI")
    if parts[0] != "compress" or parts[1] not in LAYER_OF_FOLDER:
        raise KeyError(f"{module} lies in no folder of LAYERS; add its folder to the layer it belongs to")
    return LAYER_OF_FOLDER[parts[1]]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_graph(files: list[Path]) -> dict[str, set[str]]:
    """Each library module -> the library modules it imports, at module level or inside a
    function; ``from pkg import sub`` counts as an import of the submodule ``pkg.sub``."""
    names = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                candidates = [[a.name] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                candidates = [[f"{mod}.{a.name}", mod] for a in node.names]
            else:
                continue
            for options in candidates:
                for cand in options:  # the most specific name that is a module of the library
                    while cand and cand not in names:
                        cand = cand.rpartition(".")[0]
                    if cand:
                        if cand != name:
                            targets.add(cand)
                        break
        graph[name] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected component of two or more modules
    (Tarjan), sorted; ``closed_walk`` gives one chain of imports around it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of modules (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(sorted(c) for c in components)


def closed_walk(graph: dict[str, set[str]], circle: list[str]) -> list[str]:
    """The shortest chain of imports ``[a, b, ..., a]`` from the circle's first module back to
    itself, through modules of the circle only (breadth-first)."""
    start, within = circle[0], set(circle)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & within):
                if w == start:
                    walk = [v]
                    while walk[-1] != start:
                        walk.append(parent[walk[-1]])
                    return [start, *reversed(walk[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def _as_files(modules: list[str], sep: str) -> str:
    names = {_module_name(p): p for p in _library_files()}
    return sep.join(str(names[m].relative_to(ROOT)) if m in names else m for m in modules)


def _library_files() -> list[Path]:
    return sorted(p for pkg in ("compress", "students") for p in (ROOT / pkg).rglob("*.py"))


def test_library_does_not_import_pipelines():
    files = _library_files()
    assert len(files) > 20  # the scan sees the real package
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in files for m in _imported_modules(p)
           if m == "pipelines" or m.startswith("pipelines.")]
    assert not bad, "library modules import pipelines/: " + "; ".join(bad)


def test_scanner_catches_each_import_form(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import pipelines.gordon\nfrom pipelines import stages\n"
                 "import importlib\nimportlib.import_module('pipelines.docbert')\nfrom . import y\n")
    assert sorted(_imported_modules(f)) == ["importlib", "pipelines", "pipelines.docbert", "pipelines.gordon"]


def test_pipelines_table_points_at_real_files():
    from compress.cli.run import PIPELINES, pipelines_dir

    assert pipelines_dir() == ROOT / "pipelines"
    for name, file in PIPELINES.items():
        assert (ROOT / "pipelines" / file).is_file(), name
        assert (ROOT / "pipelines" / "configs" / f"{name}.yaml").is_file(), name


def test_every_import_goes_to_the_same_layer_or_below():
    graph = module_graph(_library_files())
    assert {"compress.recipes.prune", "compress.training.loop", "compress.cli.main"} <= set(graph)
    bad = [f"{a} ({LAYER_NAMES[layer_of(a)]}) imports {b} ({LAYER_NAMES[layer_of(b)]})"
           for a, targets in sorted(graph.items()) for b in sorted(targets) if layer_of(b) > layer_of(a)]
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def test_layer_scanner_sees_imports_inside_functions_and_relative_ones(tmp_path, monkeypatch):
    pkg = tmp_path / "compress"
    for d in ("pruning", "recipes", "core"):
        (pkg / d).mkdir(parents=True)
    for f in ("__init__.py", "pruning/__init__.py", "recipes/__init__.py", "recipes/prune.py",
              "core/__init__.py", "core/errors.py"):
        (pkg / f).write_text("")
    (pkg / "pruning" / "masks.py").write_text(
        "from ..core.errors import UsageError\n"
        "def f():\n    from compress.recipes import prune\n    return prune\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    graph = module_graph(sorted(pkg.rglob("*.py")))
    assert graph["compress.pruning.masks"] == {"compress.core.errors", "compress.recipes.prune"}
    assert layer_of("compress.pruning.masks") == 3 and layer_of("compress.recipes.prune") == 5
    assert layer_of("compress.core.errors") == 0 and layer_of("compress") == 4
    assert layer_of("compress.__main__") == 6 and layer_of("students.bilstm") == 3


def test_a_module_outside_the_layer_folders_has_no_layer():
    for module in ("compress.errors", "compress.newfolder.thing"):  # loose, or in an unlisted folder
        with pytest.raises(KeyError, match="no folder of LAYERS"):
            layer_of(module)


def test_the_folders_of_compress_are_its_layers():
    """Every module of compress/ is in a folder, every folder is in exactly one layer, and every
    layer's folder exists."""
    package = ROOT / "compress"
    loose = sorted(p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules loose in compress/ (put each in its layer's folder): {loose}"
    folders = {p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    listed = [f for _, fs in LAYERS for f in fs]
    assert len(listed) == len(set(listed)), "a folder is named in two layers"
    assert folders == set(listed), (f"folders in no layer: {sorted(folders - set(listed))}; "
                                    f"layers naming a missing folder: {sorted(set(listed) - folders)}")


def test_workflows_live_in_recipes_and_cli_only():
    """No module outside compress/recipes/ and compress/cli/ defines a ``run_*`` function."""
    bad = []
    for path in _library_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("compress/recipes/", "compress/cli/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("run_"):
                bad.append(f"{rel}:{node.lineno} {node.name}")
    assert not bad, "workflows outside compress/recipes/: " + "; ".join(bad)


def test_the_import_graph_has_no_circle():
    """No module reaches itself through imports, inside functions included: a circle means that
    one of its modules cannot be read, tested or moved without the others."""
    graph = module_graph(_library_files())
    circles = import_cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(
        f"{len(c)} files ({_as_files(c, ', ')}); one chain: {_as_files(closed_walk(graph, c), ' -> ')}"
        for c in circles)


def test_circle_finder_names_a_circle_closed_by_an_import_inside_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "compress"
    (pkg / "pruning").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "pruning" / "__init__.py").write_text("")
    (pkg / "training.py").write_text("from compress.pruning.pruner import Pruner\n")
    (pkg / "pruning" / "pruner.py").write_text("from .. import errors\nclass Pruner:\n    pass\n")
    (pkg / "errors.py").write_text("def f():\n    from compress.training import train\n    return train\n")
    (pkg / "models.py").write_text("from compress import errors\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    graph = module_graph(sorted(pkg.rglob("*.py")))
    circle = ["compress.errors", "compress.pruning.pruner", "compress.training"]
    assert import_cycles(graph) == [circle]
    assert closed_walk(graph, circle) == ["compress.errors", "compress.training", "compress.pruning.pruner",
                                          "compress.errors"]
    (pkg / "errors.py").write_text("def f():\n    return 1\n")  # the function-level import removed
    assert import_cycles(module_graph(sorted(pkg.rglob("*.py")))) == []
    assert import_cycles({"a": {"a"}}) == []  # a module naming itself is no circle between files


def folder_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, tuple[str, str]]]:
    """Each folder of compress/ -> the folders its modules import (inside functions too), each
    with one module-to-module import that makes the edge."""
    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == "compress" and len(parts) > 2 else None

    out: dict[str, dict[str, tuple[str, str]]] = {}
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            fa, fb = folder(a), folder(b)
            if fa and fb and fa != fb:
                out.setdefault(fa, {}).setdefault(fb, (a, b))
    return out


def test_the_folders_of_compress_form_no_circle():
    """Folders that reach each other both ways (through imports inside functions too) are one layer
    in disguise: the folders form a line, and a circle fails naming each import on it."""
    edges = folder_graph(module_graph(_library_files()))
    graph = {a: set(bs) for a, bs in edges.items()}
    circles = import_cycles(graph)
    lines = []
    for circle in circles:
        walk = closed_walk(graph, circle)
        lines.append(" -> ".join(walk) + ": " + "; ".join(
            f"{edges[a][b][0]} imports {edges[a][b][1]}" for a, b in zip(walk, walk[1:])))
    assert not circles, "folder circles:\n" + "\n".join(lines)


def test_a_folder_circle_made_by_an_import_inside_a_function_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "compress"
    for d in ("pruning", "measure"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "measure" / "verdict.py").write_text("from compress.pruning import masks\n")
    (pkg / "pruning" / "masks.py").write_text("def f():\n    from compress.measure import verdict\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    graph = {a: set(bs) for a, bs in folder_graph(module_graph(sorted(pkg.rglob("*.py")))).items()}
    assert import_cycles(graph) == [["measure", "pruning"]]


# Recipe modules that may import another recipe, each with the reason (also written in the module):
# none today. A recipe is a script over the library; what two recipes share is a library function.
RECIPE_IMPORT_EXCEPTIONS: dict[str, set[str]] = {}


def recipe_to_recipe_imports(graph: dict[str, set[str]],
                             allowed: dict[str, set[str]] | None = None) -> list[str]:
    """``a imports b`` for each import (inside functions too) from one module of compress/recipes/ to
    another, less those ``allowed`` lists (module -> the recipes it may import)."""
    allowed = RECIPE_IMPORT_EXCEPTIONS if allowed is None else allowed

    def recipe(module: str) -> bool:
        return module.startswith("compress.recipes.")

    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) if recipe(a)
            for b in sorted(targets) if recipe(b) and b not in allowed.get(a, set())]


def test_no_recipe_imports_another_recipe():
    """Recipes use the library, never another recipe (torchtune's rule): the CLI picks among them."""
    graph = module_graph(_library_files())
    assert {"compress.recipes.prune", "compress.recipes.speed_family"} <= set(graph)
    bad = recipe_to_recipe_imports(graph)
    assert not bad, "recipes importing recipes (move what they share into the library):\n" + "\n".join(bad)
    for a, targets in RECIPE_IMPORT_EXCEPTIONS.items():  # an exception names real modules
        assert a in graph and targets <= set(graph), (a, targets)


def test_a_recipe_importing_a_recipe_inside_a_function_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "compress"
    (pkg / "recipes").mkdir(parents=True)
    for f in ("__init__.py", "recipes/__init__.py", "recipes/prune.py"):
        (pkg / f).write_text("")
    (pkg / "recipes" / "family.py").write_text(
        "from compress.recipes import prune\ndef f():\n    from .prune import x\n    return x\n")
    (pkg / "recipes" / "bench.py").write_text("def f():\n    import compress.recipes.family\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    graph = module_graph(sorted(pkg.rglob("*.py")))
    assert recipe_to_recipe_imports(graph) == ["compress.recipes.bench imports compress.recipes.family",
                                               "compress.recipes.family imports compress.recipes.prune"]
    allowed = {"compress.recipes.family": {"compress.recipes.prune"}}
    assert recipe_to_recipe_imports(graph, allowed) == [
        "compress.recipes.bench imports compress.recipes.family"]
