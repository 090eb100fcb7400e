"""Run folders: self-describing, written under a temporary name, renamed when complete, never overwritten."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from compress.errors import UsageError


def artifacts_root() -> Path:
    return Path(os.environ.get("COMPRESS_ARTIFACTS", "artifacts"))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(seed: int | None = None) -> dict[str, Any]:
    """Versions, device and commit: what ``env.json`` records for a run."""
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(),
        "git_commit": _git_commit(),
        "seed": seed,
    }
    for mod in ("datasets", "accelerate", "onnx", "onnxruntime", "torch_pruning", "sklearn"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is recorded, not fatal
            info[mod] = None
    return info


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file + rename) so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class RunDir:
    """A run folder written as ``.tmp-<name>`` and renamed to ``<name>`` on success.

    Use as a context manager. On an exception the temporary folder is removed, so a run folder is
    complete or absent. Nothing is created before ``__enter__``.
    """

    def __init__(self, command: str, name: str = "run", out: str | Path | None = None,
                 resume: bool = False):
        if out is not None:
            self.final = Path(out)
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.final = artifacts_root() / command / f"{stamp}-{name}"
            n = 2
            while self.final.exists() or self._tmp_for(self.final).exists():
                self.final = artifacts_root() / command / f"{stamp}-{name}-{n}"
                n += 1
        self.path = self._tmp_for(self.final)
        self.resume = resume
        if self.final.exists():
            raise UsageError(f"run folder {self.final} already exists; runs are never overwritten "
                             "(choose another --out)")
        if self.path.exists() and not resume:
            raise UsageError(f"an interrupted run is at {self.path}; pass --resume to continue it "
                             "or remove that folder")

    @staticmethod
    def _tmp_for(final: Path) -> Path:
        return final.parent / f".tmp-{final.name}"

    def __enter__(self) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=self.resume)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            os.replace(self.path, self.final)
            self.path = self.final
        elif not self._keep_for_resume(exc_type):
            shutil.rmtree(self.path, ignore_errors=True)
        return False

    def _keep_for_resume(self, exc_type) -> bool:
        # An interrupted run that saved a checkpoint is kept so --resume can continue it;
        # a run that failed on bad input is removed so no half-written folder is left behind.
        return issubclass(exc_type, KeyboardInterrupt) and (self.path / "checkpoint").exists()

    def write_config(self, cfg: dict[str, Any]) -> None:
        (self.path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

    def write_env(self, seed: int | None) -> None:
        write_json(self.path / "env.json", environment(seed))

    def log_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.path / "summary.json", summary)
