"""Typed, frozen configs and their resolution: dataclass defaults < ``--config`` YAML < explicit flags."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from compress.core.errors import UsageError

C = TypeVar("C")


def option(default: Any, *, help: str,  # noqa: A002 - argparse's word
           choices: typing.Sequence[str] | typing.Callable[[], typing.Sequence[str]] | None = None
           ) -> Any:
    """A config field that carries its own help text and choices, Hugging Face's
    ``field(metadata={"help": ..., "choices": ...})`` convention: the commands build their flags'
    help from it, so a field and its explanation live in one place. ``choices`` may be a function
    that reads a registry when help is printed (tasks and students registered later show up)."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    return dataclasses.field(default=default, metadata=metadata)


def option_like(cls: type, name: str, default: Any = dataclasses.MISSING) -> Any:
    """A field with the help, choices and default of ``cls``'s field ``name`` (the default
    replaced when given): one text for an option two unrelated configs share."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=f.default if default is dataclasses.MISSING else default,
                             metadata=dict(f.metadata))


def field_choices(f: dataclasses.Field) -> list[str] | None:
    """The choices a field's metadata lists (calling a registry reader), or None."""
    choices = f.metadata.get("choices")
    if callable(choices):
        choices = choices()
    return list(choices) if choices is not None else None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader; errors name the file and the fix."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file not found: {p} (pass an existing YAML file to --config)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"config file {p} is not valid YAML: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {p} must hold a mapping of option: value, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Coerce YAML scalars to the field type so a config file gets the same checks as a flag."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if value is None:
        optional = origin in (typing.Union, types.UnionType) and type(None) in args
        if not optional and annotation is not Any:
            kind = getattr(annotation, "__name__", str(annotation))
            raise UsageError(f"option {name}: expected {kind}, got null (remove the key to use the default)")
        return None
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _coerce(name, value, non_none[0])
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"option {name}: expected a list, got {value!r}")
        inner = args[0] if args else str
        return tuple(_coerce(name, v, inner) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"option {name}: expected true or false, got {value!r}")
    if annotation in (int, float, str):
        if annotation is not str and isinstance(value, bool):
            raise UsageError(f"option {name}: expected a number, got {value!r}")
        try:
            out = annotation(value)
        except (TypeError, ValueError, OverflowError):
            raise UsageError(f"option {name}: expected {annotation.__name__}, got {value!r}") from None
        if annotation is int and isinstance(value, float) and value != out:
            raise UsageError(f"option {name}: expected an integer, got {value!r}")
        return out
    return value


def resolve_config(cls: type[C], file_values: dict[str, Any] | None, flag_values: dict[str, Any]) -> C:
    """Build ``cls`` from defaults, then the YAML values, then flags; unknown keys are rejected."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    merged: dict[str, Any] = {}
    for source, values in (("config file", file_values or {}), ("flags", flag_values)):
        for key, value in values.items():
            if key not in fields:
                valid = ", ".join(sorted(fields))
                raise UsageError(f"unknown option '{key}' in {source}; valid options: {valid}")
            merged[key] = _coerce(key, value, hints[key])
    try:
        return cls(**merged)
    except TypeError as exc:
        raise UsageError(str(exc)) from None


def explicit_fields(cls: type, file_values: dict[str, Any] | None, flag_values: dict[str, Any]
                    ) -> set[str]:
    """The fields of ``cls`` the user set: every flag given (whatever its value) and every key of
    the config file whose value differs from the default (a run's resolved ``config.yaml`` lists
    every field, defaults included). For refusing options that do not apply: a config dataclass
    cannot tell a default from the same value typed."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    out = {k for k in flag_values if k in fields}
    for key, value in (file_values or {}).items():
        f = fields.get(key)
        if f is None:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if _coerce(key, value, hints[key]) != default:
            out.add(key)
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, YAML-safe dict of a config dataclass (tuples become lists, paths strings)."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, Path):
            v = str(v)
        out[f.name] = v
    return out


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> None:
    """Raise UsageError naming the option when ``value`` lies outside the interval."""
    # NaN compares false with everything and inf is never a sensible setting: both are refused
    bad = (isinstance(value, float) and not math.isfinite(value)) or (
        lo is not None and (value < lo or (lo_open and value == lo))) or (
        hi is not None and (value > hi or (hi_open and value == hi)))
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise UsageError(f"--{name.replace('_', '-')} must be in {left}{lo_s}, {hi_s}{right}, got {value}")


def check_sparsity(value: float, name: str = "sparsity") -> None:
    """A sparsity is the fraction of weights set to zero: in [0, 1) (1 would remove every weight)."""
    check_range(name, value, 0, 1, hi_open=True)


def check_choice(name: str, value: str, choices: typing.Iterable[str]) -> None:
    choices = list(choices)
    if value not in choices:
        raise UsageError(
            f"unknown {name.replace('_', ' ')} '{value}'; choose one of: {', '.join(choices)}"
        )
