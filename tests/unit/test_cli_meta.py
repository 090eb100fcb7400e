"""Every registered subcommand: a module with help, examples, and flags generated from its config."""

from __future__ import annotations

import importlib

import pytest

from compress.cli.main import COMMANDS, build_parser, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_subcommand_has_help_and_examples(name, capsys):
    mod = importlib.import_module(COMMANDS[name])
    assert mod.HELP and "examples:" in mod.EXAMPLES and f"compress {name}" in mod.EXAMPLES
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out


def test_top_level_help_lists_every_subcommand():
    text = build_parser().format_help()
    for name in COMMANDS:
        assert name in text


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["finetune", "--batch-size", "3.5"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size" in err[0] and "expected an integer" in err[0]
