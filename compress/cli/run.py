"""``compress run PIPELINE.yaml [key=value ...]``: run a staged pipeline from ``pipelines/``.

The library never imports ``pipelines/`` (tests/unit/test_layering.py): this command finds the
pipeline's file through the explicit ``PIPELINES`` table and loads it by path, so the pipelines
stay scripts that read top to bottom and the library stays free of workflows.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

from compress.core.config import load_yaml
from compress.core.errors import UsageError

HELP = "run a staged pipeline (gordon, docbert, export-bench) from its YAML config, with overrides"
EXAMPLES = """examples:
  compress run pipelines/configs/gordon-small.yaml
  compress run pipelines/configs/gordon.yaml sweep.jobs=2 finetune.tasks=sst2 out=artifacts/g1
  compress run pipelines/configs/docbert.yaml task=reuters students=bilstm
overrides are KEY=VALUE with dotted keys into the YAML's sections; VALUE is read as YAML
(2e-5 -> number, [a, b] -> list, true -> boolean). Re-run the same command to resume.
"""

# pipeline name (the YAML's ``pipeline:`` key) -> file under pipelines/
PIPELINES: dict[str, str] = {
    "gordon": "gordon.py",
    "docbert": "docbert.py",
    "export-bench": "export_bench.py",
}


def pipelines_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "pipelines"


def add_arguments(parser):
    parser.add_argument("config", nargs="?", help="pipeline YAML, e.g. pipelines/configs/gordon.yaml")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override a setting, dotted keys into sections (sweep.jobs=2)")


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``values`` with each ``a.b=value`` set (value parsed as YAML)."""
    out = yaml.safe_load(yaml.safe_dump(values)) or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"override '{item}' is not KEY=VALUE (e.g. sweep.jobs=2)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise UsageError(f"override '{item}': the value is not valid YAML") from None
        parts = [p.replace("-", "_") for p in key.strip().split(".")]
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p, {}), dict):
                raise UsageError(f"override '{item}': '{p}' is a value, not a section")
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def load_pipeline(name: str):
    """Import ``pipelines/<file>`` for ``name`` by path (it must define ``run(values) -> Path``)."""
    if name not in PIPELINES:
        raise UsageError(f"unknown pipeline '{name}' in the config's 'pipeline:' key; choose one of: "
                         f"{', '.join(PIPELINES)}")
    path = pipelines_dir() / PIPELINES[name]
    if not path.is_file():
        raise UsageError(f"pipeline file {path} not found; 'compress run' needs the source checkout "
                         "(pipelines/ beside compress/)")
    spec = importlib.util.spec_from_file_location(f"compress_pipeline_{name.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def run(args):
    if not args.config:
        raise UsageError("pass a pipeline YAML, e.g. compress run pipelines/configs/gordon-small.yaml")
    values = apply_overrides(load_yaml(args.config), args.overrides)
    name = values.pop("pipeline", None)
    if name is None:
        raise UsageError(f"{args.config} has no 'pipeline:' key; add one of: {', '.join(PIPELINES)}")
    module = load_pipeline(str(name))
    out = module.run(values)
    print(f"pipeline {name} finished: {out}")
    return 0
