"""``compress`` entry point: one module per subcommand in an explicit table."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from compress import __version__
from compress.cli.common import OneLineParser
from compress.core.errors import CompressError

# name -> module; each module has HELP, EXAMPLES, add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, str] = {
    "finetune": "compress.cli.finetune",
    "eval": "compress.cli.eval",
    "info": "compress.cli.info",
    "measure": "compress.cli.measure",
    "export": "compress.cli.export",
    "bench": "compress.cli.bench",
    "prune": "compress.cli.prune",
    "verify": "compress.cli.verify",
    "distill": "compress.cli.distill",
    "sweep": "compress.cli.sweep",
    "report": "compress.cli.report",
    "run": "compress.cli.run",
}


RESUMABLE: dict[str, bool] = {}  # command -> whether it has a --resume flag (filled by build_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="compress", description="Prune, distil, measure and export BERT models.")
    parser.add_argument("--version", action="version", version=f"compress {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, epilog=mod.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.add_argument("--verbose", action="store_true",
                       help="show the Hugging Face load reports, warnings and progress bars that are "
                            "hidden by default")
        p.set_defaults(func=mod.run)
        RESUMABLE[name] = any("--resume" in a.option_strings for a in p._actions)
    return parser


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one line of at most ``limit`` characters: a bad value quoted in it may
    hold newlines or be a 70,000-character field."""
    text = " ".join(message.splitlines())  # every line break, including \r, \x0b, U+2028
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so it unwinds as Ctrl-C does: a run folder with a
    checkpoint is kept for --resume, one without is removed."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM that ``exc`` was raised while handling (``__context__`` /
    ``__cause__``), if any: a library that catches the interrupt mid-write (torch.save's zip
    writer) raises its own error from it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def resumable(args: argparse.Namespace) -> bool:
    """Whether the parsed command continues an interrupted run with ``--resume``: it has the flag,
    and it is not one of the runs that refuse it (a post-training prune, ReQA training). Flags
    reach ``args`` only when typed, so an absent ``stage`` is the default one."""
    return (RESUMABLE.get(args.command, False) and getattr(args, "stage", None) != "post-training"
            and getattr(args, "task", None) != "reqa")


def _stopped(args: argparse.Namespace, exc: KeyboardInterrupt) -> int:
    """One line for an interrupted run; 143 for SIGTERM, 130 for Ctrl-C. ``--resume`` is suggested
    only where the command accepts it."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    then = ("a run that saved a checkpoint is kept; continue it with the same command plus --resume"
            if resumable(args) else "this run does not resume and keeps no folder; run the command again")
    print(f"compress {args.command}: {what} ({then})", file=sys.stderr)
    return 143 if isinstance(exc, Terminated) else 130


# Flags naming a model that a command loads: checked before any heavy import, so an unknown name
# with no hub to ask answers in a second or two (compress.models.loading.resolve_model).
MODEL_FLAGS = {"finetune": ("model",), "eval": ("model",), "prune": ("model", "teacher"),
               "distill": ("teacher",)}


def check_model_flags(argv: list[str]) -> None:
    """Resolve the typed model flags of ``argv`` before the full parser is built: building it
    imports every command's workflow (torch, scikit-learn), seconds that a wrong name should not
    wait for."""
    if not argv or argv[0] not in MODEL_FLAGS:
        return
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in MODEL_FLAGS[argv[0]]:
        pre.add_argument("--" + name)
    known, _ = pre.parse_known_args(argv[1:])
    from compress.models.loading import resolve_model

    for name in MODEL_FLAGS[argv[0]]:
        value = getattr(known, name, None)
        if value is not None and not value.strip():  # a variable that expanded to nothing
            from compress.core.errors import UsageError

            raise UsageError(f"--{name} {value!r} is empty; pass a model or run folder (or 'minilm'), "
                             f"or drop --{name}")
        # 'self' (prune's teacher) and 'bm25' (eval's ReQA baseline) name no model folder
        if value and value not in ("self", "bm25"):
            resolve_model(value)


def check_sweep_address(argv: list[str]) -> None:
    """``compress sweep --backend ray --address A``: prove that A answers before the full parser is
    built (seconds of imports), so a dead cluster is refused within a few seconds. The sweep
    checks it again when the address comes from --config."""
    if not argv or argv[0] != "sweep":
        return
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--backend")
    pre.add_argument("--address")
    known, _ = pre.parse_known_args(argv[1:])
    if known.backend == "ray" and known.address is not None and known.address.strip():
        from compress.core.sweep_backends import check_address

        check_address(known.address)


def quiet_libraries() -> None:
    """Hide the Hugging Face load reports (tables of MISSING keys), warnings and weight-loading
    bars, and the training bar when stderr is not a terminal (a log file would fill with carriage
    returns). Set through the environment, so worker processes inherit it."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not sys.stderr.isatty():
        os.environ["COMPRESS_NO_PROGRESS"] = "1"
    if "transformers" in sys.modules:  # imported already (in-process callers): set it there too
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def loud_libraries() -> None:
    """--verbose: the libraries' own defaults, even where an earlier quiet call in this process (or
    a parent's environment) turned them down."""
    os.environ["TRANSFORMERS_VERBOSITY"] = "warning"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"
    os.environ["COMPRESS_NO_PROGRESS"] = "0"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning()
        hf_logging.enable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        check_model_flags(argv)
        check_sweep_address(argv)
    except CompressError as exc:
        print(f"compress {argv[0]}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.verbose:
        loud_libraries()
    else:
        quiet_libraries()
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the interpreter's main thread (an embedding caller): leave it alone
        previous = None
    try:
        return int(args.func(args) or 0)
    except CompressError as exc:
        print(f"compress {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        return _stopped(args, exc)
    except Exception as exc:  # a signal inside a library call (torch.save) that re-raised it as another error
        stop = interrupt_behind(exc)
        if stop is None:
            if isinstance(exc, OSError):  # disk full, permission denied: the environment -> one line
                print(f"compress {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
                return 1
            raise
        return _stopped(args, stop)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
