"""The data of the examples: compress's bundled smoke sample (320 short sentiment sentences; every
fifth is dev). Replace ``read_sample`` with your own data; the rest of each example stays."""

from __future__ import annotations

from importlib import resources

LABELS = ("negative", "positive")


def read_sample() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, dev) lists of (sentence, label) from ``compress/data/sample.tsv``."""
    text = (resources.files("compress") / "data" / "sample.tsv").read_text(encoding="utf-8")
    rows = [line.split("\t") for line in text.splitlines()[1:] if line.strip()]
    pairs = [(sentence, int(label)) for sentence, label in rows]
    train = [p for i, p in enumerate(pairs) if i % 5 != 4]
    dev = [p for i, p in enumerate(pairs) if i % 5 == 4]
    return train, dev


def encode(tokenizer, rows: list[tuple[str, int]], max_length: int) -> list[dict]:
    """One dict per example (``input_ids``, ``attention_mask``, ..., ``labels``), unpadded: a
    ``DataCollatorWithPadding`` pads each batch."""
    enc = tokenizer([s for s, _ in rows], truncation=True, max_length=max_length)
    return [{**{k: v[i] for k, v in enc.items()}, "labels": y} for i, (_, y) in enumerate(rows)]


def accuracy(eval_pred) -> dict[str, float]:
    """``compute_metrics`` for a Trainer: the fraction of dev sentences classified right."""
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}
