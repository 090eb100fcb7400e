"""SQuAD JSON loading: validation errors, --skip-bad-examples, split by article."""

from __future__ import annotations

import json

import pytest

from compress.core.errors import DataError, UsageError
from compress.tasks.base import DataOptions
from compress.tasks.qa import load_squad_split, parse_split_by_article, parse_squad

CTX = "Paris is the capital of France. It has the Eiffel Tower."


def _squad(qas, context=CTX, title="A"):
    return {"version": "1.1", "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}]}


def _q(qid, text, start, question="q?"):
    return {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}


def test_valid_file_is_flattened():
    ds = parse_squad(_squad([_q("a1", "Paris", 0), _q("a2", "France", 24)]), "mem")
    assert [e.qid for e in ds.examples] == ["a1", "a2"]
    assert ds.examples[1].answers == ("France",) and ds.examples[1].answer_starts == (24,)
    assert ds.articles == ("A",) and ds.skipped == 0


def test_answer_start_mismatch_names_the_question():
    needle = r"question bad-7: answer_start 3 does not match.*--skip-bad-examples"
    with pytest.raises(DataError, match=needle):
        parse_squad(_squad([_q("ok", "Paris", 0), _q("bad-7", "France", 3)]), "mem")


def test_skip_bad_examples_counts_them():
    ds = parse_squad(_squad([_q("ok", "Paris", 0), _q("b1", "France", 3), _q("b2", "Tower", 0)]), "mem",
                     skip_bad_examples=True)
    assert [e.qid for e in ds.examples] == ["ok"] and ds.skipped == 2


def test_missing_context_and_empty_data():
    obj = {"data": [{"title": "T", "paragraphs": [{"qas": []}]}]}
    with pytest.raises(DataError, match="paragraph 0 has no 'context' field"):
        parse_squad(obj, "mem")
    with pytest.raises(DataError, match="'data' list is empty"):
        parse_squad({"version": "1.1", "data": []}, "mem")
    with pytest.raises(DataError, match="not SQuAD JSON"):
        parse_squad([1, 2], "mem")


def test_parse_split_by_article():
    assert parse_split_by_article("38/10") == (38, 10)
    assert parse_split_by_article(None) is None
    for bad in ("38", "a/b", "0/10", "3/4/5"):
        with pytest.raises(UsageError, match="--split-by-article"):
            parse_split_by_article(bad)


def test_split_by_article_on_a_small_file(tmp_path):
    data = {"data": [
        {"title": f"T{i}",
         "paragraphs": [{"context": CTX, "qas": [_q(f"{i}-{j}", "Paris", 0) for j in range(i + 1)]}]}
        for i in range(4)]}
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(data))
    opts = DataOptions(tmp_path)
    tr = load_squad_split(opts, "train", "2/1")
    ev = load_squad_split(opts, "dev", "2/1")
    assert tr.articles == ("T0", "T1") and len(tr) == 1 + 2
    assert ev.articles == ("T2",) and len(ev) == 3
    with pytest.raises(DataError, match="needs 5 articles"):
        load_squad_split(opts, "train", "3/2")


def test_real_dev_split_38_10_never_shares_an_article(shared_data):
    opts = DataOptions(shared_data)
    tr = load_squad_split(opts, "train", "38/10")
    ev = load_squad_split(opts, "dev", "38/10")
    assert len(tr.articles) == 38 and len(ev.articles) == 10
    assert not set(tr.articles) & set(ev.articles)
    assert not {e.context for e in tr.examples} & {e.context for e in ev.examples}
    assert len(tr) + len(ev) == 10570  # all 48 articles of the dev set, no question dropped
