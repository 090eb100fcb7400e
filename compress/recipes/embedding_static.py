"""``compress distill --task embedding --student static``: a sentence-embedding teacher distilled into
static token vectors by model2vec, then tuned towards the teacher's similarities on unlabelled text
(``compress.embedding.static``), saved as a model2vec folder (``students.static_embedding``: model2vec
and sentence-transformers open it), scored on the embedding task beside the teacher and Model2Vec's
own distillation of the same teacher at the same width; each encodes the same held-out texts once
more, timed, for its sentences per second on this machine.

Reads top to bottom: check -> the scored sets (and the unlabelled text of the tuning and of
``--weighting text``) -> the teacher -> run folder -> teacher scores -> the student (distilled,
tuned) and its scores -> the peer -> save the student (``student/``) and the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from compress.core.config import check_range, option, to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, write_json
from compress.embedding.evaluation import encoder_scorer, load_eval_data, refuse_non_embedding_model
from compress.embedding.model import ST_MODEL_CONFIG, load_sentence_encoder
from compress.embedding.scores import brief, embedding_scores
from compress.embedding.static import (
    DEFAULT_DIMS,
    DTYPES,
    SIF_COEFFICIENT,
    WEIGHTINGS,
    AlignConfig,
    distil_static,
)
from compress.tasks.base import DataOptions, data_dir_from_env
from compress.tasks.embedding import EMBEDDING_TASK, unlabelled_text
from students.static_embedding import StaticEncoder, save_static

STATIC_STUDENT = "static"


@dataclass(frozen=True)
class StaticDistillConfig:
    task: str = option(EMBEDDING_TASK, help="embedding (the only task of the static student)")
    student: str = option(STATIC_STUDENT, help="static: one vector per vocabulary token")
    teacher: str = option("minilm", help="the sentence-embedding model to distil (minilm, a "
                                         "sentence-transformers folder or hub id, a compress run)")
    dims: int = option(DEFAULT_DIMS, help="width of the static vectors (PCA components)")
    weighting: str = option("zipf", choices=WEIGHTINGS,
                            help="token weights a/(a+p): p from Zipf's law on the vocabulary order "
                                 "(zipf, Model2Vec's) or counted on unlabelled text (text)")
    sif_coefficient: float = option(SIF_COEFFICIENT, help="a of the weights a/(a+p)")
    dtype: str = option("float32", choices=DTYPES,
                        help="precision of the saved vectors: float32 (model2vec and sentence-transformers "
                             "give equal embeddings) or float16 (half the file, embeddings rounded)")
    align_epochs: int = option(8, help="passes of teacher-aligned tuning over the unlabelled text "
                                       "(0: Model2Vec's vectors as they are)")
    align_lr: float = option(5e-3, help="learning rate of the teacher-aligned tuning")
    calibration_data: str | None = option(None, help="the unlabelled text of --align-epochs and "
                                                     "--weighting text: a text file or folder (default: "
                                                     "WikiText-2 under --data-dir)")
    no_peer: bool = option(False, help="do not run Model2Vec beside the student")
    data_dir: str | None = option(None, help="folder holding squad_v1.1, mrpc and wikitext2")
    split_by_article: str | None = option(None, help="TRAIN/EVAL article counts of the SQuAD file; "
                                                     "ReQA is scored on the EVAL articles (e.g. 38/10)")
    eval_limit: int | None = option(None, help="score only the first N ReQA questions")
    batch_size: int = option(128, help="sentences per batch when encoding")
    seed: int = option(42, help="seed of the teacher-aligned tuning's batches")
    out: str | None = option(None, help="run folder to create")
    name: str | None = option(None, help="run name")

    def __post_init__(self):
        if self.task != EMBEDDING_TASK:
            raise UsageError("the static student distils a sentence-embedding model: use --task "
                             f"{EMBEDDING_TASK}")
        if self.student != STATIC_STUDENT:
            raise UsageError(f"--task embedding has one student, '{STATIC_STUDENT}'; got '{self.student}'")
        check_range("dims", self.dims, 1)
        check_range("sif_coefficient", self.sif_coefficient, 0, 1, lo_open=True, hi_open=True)
        check_range("batch_size", self.batch_size, 1)
        check_range("align_epochs", self.align_epochs, 0)
        check_range("align_lr", self.align_lr, 0, lo_open=True)
        if self.eval_limit is not None:
            check_range("eval_limit", self.eval_limit, 1)
        if self.calibration_data is not None and self.weighting != "text" and not self.align_epochs:
            raise UsageError("--calibration-data is the text of the teacher-aligned tuning and of "
                             "--weighting text: add --align-epochs N or --weighting text, or drop it")
        if self.split_by_article is not None:
            from compress.tasks.qa import parse_split_by_article

            parse_split_by_article(self.split_by_article)

    def data_options(self) -> DataOptions:
        return DataOptions(data_dir_from_env(self.data_dir))


def timed_scores(encode: Callable[[list[str]], torch.Tensor], data, reference=None) -> dict:
    """Scores, then the same held-out texts encoded once more, timed: ``sentences_per_second``."""
    scores, _ = embedding_scores(encode, data, reference)
    texts = data.heldout_texts()
    t0 = time.perf_counter()
    encode(texts)
    seconds = time.perf_counter() - t0
    return {**scores, "sentences_per_second": len(texts) / seconds, "timed_texts": len(texts),
            "threads": torch.get_num_threads()}


def model2vec_peer(teacher_path: str, dims: int, data) -> dict:
    """Model2Vec's distillation of the same teacher at ``dims``, scored and timed; or why not."""
    try:
        import model2vec
        from model2vec.distill import distill
    except ImportError as exc:
        return {"skipped": f"model2vec's distill cannot be imported ({exc}); pip install model2vec "
                           "skeletoken"}
    t0 = time.perf_counter()
    peer = distill(model_name=teacher_path, pca_dims=dims)
    seconds = time.perf_counter() - t0
    return {"version": model2vec.__version__, "distill_seconds": round(seconds, 1),
            **timed_scores(lambda texts: torch.as_tensor(peer.encode(list(texts))), data)}


def run_static_distill(cfg: StaticDistillConfig) -> Path:
    from compress.models.loading import resolve_model

    opts = cfg.data_options()
    data = load_eval_data(cfg)
    needs_text = cfg.weighting == "text" or cfg.align_epochs > 0
    texts = unlabelled_text(opts, cfg.calibration_data) if needs_text else []
    teacher, tokenizer, meta = load_sentence_encoder(cfg.teacher)
    refuse_non_embedding_model(meta, cfg.teacher)
    data = data.with_prompts(teacher.prompts)  # the student and the peer read the teacher's inputs
    with RunDir("distill", name=cfg.name or f"{EMBEDDING_TASK}-static-{cfg.dims}", out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        teacher_scores = timed_scores(encoder_scorer(teacher, tokenizer, cfg.batch_size, None), data)
        t0 = time.perf_counter()
        align = AlignConfig(cfg.align_epochs, cfg.align_lr, seed=cfg.seed) if cfg.align_epochs else None
        student, report = distil_static(teacher, tokenizer, cfg.dims, cfg.weighting, texts,
                                        cfg.sif_coefficient, cfg.dtype, align, cfg.batch_size)
        report["distill_seconds"] = round(time.perf_counter() - t0, 1)
        student_scores = timed_scores(StaticEncoder(student, cfg.batch_size), data)
        peer = {"skipped": "--no-peer"} if cfg.no_peer else model2vec_peer(resolve_model(cfg.teacher),
                                                                              cfg.dims, data)
        save_static(student, run.path / "student")
        if teacher.model_config:  # the teacher's prompts, which the student was scored with
            write_json(run.path / "student" / ST_MODEL_CONFIG, teacher.model_config)
        run.write_summary({"command": "distill", "task": EMBEDDING_TASK, "student": STATIC_STUDENT,
                           "teacher": cfg.teacher, "metric": "p@1", "static": report,
                           "eval": student_scores, "teacher_eval": teacher_scores, "model2vec": peer})
    lines = [f"teacher {cfg.teacher}: {brief(teacher_scores)}, {teacher_scores['sentences_per_second']:.0f} "
             "sentences/s",
             f"static student ({cfg.dims} dims): {brief(student_scores)}, "
             f"{student_scores['sentences_per_second']:.0f} sentences/s"]
    if "skipped" not in peer:
        lines.append(f"model2vec {peer['version']}: {brief(peer)}, {peer['sentences_per_second']:.0f} "
                     "sentences/s")
    print("\n".join(lines) + f"\n-> {run.path}")
    return run.path
