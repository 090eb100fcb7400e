"""The one line an interrupted command prints: --resume suggested only where the command takes it."""

from __future__ import annotations

import pytest

from compress.cli.main import Terminated, _stopped, build_parser


@pytest.mark.parametrize("argv, resume", [
    (["prune", "--model", "x"], True),
    (["prune", "--model", "x", "--stage", "after-finetune"], True),
    (["finetune", "--task", "sst2"], True),
    (["distill", "--teacher", "x"], True),
    (["prune", "--model", "x", "--stage", "post-training"], False),
    (["finetune", "--task", "reqa"], False),
    (["export", "x"], False),  # no --resume flag at all
])
def test_the_interrupt_line_suggests_resume_only_where_it_is_accepted(argv, resume, capsys):
    args = build_parser().parse_args(argv)
    assert _stopped(args, KeyboardInterrupt()) == 130
    assert _stopped(args, Terminated()) == 143
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"compress {args.command}: interrupted (")
    assert lines[1].startswith(f"compress {args.command}: terminated (SIGTERM)")
    assert all(("--resume" in line) == resume for line in lines)
    if not resume:
        assert all("run the command again" in line for line in lines)
