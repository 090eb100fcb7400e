"""Single-label classification tasks: GLUE TSVs (single sentence and pairs), AG News, movie reviews,
the bundled sample, and generic CSV/JSONL files."""

from __future__ import annotations

import csv
import itertools
from importlib import resources
from pathlib import Path

from compress.core.errors import DataError
from compress.tasks.base import DataOptions, TextDataset, check_label, task_folder
from compress.tasks.readers import column, read_delimited, read_jsonl, read_text

_SPLIT_FILES = {"train": ("train",), "dev": ("dev", "validation"), "test": ("test",)}


def _split_file(folder: Path, split: str, exts: tuple[str, ...], stems: tuple[str, ...] | None = None
                ) -> Path:
    """The first of ``folder/<stem>.<ext>`` that exists; ``stems`` defaults to the split's usual
    names."""
    stems = stems or _SPLIT_FILES.get(split, (split,))
    for stem in stems:
        for ext in exts:
            p = folder / f"{stem}.{ext}"
            if p.is_file():
                return p
    expected = " or ".join(f"{stem}.{exts[0]}" for stem in stems if stem != "validation")
    raise DataError(f"no {split} file in {folder}: expected {expected}")


def _from_hub(hub: str, split: str, text: str, pair: str | None, label: str,
              label_names: tuple[str, ...]) -> TextDataset:
    """Load a split from the Hugging Face hub (needs internet)."""
    import datasets

    name, _, config = hub.partition(":")
    hub_split = {"dev": "validation"}.get(split, split)
    try:
        ds = datasets.load_dataset(name, config or None, split=hub_split)
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one actionable line
        raise DataError(f"could not load '{hub}' split '{hub_split}' from the hub "
                        f"({type(exc).__name__}); pass --data-dir with a local copy") from None
    missing = [c for c in (text, pair, label) if c and c not in ds.column_names]
    if missing:
        raise DataError(f"hub dataset '{hub}' split '{hub_split}' has no column {missing[0]!r} (its "
                        f"columns: {', '.join(ds.column_names)}); pass --data-dir with a local copy")
    pairs = [str(x) for x in ds[pair]] if pair else None
    labels = [check_label(v, label_names, f"hub {hub}") for v in ds[label]]
    return TextDataset([str(x) for x in ds[text]], labels, label_names, pairs)


def glue_loader(dirs: tuple[str, ...], labels: tuple[str, ...], text: str, pair: str | None,
                label: str, hub: str, headerless: tuple[int, int | None, int] | None = None,
                hub_columns: tuple[str, str | None, str] | None = None):
    """A loader for a GLUE-style TSV task.

    ``headerless`` gives (text, pair, label) column indices for files without a header row, as in
    the original CoLA distribution. ``hub_columns`` names (text, pair, label) in the hub dataset
    where they differ from the TSV header (MRPC: ``#1 String`` locally, ``sentence1`` on the hub).
    """

    def load(opts: DataOptions, split: str) -> TextDataset:
        if opts.data_dir is None:
            return _from_hub(hub, split, *(hub_columns or (text, pair, label)), labels)
        path = _split_file(task_folder(opts, dirs, ("train.tsv", "dev.tsv")), split, ("tsv",))
        first = read_text(path, "utf-8-sig").split("\n", 1)[0].split("\t")
        has_header = label in first or (text in first)
        head, rows, lines = read_delimited(path, "\t", header=has_header or headerless is None,
                                           quoting=csv.QUOTE_NONE)
        if head is not None:
            ti, li = column(head, text, path), column(head, label, path)
            pi = column(head, pair, path) if pair else None
        else:
            assert headerless is not None
            ti, pi, li = headerless
            for line, r in zip(lines, rows):
                if len(r) <= max(ti, li, pi or 0):
                    raise DataError(f"{path}:{line}: expected at least {max(ti, li) + 1} columns")
        ys = [check_label(r[li], labels, f"{path}:{line}") for line, r in zip(lines, rows)]
        return TextDataset([r[ti].strip() for r in rows], ys, labels,
                           [r[pi].strip() for r in rows] if pi is not None else None)

    return load


AG_NEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")


MRPC_LABELS = ("not_paraphrase", "paraphrase")
load_mrpc = glue_loader(("mrpc", "MRPC"), MRPC_LABELS, "#1 String", "#2 String", "Quality",
                        "nyu-mll/glue:mrpc", hub_columns=("sentence1", "sentence2", "label"))


def load_ag_news(opts: DataOptions, split: str) -> TextDataset:
    """AG News: original CSV (class 1-4, title, description, no header); for train, the 10k TSV
    subset (``description<TAB>class name``) is used when the full ``train.csv`` is absent. The
    model then reads descriptions only, so ``test.csv`` gives descriptions only too; with
    ``train.csv`` both splits are ``title description``, as the hub copy's ``text``."""
    if opts.data_dir is None:
        return _from_hub("fancyzhx/ag_news", "test" if split == "dev" else split, "text", None,
                         "label", AG_NEWS_LABELS)
    folder = task_folder(opts, ("ag_news",), ("test.csv", "train.csv", "train_subset_10k_alps.tsv"))
    stem = "test" if split in ("dev", "test") else "train"
    path = folder / f"{stem}.csv"
    with_title = (folder / "train.csv").is_file()  # else training reads the description-only subset
    if path.is_file():
        _, rows, lines = read_delimited(path, ",", header=False)
        texts, ys = [], []
        for i, r in zip(lines, rows):
            if len(r) != 3:
                raise DataError(f"{path}:{i}: expected 3 columns (class, title, description), got {len(r)}")
            cls = r[0].strip()
            if not (cls.isdigit() and 1 <= int(cls) <= 4):
                raise DataError(f"{path}:{i}: label '{cls}' is not in the label set 1-4")
            ys.append(int(cls) - 1)
            text = f"{r[1].strip()} {r[2].strip()}" if with_title else r[2].strip()
            texts.append(text.replace("\\", " "))
        return TextDataset(texts, ys, AG_NEWS_LABELS)
    alt = folder / "train_subset_10k_alps.tsv"
    if stem == "train" and alt.is_file():
        _, rows, lines = read_delimited(alt, "\t", header=False, quoting=csv.QUOTE_NONE)
        ys = [check_label(r[-1], AG_NEWS_LABELS, f"{alt}:{i}") for i, r in zip(lines, rows)]
        return TextDataset([r[0].strip().replace("\\", " ") for r in rows], ys, AG_NEWS_LABELS)
    raise DataError(f"no AG News {split} file in {folder}: expected {stem}.csv")


MOVIE_LABELS = ("neg", "pos")


def load_movie_reviews(opts: DataOptions, split: str) -> TextDataset:
    """Pang & Lee polarity v2: ``pos/`` and ``neg/`` folders of .txt files. No official split:
    files sorted by name, every fifth (index % 5 == 4) is dev, giving 1,600/400. The two classes
    alternate (neg, pos, neg, ...), so that the first N of ``--train-limit``/``--eval-limit`` hold
    both; read folder by folder, any N up to 800 would be all negative."""
    if opts.data_dir is None:
        raise DataError("movie_reviews has no hub copy; pass --data-dir with pos/ and neg/ folders")
    folder = task_folder(opts, ("movie_reviews", "movie_reviews_polarity_v2"), ("pos", "neg"))
    per_class = []
    for y, name in enumerate(MOVIE_LABELS):
        files = sorted((folder / name).glob("*.txt"))
        if not files:
            raise DataError(f"no .txt files in {folder / name}")
        per_class.append([(f, y) for i, f in enumerate(files) if (i % 5 == 4) == (split in ("dev", "test"))])
    order = [fy for group in itertools.zip_longest(*per_class) for fy in group if fy is not None]
    return TextDataset([" ".join(read_text(f).split()) for f, _ in order], [y for _, y in order],
                       MOVIE_LABELS)


SAMPLE_LABELS = ("negative", "positive")


def load_sample(opts: DataOptions, split: str) -> TextDataset:
    """The bundled smoke sample (``compress/data/sample.tsv``): every fifth row is dev."""
    path = Path(str(resources.files("compress") / "data" / "sample.tsv"))
    head, rows, lines = read_delimited(path, "\t", quoting=csv.QUOTE_NONE)
    keep = [(line, r) for i, (line, r) in enumerate(zip(lines, rows))
            if (i % 5 == 0) == (split in ("dev", "test"))]
    ys = [check_label(r[1], SAMPLE_LABELS, f"{path}:{line}") for line, r in keep]
    return TextDataset([r[0] for _, r in keep], ys, SAMPLE_LABELS)


def infer_labels(raw: list[str]) -> tuple[str, ...]:
    """Label names of a generic file: sorted numerically when all are integers, else by name."""
    uniq = sorted(set(raw))
    if all(u.lstrip("-").isdigit() for u in uniq):
        uniq = sorted(uniq, key=int)
    return tuple(uniq)


_EVAL_STEMS = ("dev", "validation", "test")


def generic_loader(ext: str):
    """``csv``/``jsonl`` tasks: ``<data-dir>/train.<ext>`` and ``dev.<ext>`` (else ``validation`` or
    ``test``), columns chosen with --text-column, --text-pair-column and --label-column. Labels are
    the sorted distinct values of the train file, at least two; an eval label outside them is an
    error. Errors name the file line (a CSV header is line 1)."""

    def rows_of(path: Path, opts: DataOptions
                ) -> tuple[list[str], list[str] | None, list[str], list[int]]:
        cols = [opts.text_column, opts.label_column] + (
            [opts.text_pair_column] if opts.text_pair_column else [])
        if ext == "csv":
            head, rows, lines = read_delimited(path, ",")
            idx = [column(head, c, path) for c in cols]
            table = [[r[i] for i in idx] for r in rows]
        else:
            table, lines = [], []
            for line, rec in read_jsonl(path):
                table.append([_field(rec, c, path, line) for c in cols])
                lines.append(line)
        texts = [t[0] for t in table]
        labels = [t[1].strip() for t in table]
        pairs = [t[2] for t in table] if opts.text_pair_column else None
        return texts, pairs, labels, lines

    def load(opts: DataOptions, split: str) -> TextDataset:
        if opts.data_dir is None:
            raise DataError(f"task {ext} needs --data-dir with train.{ext} and dev.{ext}")
        train_path = _split_file(opts.data_dir, "train", (ext,))
        _, _, train_labels, _ = rows_of(train_path, opts)
        names = infer_labels(train_labels)
        if len(names) < 2:
            raise DataError(f"{train_path}: every row has the label '{names[0]}'; a classifier needs "
                            "at least two labels (add rows of the other labels, or check "
                            "--label-column)")
        if split == "train":
            path = train_path
        elif split == "dev":
            path = _split_file(opts.data_dir, split, (ext,), stems=_EVAL_STEMS)
        else:
            path = _split_file(opts.data_dir, split, (ext,))
        texts, pairs, raw, lines = rows_of(path, opts)
        ys = [check_label(v, names, f"{path}:{line}") if v in names else _bad(v, names, path, line)
              for line, v in zip(lines, raw)]
        return TextDataset(texts, ys, names, pairs)

    return load


def _field(rec: dict, name: str, path: Path, line: int) -> str:
    """Field ``name`` of a JSONL object as text; a missing field, null, a list or an object is an
    error naming the file line (``str(None)`` would train on the word "None")."""
    if name not in rec:
        raise DataError(f"{path}:{line}: no field '{name}'; fields are {sorted(rec)} "
                        "(choose with --text-column/--text-pair-column/--label-column)")
    value = rec[name]
    if value is None or isinstance(value, (list, dict)):
        what = "null" if value is None else f"a JSON {'array' if isinstance(value, list) else 'object'}"
        raise DataError(f"{path}:{line}: field '{name}' is {what}; give it a string (or a number for "
                        "the label), or drop the row")
    return str(value)


def _bad(value: str, names: tuple[str, ...], path: Path, line: int) -> int:
    raise DataError(f"{path}:{line}: label '{value}' is not in the label set {list(names)} seen in the "
                    "train file (fix the row or add the label to train)")
