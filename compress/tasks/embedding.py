"""The embedding task: what scores a sentence-embedding model without fine-tuning it, and the
unlabelled text it is calibrated and distilled on.

- **Retrieval**: ReQA built from SQuAD-format data (``compress.tasks.retrieval``), questions ranked
  against every sentence of their split by the cosine of their embeddings; P@1/5/10 and MRR.
- **Pair similarity**: MRPC dev pairs where ``mrpc/dev.tsv`` is present (or the hub has it): the
  ROC-AUC of the cosine of the two sentences' embeddings against the paraphrase label.
- **Unlabelled text**: the lines of ``--calibration-data`` (a file or a folder of text files), else
  WikiText-2 (``<data-dir>/wikitext2/wiki.test.raw``, or the hub's raw train split); paragraphs are
  cut into sentences with Punkt, headings dropped. Nothing of it is scored.

A model with prompts is scored with them (``EmbeddingEval.with_prompts``). The scored texts
(questions, candidate sentences, pair sentences, prompts included) are also the held-out text of the
cosine between a compressed model's and its original's embeddings: none of them is calibrated or
distilled on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from compress.core.errors import DataError
from compress.tasks.base import DataOptions, TextDataset
from compress.tasks.classification import load_mrpc
from compress.tasks.corpus import read_corpus
from compress.tasks.retrieval import ReQADataset, _punkt, load_reqa_split

EMBEDDING_TASK = "embedding"
WIKITEXT_FILE = "wikitext2/wiki.test.raw"
WIKITEXT_HUB = ("Salesforce/wikitext", "wikitext-2-raw-v1")
HEADING = re.compile(r"^\s*=+ .* =+\s*$")
MIN_WORDS = 4


@dataclass
class EmbeddingEval:
    """What an embedding model is scored on: ReQA, and sentence pairs with 0/1 labels (or None)."""

    reqa: ReQADataset
    pairs: TextDataset | None = None

    def __len__(self) -> int:
        return len(self.reqa)

    def with_prompts(self, prompts) -> EmbeddingEval:
        """The same sets with a model's prompts (``compress.embedding.model.Prompts``) before each text:
        the query prompt before the questions, the document prompt before the candidate sentences,
        the default prompt before the pair sentences."""
        if not (prompts.query or prompts.document or prompts.other):
            return self
        r = self.reqa
        reqa = replace(r, questions=[prompts.query + q for q in r.questions],
                       sentences=[prompts.document + t for t in r.sentences])
        pairs = self.pairs
        if pairs is not None and prompts.other:
            pairs = replace(pairs, texts=[prompts.other + t for t in pairs.texts],
                            pairs=None if pairs.pairs is None else [prompts.other + t for t in pairs.pairs])
        return EmbeddingEval(reqa, pairs)

    def heldout_texts(self) -> list[str]:
        """Every distinct scored text, in a fixed order."""
        texts = list(self.reqa.questions) + list(self.reqa.sentences)
        if self.pairs is not None:
            texts += list(self.pairs.texts) + list(self.pairs.pairs or [])
        return list(dict.fromkeys(texts))


def load_pairs(opts: DataOptions) -> TextDataset | None:
    """MRPC dev pairs: from ``<data-dir>/mrpc`` where it holds a dev file, from the hub without a
    ``--data-dir``, none otherwise (the pair score is then left out)."""
    if opts.data_dir is not None and not any((opts.data_dir / d / "dev.tsv").is_file()
                                             for d in ("mrpc", "MRPC")):
        return None
    return load_mrpc(DataOptions(opts.data_dir), "dev")


def load_embedding_eval(opts: DataOptions, split_by_article: str | None = None,
                        limit: int | None = None) -> EmbeddingEval:
    """ReQA on the eval split (the last ``split_by_article`` articles, else the whole dev file;
    ``limit``: its first questions, every candidate kept) and the MRPC pairs."""
    reqa = load_reqa_split(opts, "dev", split_by_article).subset(limit)
    if len(reqa) == 0:
        raise DataError("embedding: the ReQA eval split has no questions")
    return EmbeddingEval(reqa, load_pairs(opts))


def sentences_of(lines: list[str], data_dir: Path | None) -> list[str]:
    """Paragraph lines cut into sentences (Punkt); headings and fragments under ``MIN_WORDS`` words
    dropped."""
    splitter = _punkt(data_dir)
    out = []
    for line in lines:
        if HEADING.match(line):
            continue
        for s, e in splitter.span_tokenize(line):
            text = line[s:e].strip()
            if len(text.split()) >= MIN_WORDS:
                out.append(text)
    return out


def _wikitext_from_hub() -> list[str]:
    import datasets

    try:
        ds = datasets.load_dataset(*WIKITEXT_HUB, split="train")
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one actionable line
        raise DataError(f"could not load '{WIKITEXT_HUB[0]}' ({WIKITEXT_HUB[1]}) from the hub "
                        f"({type(exc).__name__}); pass --data-dir with {WIKITEXT_FILE}, or "
                        "--calibration-data with your own text") from None
    return [r["text"].strip() for r in ds if r["text"].strip()]


def unlabelled_text(opts: DataOptions, calibration_data: str | None) -> list[str]:
    """The sentences to calibrate and distil on (module docstring)."""
    if calibration_data is not None:
        lines = read_corpus((calibration_data,), "--calibration-data")
    elif opts.data_dir is not None:
        path = opts.data_dir / WIKITEXT_FILE
        if not path.is_file():
            raise DataError(f"no unlabelled text: {path} is missing; pass --calibration-data with a text "
                            "file or folder (one text per line)")
        lines = read_corpus((str(path),), "--calibration-data")
    else:
        lines = _wikitext_from_hub()
    texts = sentences_of(lines, opts.data_dir)
    if not texts:
        raise DataError(f"the unlabelled text has no sentence of {MIN_WORDS} words or more; pass "
                        "--calibration-data with prose, one text per line")
    return texts


def load_embedding(opts: DataOptions, split: str):
    """The registry's loader: the unlabelled text for ``train``, the scored sets for any other split."""
    if split == "train":
        texts = unlabelled_text(opts, None)
        return TextDataset(texts, [None] * len(texts), ())
    return load_embedding_eval(opts)
