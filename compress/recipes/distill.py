"""``compress distill``: teacher -> transfer set (+ augmentation) -> cached teacher logits ->
student training -> evaluation -> report. Everything that can be checked is checked before the run
folder exists, so bad input leaves nothing behind.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.config import check_choice, check_range, option, option_like, to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir
from compress.distill.augment import (
    OPERATORS,
    AugmentConfig,
    augment_texts,
    mask_token_of,
    require_nltk_data,
)
from compress.distill.embeddings import (
    check_embed_dim,
    check_embedding_spec,
    embedding_width,
    initial_embeddings,
)
from compress.distill.losses import (
    DEFAULT_TEMPERATURE,
    KD_LOSS_CHOICES,
    MAX_KD_LAMBDA,
    MAX_TEMPERATURE,
    check_kd_values,
    default_kd_lambda,
    kd_loss_name,
)
from compress.distill.teacher import (
    CACHE_DIR,
    cached_logits,
    resolve_cache_source,
    teacher_fingerprint,
    teacher_predict,
    transfer_key,
)
from compress.distill.train import (
    LR_SCHEDULES,
    StudentTrainConfig,
    predict_student,
    train_student,
)
from compress.models.loading import PACKAGED, load_classifier, load_tokenizer, resolve_model
from compress.report.distillation import bert_flops_formula, format_table, measure_flops, teacher_agreement
from compress.tasks import DataOptions, data_dir_from_env
from compress.tasks.metrics import compute_metrics
from compress.tasks.task_data import TaskDataConfig
from compress.training.loop import TrainConfig
from compress.training.trackers import check_report_to, start_tracking
from students.registry import build_student, get_student, parse_options, save_student, student_config


def student_choices() -> list[str]:
    """The registry's students and the retrieval one, which lives with its task."""
    from students.registry import STUDENTS

    return [*STUDENTS, "dual-encoder (--task reqa only)"]


@dataclass(frozen=True)
class DistillConfig:
    # what
    student: str = option("bilstm", choices=student_choices, help="student architecture")
    teacher: str = option("minilm", help="a fine-tuned run or model folder for the task, or 'minilm' "
                                         "to fine-tune one first")
    task: str = option_like(TaskDataConfig, "task")
    student_options: tuple[str, ...] = option((), help="student config as KEY=VALUE,... (e.g. "
                                                       "hidden_size=128,pooling=last; tuples with "
                                                       "';': widths=3;4;5)")
    student_embeddings: str = option("teacher", help="initial embeddings: teacher, random, or a "
                                                     "word2vec/GloVe text file")
    # data
    data_dir: str | None = option_like(TaskDataConfig, "data_dir")
    text_column: str = option_like(TaskDataConfig, "text_column")
    text_pair_column: str | None = option_like(TaskDataConfig, "text_pair_column")
    label_column: str = option_like(TaskDataConfig, "label_column")
    train_limit: int | None = option(None, help="use only the first N training examples (teacher "
                                                "and student)")
    eval_limit: int | None = option_like(TaskDataConfig, "eval_limit")
    max_length: int = option_like(TrainConfig, "max_length")
    augment: int = option(0, help="augmented copies per training example (Tang et al. 2019); needs "
                                  "NLTK tagger data")
    # the operators of each augmented copy, defaults from AugmentConfig (Tang et al. 2019's values)
    p_mask: float = option(AugmentConfig.p_mask, help="--augment: probability of masking each word")
    p_pos: float = option(AugmentConfig.p_pos, help="--augment: probability of replacing each word "
                                                    "by another of its POS tag")
    p_ngram: float = option(AugmentConfig.p_ngram, help="--augment: probability of cutting a copy "
                                                        "to an n-gram of 1..--max-ngram words, or "
                                                        "sentences for a multi-sentence document")
    max_ngram: int = option(AugmentConfig.max_ngram, help="--augment: longest n-gram that --p-ngram "
                                                          "keeps")
    p_shuffle: float = option(AugmentConfig.p_shuffle, help="--augment: probability of shuffling the "
                                                            "sentences of a multi-sentence document")
    # no task loss for these: the teacher labels them and they join the transfer set as they are
    unlabeled_examples: int = option(0, help="N more training examples after --train-limit whose "
                                             "gold labels stay hidden: the teacher labels them for "
                                             "the transfer set (not augmented)")
    val_fraction: float = option(0.0, help="hold out this share of the training examples (not "
                                           "trained on, not augmented) and keep the student's best "
                                           "epoch on them (0: the last epoch)")
    # loss
    temperature: float = option(DEFAULT_TEMPERATURE, help="softmax/sigmoid temperature T of the "
                                                          f"distillation term, in (0, {MAX_TEMPERATURE:g}]")
    # Adhikari et al. 2020's weights
    kd_lambda: float | None = option(None, help="weight of the distillation term: L = L_task + "
                                                f"lambda L_KD, in [0, {MAX_KD_LAMBDA:g}] (unset: 4 "
                                                "single-label, 1 multi-label)")
    kd_loss: str = option("kl", choices=KD_LOSS_CHOICES,
                          help="distillation term: kl (KL of T-softened outputs; per-label "
                               "Bernoulli KL for multi-label) or mse (squared error of raw logits, "
                               "Tang et al. 2019)")
    no_kd: bool = option(False, help="train the same student on gold labels only (the baseline)")
    # student training; unset values come from the student's registry entry
    lr: float | None = option(None, help="student Adam learning rate (unset: per student, 1e-3 "
                                         "bilstm/kimcnn, 3e-2 logreg; 1.0 logreg on multi-label "
                                         "tasks)")
    epochs: int = option(10, help="student training epochs")
    batch_size: int = option(64, help="student examples per optimizer step")
    weight_decay: float | None = option(None, help="Adam L2 penalty of the student (unset: per "
                                                   "student, 0 bilstm/kimcnn, 5e-5 logreg; on "
                                                   "multi-label tasks 2e-6 logreg divided by the "
                                                   "number of labels)")
    lr_schedule: str | None = option(None, choices=LR_SCHEDULES,
                                     help="student learning rate: constant or linear (decay to 0); "
                                          "unset: per student, constant bilstm/kimcnn, linear "
                                          "logreg")
    max_grad_norm: float = option(5.0, help="clip the student's gradient norm to this")
    seed: int = option(42, help="seed of the student initialisation, data order and dropout")
    data_seed: int | None = option(None, help="seed of the --val-fraction split and the augmented "
                                              "copies (unset: --seed); fix it while varying --seed "
                                              "to reuse one transfer set and its --teacher-cache")
    # teacher fine-tuning (when --teacher names a packaged encoder) and inference
    teacher_epochs: float = option(3.0, help="epochs when fine-tuning the teacher first (--teacher "
                                             "minilm)")
    teacher_lr: float = option(5e-5, help="learning rate when fine-tuning the teacher first")
    teacher_batch_size: int = option(32, help="batch size when fine-tuning the teacher first")
    teacher_eval_batch_size: int = option(128, help="batch size when the teacher labels the "
                                                    "transfer set")
    teacher_cache: str | None = option(None, help="an earlier distill run folder whose cached "
                                                  "teacher logits to reuse")
    # run folder
    out: str | None = option_like(TaskDataConfig, "out")
    name: str | None = option_like(TaskDataConfig, "name")
    resume: bool = option(False, help="continue an interrupted run in --out")
    report_to: str = option_like(TrainConfig, "report_to")

    def __post_init__(self):
        get_student(self.student)
        check_report_to(self.report_to)
        from compress.distill.teacher_kd import check_teacher_spec

        check_teacher_spec(self.teacher)
        check_kd_values(self.temperature, self.kd_lambda)
        check_choice("kd_loss", self.kd_loss, KD_LOSS_CHOICES)
        if self.no_kd:  # gold labels only: the KD term's settings would do nothing
            changed = [f"--{n.replace('_', '-')} {getattr(self, n)}" for n, default in
                       (("kd_lambda", None), ("temperature", DEFAULT_TEMPERATURE), ("kd_loss", "kl"))
                       if getattr(self, n) != default]
            if changed:
                raise UsageError(f"{', '.join(changed)} has no effect with --no-kd (no distillation "
                                 "term); drop it or drop --no-kd")
        if self.kd_loss == "mse" and self.temperature != 1.0:
            raise UsageError(f"--temperature {self.temperature} has no effect with --kd-loss mse (it "
                             "compares raw logits); drop --temperature or use --kd-loss kl")
        self.augment_config()  # checks --augment and the operators' ranges
        changed = [n for n in OPERATORS if getattr(self, n) != getattr(AugmentConfig, n)]
        if changed and not self.augment:
            flags = " ".join(f"--{n.replace('_', '-')} {getattr(self, n)}" for n in changed)
            raise UsageError(f"{flags} has no effect without augmented copies; add --augment N or drop it")
        if self.augment and self.p_mask == self.p_pos == self.p_ngram == self.p_shuffle == 0:
            raise UsageError(f"--augment {self.augment} with --p-mask, --p-pos, --p-ngram and --p-shuffle "
                             "all 0 would only repeat the examples; raise one of them above 0")
        check_range("val_fraction", self.val_fraction, 0, 0.5, hi_open=True)
        check_range("max_length", self.max_length, 8, 512)
        check_range("epochs", self.epochs, 1)
        if self.lr is not None:
            check_range("lr", self.lr, 0, None, lo_open=True)
        check_range("batch_size", self.batch_size, 1)
        if self.weight_decay is not None:
            check_range("weight_decay", self.weight_decay, 0)
        if self.lr_schedule is not None:
            check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_range("teacher_epochs", self.teacher_epochs, 0, None, lo_open=True)
        for lim in ("train_limit", "eval_limit"):
            v = getattr(self, lim)
            if v is not None:
                check_range(lim, v, 1)
        check_range("unlabeled_examples", self.unlabeled_examples, 0)
        if self.unlabeled_examples and self.train_limit is None:
            raise UsageError("--unlabeled-examples takes the training examples after the first "
                             "--train-limit; add --train-limit N")
        if self.no_kd and self.unlabeled_examples:
            raise UsageError("--unlabeled-examples needs teacher labels; it cannot be combined with "
                             "--no-kd (their gold labels stay hidden)")
        if self.no_kd and self.augment:
            raise UsageError("--augment needs teacher labels; it cannot be combined with --no-kd "
                             "(augmented examples have no gold label)")

    def augment_config(self, seed: int = 42, mask_token: str = "[MASK]") -> AugmentConfig:
        return AugmentConfig(copies=self.augment, mask_token=mask_token, seed=seed,
                             **{n: getattr(self, n) for n in OPERATORS})

    def data_options(self) -> DataOptions:
        return DataOptions(data_dir_from_env(self.data_dir), self.text_column,
                           self.text_pair_column, self.label_column)


# Student options the run sets itself; a value given in --student-options would disagree with them.
SET_BY_RUN = ("num_labels", "pad_id", "special_ids")


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _score(family: str, metric: str, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    m = compute_metrics(family, logits, labels)
    m["score"] = m[metric]
    return m


def _gold(ds) -> np.ndarray:
    if ds.multilabel:
        y = np.zeros((len(ds), len(ds.label_names)), dtype=np.float32)
        for i, labs in enumerate(ds.labels):
            y[i, labs] = 1.0
        return y
    return np.asarray(ds.labels)


def hold_out(ds, fraction: float, seed: int):
    """Split ``ds`` into (train, held-out): a seeded random ``fraction`` of the examples (at least
    one) is held out, both parts keep their original order. ``fraction`` 0 returns (ds, None).
    The held-out examples are neither trained on nor augmented; they only pick the epoch."""
    if fraction <= 0:
        return ds, None
    n_val = max(1, round(len(ds) * fraction))
    if n_val >= len(ds):
        raise UsageError(f"--val-fraction {fraction} leaves no training examples out of {len(ds)}; "
                         "lower it or raise --train-limit")
    held = set(np.random.default_rng(seed).permutation(len(ds))[:n_val].tolist())
    keep = [i for i in range(len(ds)) if i not in held]
    return ds.select(keep), ds.select(sorted(held))


def non_feature_ids(tokenizer) -> tuple[int, ...]:
    """Token ids that are not features of a bag-of-ids student: the tokenizer's special ids
    ([CLS]/<s>, [SEP]/</s>, padding, unknown, any added special token), sorted, but never the mask
    token. A masked copy then reads to the linear student as it does to the teacher (a word it
    cannot see), not as a deletion that joins the neighbours into a new bigram."""
    named = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    ids = set(tokenizer.all_special_ids) | {i for i in named if i is not None}
    return tuple(sorted(ids - {tokenizer.mask_token_id}))


def flops_input_ids(tokenizer, seq_len: int) -> torch.Tensor:
    """(1, seq_len) ids for counting FLOPs: the tokenizer's [CLS] ... [SEP] (or <s> ... </s>) around
    its first non-special id repeated, so every id is in the vocabulary of any tokenizer."""
    special = set(tokenizer.all_special_ids)
    word = next(i for i in range(len(tokenizer)) if i not in special)
    ids = torch.full((1, seq_len), word, dtype=torch.long)
    if seq_len >= 2:
        if tokenizer.cls_token_id is not None:
            ids[0, 0] = tokenizer.cls_token_id
        if tokenizer.sep_token_id is not None:
            ids[0, -1] = tokenizer.sep_token_id
    return ids


def _finetune_teacher(cfg: DistillConfig, folder: Path) -> Path:
    """Fine-tune the packaged encoder on the task into ``folder`` (a finetune run folder)."""
    from compress.api.finetuning import FinetuneConfig, finetune_classifier

    if (folder / "model" / "compress.json").is_file():
        return folder  # resumed run: the teacher is already there
    ft = FinetuneConfig(task=cfg.task, model=cfg.teacher, data_dir=cfg.data_dir,
                        text_column=cfg.text_column, text_pair_column=cfg.text_pair_column,
                        label_column=cfg.label_column, train_limit=cfg.train_limit,
                        eval_limit=cfg.eval_limit, epochs=cfg.teacher_epochs, lr=cfg.teacher_lr,
                        batch_size=cfg.teacher_batch_size, max_length=cfg.max_length, seed=cfg.seed,
                        out=str(folder))
    return finetune_classifier(ft, command="distill-teacher")


@dataclass
class DistillPlan:
    """Everything ``run_distill`` checked before the run folder exists: the data split, the
    student's options and training settings, the teacher's tokenizer."""

    entry: Any                      # the student's registry entry
    options: dict[str, Any]         # the student's config values, the run's own included
    spec: Any                       # the task
    train_ds: Any                   # the labelled training examples (less the held-out ones)
    unlabeled_ds: Any               # training examples whose gold labels stay hidden
    val_ds: Any                     # held-out examples that pick the epoch, or None
    eval_ds: Any
    finetune_first: bool            # --teacher names a packaged encoder: fine-tune it first
    tokenizer: Any                  # the teacher's
    train_cfg: StudentTrainConfig
    aug_cfg: AugmentConfig
    device: torch.device
    mode: str                       # "kd" | "no-kd"

    @property
    def labels(self) -> list[str]:
        return self.train_ds.label_names

    @property
    def multilabel(self) -> bool:
        return self.train_ds.multilabel


@dataclass
class TransferSet:
    """The texts the teacher labels and the student trains on: the training examples, their
    augmented copies and the unlabeled examples, in that order."""

    texts: list[str]
    pairs: list[str] | None
    augmented: int
    seconds: float                  # augmentation time


@dataclass
class TeacherLogits:
    eval: np.ndarray
    eval_from: str
    transfer: np.ndarray | None     # None under --no-kd
    transfer_from: str
    seconds: float


def run_distill(cfg: DistillConfig) -> Path:
    """Distil a teacher into ``cfg.student`` on ``cfg.task``; returns the finished run folder."""
    plan = plan_distill(cfg)  # everything checked before the run folder exists
    name = cfg.name or f"{plan.spec.name}-{cfg.student}-{plan.mode}"
    with RunDir("distill", name=name, out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))  # resolved lambda and lr are in summary.json
        run.write_env(cfg.seed)
        start_tracking(run, cfg.report_to, to_dict(cfg), "distill")
        t_start = time.time()

        teacher_spec = cfg.teacher
        if plan.finetune_first:
            teacher_spec = str(_finetune_teacher(cfg, run.path / "teacher"))
        teacher_seconds = time.time() - t_start
        # the teacher's tokenizer as loaded with it: its encodings hold only the inputs it takes
        teacher, tokenizer, _ = load_classifier(teacher_spec, plan.labels, plan.multilabel,
                                                strict_labels=True)
        teacher.to(plan.device)
        fingerprint = teacher_fingerprint(resolve_model(teacher_spec))
        transfer = transfer_set(plan)
        logits = _teacher_logits(cfg, plan, teacher, tokenizer, fingerprint, transfer, run.path)
        # An interrupted run with this folder keeps what is cached and resumes (--resume).
        (run.path / "checkpoint").mkdir(exist_ok=True)

        student, scfg, emb_info, eval_ids, result = _train(cfg, plan, teacher, tokenizer, transfer,
                                                           logits, run)
        evaluation = _evaluate(cfg, plan, student, teacher, tokenizer, teacher_spec, eval_ids, logits.eval)

        save_student(student, cfg.student, run.path / "student",
                     {"task": plan.spec.name, "label_names": list(plan.labels),
                      "multilabel": plan.multilabel, "max_length": cfg.max_length, "teacher": teacher_spec})
        tokenizer.save_pretrained(run.path / "student")
        seconds = {"teacher_finetune": round(teacher_seconds, 1) if plan.finetune_first else 0.0,
                   "augment": round(transfer.seconds, 1), "teacher_logits": round(logits.seconds, 1),
                   "student_train": round(result["seconds"], 1), "total": round(time.time() - t_start, 1)}
        run.write_summary(_summary(cfg, plan, teacher_spec, scfg, emb_info, transfer, logits, evaluation,
                                   result, seconds))
        table = format_table(evaluation["rows"], plan.spec.metric, evaluation["seq_len"]) + (
            f"\nstudent-teacher agreement on {len(plan.eval_ds)} eval examples: "
            f"{evaluation['fidelity']['agreement']:.4f}")
        (run.path / "report.txt").write_text(table + "\n", encoding="utf-8")
        shutil.rmtree(run.path / "checkpoint", ignore_errors=True)
    print(table)
    print(f"-> {run.path}")
    if not math.isfinite(result["final_loss"]):
        print("warning: the final training loss is not finite")
    return run.path


def plan_distill(cfg: DistillConfig) -> DistillPlan:
    """Load the task data, split it, and check every option against the student, the task's labels
    and the teacher; nothing is written."""
    from compress.tasks.task_data import load_task_data

    entry = get_student(cfg.student)
    options = parse_options(cfg.student_options)
    check_embedding_spec(cfg.student_embeddings)
    if cfg.augment:
        require_nltk_data()
    pool = None if cfg.train_limit is None else cfg.train_limit + cfg.unlabeled_examples
    spec, data = load_task_data(replace(cfg, train_limit=pool))
    train_ds, eval_ds = data["train"], data["eval"]
    # the first --train-limit examples keep their gold labels; the rest are the unlabeled pool
    n_labeled = min(len(train_ds), cfg.train_limit or len(train_ds))
    unlabeled_ds = train_ds.select(list(range(n_labeled, len(train_ds))))
    train_ds = train_ds.subset(n_labeled)
    data_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
    train_ds, val_ds = hold_out(train_ds, cfg.val_fraction, data_seed)
    labels, multilabel = train_ds.label_names, train_ds.multilabel
    kd_lambda = cfg.kd_lambda if cfg.kd_lambda is not None else default_kd_lambda(multilabel)
    for key in SET_BY_RUN:
        if key in options:
            raise UsageError(f"student option {key} is set by the run (from the task's labels and the "
                             f"teacher's tokenizer); drop {key}= from --student-options")
    options["num_labels"] = len(labels)
    student_config(cfg.student, options)  # typed check of --student-options now
    if entry.model_class.uses_embeddings:  # before a teacher is fine-tuned or run
        check_embed_dim(options, embedding_width(cfg.student_embeddings, cfg.teacher))
    for role in ("transfer", "eval"):
        resolve_cache_source(cfg.teacher_cache, role)
    finetune_first = cfg.teacher in PACKAGED
    if not finetune_first:
        load_classifier(cfg.teacher, labels, multilabel, strict_labels=True)  # label set must match
    tokenizer = load_tokenizer(cfg.teacher)
    options["pad_id"] = tokenizer.pad_token_id or 0
    if "special_ids" in entry.config_class.__dataclass_fields__:
        options["special_ids"] = non_feature_ids(tokenizer)
    train_cfg = StudentTrainConfig(
        lr=cfg.lr if cfg.lr is not None else entry.lr_for(multilabel), epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        weight_decay=(cfg.weight_decay if cfg.weight_decay is not None
                      else entry.weight_decay_for(len(labels), multilabel)),
        lr_schedule=cfg.lr_schedule or entry.default_lr_schedule, max_grad_norm=cfg.max_grad_norm,
        seed=cfg.seed, temperature=cfg.temperature, kd_lambda=kd_lambda, kd_loss=cfg.kd_loss,
        multilabel=multilabel)
    # the mask token is the teacher's ([MASK], <mask>); asked for only when copies mask words
    mask = {"mask_token": mask_token_of(tokenizer)} if cfg.augment and cfg.p_mask > 0 else {}
    return DistillPlan(entry, options, spec, train_ds, unlabeled_ds, val_ds, eval_ds, finetune_first,
                       tokenizer, train_cfg, cfg.augment_config(seed=data_seed, **mask), _device(),
                       "no-kd" if cfg.no_kd else "kd")


def transfer_set(plan: DistillPlan) -> TransferSet:
    """The training examples plus augmented copies (teacher labels only) plus the unlabeled pool."""
    train_ds, unlabeled_ds = plan.train_ds, plan.unlabeled_ds
    t0 = time.time()
    aug_texts, aug_pairs = augment_texts(train_ds.texts, train_ds.pairs, plan.aug_cfg)
    seconds = time.time() - t0
    texts = train_ds.texts + aug_texts + unlabeled_ds.texts
    pairs = (None if train_ds.pairs is None
             else train_ds.pairs + (aug_pairs or []) + (unlabeled_ds.pairs or []))
    return TransferSet(texts, pairs, len(aug_texts), seconds)


def _teacher_logits(cfg: DistillConfig, plan: DistillPlan, teacher, tokenizer, fingerprint: str,
                    transfer: TransferSet, run_path: Path) -> TeacherLogits:
    """The teacher's logits on the eval set and (unless --no-kd) the transfer set, from the run's
    cache, --teacher-cache, or computed and cached."""
    def logits_for(role, tx, px):
        key = transfer_key(fingerprint, tx, px, cfg.max_length)
        return cached_logits(
            run_path / CACHE_DIR / f"{role}.safetensors", key,
            lambda: teacher_predict(teacher, tokenizer, tx, px, cfg.max_length,
                                    cfg.teacher_eval_batch_size),
            source=resolve_cache_source(cfg.teacher_cache, role), strict_source=role == "transfer")

    t0 = time.time()
    teacher_eval, eval_from = logits_for("eval", plan.eval_ds.texts, plan.eval_ds.pairs)
    if cfg.no_kd:
        teacher_train, train_from = None, "not used (--no-kd)"
    else:
        teacher_train, train_from = logits_for("transfer", transfer.texts, transfer.pairs)
    return TeacherLogits(teacher_eval, eval_from, teacher_train, train_from, time.time() - t0)


def _train(cfg: DistillConfig, plan: DistillPlan, teacher, tokenizer, transfer: TransferSet,
           logits: TeacherLogits, run):
    """Build the student (initial embeddings, prepared on the transfer set) and train it; returns
    (student, its config, the embeddings' source, the eval set's ids, train_student's result)."""
    train_ds, val_ds, multilabel, options = plan.train_ds, plan.val_ds, plan.multilabel, plan.options

    def encode(tx, px):
        return tokenizer(tx, px, truncation=True, max_length=cfg.max_length)["input_ids"]

    if cfg.no_kd:
        train_ids = encode(train_ds.texts, train_ds.pairs)
    else:
        train_ids = encode(transfer.texts, transfer.pairs)
    eval_ids = encode(plan.eval_ds.texts, plan.eval_ds.pairs)
    val_ids = encode(val_ds.texts, val_ds.pairs) if val_ds is not None else None
    gold = _gold(train_ds)
    examples = []
    for i, ids in enumerate(train_ids):
        label = None
        if i < len(train_ds):
            label = gold[i].tolist() if multilabel else int(gold[i])
        examples.append({"input_ids": ids, "label": label,
                         "teacher": None if logits.transfer is None else logits.transfer[i]})

    emb, emb_info = (None, {"source": "not used"})
    if plan.entry.model_class.uses_embeddings:
        emb, emb_info = initial_embeddings(cfg.student_embeddings, teacher, tokenizer, cfg.seed)
        if emb is not None:
            check_embed_dim(options, int(emb.shape[1]))
            options["embed_dim"] = int(emb.shape[1])
    vocab_size = max(len(tokenizer), emb.shape[0] if emb is not None else 0)
    scfg = student_config(cfg.student, options)
    torch.manual_seed(cfg.seed)
    student = build_student(cfg.student, scfg, vocab_size)
    # Fitted on the whole transfer set: augmented copies are unlabelled text the student
    # trains on, so their n-grams get idf weights too (under --no-kd: the originals only).
    student.prepare([e["input_ids"] for e in examples])
    if emb is not None:
        student.init_embeddings(emb)
    if multilabel:  # as the teacher's head: rare labels start near their frequency, not at 0.5
        from compress.training.classifier import init_bias_to_prior

        init_bias_to_prior(student.output_layer(), train_ds)
    pad_id = tokenizer.pad_token_id or 0
    spec, device, eval_gold = plan.spec, plan.device, _gold(plan.eval_ds)

    def epoch_end(epoch):
        student_logits = predict_student(student, eval_ids, pad_id, device=device)
        return _score(spec.family, spec.metric, student_logits, eval_gold)

    def validate():
        student_logits = predict_student(student, val_ids, pad_id, device=device)
        return _score(spec.family, spec.metric, student_logits, _gold(val_ds))["score"]

    print(f"distill {cfg.student} ({plan.mode}) on {spec.name}: {len(examples)} training examples "
          f"({len(train_ds)} original + {transfer.augmented if not cfg.no_kd else 0} augmented"
          + (f" + {len(plan.unlabeled_ds)} unlabeled" if len(plan.unlabeled_ds) else "") + "), "
          f"teacher logits: {logits.transfer_from}", flush=True)
    result = train_student(student, examples, plan.train_cfg, pad_id, device, use_teacher=not cfg.no_kd,
                           log=run.log_metrics, epoch_end=epoch_end,
                           validate=validate if val_ds is not None else None,
                           checkpoint=run.path / "checkpoint" / "student.pt")
    return student, scfg, emb_info, eval_ids, result


def _evaluate(cfg: DistillConfig, plan: DistillPlan, student, teacher, tokenizer, teacher_spec: str,
              eval_ids, teacher_eval: np.ndarray) -> dict[str, Any]:
    """Student and teacher on the eval set (metrics, agreement) and their size: parameters and
    FLOPs per example at the eval set's mean length; the report's two rows."""
    spec, multilabel, eval_gold = plan.spec, plan.multilabel, _gold(plan.eval_ds)
    student_logits = predict_student(student, eval_ids, (tokenizer.pad_token_id or 0), device=plan.device)
    student_metrics = _score(spec.family, spec.metric, student_logits, eval_gold)
    teacher_metrics = _score(spec.family, spec.metric, teacher_eval, eval_gold)
    fidelity = teacher_agreement(student_logits, teacher_eval, eval_gold, multilabel)
    seq_len = max(1, round(float(np.mean([len(x) for x in eval_ids]))))
    ids = flops_input_ids(tokenizer, seq_len)
    student.cpu()
    teacher.cpu()
    s_flops, s_src = measure_flops(student, {"input_ids": ids}, student.flops_per_example(seq_len))
    t_flops, t_src = measure_flops(
        teacher, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        bert_flops_formula(teacher.config, seq_len, len(plan.labels)))
    t_params = sum(p.numel() for p in teacher.parameters())
    s_params = student.num_parameters()
    rows = [
        {"model": f"teacher ({Path(teacher_spec).name if not plan.finetune_first else cfg.teacher})",
         "score": teacher_metrics["score"], "params": t_params, "flops": t_flops,
         "flops_ratio": 1.0},
        {"model": f"{cfg.student} ({plan.mode})", "score": student_metrics["score"], "params": s_params,
         "flops": s_flops, "flops_ratio": t_flops / max(s_flops, 1)},
    ]
    return {"student": student_metrics, "teacher": teacher_metrics, "fidelity": fidelity,
            "seq_len": seq_len, "rows": rows, "params": {"teacher": t_params, "student": s_params},
            "flops": (t_flops, s_flops), "flops_sources": (t_src, s_src)}


def _summary(cfg: DistillConfig, plan: DistillPlan, teacher_spec: str, scfg, emb_info,
             transfer: TransferSet, logits: TeacherLogits, evaluation: dict[str, Any], result: dict[str, Any],
             seconds: dict[str, float]) -> dict[str, Any]:
    """``summary.json`` of a distill run."""
    t_flops, s_flops = evaluation["flops"]
    t_src, s_src = evaluation["flops_sources"]
    val_ds, train_cfg = plan.val_ds, plan.train_cfg
    return {
        "command": "distill", "task": plan.spec.name, "metric": plan.spec.metric, "student": cfg.student,
        "mode": plan.mode, "teacher": teacher_spec, "teacher_finetuned_here": plan.finetune_first,
        "kd_loss": None if cfg.no_kd else kd_loss_name(plan.multilabel, cfg.kd_loss),
        "kd_lambda": train_cfg.kd_lambda,
        "temperature": cfg.temperature, "lr": train_cfg.lr, "weight_decay": train_cfg.weight_decay,
        "lr_schedule": train_cfg.lr_schedule, "student_config": to_dict(scfg),
        "embeddings": emb_info,
        "train_examples": len(plan.train_ds), "augmented_examples": 0 if cfg.no_kd else transfer.augmented,
        "unlabeled_examples": len(plan.unlabeled_ds),
        "eval_examples": len(plan.eval_ds),
        "teacher_logits": {"transfer": logits.transfer_from, "eval": logits.eval_from},
        "teacher_eval": evaluation["teacher"], "student_eval": evaluation["student"],
        "teacher_agreement": evaluation["fidelity"],
        "params": evaluation["params"],
        "flops_per_example": {"teacher": t_flops, "student": s_flops, "seq_len": evaluation["seq_len"],
                              "seq_len_from": "the mean token length of the eval set",
                              "teacher_source": t_src, "student_source": s_src,
                              "unit": "FLOPs = 2 x multiply-adds, dense, batch 1",
                              "teacher_over_student": round(t_flops / max(s_flops, 1), 2)},
        "seconds": seconds,
        "steps": result["steps"], "epochs": cfg.epochs,
        "model_selection": (
            {"rule": "best epoch on held-out training examples", "val_fraction": cfg.val_fraction,
             "val_examples": len(val_ds), "val_scores": result["val_scores"],
             "selected_epoch": result["selected_epoch"]}
            if val_ds is not None else {"rule": "last epoch"}),
    }
