"""ReQA (Ahmad et al. 2019): sentence-level answer retrieval built from SQuAD-format data.

Candidates are all distinct sentences of the split's contexts (Punkt sentence splitting); a
question's target is the sentence holding its answer (the one containing ``answer_start``; several
when reference answers sit in different sentences). Questions only ever retrieve from their own
split, so a split by article keeps train and eval candidates apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from compress.core.errors import DataError
from compress.tasks.base import DataOptions, refuse_column_options
from compress.tasks.qa import QADataset, load_squad_split


@dataclass
class ReQADataset:
    """``gold[i]`` are indices into ``sentences`` holding question ``i``'s answer;
    ``sentence_context[j]`` is the index in ``contexts`` of the first context with sentence ``j``."""

    qids: list[str]
    questions: list[str]
    gold: list[tuple[int, ...]]
    sentences: list[str]
    sentence_context: list[int]
    contexts: list[str]
    label_names: tuple[str, ...] = ()
    multilabel: bool = False

    def __len__(self) -> int:
        return len(self.questions)

    def subset(self, n: int | None) -> ReQADataset:
        """The first ``n`` questions; the candidate pool is unchanged."""
        if n is None or n >= len(self):
            return self
        return ReQADataset(self.qids[:n], self.questions[:n], self.gold[:n], self.sentences,
                           self.sentence_context, self.contexts)


def _punkt(data_dir: Path | None = None):
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    for extra in ([data_dir / "nltk_data"] if data_dir else []) + (
            [Path(os.environ["NLTK_DATA"])] if os.environ.get("NLTK_DATA") else []):
        if extra.is_dir() and str(extra) not in nltk.data.path:
            nltk.data.path.insert(0, str(extra))
    try:
        return PunktTokenizer("english")
    except LookupError:
        raise DataError("the NLTK Punkt sentence splitter (punkt_tab) is not installed; set NLTK_DATA "
                        "to a folder holding tokenizers/punkt_tab (e.g. ../shared/data/nltk_data)") from None


def sentence_spans(text: str, splitter) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of ``text``."""
    return list(splitter.span_tokenize(text))


def build_reqa(qa: QADataset, data_dir: Path | None = None) -> ReQADataset:
    splitter = _punkt(data_dir)
    sentences: list[str] = []
    sent_ctx: list[int] = []
    index: dict[str, int] = {}
    contexts: list[str] = []
    ctx_index: dict[str, int] = {}
    spans_of: dict[int, list[tuple[int, int, int]]] = {}
    for ex in qa.examples:
        if ex.context in ctx_index:
            continue
        c = ctx_index[ex.context] = len(contexts)
        contexts.append(ex.context)
        spans = []
        for s, e in sentence_spans(ex.context, splitter):
            text = ex.context[s:e].strip()
            if not text:
                continue
            if text not in index:
                index[text] = len(sentences)
                sentences.append(text)
                sent_ctx.append(c)
            spans.append((s, e, index[text]))
        spans_of[c] = spans
    qids, questions, gold = [], [], []
    for ex in qa.examples:
        spans = spans_of[ctx_index[ex.context]]
        g = []
        for start in ex.answer_starts:
            hit = [j for s, e, j in spans if s <= start < e]
            if not hit:  # an answer starting in whitespace between sentences: the next sentence
                hit = [j for s, e, j in spans if s >= start][:1]
            for j in hit[:1]:
                if j not in g:
                    g.append(j)
        if not g:
            raise DataError(f"{qa.source}: question {ex.qid}: no sentence holds its answer")
        qids.append(ex.qid)
        questions.append(ex.question.strip())
        gold.append(tuple(g))
    return ReQADataset(qids, questions, gold, sentences, sent_ctx, contexts)


def load_reqa_split(opts: DataOptions, split: str, split_by_article: str | None = None,
                    skip_bad_examples: bool = False) -> ReQADataset:
    refuse_column_options(opts, "reqa")
    qa = load_squad_split(opts, split, split_by_article, skip_bad_examples)
    return build_reqa(qa, opts.data_dir)


def load_reqa(opts: DataOptions, split: str) -> ReQADataset:
    """The registry's loader (no article split)."""
    return load_reqa_split(opts, split)
