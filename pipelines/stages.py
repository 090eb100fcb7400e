"""Orchestration glue shared by the pipelines: run a CLI command as a stage, skip finished ones.

Every stage is one ``compress`` subprocess writing one run folder (or one JSON file). A stage is
finished when its output exists (run folders are renamed into place only when complete), so
re-running a pipeline picks up where it stopped. No algorithms here: only calls to the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from compress.core.config import resolve_config
from compress.core.errors import CompressError, UsageError
from compress.core.runs import write_json, write_text_atomic


def section(values: dict[str, Any], name: str, cls: type):
    """Build the frozen config ``cls`` from ``values[name]`` (unknown keys fail, naming the valid ones)."""
    raw = values.get(name) or {}
    if not isinstance(raw, dict):
        raise UsageError(f"pipeline section '{name}' must be a mapping of option: value, got {raw!r}")
    return resolve_config(cls, {k.replace("-", "_"): v for k, v in raw.items()}, {})


def top_level(values: dict[str, Any], cls: type, sections: tuple[str, ...]):
    """The pipeline's top-level options (everything that is not a section)."""
    flat = {k.replace("-", "_"): v for k, v in values.items() if k not in sections}
    return resolve_config(cls, flat, {})


def finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file()


def cli(args: list[str], log_file: Path) -> str:
    """Run ``python -m compress ARGS``; its output goes to ``log_file`` and is returned. A failure
    raises CompressError naming the command and the last line of its error output."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COMPRESS_NO_PROGRESS": os.environ.get("COMPRESS_NO_PROGRESS", "1")}
    proc = subprocess.run([sys.executable, "-m", "compress", *args], capture_output=True, text=True, env=env)
    write_text_atomic(log_file, f"$ compress {' '.join(args)}\n{proc.stdout}\n{proc.stderr}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no error output)"])[-1]
        raise CompressError(f"stage 'compress {args[0]}' failed (exit {proc.returncode}): {last} "
                            f"(full log: {log_file}); fix it and re-run: finished stages are kept")
    return proc.stdout


def run_stage(out_dir: Path, name: str, args: list[str], log=print) -> Path:
    """Run ``compress ARGS --out <out_dir>/<name>`` unless that run folder is finished."""
    run_dir = out_dir / name
    if finished(run_dir):
        log(f"  {name}: finished already")
        return run_dir
    shutil.rmtree(out_dir / f".tmp-{name}", ignore_errors=True)  # left by a killed stage
    log(f"  {name}: compress {' '.join(args[:3])} ...")
    cli([*args, "--out", str(run_dir)], out_dir / "logs" / f"{name}.log")
    return run_dir


def json_stage(dest: Path, args: list[str], log=print) -> dict[str, Any]:
    """Run a command that prints JSON (``compress measure X --json``) and keep it in ``dest``
    (skipped when ``dest`` exists)."""
    if dest.is_file():
        return json.loads(dest.read_text(encoding="utf-8"))
    log(f"  {dest.name}: compress {' '.join(args[:2])} ...")
    text = cli(args, dest.parent / "logs" / f"{dest.stem}.log")
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise CompressError(f"'compress {' '.join(args)}' printed no JSON object; see "
                            f"{dest.parent / 'logs' / (dest.stem + '.log')}")
    write_json(dest, data)
    return data


def write_manifest(out_dir: Path, pipeline: str, config: dict[str, Any], models: dict[str, Any]) -> None:
    """``pipeline.json``: what ``compress report`` reads to build the pipeline's tables."""
    write_json(out_dir / "pipeline.json", {"pipeline": pipeline, "config": config, "models": models})
