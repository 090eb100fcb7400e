"""Extractive QA data in SQuAD v1.1 JSON (any file in that format, e.g. MRQA-style sets).

A file holds ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}]}]}]}]}``. Every answer is checked against its context at load
time: a mismatch is a ``DataError`` naming the question id, or, with ``skip_bad_examples``, the
question is dropped and counted.

Only the SQuAD dev file exists offline, so ``split_by_article="38/10"`` splits one file by article:
the first 38 articles (file order) train, the next 10 evaluate. Questions of one article never end up
on both sides, so no context leaks from train to eval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from compress.core.errors import DataError, UsageError
from compress.tasks.base import DataOptions, refuse_column_options

SQUAD_DIRS = ("squad_v1.1", "squad", "squad_v1")
SPLIT_FILES = {"train": ("train-v1.1.json", "train.json"), "dev": ("dev-v1.1.json", "dev.json")}
HUB_ID = "rajpurkar/squad"


@dataclass(frozen=True)
class QAExample:
    """One question on one context; ``answers[i]`` starts at character ``answer_starts[i]``."""

    qid: str
    title: str
    context: str
    question: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]


@dataclass
class QADataset:
    """Questions in file order; ``articles`` lists the article titles they come from, in order."""

    examples: list[QAExample]
    articles: tuple[str, ...] = ()
    skipped: int = 0
    source: str = ""
    label_names: tuple[str, ...] = field(default_factory=tuple)
    multilabel: bool = False

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, n: int | None) -> QADataset:
        if n is None or n >= len(self):
            return self
        ex = self.examples[:n]
        titles = tuple(dict.fromkeys(e.title for e in ex))
        return QADataset(ex, titles, self.skipped, self.source)


def parse_split_by_article(value: str | None) -> tuple[int, int] | None:
    """``"38/10"`` -> (38, 10); None stays None. Bad text is a usage error naming the value."""
    if value is None:
        return None
    parts = str(value).split("/")
    try:
        n_train, n_eval = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--split-by-article must look like TRAIN/EVAL article counts, e.g. 38/10; "
                         f"got '{value}'") from None
    if n_train < 1 or n_eval < 1:
        raise UsageError(f"--split-by-article needs at least 1 article on each side, got '{value}'")
    return n_train, n_eval


def _check_answer(path: str, qid: str, context: str, ans: dict) -> tuple[str, int]:
    if not isinstance(ans, dict) or "text" not in ans or "answer_start" not in ans:
        raise DataError(f"{path}: question {qid}: each answer needs 'text' and 'answer_start'")
    text, start = str(ans["text"]), ans["answer_start"]
    if not isinstance(start, int) or isinstance(start, bool):
        raise DataError(f"{path}: question {qid}: answer_start {start!r} is not an integer")
    found = context[start:start + len(text)]
    if found != text:
        raise DataError(f"{path}: question {qid}: answer_start {start} does not match its answer "
                        f"{text!r} (the context has {found!r} there); fix the file or pass "
                        "--skip-bad-examples")
    return text, start


def parse_squad(obj, source: str, skip_bad_examples: bool = False) -> QADataset:
    """Validate and flatten a parsed SQuAD JSON object."""
    if not isinstance(obj, dict) or "data" not in obj:
        raise DataError(f"{source}: not SQuAD JSON (expected an object with a 'data' list)")
    data = obj["data"]
    if not isinstance(data, list) or not data:
        raise DataError(f"{source}: the 'data' list is empty; a SQuAD file needs at least one article")
    examples: list[QAExample] = []
    titles: list[str] = []
    skipped = 0
    for a, article in enumerate(data):
        title = str(article.get("title", f"article-{a}")) if isinstance(article, dict) else ""
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{source}: article {a} ('{title}') has no 'paragraphs' list")
        titles.append(title)
        for p, para in enumerate(paragraphs):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise DataError(f"{source}: article {a} ('{title}') paragraph {p} has no 'context' "
                                "field (each paragraph needs 'context' and 'qas')")
            context = para["context"]
            for q in para.get("qas", []):
                qid = str(q.get("id", f"{a}-{p}-?"))
                if not isinstance(q.get("question"), str):
                    raise DataError(f"{source}: question {qid} has no 'question' text")
                answers = q.get("answers") or []
                try:
                    if not answers:
                        raise DataError(f"{source}: question {qid} has no answers (SQuAD v2 "
                                        "unanswerable questions are not supported); remove it or "
                                        "pass --skip-bad-examples")
                    checked = [_check_answer(source, qid, context, ans) for ans in answers]
                except DataError:
                    if not skip_bad_examples:
                        raise
                    skipped += 1
                    continue
                examples.append(QAExample(qid, title, context, q["question"],
                                          tuple(t for t, _ in checked), tuple(s for _, s in checked)))
    return QADataset(examples, tuple(titles), skipped, source)


def read_squad_file(path: Path, skip_bad_examples: bool = False) -> QADataset:
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"SQuAD file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
    return parse_squad(obj, str(path), skip_bad_examples)


def squad_file(data_dir: Path, split: str) -> Path:
    """``<data_dir>/<squad dir>/<split file>`` or ``<data_dir>/<split file>``."""
    names = SPLIT_FILES.get(split, (f"{split}.json",))
    for folder in [data_dir / d for d in SQUAD_DIRS] + [data_dir]:
        for n in names:
            if (folder / n).is_file():
                return folder / n
    raise DataError(f"no SQuAD {split} file under {data_dir}: expected {SQUAD_DIRS[0]}/{names[0]} "
                    f"or {names[0]} (use --split-by-article 38/10 to split the dev file)")


def _from_hub(split: str) -> QADataset:
    import datasets

    hub_split = {"dev": "validation"}.get(split, split)
    try:
        ds = datasets.load_dataset(HUB_ID, split=hub_split)
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one actionable line
        raise DataError(f"could not load '{HUB_ID}' split '{hub_split}' from the hub "
                        f"({type(exc).__name__}); pass --data-dir with a local SQuAD copy") from None
    articles: dict[str, list] = {}
    for row in ds:
        articles.setdefault(row["title"], []).append(row)
    data = [{"title": t, "paragraphs": [{"context": r["context"], "qas": [{
        "id": r["id"], "question": r["question"],
        "answers": [{"text": x, "answer_start": s}
                    for x, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}]}
        for r in rows]} for t, rows in articles.items()]
    return parse_squad({"data": data}, f"hub {HUB_ID}:{hub_split}")


def select_articles(ds: QADataset, first: int, count: int) -> QADataset:
    """Questions of articles ``first .. first+count-1`` (by position in the file)."""
    keep = set(ds.articles[first:first + count])
    titles = ds.articles[first:first + count]
    return QADataset([e for e in ds.examples if e.title in keep], titles, ds.skipped, ds.source)


def load_squad_split(opts: DataOptions, split: str, split_by_article: str | None = None,
                     skip_bad_examples: bool = False) -> QADataset:
    """One split. With ``split_by_article`` both splits come from the dev file, cut by article."""
    refuse_column_options(opts, "squad")
    cut = parse_split_by_article(split_by_article)
    if cut is None:
        if opts.data_dir is None:
            return _from_hub(split)
        return read_squad_file(squad_file(opts.data_dir, split), skip_bad_examples)
    source = _from_hub("dev") if opts.data_dir is None else read_squad_file(
        squad_file(opts.data_dir, "dev"), skip_bad_examples)
    n_train, n_eval = cut
    if n_train + n_eval > len(source.articles):
        raise DataError(f"--split-by-article {split_by_article} needs {n_train + n_eval} articles but "
                        f"{source.source} has {len(source.articles)}")
    if split == "train":
        return select_articles(source, 0, n_train)
    return select_articles(source, n_train, n_eval)


def load_squad(opts: DataOptions, split: str) -> QADataset:
    """The registry's loader (no article split): train/dev files, or the hub."""
    return load_squad_split(opts, split)
