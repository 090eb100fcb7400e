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

from compress.core.config import explicit_fields, field_choices, load_yaml, resolve_config


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


def _help_for(f: dataclasses.Field, helps: dict[str, str], default: Any) -> str:
    """The command's own text for the field, else the field's (``compress.core.config.option``); then
    its choices (read from the registries) and its default, each said once."""
    text = helps.get(f.name) or f.metadata.get("help", "")
    choices = field_choices(f)
    if choices and "choices:" not in text:
        text = f"{text}; choices: {', '.join(choices)}" if text else f"choices: {', '.join(choices)}"
    says_unset = default in (None, ()) and "unset" in text  # "(unset: --lr)" is its default
    if "(default" not in text and "default:" not in text and not says_unset:
        text = f"{text} (default: {default})" if text else f"default: {default}"
    return text.replace("%", "%%")  # argparse formats help with %-style placeholders


def add_config_args(parser: argparse.ArgumentParser, cls: type, helps: dict[str, str] | None = None,
                    positional: tuple[str, ...] = (), only: typing.Collection[str] | None = None,
                    skip: typing.Collection[str] = ()) -> None:
    """One flag per dataclass field (``foo_bar`` -> ``--foo-bar``), defaults shown from the class.

    Flags go into argument groups (model and task first; then data, training, pruning,
    distillation, question answering, output; ``compress.cli.option_groups``); a command's own
    options stay in the parser's. With ``only``, just those fields, in ``parser`` itself, and no
    ``--config`` (extra flags of a second config class, added to an argument group of a parser that
    already has them). ``skip`` leaves fields out (options a command does not use)."""
    from compress.cli.option_groups import GROUP_ORDER, group_of

    helps = helps or {}
    hints = typing.get_type_hints(cls)
    if only is None:
        parser.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE.yaml",
                            help="YAML file of options; explicit flags win over it")
    fields = [f for f in dataclasses.fields(cls) if f.name not in skip
              and (only is None or f.name in only)]
    groups: dict[str, Any] = {}
    if only is None:
        used = {group_of(cls, f.name) for f in fields if f.name not in positional}
        for title in GROUP_ORDER:
            if title in used:
                groups[title] = parser.add_argument_group(title)
        rank = {t: i for i, t in enumerate(GROUP_ORDER)}
        fields.sort(key=lambda f: rank.get(group_of(cls, f.name), -1))  # the command's own first
    for f in fields:
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        text = _help_for(f, helps, default)
        if f.name in positional:
            parser.add_argument(f.name, nargs="?", default=argparse.SUPPRESS, help=text)
            continue
        target = groups.get(group_of(cls, f.name), parser) if only is None else parser
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            target.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)
        elif typing.get_origin(kind) is tuple:
            target.add_argument(flag, default=argparse.SUPPRESS, metavar="A,B,...", help=text)
        elif kind in (int, float):
            target.add_argument(flag, type=_number(kind), default=argparse.SUPPRESS, help=text)
        else:
            target.add_argument(flag, default=argparse.SUPPRESS, help=text)


def _typed_and_file_values(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    values = {k: v for k, v in vars(args).items() if k not in ("config", "command", "func", "verbose")}
    file_values = load_yaml(args.config) if getattr(args, "config", None) else None
    return values, file_values


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    values, file_values = _typed_and_file_values(args)
    return resolve_config(cls, file_values, values)


def explicit_options(cls: type, args: argparse.Namespace) -> set[str]:
    """The fields of ``cls`` the user set, by a flag or in ``--config`` (``explicit_fields``)."""
    values, file_values = _typed_and_file_values(args)
    return explicit_fields(cls, file_values, values)
