"""Flags generated from config dataclasses, so every default lives in the dataclass.

Flags are parsed with ``argparse.SUPPRESS`` defaults: only flags the user typed reach
``resolve_config``, which applies them over the ``--config`` file over the dataclass defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from compress.config import load_yaml, resolve_config


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exits 2)."""

    def error(self, message: str) -> typing.NoReturn:
        message = " ".join(message.splitlines())  # a bad value may hold a newline: still one line
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _base_type(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def _number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
    parse.__name__ = kind.__name__
    return parse


def add_config_args(parser: argparse.ArgumentParser, cls: type, helps: dict[str, str] | None = None,
                    positional: tuple[str, ...] = (), only: typing.Collection[str] | None = None) -> None:
    """One flag per dataclass field (``foo_bar`` -> ``--foo-bar``), defaults shown from the class.

    With ``only``, just those fields and no ``--config`` (extra flags of a second config class, added
    to an argument group of a parser that already has them)."""
    helps = helps or {}
    hints = typing.get_type_hints(cls)
    if only is None:
        parser.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE.yaml",
                            help="YAML file of options; explicit flags win over it")
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        text = helps.get(f.name, "")
        text = f"{text} (default: {default})" if text else f"default: {default}"
        text = text.replace("%", "%%")  # argparse formats help with %-style placeholders
        if f.name in positional:
            parser.add_argument(f.name, nargs="?", default=argparse.SUPPRESS, help=text)
            continue
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag, default=argparse.SUPPRESS, metavar="A,B,...", help=text)
        elif kind in (int, float):
            parser.add_argument(flag, type=_number(kind), default=argparse.SUPPRESS, help=text)
        else:
            parser.add_argument(flag, default=argparse.SUPPRESS, help=text)


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    values = {k: v for k, v in vars(args).items() if k not in ("config", "command", "func", "verbose")}
    file_values = load_yaml(args.config) if getattr(args, "config", None) else None
    return resolve_config(cls, file_values, values)
