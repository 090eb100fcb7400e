"""What every benchmark shares, once: the registry's entry type, the command line (the common flags
and each benchmark's own), the steps a benchmark runs (a ``python -m compress`` call, a library
call) with their dry run, and the result file.

A benchmark is a module of this package with

- ``add_arguments(parser)``: its own options (the parser comes from here; no benchmark builds one);
- ``budget(args) -> str``: what the run spends, in words (steps, samples, seeds, rounds);
- ``run(args, ctx) -> dict``: runs its steps through ``ctx`` and returns its results (``None`` in a
  dry run, where the steps are printed instead of run);
- ``COMMON``: which common flags it takes, of :data:`COMMON_FLAGS`; ``SEEDS``: the default of
  ``--seeds`` when it takes them; ``PASSTHROUGH``: True when arguments after ``--`` go to every run.

``python -m benchmarks NAME`` writes ``artifacts/benchmarks/NAME-<date>.json`` (or ``--out``): the
benchmark, its command, date, commit, machine, load average at start and end, the budget in words,
the steps it ran with their wall times, and its results.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = "../shared/data"
# set for every CLI step unless the caller's environment says otherwise
STEP_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COMPRESS_NO_PROGRESS": "1"}


class BenchmarkError(RuntimeError):
    """A step failed, or a benchmark cannot run with the options given (the message says which)."""


@dataclass(frozen=True)
class Benchmark:
    """One named benchmark: the module that runs it, one line for the list, and option defaults
    (one module can serve several names that differ only in defaults, e.g. per task)."""

    name: str
    module: str
    summary: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def load(self):
        return importlib.import_module(f"benchmarks.{self.module}")


# ---------------------------------------------------------------------------------------------
# the command line


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes integers separated by commas, got {text!r}"
                                         ) from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


COMMON_FLAGS: dict[str, Callable[[argparse.ArgumentParser, Any, str], None]] = {
    "data_dir": lambda p, m, name: p.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help="the datasets folder (default: %(default)s)"),
    "seeds": lambda p, m, name: p.add_argument(
        "--seeds", type=_seeds, default=_seeds(getattr(m, "SEEDS", "42")),
        help=f"comma-separated seeds (default: {getattr(m, 'SEEDS', '42')})"),
    "work": lambda p, m, name: p.add_argument(
        "--work", type=Path, default=Path("artifacts") / name,
        help="folder of the runs, models and exports; a step whose output is there already is "
             "skipped, so a stopped benchmark can be run again (default: %(default)s)"),
    "python": lambda p, m, name: p.add_argument(
        "--python", default=sys.executable,
        help="the interpreter that runs `python -m compress` (default: this one)"),
}


def build_parser(entry: Benchmark, module) -> argparse.ArgumentParser:
    """The benchmark's parser: its docstring as help, the common flags it takes, its own options."""
    doc = (module.__doc__ or entry.summary).strip()
    head, _, rest = doc.partition("\n\n")
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {entry.name}", description=head,
                                     epilog=rest or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write (default: "
                        f"artifacts/benchmarks/{entry.name}-<date>.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the steps (commands) it would run; run and write nothing")
    unknown = set(getattr(module, "COMMON", ())) - set(COMMON_FLAGS)
    if unknown:
        raise TypeError(f"benchmarks.{entry.module}.COMMON names {sorted(unknown)}; "
                        f"the common flags are {', '.join(COMMON_FLAGS)}")
    for flag in getattr(module, "COMMON", ()):
        COMMON_FLAGS[flag](parser, module, entry.name)
    module.add_arguments(parser)
    parser.set_defaults(**entry.defaults)
    return parser


def parse(entry: Benchmark, argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse ``argv`` for ``entry``; with ``PASSTHROUGH``, what follows ``--`` is ``args.extra``."""
    module = entry.load()
    parser = build_parser(entry, module)
    extra: list[str] = []
    if getattr(module, "PASSTHROUGH", False) and "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = parser.parse_args(argv)
    args.extra = extra
    return parser, args


def run_benchmark(entry: Benchmark, argv: list[str]) -> int:
    """Parse, run, write the result file; the exit code (1 when a step failed)."""
    parser, args = parse(entry, argv)
    module = entry.load()
    try:
        budget = module.budget(args)
    except BenchmarkError as exc:
        parser.error(str(exc))
    ctx = Context(entry.name, dry_run=args.dry_run, python=getattr(args, "python", sys.executable),
                  work=getattr(args, "work", None))
    if args.dry_run:
        print(f"# {entry.name} (dry run): {budget}")
    started = Started.now()
    out = args.out or default_out(entry.name, started.date)
    if not args.dry_run:  # rows written as they end, so a stopped benchmark keeps what it measured
        ctx.save = lambda results: write_result(out, entry.name, argv, budget, results, started,
                                                finished=False, steps=ctx.steps)
    from compress.core.errors import CompressError  # no torch

    try:
        results = module.run(args, ctx)
    except BenchmarkError as exc:
        if not ctx.steps:  # refused before any step: a usage error
            parser.error(str(exc))
        print(f"{entry.name}: error: {exc}", file=sys.stderr)
        return 1
    except CompressError as exc:  # a library step refused its input: one line, its exit code
        print(f"{entry.name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.dry_run:
        print(f"# dry run: {len(ctx.steps)} steps listed, nothing run, nothing written")
        return 0
    path = write_result(out, entry.name, argv, budget, results, started, steps=ctx.steps)
    print(f"-> {path}")
    return 1 if ctx.failed() else 0


# ---------------------------------------------------------------------------------------------
# steps


@dataclass
class Context:
    """Runs a benchmark's steps and keeps their record (command, exit code, wall seconds).

    In a dry run every step prints its command and returns without running; a benchmark returns
    ``None`` from ``run`` once its steps are listed, before it reads any of their outputs."""

    name: str
    dry_run: bool = False
    python: str = sys.executable
    work: Path | None = None
    steps: list[dict] = field(default_factory=list)
    save: Callable[[Any], Path | None] = lambda results: None

    def compress(self, step: str, argv: list[str], *, done: tuple[Path, ...] = (), check: bool = True,
                 env: Mapping[str, str] | None = None, log: Path | None = None) -> dict:
        """``python -m compress ARGV``, unless one of ``done`` exists (a finished earlier run)."""
        return self.command(step, [self.python, "-m", "compress", *map(str, argv)], done=done, check=check,
                            env=env, log=log)

    def benchmark(self, step: str, name: str, argv: list[str], **kw) -> dict:
        """Another benchmark of this suite, as its own process."""
        return self.command(step, [self.python, "-m", "benchmarks", name, *map(str, argv)], **kw)

    def command(self, step: str, cmd: list[str], *, done: tuple[Path, ...] = (), check: bool = True,
                env: Mapping[str, str] | None = None, log: Path | None = None,
                timeout: float | None = None) -> dict:
        """Run ``cmd`` with this worktree's packages first on the path; its output goes to ``log``
        (default ``<work>/logs/<step>.log``). ``check``: raise :class:`BenchmarkError` on failure
        (else the record holds ``rc`` and the output's tail)."""
        record: dict = {"name": step, "cmd": shlex.join(cmd)}
        finished = next((str(p) for p in done if Path(p).exists()), None)
        if finished:
            record["skipped"] = f"{finished} exists"
        if self.dry_run:
            print(("# done already: " if finished else "") + record["cmd"])
        if finished or self.dry_run:
            self.steps.append(record)
            return record
        if log is None and self.work is not None:
            log = Path(self.work) / "logs" / f"{step}.log"
        full_env = {**STEP_ENV, **os.environ, **(env or {}),
                    "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        print(f"{time.strftime('%H:%M:%S')} {step}", flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
            rc, said = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            rc, said = None, (out.decode(errors="replace") if isinstance(out, bytes) else out)
            record["timed_out"] = True
        record.update(rc=rc, seconds=round(time.monotonic() - t0, 1))
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(said, encoding="utf-8")
            record["log"] = str(log)
        if rc != 0:
            record["tail"] = said[-3000:]
        self.steps.append(record)
        if rc != 0 and check:
            raise BenchmarkError(f"step {step} failed (rc {rc}): {record['cmd']}\n{said[-2000:]}")
        return record

    def call(self, step: str, fn: Callable, *args, **kwargs) -> Any:
        """A library step, timed and recorded (in a dry run only named)."""
        record: dict = {"name": step, "call": f"{fn.__module__}.{fn.__qualname__}"}
        self.steps.append(record)
        if self.dry_run:
            print(f"# {step}: {record['call']}")
            return None
        print(f"{time.strftime('%H:%M:%S')} {step}", flush=True)
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            record["seconds"] = round(time.monotonic() - t0, 1)

    def timings(self) -> dict[str, float]:
        """Wall seconds of every step that ran, by name."""
        return {s["name"]: s["seconds"] for s in self.steps if "seconds" in s}

    def failed(self) -> list[str]:
        return [s["name"] for s in self.steps if s.get("rc") not in (0, None) or s.get("timed_out")]


# ---------------------------------------------------------------------------------------------
# the result file


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


@dataclass(frozen=True)
class Started:
    date: str
    time: str
    monotonic: float
    load: list[float] | None

    @classmethod
    def now(cls) -> Started:
        now = datetime.datetime.now()
        return cls(now.date().isoformat(), now.isoformat(timespec="seconds"), time.monotonic(), _load())


def default_out(name: str, date: str) -> Path:
    root = Path(os.environ.get("COMPRESS_ARTIFACTS", "artifacts"))
    return root / "benchmarks" / f"{name}-{date}.json"


def commit() -> str:
    """The worktree's commit, ``+dirty`` when it has uncommitted changes; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine() -> dict:
    """CPU model and cores, the Python and torch versions (read without importing torch), and the
    GPU when torch is loaded and sees one."""
    info: dict[str, Any] = {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version(), "torch": _version("torch"),
                            "transformers": _version("transformers"), "onnxruntime": _version("onnxruntime")
                            or _version("onnxruntime-gpu"),
                            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_result(path: Path, name: str, argv: list[str], budget: str, results: Any, started: Started, *,
                 finished: bool = True, steps: list[dict] | None = None) -> Path:
    """The benchmark's JSON, written to a temporary name and renamed (a reader never sees half)."""
    record = {
        "benchmark": name,
        "command": shlex.join(["python", "-m", "benchmarks", name, *map(str, argv)]),
        "date": started.date,
        "started": started.time,
        "commit": commit(),
        "machine": machine(),
        "load_average": {"start": started.load, "end": _load()},
        "budget": budget,
        "finished": finished,
        "wall_seconds": round(time.monotonic() - started.monotonic, 1),
        "steps": steps or [],
        "results": results,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
