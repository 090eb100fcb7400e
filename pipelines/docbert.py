"""Adhikari et al. 2020, "DocBERT": distil a fine-tuned BERT into small students.

Stages, top to bottom:
  1. teacher   fine-tune the encoder on the task (``compress finetune``);
  2. distill   every student with knowledge distillation (augmented data, teacher logits) and
               without it (gold labels only), plus a BiLSTM hidden-size sweep (Figure 1);
  3. measure   parameters and FLOPs of the teacher and every student (``compress measure``);
  4. export    each model to ONNX (``compress export``);
  5. bench     latency of all exported models in one run (``compress bench``);
  6. report    the distillation table (params / FLOPs / latency / metric, Tables 2-3) and the
               hidden-size curve, via ``compress report``.
Each stage writes a run folder or file and is skipped when that exists, so a re-run resumes.
Run with ``compress run pipelines/configs/docbert.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.security import resolve_out
from compress.report import write_report

try:  # loaded by path from ``compress run``: find stages.py beside this file
    from pipelines.stages import cli, json_stage, run_stage, section, top_level, write_manifest
except ImportError:  # pragma: no cover - pipelines/ not on sys.path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines.stages import cli, json_stage, run_stage, section, top_level, write_manifest

SECTIONS = ("teacher", "distill", "bench")


@dataclass(frozen=True)
class DocbertOptions:
    out: str = "artifacts/docbert"
    model: str = "minilm"
    task: str = "sst2"
    data_dir: str | None = None
    train_limit: int | None = None
    eval_limit: int | None = None
    max_length: int = 128
    students: tuple[str, ...] = ("bilstm", "kimcnn", "logreg")
    lstm_hidden_sizes: tuple[int, ...] = ()
    export: bool = True


@dataclass(frozen=True)
class TeacherStage:
    lr: float = 5e-5
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 32


@dataclass(frozen=True)
class DistillStage:
    augment: int = 0
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 64


@dataclass(frozen=True)
class BenchStage:
    batch_sizes: tuple[int, ...] = (1,)
    seq_lens: tuple[int, ...] = (128,)
    iterations: int = 10


def _data_flags(o: DocbertOptions) -> list[str]:
    flags = ["--task", o.task, "--max-length", str(o.max_length)]
    if o.data_dir:
        flags += ["--data-dir", str(Path(o.data_dir).expanduser().resolve())]
    for name in ("train_limit", "eval_limit"):
        if getattr(o, name) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(o, name))]
    return flags


def run(values: dict[str, Any], log=print) -> Path:
    # setup: typed sections, so a typo in the YAML fails before any training
    o = top_level(values, DocbertOptions, SECTIONS)
    t = section(values, "teacher", TeacherStage)
    d = section(values, "distill", DistillStage)
    b = section(values, "bench", BenchStage)
    if not o.students and not o.lstm_hidden_sizes:
        raise UsageError("docbert: 'students' is empty and no 'lstm_hidden_sizes'; name at least one "
                         "student (bilstm, kimcnn, logreg)")
    out = resolve_out(o.out)
    out.mkdir(parents=True, exist_ok=True)
    data = _data_flags(o)
    models: dict[str, dict[str, Any]] = {}

    # 1. teacher
    log("docbert: teacher")
    teacher_args = ["finetune", "--model", o.model, *data, "--lr", str(t.lr), "--epochs", str(t.epochs),
                    "--batch-size", str(t.batch_size)]
    if t.max_steps:
        teacher_args += ["--max-steps", str(t.max_steps)]
    teacher = run_stage(out, "teacher", teacher_args, log)
    models["teacher"] = {"run": str(teacher), "kind": "teacher"}

    # 2. students, with and without KD, and the BiLSTM hidden-size curve
    log("docbert: distill")
    student_args = ["--teacher", str(teacher), *data, "--epochs", str(d.epochs), "--lr", str(d.lr),
                    "--batch-size", str(d.batch_size)]
    for student in o.students:
        for kd in (True, False):
            label = f"{student}-{'kd' if kd else 'nokd'}"
            extra = ["--augment", str(d.augment)] if kd and d.augment else []
            extra += [] if kd else ["--no-kd"]
            run = run_stage(out, label, ["distill", "--student", student, *student_args, *extra], log)
            models[label] = {"run": str(run), "kind": "student", "student": student, "kd": kd}
    for h in o.lstm_hidden_sizes:
        label = f"bilstm-kd-h{h}"
        run = run_stage(out, label, ["distill", "--student", "bilstm", "--student-options",
                                     f"hidden_size={h}", *student_args], log)
        models[label] = {"run": str(run), "kind": "student", "student": "bilstm", "kd": True, "hidden": h}

    # 3. measure
    log("docbert: measure")
    for label, m in models.items():
        json_stage(out / "measure" / f"{label}.json", ["measure", m["run"], "--json", "--seq-len",
                                                        str(b.seq_lens[0])], log)
        m["measure"] = str(out / "measure" / f"{label}.json")

    # 4-5. export and bench
    if o.export:
        log("docbert: export")
        for label, m in models.items():
            onnx = out / "onnx" / f"{label}.onnx"
            if not onnx.is_file():
                onnx.parent.mkdir(exist_ok=True)
                cli(["export", m["run"], "--to", str(onnx)], out / "logs" / f"export-{label}.log")
            m["onnx"] = str(onnx)
        log("docbert: bench")
        run_stage(out, "bench", ["bench", *(f"{label}={m['onnx']}" for label, m in models.items()),
                                 "--batch-sizes", ",".join(map(str, b.batch_sizes)),
                                 "--seq-lens", ",".join(map(str, b.seq_lens)),
                                 "--iterations", str(b.iterations)], log)

    # 6. report
    write_manifest(out, "docbert", {"options": to_dict(o), "teacher": to_dict(t), "distill": to_dict(d),
                                    "bench": to_dict(b)}, models)
    log(f"docbert: report {write_report(out)}")
    return out
