"""Property-based bad input for every data loader: malformed TSV/CSV/JSON/JSONL/SGML, wrong
encodings, NUL bytes, empty and huge fields. A loader returns a dataset or raises a CompressError;
through the CLI (``main()`` in process) every failure is one line on stderr with exit code 1 or 2."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.cli.main import main
from compress.core.errors import CompressError
from compress.tasks import TASKS, DataOptions, load_split

SETTINGS = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- content strategies -------------------------------------------------------------------------
# Each format has a well-formed generator whose fields are drawn from nasty values (so parsing gets
# past the structure and reaches label and column checks), mixed with wrong encodings, raw bytes
# and truncation.

NASTY = st.sampled_from(["", " ", ",", "\t", '"', '""', "\n", "\r\n", "\r", "\x00", "\ufeff", "\\",
                         "label", "text", "0", "1", "-1", "positive", "negative", "é", "\u2028",
                         "x" * 70_000, "1e400", "NaN", "null", "{", "}", "[", "]", "<", ">", "&amp;"])
FIELD = st.one_of(NASTY, st.text(max_size=12), st.text(alphabet="abc xyz.", min_size=1, max_size=30))
LABEL = st.one_of(st.sampled_from(["0", "1", "positive", "negative", "2", "", " 1", "entailment",
                                   "not_entailment", "3", "4", "World"]), FIELD)
ENCODING = st.sampled_from(["utf-8"] * 6 + ["utf-8-sig", "latin-1", "utf-16", "cp1252"])


def _encode(draw, text: str) -> bytes:
    data = text.encode(draw(ENCODING), errors="replace")
    fault = draw(st.integers(0, 9))
    if fault == 0:  # raw garbage
        data = draw(st.binary(max_size=64))
    elif fault == 1:  # cut short (a torn download)
        data = data[: draw(st.integers(0, len(data)))]
    return data


@st.composite
def delimited(draw, delimiter: str, columns: list[str], label_col: str | None, header: bool = True) -> bytes:
    """Rows of ``columns`` (label column from LABEL, others from FIELD); sometimes ragged rows, a
    wrong header or no header."""
    def row():
        if draw(st.integers(0, 5)) == 0:
            return draw(st.lists(FIELD, max_size=len(columns) + 2))  # ragged
        return [draw(LABEL) if c == label_col else draw(FIELD) for c in columns]

    rows = [list(columns)] if header and draw(st.integers(0, 5)) else []
    rows += [row() for _ in range(draw(st.integers(0, 6)))]
    text = "\n".join(delimiter.join(r) for r in rows) + draw(st.sampled_from(["", "\n"]))
    return _encode(draw, text)


JSON_KEYS = st.sampled_from(["text", "label", "data", "title", "paragraphs", "context", "qas", "id",
                             "question", "answers", "answer_start", "version"])
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(allow_nan=True), FIELD),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(JSON_KEYS, inner, max_size=4)),
    max_leaves=10)


@st.composite
def jsonl(draw) -> bytes:
    recs = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 4)) == 0:
            recs.append(json.dumps(draw(JSON_VALUE)))
        else:
            recs.append(json.dumps({"text": draw(st.one_of(FIELD, JSON_VALUE)),
                                    "label": draw(st.one_of(LABEL, JSON_VALUE))}))
    if draw(st.integers(0, 5)) == 0:
        recs.append("{not json")
    return _encode(draw, "\n".join(recs))


@st.composite
def squad(draw) -> bytes:
    """SQuAD v1.1 layout; answers usually consistent with their context, sometimes not."""
    if draw(st.integers(0, 5)) == 0:
        return _encode(draw, json.dumps(draw(JSON_VALUE)))
    arts = []
    for a in range(draw(st.integers(0, 2))):
        paras = []
        for _ in range(draw(st.integers(0, 2))):
            before, answer, after = draw(FIELD), draw(FIELD), draw(FIELD)
            context = f"{before}{answer}{after}. Another sentence here."
            start = len(before) if draw(st.integers(0, 3)) else draw(st.integers(-5, 10**6))
            qa = {"id": draw(st.one_of(st.text(max_size=5), JSON_VALUE)), "question": draw(FIELD),
                  "answers": [{"text": answer, "answer_start": start}]}
            if draw(st.integers(0, 6)) == 0:
                del qa[draw(st.sampled_from(["id", "question", "answers"]))]
            paras.append({"context": context, "qas": [qa]})
        arts.append({"title": draw(FIELD) or f"t{a}", "paragraphs": paras})
    return _encode(draw, json.dumps({"version": "1.1", "data": arts}))


@st.composite
def sgml(draw) -> bytes:
    docs = []
    for _ in range(draw(st.integers(0, 4))):
        split = draw(st.sampled_from(["TRAIN", "TEST", "TRAIN", "TEST", "NOT-USED", ""]))
        topics = "".join(f"<D>{t}</D>" for t in draw(st.lists(st.sampled_from(["earn", "acq", "", "&amp;"]),
                                                              max_size=3)))
        close = draw(st.sampled_from(["</REUTERS>", "</REUTERS>", "", "</REUTERS"]))
        docs.append(f'<REUTERS TOPICS="{draw(st.sampled_from(["YES", "YES", "NO"]))}" LEWISSPLIT="{split}">'
                    f"<TOPICS>{topics}</TOPICS><TEXT><TITLE>{draw(FIELD)}</TITLE><BODY>{draw(FIELD)}</BODY>"
                    f"</TEXT>{close}")
    return _encode(draw, "\n".join(docs))


# -- where each task reads its files -----------------------------------------------------------

def _write(root: Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def _glue(name: str, cols: list[str], label: str, header: bool = True):
    return (delimited("\t", cols, label, header), [f"{name}/train.tsv", f"{name}/dev.tsv"])


LAYOUTS = {  # task -> (strategy for one file, the files it is written to)
    "csv": (delimited(",", ["text", "label"], "label"), ["train.csv", "dev.csv"]),
    "jsonl": (jsonl(), ["train.jsonl", "dev.jsonl"]),
    "sst2": _glue("sst2", ["sentence", "label"], "label"),
    "cola": _glue("cola", ["source", "label", "mark", "sentence"], "label", header=False),
    "mrpc": _glue("mrpc", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], "Quality"),
    "rte": _glue("rte", ["index", "sentence1", "sentence2", "label"], "label"),
    "qnli": _glue("qnli", ["index", "question", "sentence", "label"], "label"),
    "ag_news": (delimited(",", ["class", "title", "description"], "class", header=False),
                ["ag_news/train.csv", "ag_news/test.csv"]),
    "movie_reviews": (st.one_of(st.binary(max_size=40), FIELD.map(str.encode)),
                      ["movie_reviews/pos/a.txt", "movie_reviews/neg/b.txt"]),
    "reuters": (sgml(), ["reuters21578/reut2-000.sgm", "reuters21578/reut2-001.sgm"]),
    "squad": (squad(), ["squad_v1.1/train-v1.1.json", "squad_v1.1/dev-v1.1.json"]),
    "reqa": (squad(), ["squad_v1.1/train-v1.1.json", "squad_v1.1/dev-v1.1.json"]),
    # train: the unlabelled text (any bytes); dev: ReQA from the SQuAD file (no MRPC pairs here)
    "embedding": (squad(), ["wikitext2/wiki.test.raw", "squad_v1.1/dev-v1.1.json"]),
}


def test_every_file_based_task_is_fuzzed():
    """Meta-test: a task added to the registry gets a layout here (sample reads no user files)."""
    assert set(TASKS) - {"sample"} == set(LAYOUTS)


def _load(task: str, files: list[bytes], split: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        for rel, data in zip(LAYOUTS[task][1], files):
            _write(Path(d), rel, data)
        try:
            ds = load_split(TASKS[task], DataOptions(Path(d)), split)
        except CompressError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} with an empty message"
            return
        assert len(ds) > 0


def _fuzz(task: str):
    strat, rels = LAYOUTS[task]

    @SETTINGS
    @given(files=st.lists(strat, min_size=len(rels), max_size=len(rels)),
           split=st.sampled_from(["train", "dev"]))
    def run(files, split):
        _load(task, files, split)

    return run


@pytest.mark.parametrize("task", sorted(LAYOUTS))
def test_loader_raises_only_compress_errors(task):
    _fuzz(task)()


# -- the same through the CLI: one line, exit 1 or 2, never a traceback ---------------------------

def _cli(task: str, files: list[bytes], extra: list[str], capsys) -> None:
    with tempfile.TemporaryDirectory() as d:
        for rel, data in zip(LAYOUTS[task][1], files):
            _write(Path(d), rel, data)
        capsys.readouterr()
        code = main(["finetune", "--task", task, "--data-dir", d, "--model", str(Path(d) / "no-model"),
                     "--out", str(Path(d) / "run"), *extra])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code in (1, 2), code
        assert len(err) == 1 and err[0].startswith("compress finetune: error: "), err
        assert not (Path(d) / "run").exists() and not (Path(d) / ".tmp-run").exists()


@pytest.mark.parametrize("task", ["csv", "jsonl", "sst2", "reuters"])
def test_cli_reports_bad_data_as_one_line(task, capsys):
    strat, rels = LAYOUTS[task]

    @settings(SETTINGS, max_examples=25)
    @given(files=st.lists(strat, min_size=len(rels), max_size=len(rels)),
           extra=st.lists(st.sampled_from(["--text-column", "--label-column", "--text-pair-column"]),
                          max_size=1).map(lambda xs: [x for f in xs for x in (f, "label")]))
    def run(files, extra):
        _cli(task, files, extra, capsys)

    run()


# -- round trips: what a standard writer produces reads back unchanged ---------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
               max_size=40).filter(lambda t: t.strip() == t and t.strip())


@SETTINGS
@given(rows=st.lists(st.tuples(TEXT, st.sampled_from(["0", "1"])), min_size=1, max_size=6))
def test_csv_written_by_csv_writer_reads_back(rows):
    """Quoted newlines, U+2028, U+0085 and friends inside a field are part of the field, not row breaks."""
    import csv
    import io

    rows = rows + [("filler", "0"), ("filler", "1")]
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["text", "label"])
    w.writerows(rows)
    with tempfile.TemporaryDirectory() as d:
        for name in ("train.csv", "dev.csv"):
            (Path(d) / name).write_text(buf.getvalue(), encoding="utf-8", newline="")
        ds = load_split(TASKS["csv"], DataOptions(Path(d)), "train")
    assert ds.texts == [t for t, _ in rows]
    assert [ds.label_names[y] for y in ds.labels] == [y for _, y in rows]


@SETTINGS
@given(rows=st.lists(st.tuples(TEXT, st.sampled_from(["a", "b"])), min_size=1, max_size=6),
       ascii_only=st.booleans())
def test_jsonl_written_by_json_dumps_reads_back(rows, ascii_only):
    rows = rows + [("filler", "a"), ("filler", "b")]  # train needs two labels
    lines = [json.dumps({"text": t, "label": y}, ensure_ascii=ascii_only) for t, y in rows]
    with tempfile.TemporaryDirectory() as d:
        for name in ("train.jsonl", "dev.jsonl"):
            (Path(d) / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        ds = load_split(TASKS["jsonl"], DataOptions(Path(d)), "dev")
    assert ds.texts == [t for t, _ in rows]
