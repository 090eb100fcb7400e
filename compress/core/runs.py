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

from compress.core.errors import UsageError
from compress.core.security import resolve_out, safe_run_name


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


def _read_or_none(path: Path, parse) -> Any:
    """A small file of an interrupted run, parsed; None when missing or damaged (it is rewritten:
    the checkpoint, not this file, holds the run's progress)."""
    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return None


def launch_rank() -> tuple[int, int]:
    """(rank, world size) of this process in a torchrun/accelerate launch; (0, 1) otherwise.

    Read from the launcher's environment because the process group starts later, in ``train``.
    """
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file and rename it over ``path``: readers (and a resumed run)
    see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file + rename) so a reader never sees half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def complete_records(path: Path) -> list[str]:
    """The lines of a metrics.jsonl up to, not including, the first unreadable one (e.g. one cut
    short by a kill); [] when the file does not exist."""
    if not path.is_file():
        return []
    kept = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                json.loads(line)
            except json.JSONDecodeError:
                break
            if not line.endswith("\n"):
                break
            kept.append(line)
    return kept


def _upto(lines: list[str], step: int) -> list[str]:
    """``lines`` up to, not including, the first record with a step beyond ``step``."""
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > step:
            return lines[:i]
    return lines


def records_upto(path: Path, step: int) -> list[str]:
    """The lines of a metrics.jsonl up to, not including, the first record with a step beyond
    ``step`` (or the first unreadable line, e.g. one cut short by a kill)."""
    return _upto(complete_records(path), step)


PHASE_DONE = "done.json"
OWNER_FILE = "owner.pid"  # in a .tmp- folder: the PID of the process writing it


def live_owner(folder: Path) -> int | None:
    """The PID recorded in ``folder/owner.pid`` if that process is alive and is not this one."""
    try:
        pid = int((folder / OWNER_FILE).read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid() or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by another user
        return pid
    return pid


class RunDir:
    """A run folder written as ``.tmp-<name>`` and renamed to ``<name>`` on success.

    Use as a context manager. On an exception the temporary folder is removed, so a run folder is
    complete or absent, unless training already saved a checkpoint in ``checkpoint_dir``: then it
    is kept (Ctrl-C, a full disk, a crash) so ``resume=True`` can continue it. Nothing is created
    before ``__enter__``.

    Resuming re-opens ``.tmp-<name>``: ``metrics.jsonl`` is rewound to the newest valid checkpoint
    (records of later steps, which the resumed run logs again, are dropped), ``write_config``
    refuses options that differ from the interrupted run's, and ``env.json`` gains a ``resumes``
    entry.

    A run of several training phases (prune's pre-training and after-finetune stages) checkpoints
    each phase in ``checkpoint/<phase>/`` (``phase_checkpoint_dir``) and closes it with
    ``finish_phase``, which records the phase's results in ``checkpoint/<phase>/done.json``. A
    resumed run skips the phases recorded there (``phase_results``) and continues the unfinished
    one from its newest checkpoint; ``metrics.jsonl`` keeps the records of the finished phases and
    those of the unfinished one up to that checkpoint.
    """

    def __init__(self, command: str, name: str = "run", out: str | Path | None = None,
                 resume: bool = False):
        name = safe_run_name(name)
        self.rank, world = launch_rank()
        if out is not None:
            self.final = resolve_out(out)
        elif resume:
            raise UsageError("--resume needs --out naming the interrupted run's folder "
                             "(the folder it was started with)")
        elif world > 1:
            raise UsageError(f"a {world}-process launch needs --out, so that every process names the "
                             "same run folder")
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.final = artifacts_root() / command / f"{stamp}-{name}"
            n = 2
            while self.final.exists() or self._tmp_for(self.final).exists():
                self.final = artifacts_root() / command / f"{stamp}-{name}-{n}"
                n += 1
        self.path = self._tmp_for(self.final)
        if resume and not self.path.is_dir():  # resuming nothing would silently start afresh
            if self.final.is_dir():
                raise UsageError(f"{self.final} is a finished run: there is nothing to resume (drop "
                                 "--resume, and choose a new --out for a new run)")
            raise UsageError(f"no interrupted run to resume at {self.final} (no {self.path.name} "
                             "folder); pass the --out the interrupted run was started with, or drop "
                             "--resume to start a new run")
        self.resume = resume
        self.resumed = False
        # an experiment tracker (compress.training.trackers.start_tracking) that the logged records go to too
        self.tracker = None
        self._phases_done: dict[str, dict] = {}
        if self.rank > 0:
            # Another process of a multi-process launch: it writes to a scratch folder that is
            # removed at the end, and sees rank 0's checkpoints (to resume from the same step)
            # through a link; rank 0 alone writes the run folder and the checkpoints.
            self.leader_path = self.path
            self.path = self.final.parent / f".tmp-{self.final.name}.rank{self.rank}"
            return
        if self.final.exists():
            raise UsageError(f"run folder {self.final} already exists; runs are never overwritten "
                             "(choose another --out)")
        owner = live_owner(self.path) if self.path.exists() else None
        if owner is not None:
            raise UsageError(f"{self.path} is being written by a running process (PID {owner}); wait "
                             "for it to finish, or stop it and then continue it with --resume")
        if self.path.exists() and not resume:
            raise UsageError(f"an interrupted run is at {self.path}; pass --resume to continue it "
                             "or remove that folder")

    @staticmethod
    def _tmp_for(final: Path) -> Path:
        return final.parent / f".tmp-{final.name}"

    @property
    def checkpoint_dir(self) -> Path:
        """Where ``train`` saves checkpoints; removed by the caller once the run is complete."""
        return self.path / "checkpoint"

    def __enter__(self) -> RunDir:
        if self.rank > 0:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path.mkdir(parents=True)
            (self.path / "checkpoint").symlink_to(self.leader_path / "checkpoint", target_is_directory=True)
            if self.resume:  # skip the phases rank 0 skips: read before any of them can finish now
                self._phases_done = self._read_phases()
            return self
        if self.resume and self.path.is_dir():
            self.resumed = True
            self._phases_done = self._read_phases()
            self._rewind_metrics()
        else:
            self.path.mkdir(parents=True, exist_ok=self.resume)
        write_text_atomic(self.path / OWNER_FILE, f"{os.getpid()}\n")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.tracker is not None:  # its files are in the folder: closed before it is renamed
            self.tracker.close()
            self.tracker = None
        if self.rank > 0:
            shutil.rmtree(self.path, ignore_errors=True)  # removes the link, not rank 0's checkpoints
            return False
        (self.path / OWNER_FILE).unlink(missing_ok=True)
        if exc_type is None:
            os.replace(self.path, self.final)
            self.path = self.final
        elif not self._keep_for_resume(exc_type):
            shutil.rmtree(self.path, ignore_errors=True)
        return False

    def _keep_for_resume(self, exc_type) -> bool:
        """Whether a failed run's temporary folder stays for ``--resume``.

        A resumed run is never removed (it holds the progress of earlier invocations). A fresh run
        is kept when it created ``checkpoint/`` (train's step checkpoints, or another loop's state
        such as distillation's) and it was stopped by something other than bad input: Ctrl-C, a
        full disk, a crash. A CompressError removes it unless train() checkpoints exist, so bad input
        leaves no half-written folder; a diverged run (TrainingDivergedError) also stays when
        another loop's checkpoint file is there (a student's ``student.pt``).
        """
        from compress.core.checkpoints import checkpoint_dirs
        from compress.core.errors import CompressError, TrainingDivergedError

        if self.resumed:
            return True
        if not self.checkpoint_dir.is_dir():
            return False
        progress = any(checkpoint_dirs(d) or (d / PHASE_DONE).is_file()
                       for d in [self.checkpoint_dir, *self._phase_dirs()])
        if issubclass(exc_type, TrainingDivergedError):  # a student's epoch checkpoint is progress too
            progress = progress or any(f.is_file() for f in self.checkpoint_dir.iterdir())
        return not issubclass(exc_type, CompressError) or progress

    def _phase_dirs(self) -> list[Path]:
        """The phase folders under ``checkpoint/`` (not train's own ``step-*`` checkpoints)."""
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(d for d in self.checkpoint_dir.iterdir()
                      if d.is_dir() and not d.name.startswith((".", "step-")))

    def _read_phases(self) -> dict[str, dict]:
        """The ``done.json`` record of every finished phase, by phase name (damaged ones: unfinished)."""
        done = {}
        for d in self._phase_dirs():
            rec = _read_or_none(d / PHASE_DONE, json.loads)
            if (isinstance(rec, dict) and rec.get("phase") == d.name and isinstance(rec.get("results"), dict)
                    and isinstance(rec.get("metrics_lines"), int) and isinstance(rec.get("records"), list)):
                done[d.name] = rec
        return done

    def _rewind_metrics(self) -> None:
        """Keep the metrics records of the finished phases and those up to the checkpoint the run
        resumes from, drop the rest."""
        from compress.core.checkpoints import checkpoint_step, latest_checkpoint

        path = self.path / "metrics.jsonl"
        lines = complete_records(path)
        head, tail = [], lines
        if self._phases_done:
            # The newest finished phase's record says how many lines came before the records that
            # close it and holds those records: they are written from it, so a kill between
            # finish_phase's record and its logging leaves them neither missing nor twice.
            last = max(self._phases_done.values(), key=lambda r: r["metrics_lines"])
            n, closing = last["metrics_lines"], last["records"]
            head = lines[:n] + [r + "\n" for r in closing]
            tail = lines[n + len(closing):]
        upto = 0
        for d in [self.checkpoint_dir, *self._phase_dirs()]:  # the unfinished train() call, if any
            ckpt = latest_checkpoint(d) if d.name not in self._phases_done else None
            if ckpt is not None:
                upto = checkpoint_step(ckpt)
                break
        if path.is_file() or head:
            write_text_atomic(path, "".join(head + _upto(tail, upto)))

    def phase_checkpoint_dir(self, phase: str) -> Path:
        """Where ``train`` checkpoints ``phase`` of a multi-phase run (``checkpoint/<phase>``)."""
        return self.checkpoint_dir / phase

    def phase_results(self, phase: str) -> dict | None:
        """The results ``finish_phase`` recorded for ``phase`` when an earlier invocation of this
        resumed run finished it; None for a phase still to run (always None for a fresh run)."""
        rec = self._phases_done.get(phase)
        return None if rec is None else rec["results"]

    def finish_phase(self, phase: str, results: dict, records: list[dict] = ()) -> None:
        """Record that ``phase`` is complete with its ``results`` (plain JSON values), then log the
        metrics ``records`` that close it.

        The record is written (atomically) before the records are logged and holds them, so that a
        kill in between loses none and duplicates none. Rank > 0 records nothing (rank 0 does)."""
        if self.rank > 0:
            return
        lines = [json.dumps(r, default=str) for r in records]
        folder = self.phase_checkpoint_dir(phase)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / PHASE_DONE, {"phase": phase, "results": results, "records": lines,
                                         "metrics_lines": len(complete_records(self.path / "metrics.jsonl"))})
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
        if self.tracker is not None:
            for r in records:
                self.tracker.log_record(r)

    def write_config(self, cfg: dict[str, Any]) -> None:
        path = self.path / "config.yaml"
        old = _read_or_none(path, yaml.safe_load) if self.resumed else None
        if isinstance(old, dict):
            ignore = {"resume"}
            diff = sorted(k for k in set(old) | set(cfg) if k not in ignore and old.get(k) != cfg.get(k))
            if diff:
                shown = ", ".join(f"{k}: {old.get(k)!r} -> {cfg.get(k)!r}" for k in diff)
                raise UsageError(f"--resume with options that differ from the interrupted run ({shown});"
                                 " resume with the same options")
        write_text_atomic(path, yaml.safe_dump(cfg, sort_keys=False))

    def write_env(self, seed: int | None) -> None:
        path = self.path / "env.json"
        env = environment(seed)
        first = _read_or_none(path, json.loads) if self.resumed else None
        if isinstance(first, dict):
            first.setdefault("resumes", []).append(env)
            env = first
        write_json(path, env)

    def log_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
        if self.tracker is not None:
            self.tracker.log_record(record)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.path / "summary.json", summary)
