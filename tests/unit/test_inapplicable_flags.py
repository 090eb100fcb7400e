"""Options a run would silently ignore are refused in one line (exit 2, nothing written); their
defaults, and values a --config file leaves at the default, never are."""

from __future__ import annotations

import pytest
import yaml

from compress.cli.main import build_parser, main
from compress.core.errors import UsageError
from compress.tasks import DataOptions, get_task, load_split
from compress.tasks.qa import load_squad_split
from compress.tasks.retrieval import load_reqa_split


def _refused(argv, capsys, needle, out):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists() and not list(out.parent.glob(f".tmp-{out.name}*"))
    return err


@pytest.mark.parametrize("task, option, value", [
    ("sample", "text_pair_column", "sentence2"), ("sst2", "label_column", "stars"),
    ("reuters", "text_column", "body"),
])
def test_column_options_are_refused_by_tasks_that_read_their_own_columns(task, option, value):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(UsageError, match=f"{flag} {value} does not apply to task {task}"):
        load_split(get_task(task), DataOptions(None, **{option: value}), "train")
    with pytest.raises(UsageError, match=f"{flag} {value} does not apply to task squad"):
        load_squad_split(DataOptions(None, **{option: value}), "train")
    with pytest.raises(UsageError, match=f"{flag} {value} does not apply to task reqa"):
        load_reqa_split(DataOptions(None, **{option: value}), "train")


def test_column_options_still_work_where_they_apply(tmp_path):
    (tmp_path / "train.csv").write_text("a,b,y\nx,p,0\nz,q,1\n")
    (tmp_path / "dev.csv").write_text("a,b,y\nw,r,1\n")
    ds = load_split(get_task("csv"), DataOptions(tmp_path, "a", "b", "y"), "dev")
    assert (ds.texts, ds.pairs) == (["w"], ["r"])
    assert len(load_split(get_task("sample"), DataOptions(), "dev")) > 0  # defaults: no refusal


def test_finetune_refuses_a_pair_column_on_the_sample(tiny_bert, tmp_path, capsys):
    out = tmp_path / "run"
    _refused(["finetune", "--model", str(tiny_bert), "--text-pair-column", "sentence2", "--out", str(out)],
             capsys, "--text-pair-column sentence2 does not apply to task sample", out)


@pytest.mark.parametrize("extra, needle", [
    (["--task", "sst2"], "--task does not apply with --stage pretrain"),
    (["--data-dir", "DATA", "--train-limit", "5"], "--data-dir, --train-limit do not apply with --stage "
                                                   "pretrain"),
    (["--text-pair-column", "b"], "--text-pair-column does not apply with --stage pretrain"),
    (["--eval-limit", "2", "--doc-stride", "64"], "--doc-stride, --eval-limit do not apply"),
])
def test_prune_pretrain_refuses_task_and_data_options(tiny_bert, tmp_path, capsys, extra, needle):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a line of text\n" * 20)
    out = tmp_path / "run"
    extra = [str(tmp_path) if x == "DATA" else x for x in extra]
    _refused(["prune", "--stage", "pretrain", "--corpus", str(corpus), "--model", str(tiny_bert),
              *extra, "--out", str(out)], capsys, needle, out)


@pytest.mark.parametrize("extra, needle", [
    (["--schedule", "gradual"], "--schedule does not apply with --structured"),
    (["--prune-steps", "4", "--initial-sparsity", "0.1"], "--prune-steps, --initial-sparsity do not apply"),
    (["--scope", "global"], "--scope does not apply with --structured"),
    (["--include", "pooler"], "--include does not apply with --structured"),
    (["--prune-start", "3"], "--prune-start does not apply with --structured"),
])
def test_structured_pruning_refuses_schedule_options(tiny_bert, tmp_path, capsys, extra, needle):
    out = tmp_path / "run"
    _refused(["prune", "--structured", "heads", "--model", str(tiny_bert), *extra, "--out", str(out)],
             capsys, needle, out)


@pytest.mark.parametrize("argv, needle", [
    (["--pfa-epsilon", "0.2"], "--pfa-epsilon does not apply with --objective plain"),
    (["--task", "squad", "--objective", "hl-aacl", "--pfa-alignment", "kl"],
     "--pfa-alignment does not apply with --objective hl-aacl"),
    (["--mlm-probability", "0.2"], "--mlm-probability does not apply with --stage finetune"),
    (["--stage", "after-finetune", "--mlm-probability", "0.2"],
     "--mlm-probability does not apply with --stage after-finetune"),
    (["--schedule", "oneshot", "--prune-steps", "4"], "--prune-steps does not apply with --schedule oneshot"),
    (["--schedule", "oneshot", "--prune-every", "2", "--initial-sparsity", "0.1", "--schedule-power", "2"],
     "--prune-every, --initial-sparsity, --schedule-power do not apply with --schedule oneshot"),
])
def test_prune_refuses_flags_that_would_do_nothing(argv, needle):
    msg = _refusal(argv)
    assert msg is not None and needle in msg and "\n" not in msg, msg


def test_those_flags_pass_where_they_apply():
    assert _refusal(["--task", "squad", "--objective", "pfa", "--pfa-epsilon", "0.2"]) is None
    assert _refusal(["--stage", "pretrain", "--corpus", "c.txt", "--mlm-probability", "0.2"]) is None
    assert _refusal(["--prune-steps", "4", "--prune-every", "2", "--schedule-power", "2"]) is None
    assert _refusal(["--schedule", "oneshot", "--prune-start", "3"]) is None


def _refusal(argv, config: dict | None = None, tmp_path=None):
    """What cli.prune's check says of ``argv`` (and a --config file), without running anything."""
    from compress.api.prune_stages import PruneConfig
    from compress.cli.common import config_from_args, explicit_options
    from compress.cli.prune import refuse_ignored_options

    if config is not None:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = [*argv, "--config", str(path)]
    args = build_parser().parse_args(["prune", *argv])
    try:
        refuse_ignored_options(config_from_args(PruneConfig, args), explicit_options(PruneConfig, args))
    except UsageError as exc:
        return str(exc)
    return None


def test_defaults_and_what_applies_are_never_refused(tmp_path):
    from compress.api.prune_stages import PruneConfig
    from compress.core.config import to_dict

    assert _refusal(["--stage", "pretrain", "--corpus", "c.txt", "--schedule", "oneshot"]) is None
    assert _refusal(["--structured", "heads,ffn", "--schedule", "oneshot", "--stage", "after-finetune"]
                    ) is None
    assert _refusal(["--structured", "heads", "--task", "sst2", "--sparsity", "0.3"]) is None
    # a run's resolved config.yaml lists every option, the defaults included
    resolved = to_dict(PruneConfig(stage="pretrain", corpus=("c.txt",)))
    assert _refusal([], resolved, tmp_path) is None
    assert _refusal([], {**resolved, "task": "sst2"}, tmp_path) == (
        "--task does not apply with --stage pretrain (a masked LM on --corpus: no task or task data; "
        "fine-tune the pruned model on a task afterwards); remove it")
    structured = to_dict(PruneConfig(structured=("heads",)))
    assert _refusal([], structured, tmp_path) is None  # schedule: gradual there is the default
    assert "--schedule does not apply" in _refusal(["--schedule", "gradual"], structured, tmp_path)


@pytest.mark.parametrize("command", [
    ["prune", "--stage", "post-training", "--recovery-steps", "1"], ["prune", "--stage", "after-finetune"],
    ["finetune"],
])
def test_kd_layers_without_a_teacher_is_refused(tiny_bert, tmp_path, capsys, command):
    out = tmp_path / "run"
    _refused([*command, "--model", str(tiny_bert), "--kd-layers", "1", "--out", str(out)], capsys,
             "--kd-layers applies with --teacher only; add --teacher RUN (or --teacher self) or drop it", out)


def test_kd_layers_on_squad_is_refused_before_the_teacher_loads():
    from types import SimpleNamespace

    from compress.distill.teacher_kd import load_span_teacher

    for kd, needle in (({"kd_layers": 1.0}, "--kd-layers applies"),
                       ({"kd_hidden": 1.0, "kd_layers": 1.0}, "--kd-hidden, --kd-layers applies")):
        cfg = SimpleNamespace(objective="plain", teacher="self", model="unused", **kd)
        with pytest.raises(UsageError, match=f"{needle} to classification tasks; on squad drop it"):
            load_span_teacher(cfg, None)


def test_resume_into_a_folder_with_no_interrupted_run_is_refused(tiny_bert, tmp_path, capsys):
    out = tmp_path / "new"
    _refused(["finetune", "--model", str(tiny_bert), "--max-steps", "1", "--resume", "--out", str(out)],
             capsys, f"no interrupted run to resume at {out}", out)
    finished = tmp_path / "done"
    finished.mkdir()
    assert main(["finetune", "--model", str(tiny_bert), "--resume", "--out", str(finished)]) == 2
    assert "is a finished run: there is nothing to resume" in capsys.readouterr().err
