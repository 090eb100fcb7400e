"""Options of the ``squad`` and ``reqa`` tasks.

``QAOptions`` is mixed into ``FinetuneConfig`` and ``EvalConfig`` (so ``compress finetune/eval``
and every command built on them accept ``--doc-stride``, ``--n-best``, ...). Classification tasks
ignore these fields. Every default lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress.core.config import check_choice, check_range, option

QA_OBJECTIVE_NAMES = ("plain", "pfa", "hl-aacl")
PFA_ALIGNMENTS = ("cosine", "kl", "js", "w1")


@dataclass(frozen=True)
class QAOptions:
    # Hugging Face semantics; None = max_length // 3, i.e. 128 at the standard --max-length 384.
    doc_stride: int | None = option(None, help="squad: token overlap between windows of a long "
                                               "context (unset: --max-length // 3)")
    n_best: int = option(20, help="squad: start and end candidates kept per window when decoding "
                                  "answers")
    max_answer_length: int = option(30, help="squad: longest answer span in tokens")
    # never split by question: questions of one article share their context
    split_by_article: str | None = option(None, help="squad/reqa: TRAIN/EVAL article counts of one "
                                                     "SQuAD file, e.g. 38/10 (the first 38 articles "
                                                     "train, the next 10 evaluate)")
    skip_bad_examples: bool = option(False, help="squad: skip examples whose answer cannot be "
                                                 "located instead of stopping")
    # SQuAD loss plug-in (compress.qa.objectives.OBJECTIVES).
    objective: str = option("plain", choices=QA_OBJECTIVE_NAMES, help="squad: the training loss")
    objective_alpha: float = option(0.5, help="squad: weight of the pfa alignment / hl-aacl "
                                              "contrastive term")
    pfa_alignment: str = option("cosine", choices=PFA_ALIGNMENTS,
                                help="squad --objective pfa: how perturbed and clean outputs are "
                                     "aligned")
    pfa_epsilon: float = option(0.1, help="squad --objective pfa: size of the embedding "
                                          "perturbation, relative to its norm")
    hl_top_k: int = option(20, help="squad --objective hl-aacl: hard negatives kept per example")
    aacl_tau: float = option(0.1, help="squad --objective hl-aacl: temperature of the contrastive "
                                       "term")
    # Yang et al. use 100.
    retrieval_scale: float = option(100.0, help="reqa: scale of the cosine in the dual encoder's "
                                                "in-batch softmax")

    def __post_init__(self):
        check_qa_options(self)


def check_qa_options(o) -> None:
    if o.doc_stride is not None:
        check_range("doc_stride", o.doc_stride, 1)
    check_range("n_best", o.n_best, 1)
    check_range("max_answer_length", o.max_answer_length, 1)
    check_choice("objective", o.objective, QA_OBJECTIVE_NAMES)
    check_choice("pfa_alignment", o.pfa_alignment, PFA_ALIGNMENTS)
    check_range("objective_alpha", o.objective_alpha, 0)
    check_range("pfa_epsilon", o.pfa_epsilon, 0, lo_open=True)
    check_range("hl_top_k", o.hl_top_k, 1)
    check_range("aacl_tau", o.aacl_tau, 0, lo_open=True)
    check_range("retrieval_scale", o.retrieval_scale, 0, lo_open=True)
    if o.split_by_article is not None:
        from compress.tasks.qa import parse_split_by_article

        parse_split_by_article(o.split_by_article)


def effective_doc_stride(o, max_length: int) -> int:
    """The token overlap between windows; must leave room for new context in each window."""
    from compress.core.errors import UsageError

    stride = o.doc_stride if o.doc_stride is not None else max_length // 3
    if stride >= max_length // 2:
        raise UsageError(f"--doc-stride {stride} must be below half of --max-length {max_length} "
                         "(use --max-length 384 --doc-stride 128, the SQuAD standard)")
    return stride
