"""The library (compress/, students/) never imports pipelines/: pipelines are workflows built on
the library, loaded by path by ``compress run``, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

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
