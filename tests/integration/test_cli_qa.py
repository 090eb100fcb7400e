"""The real CLI on squad and reqa with a tiny random BERT: round trips and bad input."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

CTX = "Paris is the capital of France. It has the Eiffel Tower. The Seine flows through it."


def _write(tmp_path, obj, name="dev-v1.1.json"):
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(obj))
    return d


def _qa(qid, text, start):
    return {"id": qid, "question": "What?", "answers": [{"text": text, "answer_start": start}]}


def _articles(n=3, bad=()):
    arts = []
    for i in range(n):
        qas = [_qa(f"a{i}-1", "Paris", 0), _qa(f"a{i}-2", "the Eiffel Tower", CTX.index("the Eiffel"))]
        for qid in bad:
            if qid.startswith(f"a{i}-"):
                qas.append(_qa(qid, "France", 5))
        arts.append({"title": f"T{i}", "paragraphs": [{"context": CTX, "qas": qas}]})
    return {"version": "1.1", "data": arts}


def _tiny_args(tiny_bert, out):
    return ["--model", str(tiny_bert), "--max-steps", "2", "--batch-size", "4", "--max-length", "48",
            "--out", str(out)]


@pytest.mark.parametrize("obj, needle", [
    (_articles(3, bad=("a1-bad",)), "question a1-bad: answer_start 5 does not match"),
    ({"data": [{"title": "T", "paragraphs": [{"qas": []}]}]}, "has no 'context' field"),
    ({"version": "1.1", "data": []}, "'data' list is empty"),
])
def test_bad_squad_file_one_line_exit_1_no_run_folder(tiny_bert, tmp_path, obj, needle):
    data = _write(tmp_path, obj)
    out = tmp_path / "run"
    r = run_cli("finetune", "--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1",
                *_tiny_args(tiny_bert, out), env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists() and not (tmp_path / ".tmp-run").exists()
    assert not (tmp_path / "a").exists()


def test_skip_bad_examples_then_eval_reproduces_f1(tiny_bert, tmp_path):
    data = _write(tmp_path, _articles(3, bad=("a0-bad", "a2-bad")))
    out = tmp_path / "run"
    r = run_cli("finetune", "--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1",
                "--skip-bad-examples", *_tiny_args(tiny_bert, out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["skipped_bad_examples"] == 2
    assert s["train_articles"] == 2 and s["eval_articles"] == 1 and s["eval_questions"] == 2
    meta = json.loads((out / "model" / "compress.json").read_text())
    assert meta["task"] == "squad" and meta["doc_stride"] == 16
    assert set(json.loads((out / "predictions.json").read_text())) == {"a2-1", "a2-2"}
    r2 = run_cli("eval", "--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1",
                 "--skip-bad-examples", "--model", str(out), "--out", str(tmp_path / "ev"))
    assert r2.returncode == 0, r2.stderr
    again = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert again["eval"]["f1"] == pytest.approx(s["eval"]["f1"])
    assert again["eval"]["exact_match"] == pytest.approx(s["eval"]["exact_match"])
    # a shorter --max-length than training's (48, stride 16) takes a stride that fits it (20 // 3);
    # the trained stride would leave a window no new context and the tokenizer would refuse it
    r3 = run_cli("eval", "--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1",
                 "--skip-bad-examples", "--model", str(out), "--max-length", "20",
                 "--out", str(tmp_path / "e20"))
    assert r3.returncode == 0, r3.stderr
    short = json.loads((tmp_path / "e20" / "summary.json").read_text())["eval"]
    assert short["windows"] > s["eval"]["windows"]
    # EM/F1 in percent as the SQuAD script gives them; the score a fraction like every task's
    assert s["eval"]["score"] == pytest.approx(s["eval"]["f1"] / 100) and 0 <= s["eval"]["score"] <= 1


@pytest.mark.parametrize("args, code, needle", [
    (["--objective", "nope"], 2, "unknown objective 'nope'"),
    (["--split-by-article", "38"], 2, "--split-by-article"),
    (["--doc-stride", "40"], 2, "--doc-stride 40 must be below half"),
    (["--pfa-alignment", "l2"], 2, "unknown pfa alignment 'l2'"),
])
def test_bad_qa_flags(tiny_bert, tmp_path, args, code, needle):
    data = _write(tmp_path, _articles(3))
    out = tmp_path / "run"
    r = run_cli("finetune", "--task", "squad", "--data-dir", str(data), *_tiny_args(tiny_bert, out), *args)
    assert r.returncode == code, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_eval_refuses_a_model_not_trained_on_squad(tiny_bert, tmp_path):
    data = _write(tmp_path, _articles(3))
    r = run_cli("eval", "--task", "squad", "--data-dir", str(data), "--model", str(tiny_bert),
                "--out", str(tmp_path / "ev"))
    assert r.returncode == 1 and "not fine-tuned on squad" in r.stderr
    assert not (tmp_path / "ev").exists()


def test_squad_on_real_data_split_by_article(tiny_bert, tmp_path, shared_data):
    out = tmp_path / "run"
    r = run_cli("finetune", "--task", "squad", "--data-dir", str(shared_data), "--split-by-article", "38/10",
                "--train-limit", "16", "--eval-limit", "8", *_tiny_args(tiny_bert, out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["train_questions"] == 16 and s["eval_questions"] == 8 and s["steps"] == 2
    assert 0.0 <= s["eval"]["exact_match"] <= s["eval"]["f1"] <= 100.0


def test_reqa_finetune_then_eval_and_bm25(tiny_bert, tmp_path, shared_data):
    data = _write(tmp_path, _articles(3))
    out = tmp_path / "run"
    r = run_cli("finetune", "--task", "reqa", "--data-dir", str(data), "--split-by-article", "2/1",
                *_tiny_args(tiny_bert, out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["train_pairs"] == 4 and s["eval_questions"] == 2 and s["eval_candidates"] == 3
    for m in (s["eval"], s["bm25"]):
        assert 0 <= m["p@1"] <= m["p@5"] <= m["p@10"] <= 1 and m["p@5"] == 1.0  # only 3 candidates
    assert json.loads((out / "model" / "compress.json").read_text())["task"] == "reqa"
    r2 = run_cli("eval", "--task", "reqa", "--data-dir", str(data), "--split-by-article", "2/1",
                 "--model", str(out), "--out", str(tmp_path / "ev"))
    assert r2.returncode == 0, r2.stderr
    again = json.loads((tmp_path / "ev" / "summary.json").read_text())["eval"]
    assert again["mrr"] == pytest.approx(s["eval"]["mrr"])
    r3 = run_cli("eval", "--task", "reqa", "--data-dir", str(data), "--split-by-article", "2/1",
                 "--model", "bm25", "--out", str(tmp_path / "bm"))
    assert r3.returncode == 0, r3.stderr
    assert json.loads((tmp_path / "bm" / "summary.json").read_text())["eval"]["mrr"] == pytest.approx(
        s["bm25"]["mrr"])
