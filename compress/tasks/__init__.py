"""The task registry: an explicit name table. QA and retrieval families register here too."""

from __future__ import annotations

from compress.core.errors import UsageError
from compress.tasks.base import DataOptions, TaskSpec, TextDataset, data_dir_from_env, refuse_column_options
from compress.tasks.classification import (
    AG_NEWS_LABELS,
    MOVIE_LABELS,
    MRPC_LABELS,
    SAMPLE_LABELS,
    generic_loader,
    glue_loader,
    load_ag_news,
    load_movie_reviews,
    load_mrpc,
    load_sample,
)
from compress.tasks.embedding import load_embedding
from compress.tasks.multilabel import load_reuters
from compress.tasks.qa import load_squad
from compress.tasks.retrieval import load_reqa

BINARY = ("negative", "positive")
ENTAIL = ("entailment", "not_entailment")

TASKS: dict[str, TaskSpec] = {
    "sample": TaskSpec("sample", "classification", "accuracy", load_sample, labels=SAMPLE_LABELS,
                       description="bundled smoke sample (a few hundred sentences; not a benchmark)"),
    "sst2": TaskSpec("sst2", "classification", "accuracy",
                     glue_loader(("sst2", "SST-2"), BINARY, "sentence", None, "label", "nyu-mll/glue:sst2"),
                     labels=BINARY, hub="nyu-mll/glue:sst2", description="GLUE SST-2 sentiment"),
    "cola": TaskSpec("cola", "classification", "matthews",
                     glue_loader(("cola", "CoLA"), ("unacceptable", "acceptable"), "sentence", None,
                                 "label", "nyu-mll/glue:cola", headerless=(3, None, 1)),
                     labels=("unacceptable", "acceptable"), hub="nyu-mll/glue:cola",
                     description="GLUE CoLA acceptability (Matthews correlation)"),
    "mrpc": TaskSpec("mrpc", "classification", "f1", load_mrpc,
                     labels=MRPC_LABELS, pair=True, hub="nyu-mll/glue:mrpc",
                     description="GLUE MRPC paraphrase pairs (F1)"),
    "rte": TaskSpec("rte", "classification", "accuracy",
                    glue_loader(("rte", "RTE"), ENTAIL, "sentence1", "sentence2", "label",
                                "nyu-mll/glue:rte"),
                    labels=ENTAIL, pair=True, hub="nyu-mll/glue:rte", description="GLUE RTE entailment"),
    "qnli": TaskSpec("qnli", "classification", "accuracy",
                     glue_loader(("qnli", "QNLI"), ENTAIL, "question", "sentence", "label",
                                 "nyu-mll/glue:qnli"),
                     labels=ENTAIL, pair=True, hub="nyu-mll/glue:qnli",
                     description="GLUE QNLI question/sentence entailment"),
    "ag_news": TaskSpec("ag_news", "classification", "accuracy", load_ag_news, labels=AG_NEWS_LABELS,
                        hub="fancyzhx/ag_news", description="AG News 4-class topics (CSV)"),
    "movie_reviews": TaskSpec("movie_reviews", "classification", "accuracy", load_movie_reviews,
                              labels=MOVIE_LABELS, description="Pang & Lee polarity v2 (pos/neg folders)"),
    "reuters": TaskSpec("reuters", "multilabel", "micro_f1", load_reuters, eval_split="test",
                        description="Reuters-21578 ModApte, 90 topics, multi-label (micro-F1)"),
    "csv": TaskSpec("csv", "classification", "accuracy", generic_loader("csv"),
                    description="generic CSV: train.csv/dev.csv with --text-column/--label-column",
                    reads_columns=True),
    "jsonl": TaskSpec("jsonl", "classification", "accuracy", generic_loader("jsonl"),
                      description="generic JSONL: train.jsonl/dev.jsonl with --text-column/--label-column",
                      reads_columns=True),
    "squad": TaskSpec("squad", "qa", "f1", load_squad, hub="rajpurkar/squad",
                      description="SQuAD v1.1 extractive QA (any SQuAD-format JSON); official EM/F1; "
                                  "--split-by-article 38/10 splits the dev file"),
    "reqa": TaskSpec("reqa", "retrieval", "mrr", load_reqa, hub="rajpurkar/squad",
                     description="ReQA sentence retrieval built from SQuAD-format data; P@1/5/10, MRR"),
    "embedding": TaskSpec("embedding", "embedding", "p@1", load_embedding, hub="rajpurkar/squad",
                          description="a sentence-embedding model scored as is: ReQA P@1/MRR by cosine, "
                                      "MRPC cosine ROC-AUC; calibrated and distilled on unlabelled text"),
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise UsageError(f"unknown task '{name}'; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def task_choices() -> list[str]:
    """Every registered task with its one-line description, as ``--task`` lists them."""
    return [f"{name} ({spec.description})" for name, spec in TASKS.items()]


def load_split(spec: TaskSpec, opts: DataOptions, split: str) -> TextDataset:
    """Load one split and refuse an empty one, and column options the task's loader would ignore."""
    if not spec.reads_columns:
        refuse_column_options(opts, spec.name)
    ds = spec.load(opts, split)
    if len(ds) == 0:
        raise UsageError(f"task {spec.name}: split '{split}' has no examples")
    return ds


__all__ = ["TASKS", "DataOptions", "TaskSpec", "TextDataset", "data_dir_from_env", "get_task",
           "load_split", "task_choices"]
