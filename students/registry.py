"""The student registry: an explicit name table, plus building, saving and loading students."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.config import resolve_config, to_dict
from compress.core.errors import ModelError, UsageError
from students.base import Student, StudentConfig
from students.bilstm import BiLSTMConfig, BiLSTMStudent
from students.kimcnn import KimCNNConfig, KimCNNStudent
from students.logreg import LogRegConfig, LogRegStudent


@dataclass(frozen=True)
class StudentEntry:
    config_class: type[StudentConfig]
    model_class: type[Student]
    description: str
    #: Adam learning rate used when --lr is not given. The linear model on l2-normalised tf-idf
    #: needs large weights and so a larger step than the neural students.
    default_lr: float = 1e-3
    #: Adam's L2 penalty (weight_decay, coupled: it adds wd * w to the gradient, the gradient of
    #: wd/2 ||w||^2 on top of the mean loss) and the learning-rate schedule, when not given.
    #: The neural students rely on dropout; the linear model has nothing else against overfitting
    #: its ~160k tf-idf weights: wd = 1/(C n) is scikit-learn's LogisticRegression default C = 1 at
    #: n = 20,000 examples, and a linear decay to zero lets the last epoch settle instead of ending
    #: wherever a constant large step leaves it.
    default_weight_decay: float = 0.0
    default_lr_schedule: str = "constant"
    #: The same two defaults on multi-label tasks, where they differ (None: as single-label).
    #: The penalty is per one-vs-rest problem, before the division by the label count below.
    multilabel_lr: float | None = None
    multilabel_weight_decay: float | None = None

    def lr_for(self, multilabel: bool) -> float:
        """The default learning rate for a task."""
        if multilabel and self.multilabel_lr is not None:
            return self.multilabel_lr
        return self.default_lr

    def weight_decay_for(self, num_labels: int, multilabel: bool) -> float:
        """The default L2 penalty for a task. A multi-label loss is the mean of ``num_labels``
        binary cross-entropies, so each label's weights get 1/num_labels of the gradient that
        label alone would give; the penalty is divided by num_labels so that every one-vs-rest
        problem keeps its own balance of loss against penalty (on Reuters' 90 labels the
        undivided 5e-5 held the linear student at micro-F1 0.40)."""
        if not multilabel:
            return self.default_weight_decay
        wd = self.multilabel_weight_decay if self.multilabel_weight_decay is not None \
            else self.default_weight_decay
        return wd / num_labels if num_labels > 1 else wd


STUDENTS: dict[str, StudentEntry] = {
    "bilstm": StudentEntry(BiLSTMConfig, BiLSTMStudent,
                           "embedding -> BiLSTM (weight-dropped) -> max pooling -> MLP"),
    "kimcnn": StudentEntry(KimCNNConfig, KimCNNStudent,
                           "Kim (2014) CNN: widths 3,4,5, max-over-time pooling, dropout"),
    "logreg": StudentEntry(LogRegConfig, LogRegStudent,
                           "logistic regression on in-graph tf-idf of WordPiece uni+bigrams",
                           default_lr=3e-2, default_weight_decay=5e-5, default_lr_schedule="linear",
                           # Reuters-like one-vs-rest: most labels are rare, their few positive
                           # documents need large weights on few features (Adam moves a weight
                           # about lr per step in which its feature occurs), and a weak penalty
                           # (wd = 1/(C n), C ~ 64 at n ~ 7,400, as sklearn's best C there).
                           multilabel_lr=1.0, multilabel_weight_decay=2e-6),
}

STUDENT_FILE = "student.json"
WEIGHTS_FILE = "model.safetensors"


def get_student(name: str) -> StudentEntry:
    if name not in STUDENTS:
        raise UsageError(f"unknown student '{name}'; known students: {', '.join(STUDENTS)}")
    return STUDENTS[name]


def parse_options(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``("hidden_size=128", "pooling=last")`` -> {"hidden_size": "128", "pooling": "last"}."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"student option '{item}' is not KEY=VALUE (e.g. hidden_size=128)")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def student_config(name: str, values: dict[str, Any]) -> StudentConfig:
    """A typed student config from string or typed ``values``; unknown keys list the valid ones.
    Tuple values are written with ``;`` on the command line (``widths=3;4;5``)."""
    entry = get_student(name)
    fixed = {k: (v.replace(";", ",") if isinstance(v, str) else v) for k, v in values.items()}
    try:
        return resolve_config(entry.config_class, None, fixed)
    except UsageError as exc:
        raise UsageError(f"student '{name}': {exc}") from None
    except ValueError as exc:
        raise UsageError(f"student '{name}': {exc}") from None


def build_student(name: str, cfg: StudentConfig, vocab_size: int) -> Student:
    return get_student(name).model_class(cfg, vocab_size)


def save_student(model: Student, name: str, folder: Path, meta: dict[str, Any]) -> None:
    """``model.safetensors`` + ``student.json`` (name, config, vocab size, task metadata)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE))
    info = {"student": name, "config": to_dict(model.config), "vocab_size": model.vocab_size, **meta}
    (folder / STUDENT_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def load_student(folder: str | Path) -> tuple[Student, dict[str, Any]]:
    """A saved student in eval mode and its ``student.json``; accepts a distill run folder too."""
    from safetensors.torch import load_file

    p = Path(folder)
    if (p / "student" / STUDENT_FILE).is_file():
        p = p / "student"
    if not (p / STUDENT_FILE).is_file():
        raise ModelError(f"{folder} holds no {STUDENT_FILE}; pass a distill run folder or its "
                         "student/ folder")
    info = json.loads((p / STUDENT_FILE).read_text(encoding="utf-8"))
    cfg = student_config(info["student"], info["config"])
    model = build_student(info["student"], cfg, int(info["vocab_size"]))
    from compress.models.loading import check_safetensors_file

    check_safetensors_file(p / WEIGHTS_FILE, "copy the run folder again, or re-run 'compress distill'")
    model.load_state_dict(load_file(str(p / WEIGHTS_FILE)))
    model.eval()
    return model, info
