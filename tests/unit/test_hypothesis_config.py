"""Property-based bad input for the config loader and the CLI flags: YAML files of any shape and
flags with any value raise only CompressError (one line through the CLI, exit 1 or 2); valid values
give a config whose fields have the declared types."""

from __future__ import annotations

import dataclasses
import importlib
import tempfile
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.cli.main import COMMANDS, main
from compress.core.config import load_yaml, resolve_config
from compress.core.errors import CompressError, UsageError

SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _config_classes() -> dict[str, type]:
    """Every ``*Config`` dataclass a CLI command module uses (found through the COMMANDS table)."""
    found: dict[str, type] = {}
    for modname in COMMANDS.values():
        mod = importlib.import_module(modname)
        for name, obj in vars(mod).items():
            if name.endswith("Config") and dataclasses.is_dataclass(obj) and isinstance(obj, type):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


CONFIGS = _config_classes()

SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                   st.text(max_size=10), st.sampled_from(["1e400", "-0", "nan", "inf", "0x10", "1_000",
                                                          "yes", "~", "", "a,b", "minilm", "sample"]))
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=6)


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _has_type(v, t) -> bool:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(v, a) for a in typing.get_args(t))
    if t is type(None):
        return v is None
    if origin is not None:
        return isinstance(v, origin)
    if t in (int, float):
        return isinstance(v, (int, float) if t is float else int) and not isinstance(v, bool)
    if t is typing.Any or isinstance(t, typing.TypeVar):
        return True
    return isinstance(v, t)


def _check_types(cfg) -> None:
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        assert _has_type(getattr(cfg, f.name), hints[f.name]), (f.name, getattr(cfg, f.name), hints[f.name])


def test_commands_expose_their_configs():
    assert "compress.api.finetuning.FinetuneConfig" in CONFIGS


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resolve_config_raises_only_usage_errors(name):
    cls = CONFIGS[name]
    keys = st.one_of(st.sampled_from(_fields(cls)), st.text(max_size=8))

    @SETTINGS
    @given(values=st.dictionaries(keys, VALUE, max_size=5))
    def run(values):
        try:
            cfg = resolve_config(cls, values, {})
        except CompressError as exc:
            assert str(exc).strip()
            return
        _check_types(cfg)

    run()


@st.composite
def yaml_text(draw) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.binary(max_size=60))
    if kind == 1:
        return draw(st.text(max_size=60)).encode("utf-8", "surrogatepass")
    names = st.sampled_from(_fields(CONFIGS["compress.api.finetuning.FinetuneConfig"]))
    doc = draw(st.one_of(VALUE, st.dictionaries(names, VALUE, max_size=5)))
    text = yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))
    if kind == 3:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode(draw(st.sampled_from(["utf-8", "utf-16", "latin-1"])), "replace")


@SETTINGS
@given(data=yaml_text())
def test_load_yaml_raises_only_usage_errors(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.yaml"
        p.write_bytes(data)
        try:
            values = load_yaml(p)
        except UsageError as exc:
            assert str(p) in str(exc)
            return
        assert isinstance(values, dict) and all(isinstance(k, str) for k in values)


FLAGS = st.sampled_from(["--lr", "--epochs", "--max-steps", "--batch-size", "--max-length", "--seed",
                         "--warmup-ratio", "--train-limit", "--log-every", "--checkpoint-every",
                         "--text-column", "--name", "--weight-decay", "--max-grad-norm",
                         "--rank-check-every", "--task", "--data-dir", "--bogus"])
FLAG_VALUE = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "1e400", "", "abc", "3", "0.5",
                                        "sample", "csv", "nope", "/nonexistent", "a\nb", "\x7f"]),
                       st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                               max_size=8))


def _main_one_line(argv: list[str], capsys) -> None:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code in (1, 2), (code, err)
    assert len(err) == 1 and "error" in err[0], err
    assert "Traceback" not in err[0]


def test_cli_flags_with_any_value_fail_in_one_line(capsys, tmp_path):
    # --model names a missing folder, so a run whose options are all valid stops there (exit 1)
    @SETTINGS
    @given(pairs=st.lists(st.tuples(FLAGS, FLAG_VALUE), max_size=3))
    def run(pairs):
        argv = ["finetune", *[x for p in pairs for x in p], "--model", str(tmp_path / "none"),
                "--out", str(tmp_path / "run")]
        _main_one_line(argv, capsys)
        assert not (tmp_path / "run").exists()

    run()


def test_cli_config_files_of_any_shape_fail_in_one_line(capsys, tmp_path):
    @settings(SETTINGS, max_examples=40)
    @given(data=yaml_text())
    def run(data):
        cfg = tmp_path / "c.yaml"
        cfg.write_bytes(data)
        argv = ["finetune", "--config", str(cfg), "--task", "sample", "--model", str(tmp_path / "none"),
                "--out", str(tmp_path / "run")]
        _main_one_line(argv, capsys)
        assert not (tmp_path / "run").exists()

    run()


def test_a_multi_line_error_message_is_printed_as_one_line(capsys, monkeypatch):
    import compress.cli.finetune as cli_finetune

    def boom(cfg):
        raise UsageError("first line\nsecond line\u2028third " + "x" * 5000)

    monkeypatch.setattr(cli_finetune, "finetune_task", boom)
    assert main(["finetune"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "first line second line third" in err[0]
    assert err[0].endswith("more characters)") and len(err[0]) < 2100
