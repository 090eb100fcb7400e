"""Every option of every command explains itself: help text, choices from the registries, groups in
a fixed order, and only the options the command uses."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from compress.cli.main import COMMANDS, build_parser
from compress.tasks import TASKS
from students.registry import STUDENTS


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUB = _subparsers()


def _options(parser):
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help_text_and_one_default(command):
    for action in _options(SUB[command]):
        text = action.help or ""
        assert text and not text.startswith("default:"), (command, action.option_strings)
        assert text.count("(default") <= 1, (command, action.option_strings, text)


CONFIG_CLASSES = [
    "compress.api.prune_stages:PruneConfig", "compress.api.finetuning:FinetuneConfig",
    "compress.recipes.finetune:EvalConfig", "compress.recipes.distill:DistillConfig",
    "compress.recipes.reqa_mining:ReQAMiningConfig", "compress.recipes.sweep:SweepConfig",
    "compress.export.model_export:ExportConfig", "compress.recipes.measure:MeasureConfig",
    "compress.measure.bench:BenchOptions",
]


@pytest.mark.parametrize("path", CONFIG_CLASSES)
def test_every_config_field_carries_its_own_help(path):
    import importlib

    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    bare = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("help")]
    assert not bare, f"{name} fields without metadata help: {bare}"


def test_field_choices_are_read_from_the_registry_when_help_is_built(monkeypatch):
    # a task registered after import (a plugin) shows up in --task without an edit
    from compress.tasks import TASKS

    monkeypatch.setitem(TASKS, "my_task", dataclasses.replace(TASKS["sst2"], name="my_task",
                                                              description="a plugin's task"))
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = next(a.help for a in action.choices["finetune"]._actions if "--task" in a.option_strings)
    assert "my_task (a plugin's task)" in text


def _help_of(command: str, flag: str) -> str:
    return next(a.help for a in _options(SUB[command]) if flag in a.option_strings)


@pytest.mark.parametrize("command", ["finetune", "eval", "prune", "distill"])
def test_task_lists_every_task_with_its_description(command):
    text = _help_of(command, "--task")
    for name, spec in TASKS.items():
        assert f"{name} ({spec.description})" in text


def test_student_lists_every_student():
    text = _help_of("distill", "--student")
    assert all(name in text for name in STUDENTS) and "dual-encoder" in text


@pytest.mark.parametrize("flag, names", [("--criterion", ("magnitude", "random")),
                                         ("--scope", ("local", "global")),
                                         ("--schedule", ("oneshot", "gradual")),
                                         ("--stage", ("pretrain", "finetune", "after-finetune"))])
def test_pruning_choices_come_from_the_registries(flag, names):
    text = _help_of("prune", flag)
    assert "choices: " + ", ".join(names) in text


def _group_titles(parser) -> list[str]:
    return [g.title for g in parser._action_groups if g._group_actions]


@pytest.mark.parametrize("command", ["finetune", "eval", "prune"])
def test_groups_start_with_model_and_task_and_qa_options_have_their_own(command):
    titles = _group_titles(SUB[command])
    qa = "question answering (--task squad, reqa)"
    assert titles[1] == "model and task" and qa in titles
    assert titles.index(qa) > titles.index("model and task")
    group = next(g for g in SUB[command]._action_groups if g.title == qa)
    assert {a.dest for a in group._group_actions} >= {"doc_stride", "n_best", "split_by_article"}


def test_eval_offers_no_training_options():
    flags = {f for a in _options(SUB["eval"]) for f in a.option_strings}
    for training_only in ("--train-limit", "--objective", "--hl-top-k", "--pfa-alignment", "--lr"):
        assert training_only not in flags
    assert {"--task", "--model", "--doc-stride", "--split-by-article"} <= flags


def test_examples_are_one_command_per_line():
    # a lost backslash-continuation joins two example lines into one
    commands = "|".join(COMMANDS)
    for command, parser in SUB.items():
        for line in (parser.epilog or "").splitlines():
            if line.lstrip().startswith("compress "):
                assert len(re.findall(f"compress ({commands})\\b", line)) == 1, (command, line)
                assert not re.search(r"\S {2,}--", line), (command, line)  # a continuation joined in
