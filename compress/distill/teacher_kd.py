"""Distillation from a teacher while another model trains: pruning and its recovery, or fine-tuning
(say, a pruned model recovering from its dense original).

The loss of each step is ``L_task + lambda * T^2 * KL(teacher || student)``
(``compress.distill.losses.distillation_loss``: softmax KL for single-label tasks, per-label
Bernoulli KL for multi-label ones), plus, when ``hidden_weight`` > 0, ``hidden_weight`` times the
mean squared difference of the last layer's hidden states, and, when ``layers_weight`` > 0,
``layers_weight`` times the token-level layer-wise MSE of ZipLM (``compress.distill.losses.
layerwise_mse``): every kept encoder layer of the student against the same layer of the teacher,
over the non-padding tokens.

The teacher's logits over the training set are computed once before training
(``teacher_predict``) and travel with each example, so the teacher costs one forward pass over the
data, not one per step; nothing of it is trained or pruned (``TeacherLogitsLoss`` never sees its
parameters). Hidden-state distillation needs the teacher's activations of the same batch, so with
``hidden_weight`` or ``layers_weight`` > 0 the teacher runs beside the student each step instead
(in eval mode, without gradients).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compress.core.config import check_range, option
from compress.core.errors import ModelError, UsageError
from compress.distill.losses import (
    DEFAULT_TEMPERATURE,
    MAX_KD_LAMBDA,
    MAX_TEMPERATURE,
    check_kd_values,
    default_kd_lambda,
    distillation_loss,
    layerwise_mse,
)
from compress.distill.transfer import mark_teacher_only
from compress.training.loop import HAS_LABEL, is_labelled

TEACHER_LOGITS = "teacher_logits"  # the key a training example carries its teacher logits under
TEACHER_SELF = "self"  # --teacher self: the dense model the run starts from


@dataclass(frozen=True)
class TeacherKDOptions:
    """``--teacher``: a fine-tuned run folder or model folder with the task's labels, or ``self``;
    ``--kd-lambda`` (None: 4 single-label, 1 multi-label, as in ``compress distill``),
    ``--temperature`` T, ``--kd-hidden`` the weight of the last-layer hidden-state MSE and
    ``--kd-layers`` that of the layer-wise MSE over every kept layer (0 = off)."""

    teacher: str | None = option(None, help="distil from this fine-tuned run/model folder while "
                                            "training (loss = task + lambda * T^2 * KL); 'self' = "
                                            "the model the run starts from (prune --stage "
                                            "after-finetune: the model its dense phase made)")
    kd_lambda: float | None = option(None, help=f"weight of the KD term, in [0, {MAX_KD_LAMBDA:g}]; "
                                                "unset = 4 single-label, 1 multi-label (as compress "
                                                "distill)")
    temperature: float = option(DEFAULT_TEMPERATURE, help=f"softmax temperature T of the KD term, in "
                                                          f"(0, {MAX_TEMPERATURE:g}]")
    kd_hidden: float = option(0.0, help="weight of an MSE between the last layer's hidden states of "
                                        "student and teacher (0 = off; above 0 the teacher runs "
                                        "on every batch)")
    kd_layers: float = option(0.0, help=f"weight of a token-level layer-wise MSE (ZipLM): each encoder "
                                        f"layer's output tokens of student and teacher, over "
                                        f"non-padding tokens, averaged over the layers a structured "
                                        f"prune kept, in [0, {MAX_KD_LAMBDA:g}] (0 = off; above 0 the "
                                        f"teacher runs on every batch; same layer count and hidden "
                                        f"size as the student)")

    def __post_init__(self):
        check_teacher_spec(self.teacher)
        check_kd_values(self.temperature, self.kd_lambda)
        check_range("kd_hidden", self.kd_hidden, 0, MAX_KD_LAMBDA)
        check_range("kd_layers", self.kd_layers, 0, MAX_KD_LAMBDA)
        if self.teacher is None:
            changed = [f"--{n.replace('_', '-')}" for n, default in
                       (("kd_lambda", None), ("temperature", DEFAULT_TEMPERATURE), ("kd_hidden", 0.0),
                        ("kd_layers", 0.0))
                       if getattr(self, n) != default]
            if changed:
                raise UsageError(f"{', '.join(changed)} applies with --teacher only; add --teacher RUN "
                                 "(or --teacher self) or drop it")

    def lambda_for(self, multilabel: bool) -> float:
        return self.kd_lambda if self.kd_lambda is not None else default_kd_lambda(multilabel)


def check_teacher_spec(teacher: str | None) -> None:
    """An empty ``--teacher`` (a variable that expanded to nothing) names no model: refused rather
    than read as the current folder."""
    if teacher is not None and not teacher.strip():
        raise UsageError(f"--teacher {teacher!r} is empty; pass a fine-tuned run or model folder "
                         "(or 'self'), or drop --teacher")


def check_teacher_fits(teacher_tokenizer, student_tokenizer, teacher_labels, student_labels,
                       teacher_spec: str) -> None:
    """A teacher must score the same labels from the same token ids as the student (its logits
    are cached per example, so they are the student's targets position by position). Either
    mismatch is a model that does not fit (ModelError, exit 1), as a model with other labels is
    for ``compress eval``."""
    if tuple(teacher_labels) != tuple(student_labels):
        raise ModelError(f"teacher '{teacher_spec}' predicts labels {list(teacher_labels)}, the task has "
                         f"{list(student_labels)}; use a teacher fine-tuned on this task")
    same = (teacher_tokenizer.get_vocab() == student_tokenizer.get_vocab()
            and teacher_tokenizer.all_special_ids == student_tokenizer.all_special_ids)
    if not same:
        raise ModelError(f"teacher '{teacher_spec}' has another tokenizer than the pruned model "
                         f"({len(teacher_tokenizer)} vs {len(student_tokenizer)} tokens); distil from a "
                         "teacher fine-tuned from the same base model")


def attach_teacher_logits(feats: list[dict], logits) -> list[dict]:
    """Copies of the training examples, each carrying its teacher logits (a list of floats)."""
    if len(logits) != len(feats):
        raise ValueError(f"{len(logits)} teacher logits for {len(feats)} examples")
    return [{**f, TEACHER_LOGITS: [float(x) for x in row]} for f, row in zip(feats, logits)]


def teacher_logits_collate(base: Callable[[list[dict]], dict]) -> Callable[[list[dict]], dict]:
    """``base`` (the tokenizer's padding collate) plus a ``teacher_logits`` tensor (batch, labels)
    and, when any example is teacher-only (``compress.distill.transfer``), a ``has_label`` bool
    tensor (batch,)."""

    def collate(rows: list[dict]) -> dict:
        batch = base([{k: v for k, v in r.items() if k not in (TEACHER_LOGITS, HAS_LABEL)} for r in rows])
        if rows and TEACHER_LOGITS in rows[0]:
            batch[TEACHER_LOGITS] = torch.tensor([r[TEACHER_LOGITS] for r in rows], dtype=torch.float32)
        if any(HAS_LABEL in r for r in rows):
            batch[HAS_LABEL] = torch.tensor([is_labelled(r) for r in rows], dtype=torch.bool)
        return batch

    return collate


def kept_layers(model: torch.nn.Module) -> list[int]:
    """The 0-based encoder layers of ``model`` whose output a layer-wise distillation matches: all
    but those a structured prune removed entirely, i.e. whose entries in the config's
    ``layer_heads`` and ``layer_intermediate`` (``compress.models.modeling_pruned``) are both 0; a
    field that is None keeps its uniform size. The indices follow ``hidden_states`` (layer l is
    entry l + 1): ALBERT's entries are per shared layer, and one of its passes maps to nothing only
    when every layer of the group it runs is removed. ``model`` may be wrapped (DDP: ``.module``)."""
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "module"):
        config = model.module.config
    n_layers = config.num_hidden_layers
    heads, ffn = getattr(config, "layer_heads", None), getattr(config, "layer_intermediate", None)
    if heads is None and ffn is None:
        return list(range(n_layers))
    n_entries = len(heads if heads is not None else ffn)

    def removed(entry: int) -> bool:
        return ((heads is not None and heads[entry] == 0)
                and (ffn is not None and ffn[entry] == 0))

    if n_entries == n_layers:
        return [i for i in range(n_layers) if not removed(i)]
    groups = getattr(config, "num_hidden_groups", None)
    if groups is None or n_entries % groups:
        raise ValueError(f"config has {n_entries} per-layer sizes for {n_layers} encoder layers")
    inner = n_entries // groups  # ALBERT: pass i runs every layer of group int(i / (n_layers / groups))
    group_kept = [any(not removed(g * inner + j) for j in range(inner)) for g in range(groups)]
    return [i for i in range(n_layers) if group_kept[int(i / (n_layers / groups))]]


def check_teacher_shapes(teacher: torch.nn.Module, student: torch.nn.Module, cfg, spec: str) -> None:
    """Hidden-state distillation pairs the teacher's activations with the student's: --kd-hidden
    needs the same hidden size, --kd-layers also the same number of layers (structured pruning
    keeps both, so ``self`` always fits). Refused (ModelError) before any training."""
    tc, sc = teacher.config, student.config
    need_layers = getattr(cfg, "kd_layers", 0.0) > 0
    if not (need_layers or getattr(cfg, "kd_hidden", 0.0) > 0):
        return
    flag = "--kd-layers" if need_layers else "--kd-hidden"
    t_shape, s_shape = (tc.num_hidden_layers, tc.hidden_size), (sc.num_hidden_layers, sc.hidden_size)
    if t_shape[1] != s_shape[1] or (need_layers and t_shape[0] != s_shape[0]):
        raise ModelError(f"teacher '{spec}' has {t_shape[0]} layers of hidden size {t_shape[1]}, the "
                         f"student {s_shape[0]} of {s_shape[1]}; {flag} needs the same "
                         f"{'layers and hidden size' if need_layers else 'hidden size'} (drop {flag}, "
                         "or distil from the student's dense original)")


class TeacherLogitsLoss:
    """``loss_fn(model, batch) -> (loss, extra)`` for ``compress.training.loop.train``.

    ``batch`` holds the model's inputs, ``labels`` and ``teacher_logits``. With a ``teacher``
    module (hidden-state distillation) the teacher runs on the batch instead and its logits are
    used. ``layers``: the encoder layers the layer-wise term matches (None: ``kept_layers`` of the
    student, read at each step). ``extra`` (task and distill terms) is logged with the loss.
    """

    def __init__(self, multilabel: bool, kd_lambda: float, temperature: float,
                 hidden_weight: float = 0.0, teacher: torch.nn.Module | None = None,
                 layers_weight: float = 0.0, layers: Sequence[int] | None = None):
        if (hidden_weight > 0 or layers_weight > 0) and teacher is None:
            raise ValueError("hidden-state distillation needs the teacher module")
        self.multilabel, self.kd_lambda, self.temperature = multilabel, kd_lambda, temperature
        self.hidden_weight, self.teacher = hidden_weight, teacher
        self.layers_weight, self.layers = layers_weight, None if layers is None else list(layers)
        if teacher is not None:
            teacher.eval().requires_grad_(False)

    def __call__(self, model, batch: dict) -> tuple[torch.Tensor, dict]:
        inputs = {k: v for k, v in batch.items() if k not in ("labels", TEACHER_LOGITS, HAS_LABEL)}
        labels = batch["labels"]
        has_label = batch.get(HAS_LABEL)
        if has_label is None:
            has_label = torch.ones(labels.shape[0], dtype=torch.bool, device=labels.device)
        hidden = self.hidden_weight > 0 or self.layers_weight > 0
        out = model(**inputs, output_hidden_states=hidden) if hidden else model(**inputs)
        teacher_logits = batch.get(TEACHER_LOGITS)
        t_hidden = None
        if self.teacher is not None:
            self.teacher.to(out.logits.device)
            with torch.no_grad():
                t_out = self.teacher(**inputs, output_hidden_states=hidden)
            teacher_logits, t_hidden = t_out.logits, (t_out.hidden_states if hidden else None)
        parts = distillation_loss(out.logits, teacher_logits, labels, has_label.to(labels.device),
                                  self.multilabel, self.temperature, self.kd_lambda)
        loss = parts["loss"]
        extra = {"task_loss": float(parts["task"].detach()), "kd_loss": float(parts["distill"].detach())}
        if self.hidden_weight > 0:
            mse = F.mse_loss(out.hidden_states[-1], t_hidden[-1])
            loss = loss + self.hidden_weight * mse
            extra["hidden_mse"] = float(mse.detach())
        layers = []
        if self.layers_weight > 0:
            layers = self.layers if self.layers is not None else kept_layers(model)
        if layers:  # a model with every layer's blocks removed has no layer left to match
            lw = layerwise_mse(out.hidden_states, t_hidden, inputs.get("attention_mask"), layers)
            loss = loss + self.layers_weight * lw
            extra["layer_mse"] = float(lw.detach())
        return loss, extra


def agreement(student_logits, teacher_logits, multilabel: bool) -> float:
    """Fraction of eval examples (single-label) or example-label pairs (multi-label) on which the
    student's prediction equals the teacher's."""
    import numpy as np

    s, t = np.asarray(student_logits), np.asarray(teacher_logits)
    if multilabel:
        return float(((s > 0) == (t > 0)).mean())
    return float((s.argmax(-1) == t.argmax(-1)).mean())


# ------------------------------------------------------------------ extractive QA (span logits)


def span_kd_loss(student_start: torch.Tensor, student_end: torch.Tensor, teacher_start: torch.Tensor,
                 teacher_end: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * (KL(t_start || s_start) + KL(t_end || s_end)) / 2``: the distillation term of a span
    model, softmax over the token positions of each window (batch-mean KL), as the task loss
    averages the start and end cross-entropies."""

    def kl(s, t):
        return F.kl_div(F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1),
                        reduction="batchmean", log_target=True)

    return temperature ** 2 * (kl(student_start, teacher_start) + kl(student_end, teacher_end)) / 2


class SpanDistillation(torch.nn.Module):
    """The squad objective with a teacher: span cross-entropy + ``kd_lambda * span_kd_loss``.

    A training objective (``loss(model, batch) -> (loss, extra)``, no trainable parameters of its
    own). The teacher runs on each batch in eval mode without gradients; it is held outside the
    module's parameters and state, so it is never optimised, pruned or written into checkpoints."""

    def __init__(self, teacher: torch.nn.Module, kd_lambda: float, temperature: float):
        super().__init__()
        teacher.eval().requires_grad_(False)
        self._teacher = [teacher]  # a list: not a registered submodule
        self.kd_lambda, self.temperature = kd_lambda, temperature

    @property
    def teacher(self) -> torch.nn.Module:
        return self._teacher[0]

    def trainable_parameters(self):
        return []

    def loss(self, model, batch: dict):
        from compress.qa.objectives import INPUT_KEYS, span_loss

        inputs = {k: batch[k] for k in INPUT_KEYS if k in batch}
        out = model(**inputs)
        task = span_loss(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"])
        self.teacher.to(out.start_logits.device)
        with torch.no_grad():
            t = self.teacher(**inputs)
        kd = span_kd_loss(out.start_logits, out.end_logits, t.start_logits, t.end_logits, self.temperature)
        return task + self.kd_lambda * kd, {"task_loss": float(task.detach()), "kd_loss": float(kd.detach())}


def answer_agreement(student_preds: dict[str, str], teacher_preds: dict[str, str]) -> float:
    """Fraction of questions whose predicted answer text is the teacher's."""
    if not teacher_preds:
        return float("nan")
    return sum(student_preds.get(q) == a for q, a in teacher_preds.items()) / len(teacher_preds)


def load_teacher(cfg, labels, tokenizer, multilabel: bool, dense=None, student=None):
    """The frozen teacher of a classification run with ``--teacher`` (prune or finetune) and its
    folder (None for an in-memory copy).

    ``--teacher self`` is ``dense`` when given (prune after-finetune: the model the dense phase
    made), else ``--model`` itself, which must then be fine-tuned on the task. Refused in one line
    when its labels or its tokenizer differ from the student's, or, given the ``student`` and
    --kd-hidden / --kd-layers, when its layers do not pair up with the student's."""
    from compress.models.loading import load_classifier, resolve_model

    if cfg.teacher == TEACHER_SELF and dense is not None:
        teacher = copy.deepcopy(dense)
        return teacher.eval().requires_grad_(False), None
    spec = cfg.model if cfg.teacher == TEACHER_SELF else cfg.teacher
    teacher, teacher_tok, meta = load_classifier(spec, labels, multilabel=multilabel, strict_labels=True)
    check_teacher_fits(teacher_tok, tokenizer, meta["label_names"], labels, spec)
    if student is not None:
        check_teacher_shapes(teacher, student, cfg, spec)
    return teacher.eval().requires_grad_(False), resolve_model(spec)


def teacher_training(cfg, teacher, teacher_dir: str | None, tokenizer, train_ds, feats,
                     multilabel: bool, run, extras=None) -> dict:
    """``train`` arguments (feats, collate, loss_fn) that add the teacher's KD term to the loss;
    without a teacher (``teacher`` None) just ``{"feats": feats}``, plain training.

    The teacher's logits over the training set are computed once (cached in the run folder under
    a key of the teacher's files and the texts, so a resumed run reuses them); with --kd-hidden or
    --kd-layers the teacher runs each step instead, for its hidden states (the layer-wise term
    matches the student's ``kept_layers``, read when each step runs: after a structured prune).
    ``extras`` (``compress.distill.transfer.TransferExtras``): teacher-only texts appended to the
    transfer set after the labelled examples, learnt from through the KD term only."""
    from compress.distill.teacher import (
        CACHE_DIR,
        cached_logits,
        teacher_fingerprint,
        teacher_predict,
        transfer_key,
    )
    from compress.distill.transfer import concat
    from compress.training.loop import encode, make_collate

    if teacher is None:
        if extras is not None:
            raise UsageError("teacher-only transfer examples need a teacher to label them")
        return {"feats": feats}
    if extras is not None:
        feats = feats + mark_teacher_only(encode(tokenizer, extras.texts, cfg.max_length))
        train_ds = concat(train_ds, extras.texts)
    lam = cfg.lambda_for(multilabel)
    collate = teacher_logits_collate(make_collate(tokenizer))
    if cfg.kd_hidden > 0 or cfg.kd_layers > 0:
        return {"feats": feats, "collate": collate,
                "loss_fn": TeacherLogitsLoss(multilabel, lam, cfg.temperature, cfg.kd_hidden, teacher,
                                             layers_weight=cfg.kd_layers)}
    if torch.cuda.is_available():
        teacher.to("cuda")

    def compute():
        return teacher_predict(teacher, tokenizer, train_ds.texts, train_ds.pairs, cfg.max_length,
                               cfg.eval_batch_size)

    if teacher_dir is None:
        logits = compute()
    else:
        key = transfer_key(teacher_fingerprint(teacher_dir), train_ds.texts, train_ds.pairs, cfg.max_length)
        logits, _ = cached_logits(run.path / CACHE_DIR / "train.safetensors", key, compute)
    teacher.to("cpu")
    return {"feats": attach_teacher_logits(feats, logits), "collate": collate,
            "loss_fn": TeacherLogitsLoss(multilabel, lam, cfg.temperature)}


def teacher_summary(cfg, teacher, model, tokenizer, spec, eval_ds, multilabel: bool) -> dict:
    """The teacher, its metric on the eval set, and how often the student agrees with it."""
    import numpy as np

    from compress.tasks.metrics import compute_metrics
    from compress.training.loop import encode, make_collate, predict

    feats = encode(tokenizer, eval_ds, cfg.max_length)
    collate = make_collate(tokenizer)
    device = next(model.parameters()).device
    t_logits = predict(teacher.to(device), feats, collate, cfg.eval_batch_size)
    s_logits = predict(model, feats, collate, cfg.eval_batch_size)
    teacher.to("cpu")
    metrics = compute_metrics(spec.family, t_logits, np.array([f["labels"] for f in feats]))
    metrics["score"] = metrics[spec.metric]
    return {"teacher": cfg.teacher, "kd_lambda": cfg.lambda_for(multilabel), "temperature": cfg.temperature,
            "kd_hidden": cfg.kd_hidden, "kd_layers": cfg.kd_layers, "teacher_eval": metrics,
            "agreement_with_teacher": agreement(s_logits, t_logits, multilabel)}


def load_span_teacher(cfg, tokenizer) -> torch.nn.Module:
    """The frozen teacher of a squad run with ``--teacher``: a model fine-tuned on squad (``self``:
    the model the run starts from) with the student's tokenizer. Checked before any folder exists."""
    if cfg.objective != "plain":
        raise UsageError(f"--teacher on squad distils the span logits with --objective plain, not "
                         f"'{cfg.objective}'; use --objective plain or drop --teacher")
    hidden = [f"--{n.replace('_', '-')}" for n in ("kd_hidden", "kd_layers") if getattr(cfg, n, 0.0)]
    if hidden:
        raise UsageError(f"{', '.join(hidden)} applies to classification tasks; on squad drop it")
    from compress.qa.evaluation import load_qa_model

    spec = cfg.model if cfg.teacher == TEACHER_SELF else cfg.teacher
    teacher, teacher_tok, _ = load_qa_model(spec, require_finetuned=True)
    check_teacher_fits(teacher_tok, tokenizer, (), (), spec)
    return teacher.eval().requires_grad_(False)
