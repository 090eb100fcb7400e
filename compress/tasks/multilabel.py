"""Multi-label classification: Reuters-21578, ModApte split, the 90 topics seen in train and test."""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path

from compress.core.errors import DataError
from compress.tasks.base import DataOptions, TextDataset, task_folder
from compress.tasks.readers import read_text

_DOC = re.compile(r"<REUTERS([^>]*)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_TOPICS = re.compile(r"<TOPICS>(.*?)</TOPICS>", re.S)
_D = re.compile(r"<D>(.*?)</D>", re.S)
_TITLE = re.compile(r"<TITLE>(.*?)</TITLE>", re.S)
_BODY = re.compile(r"<BODY>(.*?)</BODY>", re.S)
_TEXT = re.compile(r"<TEXT[^>]*>(.*?)</TEXT>", re.S)
_TAG = re.compile(r"<[^>]+>")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def parse_sgml(text: str, where: str) -> list[dict]:
    """Documents of one Reuters SGML file: split, topics and text (title + body, entities decoded)."""
    docs = []
    for m in _DOC.finditer(text):
        attrs = dict(_ATTR.findall(m.group(1)))
        body = m.group(2)
        topics_m = _TOPICS.search(body)
        topics = [t.strip() for t in _D.findall(topics_m.group(1))] if topics_m else []
        title = _TITLE.search(body)
        main = _BODY.search(body)
        parts = [html.unescape(x.group(1)) for x in (title, main) if x]
        if not parts:  # TYPE="UNPROC" documents hold their text directly inside <TEXT>
            raw = _TEXT.search(body)
            parts = [html.unescape(_TAG.sub(" ", raw.group(1)))] if raw else []
        docs.append({
            "split": attrs.get("LEWISSPLIT", ""),
            "has_topics": attrs.get("TOPICS", "") == "YES",
            "topics": topics,
            "text": " ".join(_CONTROL.sub(" ", " ".join(parts)).split()),
        })
    if not docs:
        raise DataError(f"{where}: no <REUTERS> documents found (is this a Reuters-21578 .sgm file?)")
    return docs


@lru_cache(maxsize=2)
def _modapte(folder: str) -> tuple[tuple[str, ...], dict[str, list[tuple[str, list[str]]]]]:
    files = sorted(Path(folder).glob("reut2-*.sgm"))
    if not files:
        raise DataError(f"no reut2-*.sgm files in {folder}")
    split_docs: dict[str, list[tuple[str, list[str]]]] = {"train": [], "test": []}
    for f in files:
        # The distribution is not UTF-8 (reut2-017.sgm has a raw 0xFC byte): latin-1 reads every byte.
        for d in parse_sgml(read_text(f, encoding="latin-1"), str(f)):
            key = {"TRAIN": "train", "TEST": "test"}.get(d["split"])
            if key and d["has_topics"] and d["topics"]:
                split_docs[key].append((d["text"], d["topics"]))
    seen = {k: {t for _, ts in v for t in ts} for k, v in split_docs.items()}
    labels = tuple(sorted(seen["train"] & seen["test"]))
    if not labels:
        raise DataError(f"{folder}: no topic occurs in both the ModApte train and test splits")
    return labels, split_docs


def load_reuters(opts: DataOptions, split: str) -> TextDataset:
    if opts.data_dir is None:
        raise DataError("reuters: pass --data-dir holding reuters21578/reut2-*.sgm "
                        "(the hub copy uses a loading script, which is not run)")
    folder = task_folder(opts, ("reuters21578", "reuters"), ("reut2-000.sgm",))
    labels, split_docs = _modapte(str(folder))
    key = "test" if split in ("dev", "test") else "train"
    index = {t: i for i, t in enumerate(labels)}
    texts, ys = [], []
    for text, topics in split_docs[key]:
        y = sorted(index[t] for t in topics if t in index)
        if y:  # documents whose only topics are outside the 90 are dropped (R90 convention)
            texts.append(text)
            ys.append(y)
    return TextDataset(texts, ys, labels, multilabel=True)
