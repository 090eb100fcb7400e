"""Every registered task: a tiny generated fixture, and a few real rows from ../shared/data."""

from __future__ import annotations

import pytest

from compress.core.errors import DataError, UsageError
from compress.tasks import TASKS, DataOptions, get_task, load_split
from compress.tasks.multilabel import parse_sgml

# Tasks that read their data from files in their own layout (QA/retrieval are tested elsewhere).
CLASSIFICATION_TASKS = [n for n, s in TASKS.items() if s.family in ("classification", "multilabel")]


def _write(folder, name, text, encoding="utf-8"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(text.encode(encoding))


SGML = """<!DOCTYPE lewis SYSTEM "lewis.dtd">
<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" OLDID="1" NEWID="1">
<TOPICS><D>grain</D><D>wheat</D></TOPICS><TEXT><TITLE>WHEAT UP</TITLE><BODY>Prices rose &lt;sharply&gt;.
&#3;</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" NEWID="2"><TOPICS><D>gold</D></TOPICS>
<TEXT><TITLE>GOLD</TITLE><BODY>Only in train.</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="TEST" NEWID="3"><TOPICS><D>wheat</D></TOPICS>
<TEXT TYPE="UNPROC">&#2; raw wheat text</TEXT></REUTERS>
<REUTERS TOPICS="NO" LEWISSPLIT="TEST" NEWID="4"><TOPICS><D>grain</D></TOPICS>
<TEXT><BODY>not in ModApte</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="TEST" NEWID="5"><TOPICS><D>grain</D></TOPICS>
<TEXT><BODY>grain test</BODY></TEXT></REUTERS>
"""

FIXTURES = {
    "sst2": [("sst2/train.tsv", "sentence\tlabel\ngood film \t1\nbad film \t0\n"),
             ("sst2/dev.tsv", "sentence\tlabel\nfine \t1\n")],
    "cola": [("cola/train.tsv", "src\t1\t\tThe cat sat.\nsrc\t0\t*\tCat the sat.\n"),
             ("cola/dev.tsv", "src\t1\t\tA dog ran.\n")],
    "mrpc": [("mrpc/train.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b.\tA b!\n"
              "0\t3\t4\tC.\tD.\n"),
             ("mrpc/dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tX.\tX!\n")],
    "rte": [("rte/train.tsv", "sentence1\tsentence2\tlabel\tidx\nA.\tB.\t0\t0\nC.\tD.\t1\t1\n"),
            ("rte/dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tE.\tF.\tnot_entailment\n")],
    "qnli": [("qnli/train.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tHe.\tentailment\n"),
             ("qnli/dev.tsv", "index\tquestion\tsentence\tlabel\n0\tWhat?\tIt.\tnot_entailment\n")],
    "ag_news": [("ag_news/train.csv", '"3","Title A","Desc a"\n"1","Title B","Desc b"\n'),
                ("ag_news/test.csv", '"4","Title C","Desc c \\ more"\n')],
    "movie_reviews": [(f"movie_reviews/{c}/cv{i:03d}.txt", f"{c} review {i}\n") for c in ("pos", "neg")
                      for i in range(5)],
    "reuters": [("reuters21578/reut2-000.sgm", SGML)],
    "csv": [("train.csv", "text,label,other\nhello,a,1\nworld,b,2\n"),
            ("dev.csv", "text,label,other\nx,b,3\n")],
    "jsonl": [("train.jsonl", '{"text": "hi", "label": 1}\n{"text": "yo", "label": 0}\n'),
              ("dev.jsonl", '{"text": "hey", "label": 1}\n')],
}

EXPECTED_FIXTURE = {  # task -> (train size, first train label, eval size, first eval label)
    "sst2": (2, 1, 1, 1), "cola": (2, 1, 1, 1), "mrpc": (2, 1, 1, 1), "rte": (2, 0, 1, 1),
    "qnli": (1, 0, 1, 1), "ag_news": (2, 2, 1, 3), "movie_reviews": (8, 0, 2, 0),
    "reuters": (1, [0, 1], 2, [1]), "csv": (2, 0, 1, 1), "jsonl": (2, 1, 1, 1),
}


def test_every_task_has_a_fixture():
    assert set(CLASSIFICATION_TASKS) - {"sample"} == set(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_task_on_generated_fixture(tmp_path, name):
    for rel, text in FIXTURES[name]:
        _write(tmp_path / rel.rsplit("/", 1)[0] if "/" in rel else tmp_path, rel.rsplit("/", 1)[-1], text)
    spec = get_task(name)
    opts = DataOptions(tmp_path)
    train = load_split(spec, opts, spec.train_split)
    ev = load_split(spec, opts, spec.eval_split)
    n_train, y_train, n_eval, y_eval = EXPECTED_FIXTURE[name]
    assert (len(train), train.labels[0], len(ev), ev.labels[0]) == (n_train, y_train, n_eval, y_eval)
    assert all(isinstance(t, str) and t for t in train.texts)
    if spec.pair:
        assert train.pairs is not None and len(train.pairs) == len(train)


def test_reuters_fixture_details(tmp_path):
    docs = parse_sgml(SGML, "x")
    assert docs[0]["text"] == "WHEAT UP Prices rose <sharply>."
    assert docs[2]["text"] == "raw wheat text"  # UNPROC text, control characters dropped
    _write(tmp_path / "reuters21578", "reut2-000.sgm", SGML)
    train = load_split(get_task("reuters"), DataOptions(tmp_path), "train")
    # gold occurs only in train, so it is not a label; "grain" and "wheat" occur in both splits
    assert train.label_names == ("grain", "wheat") and train.multilabel


def test_sample_task_ships_with_package():
    spec = get_task("sample")
    train = load_split(spec, DataOptions(None), "train")
    dev = load_split(spec, DataOptions(None), "dev")
    assert len(train) == 256 and len(dev) == 64
    assert set(train.labels) == {0, 1}


def test_unknown_task_lists_known():
    with pytest.raises(UsageError, match="known tasks: sample, sst2"):
        get_task("sst3")


@pytest.mark.parametrize("name, rel, text, needle", [
    ("sst2", "sst2/train.tsv", "sentence\tlabel\ngood \t5\n", "label '5' is not in the label set"),
    ("sst2", "sst2/train.tsv", "", "is empty"),
    ("sst2", "sst2/train.tsv", "sentence\tlabel\na\tb\tc\n", "expected 2 columns"),
    ("ag_news", "ag_news/train.csv", '"9","T","D"\n', "label '9' is not in the label set"),
    ("jsonl", "train.jsonl", '{"text": "a", "label": 1}\n{not json}\n', "not valid JSON"),
    ("jsonl", "train.jsonl", '{"text": "a"}\n', "no field 'label'"),
])
def test_malformed_files_are_data_errors(tmp_path, name, rel, text, needle):
    folder = tmp_path / rel.rsplit("/", 1)[0] if "/" in rel else tmp_path
    _write(folder, rel.rsplit("/", 1)[-1], text)
    with pytest.raises(DataError, match=needle):
        load_split(get_task(name), DataOptions(tmp_path), "train")


def test_wrong_encoding_is_data_error(tmp_path):
    _write(tmp_path / "sst2", "train.tsv", "sentence\tlabel\ncaf\xe9 \t1\n", encoding="latin-1")
    with pytest.raises(DataError, match="not valid utf-8"):
        load_split(get_task("sst2"), DataOptions(tmp_path), "train")


def test_hub_fallback_reports_clear_error_offline(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="could not load 'nyu-mll/glue:sst2'.*--data-dir"):
        load_split(get_task("sst2"), DataOptions(None), "train")


def test_hub_fallback_reads_a_hub_style_dataset(monkeypatch, tmp_path):
    """The hub path with a real ``datasets`` object built from local files."""
    import datasets

    (tmp_path / "v.csv").write_text("sentence,label,idx\nnice,1,0\nawful,0,1\n")
    calls = []
    real_load = datasets.load_dataset

    def local(name, config=None, split=None):
        calls.append((name, config, split))
        return real_load("csv", data_files=str(tmp_path / "v.csv"), split="train")

    monkeypatch.setattr(datasets, "load_dataset", local)
    ds = load_split(get_task("sst2"), DataOptions(None), "dev")
    assert calls == [("nyu-mll/glue", "sst2", "validation")]
    assert ds.texts == ["nice", "awful"] and ds.labels == [1, 0]


def _hub_from_csv(monkeypatch, tmp_path, text: str):
    import datasets

    (tmp_path / "v.csv").write_text(text)
    real_load = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None: real_load(
        "csv", data_files=str(tmp_path / "v.csv"), split="train"))


def test_mrpc_hub_columns_differ_from_its_tsv_header(monkeypatch, tmp_path):
    # nyu-mll/glue:mrpc has sentence1/sentence2/label where the GLUE TSV has #1 String/#2 String/Quality
    _hub_from_csv(monkeypatch, tmp_path,
                  "sentence1,sentence2,label,idx\nA cat.,A feline.,1,0\nHi.,Bye.,0,1\n")
    ds = load_split(get_task("mrpc"), DataOptions(None), "dev")
    assert ds.texts == ["A cat.", "Hi."] and ds.pairs == ["A feline.", "Bye."] and ds.labels == [1, 0]


def test_hub_dataset_without_the_expected_column_is_one_clear_error(monkeypatch, tmp_path):
    _hub_from_csv(monkeypatch, tmp_path, "text,label\nnice,1\n")
    with pytest.raises(DataError, match=r"has no column 'sentence' \(its columns: text, label\).*--data-dir"):
        load_split(get_task("sst2"), DataOptions(None), "train")


# ---- a few real rows from ../shared/data -------------------------------------------------------

REAL = {  # task -> (train size, eval size) as published / documented in shared/data/README.md
    "sst2": (67349, 872), "mrpc": (3668, 408), "rte": (2490, 277), "ag_news": (10001, 7600),
    "movie_reviews": (1600, 400), "reuters": (7770, 3019),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_task_loads_real_data(shared_data, name):
    spec = get_task(name)
    opts = DataOptions(shared_data)
    train = load_split(spec, opts, spec.train_split)
    ev = load_split(spec, opts, spec.eval_split)
    assert (len(train), len(ev)) == REAL[name]
    assert all(train.texts[:20]) and len(set(map(str, train.labels))) > 1
    # --train-limit/--eval-limit take the first N: those must not be a single class
    assert len(set(map(str, train.labels[:200]))) > 1 and len(set(map(str, ev.labels[:200]))) > 1


def test_reuters_real_label_set(shared_data):
    train = load_split(get_task("reuters"), DataOptions(shared_data), "train")
    assert len(train.label_names) == 90 and train.multilabel
    assert "earn" in train.label_names and "acq" in train.label_names
    earn = train.label_names.index("earn")
    assert sum(earn in y for y in train.labels) == 2877  # count from the data README


def test_qnli_real_dev_and_missing_train(shared_data):
    spec = get_task("qnli")
    ev = load_split(spec, DataOptions(shared_data), "dev")
    assert len(ev) == 5463 and sum(ev.labels) == 2761  # not_entailment = 1
    with pytest.raises(DataError, match="no train file"):
        load_split(spec, DataOptions(shared_data), "train")


def test_sst2_real_label_counts(shared_data):
    ev = load_split(get_task("sst2"), DataOptions(shared_data), "dev")
    assert sum(ev.labels) == 444  # positives in GLUE SST-2 dev


def test_ag_news_test_text_matches_what_training_reads(tmp_path):
    folder = tmp_path / "ag_news"
    folder.mkdir()
    (folder / "test.csv").write_text('"3","Fears for pension","Unions say they are disappointed."\n')
    (folder / "train_subset_10k_alps.tsv").write_text("Stocks fell on Monday.\tBusiness\n")
    opts = DataOptions(tmp_path)
    # training reads the description-only subset: the test rows are descriptions only too
    assert load_split(get_task("ag_news"), opts, "train").texts == ["Stocks fell on Monday."]
    assert load_split(get_task("ag_news"), opts, "dev").texts == ["Unions say they are disappointed."]
    (folder / "train.csv").write_text('"1","Title here","Body here."\n')
    assert load_split(get_task("ag_news"), opts, "train").texts == ["Title here Body here."]
    with_title = load_split(get_task("ag_news"), opts, "dev").texts
    assert with_title == ["Fears for pension Unions say they are disappointed."]


def _generic(tmp_path, task, train, evals):
    _write(tmp_path, f"train.{task}", train)
    for name, text in evals.items():
        _write(tmp_path, name, text)
    return lambda split: load_split(get_task(task), DataOptions(tmp_path), split)


@pytest.mark.parametrize("record, needle", [
    ('{"text": null, "label": 1}', "train.jsonl:4: field 'text' is null"),
    ('{"text": "x", "label": null}', "train.jsonl:4: field 'label' is null"),
    ('{"text": ["a", "b"], "label": 1}', "train.jsonl:4: field 'text' is a JSON array"),
])
def test_jsonl_null_or_nested_field_is_refused_naming_the_file_line(tmp_path, record, needle):
    load = _generic(tmp_path, "jsonl", '{"text": "a", "label": 0}\n\n{"text": "b", "label": 1}\n'
                    f"{record}\n", {"dev.jsonl": '{"text": "c", "label": 1}\n'})
    with pytest.raises(DataError, match=needle):
        load("train")


@pytest.mark.parametrize("task, train", [
    ("csv", "text,label\ngood,pos\nfine,pos\n"),
    ("jsonl", '{"text": "good", "label": "pos"}\n{"text": "fine", "label": "pos"}\n'),
])
def test_a_train_file_with_a_single_label_is_refused_naming_it(tmp_path, task, train):
    load = _generic(tmp_path, task, train, {f"dev.{task}": train})
    for split in ("train", "dev"):
        with pytest.raises(DataError, match=f"train.{task}: every row has the label 'pos'; a "
                                            "classifier needs at least two labels"):
            load(split)


def test_jsonl_with_a_utf8_bom_reads_like_csv_with_one(tmp_path):
    rows = '{"text": "hi", "label": 1}\n{"text": "yo", "label": 0}\n'
    _write(tmp_path / "j", "train.jsonl", rows, encoding="utf-8-sig")
    _write(tmp_path / "j", "dev.jsonl", rows, encoding="utf-8-sig")
    ds = load_split(get_task("jsonl"), DataOptions(tmp_path / "j"), "dev")
    assert ds.texts == ["hi", "yo"] and [ds.label_names[y] for y in ds.labels] == ["1", "0"]


@pytest.mark.parametrize("task, train, dev, line", [
    # header = line 1; a blank line and a quoted field over two lines still count as file lines
    ("csv", "text,label\na,x\nb,y\n", 'text,label\n\n"two\nlines",x\nbad,z\n', 5),
    ("csv", "text,label\na,x\nb,y\n", "text,label\nok,x\nbad,z\n", 3),
    ("jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n',
     '\n{"text": "ok", "label": "x"}\n\n{"text": "bad", "label": "z"}\n', 4),
])
def test_generic_errors_name_the_file_line_not_the_row(tmp_path, task, train, dev, line):
    load = _generic(tmp_path, task, train, {f"dev.{task}": dev})
    with pytest.raises(DataError, match=rf"dev\.{task}:{line}: label 'z' is not in the label set"):
        load("dev")


def test_tsv_errors_name_the_file_line(tmp_path):
    _write(tmp_path / "sst2", "train.tsv", "sentence\tlabel\n\ngood \t1\nbad \t7\n")
    with pytest.raises(DataError, match=r"train\.tsv:4: label '7'"):
        load_split(get_task("sst2"), DataOptions(tmp_path), "train")
    _write(tmp_path / "sst2", "train.tsv", "sentence\tlabel\ngood \t1\n\nbad\t1\textra\n")
    with pytest.raises(DataError, match=r"train\.tsv:4: expected 2 columns"):
        load_split(get_task("sst2"), DataOptions(tmp_path), "train")


@pytest.mark.parametrize("task, train, test", [
    ("csv", "text,label\na,x\nb,y\n", "text,label\nc,y\n"),
    ("jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n', '{"text": "c", "label": "y"}\n'),
])
def test_generic_tasks_evaluate_on_test_when_there_is_no_dev(tmp_path, task, train, test):
    load = _generic(tmp_path, task, train, {f"test.{task}": test})
    ds = load("dev")
    assert ds.texts == ["c"] and ds.label_names[ds.labels[0]] == "y"
    (tmp_path / f"test.{task}").unlink()
    with pytest.raises(DataError, match=f"expected dev.{task} or test.{task}"):
        load("dev")
