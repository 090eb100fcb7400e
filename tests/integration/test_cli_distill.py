"""The real ``compress distill`` CLI on a tiny teacher: each student end to end, augmentation, and
bad input (one line, exit code, no run folder)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import (
    kill_at_first_checkpoint,
    run_cli,
    skip_without_tagger_data,
    write_tiny_reuters,
    write_tiny_squad,
)


@pytest.fixture(scope="module")
def teacher_run(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "run"
    r = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "2", "--batch-size", "8",
                "--max-length", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("student, extra", [
    ("bilstm", ["--student-options", "hidden_size=8,mlp_hidden=8", "--augment", "1"]),
    ("kimcnn", ["--student-options", "num_filters=4", "--student-embeddings", "random", "--kd-loss", "mse"]),
    ("logreg", ["--no-kd"]),
])
def test_distill_each_student_end_to_end(teacher_run, tmp_path, student, extra):
    if "--augment" in extra:
        skip_without_tagger_data()
    out = tmp_path / "run"
    r = run_cli("distill", "--student", student, "--teacher", str(teacher_run), "--epochs", "2",
                "--max-length", "32", "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    for f in ("config.yaml", "env.json", "metrics.jsonl", "summary.json", "report.txt",
              "student/model.safetensors", "student/student.json", "teacher_logits/eval.safetensors"):
        assert (out / f).exists(), f
    assert not (out / "checkpoint").exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["student"] == student and s["eval_examples"] == 64 and s["train_examples"] == 256
    assert s["mode"] == ("no-kd" if "--no-kd" in extra else "kd")
    assert s["kd_lambda"] == 4.0 and s["metric"] == "accuracy"
    assert s["kd_loss"] == {"bilstm": "kl", "kimcnn": "mse", "logreg": None}[student]
    # per-student defaults from the registry: only the linear model is L2-penalised and decayed
    expected = (5e-5, "linear") if student == "logreg" else (0.0, "constant")
    assert (s["weight_decay"], s["lr_schedule"]) == expected
    assert s["augmented_examples"] == (256 if "--augment" in extra else 0)
    fl = s["flops_per_example"]
    assert fl["teacher"] > 0 and fl["student"] > 0  # the 32-wide test teacher is cheaper than logreg
    assert fl["teacher_over_student"] == pytest.approx(fl["teacher"] / fl["student"], abs=0.01)
    assert s["params"]["student"] > 0
    fid = s["teacher_agreement"]
    assert 0.0 <= fid["agreement"] <= 1.0 and fid["teacher_right"] + fid["teacher_wrong"] == 64
    assert "student-teacher agreement on 64 eval examples" in r.stdout
    epochs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert "teacher" in r.stdout and student in r.stdout and "FLOPs/example" in r.stdout

    # the saved student reproduces the reported dev metric
    from transformers import AutoTokenizer

    from compress.distill.train import predict_student
    from compress.tasks import DataOptions, get_task
    from students import load_student

    model, info = load_student(out)
    tok = AutoTokenizer.from_pretrained(out / "student")
    dev = get_task("sample").load(DataOptions(), "dev")
    ids = tok(dev.texts, truncation=True, max_length=info["max_length"])["input_ids"]
    acc = float((predict_student(model, ids, tok.pad_token_id).argmax(1) == np.array(dev.labels)).mean())
    assert acc == pytest.approx(s["student_eval"]["accuracy"])


def test_logreg_idf_is_fitted_on_the_augmented_transfer_set(teacher_run, tmp_path):
    """n-grams that occur only in augmented copies get an idf weight (else the student could never
    learn from them); the same originals under --no-kd give the smaller, originals-only vocabulary."""
    skip_without_tagger_data()
    idf = {}
    for name, extra in (("kd", ["--augment", "2"]), ("no-kd", ["--no-kd"])):
        out = tmp_path / name
        r = run_cli("distill", "--student", "logreg", "--teacher", str(teacher_run), "--epochs", "1",
                    "--max-length", "32", "--out", str(out), *extra)
        assert r.returncode == 0, r.stderr
        idf[name] = load_file(out / "student" / "model.safetensors")["idf"]
    seen_kd, seen_plain = idf["kd"] > 0, idf["no-kd"] > 0
    assert bool((seen_plain & ~seen_kd).any()) is False  # every original n-gram is still a feature
    assert int((seen_kd & ~seen_plain).sum()) > 0  # and augmentation added new ones
    # the mask token of the masked copies is a feature (as the teacher sees it), not a deletion
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(teacher_run / "model")
    assert idf["kd"][tok.mask_token_id] > 0 and idf["no-kd"][tok.mask_token_id] == 0
    assert idf["kd"][tok.cls_token_id] == 0 and idf["kd"][tok.sep_token_id] == 0  # these stay out


def test_multilabel_distill_end_to_end_with_its_own_defaults(tiny_bert, tmp_path):
    """A multi-label teacher and the linear student: micro-F1, lambda 1, and the logreg
    student's multi-label lr and per-label L2 (2e-6 / 3 labels) recorded in summary.json."""
    data = write_tiny_reuters(tmp_path / "data")
    teacher = tmp_path / "teacher"
    r = run_cli("finetune", "--model", str(tiny_bert), "--task", "reuters", "--data-dir", str(data),
                "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--out", str(teacher))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    r = run_cli("distill", "--student", "logreg", "--teacher", str(teacher), "--task", "reuters",
                "--data-dir", str(data), "--epochs", "1", "--max-length", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["metric"] == "micro_f1" and s["kd_lambda"] == 1.0 and s["kd_loss"] == "bernoulli_kl"
    assert s["train_examples"] == 24 and s["eval_examples"] == 8
    assert s["lr"] == 1.0 and s["weight_decay"] == pytest.approx(2e-6 / 3)
    assert 0.0 <= s["student_eval"]["score"] <= 1.0
    # The output bias starts at the label prior: with a step too small to move it, it is still
    # the log-odds of (count + 0.5) / (24 + 1) for corn 8, grain 16, wheat 8 of 24 documents.
    out = tmp_path / "still"
    r = run_cli("distill", "--student", "logreg", "--no-kd", "--lr", "1e-12", "--teacher", str(teacher),
                "--task", "reuters", "--data-dir", str(data), "--epochs", "1", "--max-length", "32",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    p = np.array([8.5, 16.5, 8.5]) / 25
    bias = load_file(out / "student" / "model.safetensors")["linear.bias"].numpy()
    np.testing.assert_allclose(bias, np.log(p / (1 - p)), rtol=1e-5)


def test_val_fraction_holds_out_and_keeps_the_best_epoch(teacher_run, tmp_path):
    out = tmp_path / "run"
    r = run_cli("distill", "--student", "logreg", "--no-kd", "--teacher", str(teacher_run),
                "--epochs", "3", "--max-length", "32", "--val-fraction", "0.25", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    sel = s["model_selection"]
    assert s["train_examples"] == 192 and sel["val_examples"] == 64 and s["eval_examples"] == 64
    epochs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["val_score"] for e in epochs] == sel["val_scores"] and len(sel["val_scores"]) == 3
    assert sel["selected_epoch"] == sel["val_scores"].index(max(sel["val_scores"])) + 1
    # the reported dev score is the selected epoch's, which the per-epoch log also recorded
    assert s["student_eval"]["score"] == pytest.approx(epochs[sel["selected_epoch"] - 1]["eval"]["score"])
    assert "held-out" in r.stdout


def test_unlabeled_examples_join_the_transfer_set_with_teacher_labels(teacher_run, tmp_path):
    """--unlabeled-examples N: the N training examples after --train-limit are labelled by the
    teacher (their rows of the cached transfer logits are the teacher's logits for exactly those
    texts) and the gold-labelled set stays the first --train-limit examples."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compress.distill.teacher import CACHE_DIR, read_cache
    from compress.recipes.distill import DistillConfig
    from compress.tasks.task_data import load_task_data

    out = tmp_path / "run"
    r = run_cli("distill", "--student", "logreg", "--teacher", str(teacher_run), "--epochs", "1",
                "--max-length", "32", "--train-limit", "100", "--unlabeled-examples", "40",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "100 original + 0 augmented + 40 unlabeled" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["train_examples"], s["augmented_examples"], s["unlabeled_examples"]) == (100, 0, 40)
    _, cached = read_cache(out / CACHE_DIR / "transfer.safetensors")
    assert cached.shape[0] == 140
    texts = load_task_data(DistillConfig(task="sample"))[1]["train"].texts
    tok = AutoTokenizer.from_pretrained(teacher_run / "model")
    model = AutoModelForSequenceClassification.from_pretrained(teacher_run / "model").eval()
    with torch.no_grad():
        enc = tok(texts[100:140], truncation=True, max_length=32, padding=True, return_tensors="pt")
        expected = model(**enc).logits.numpy()
    np.testing.assert_allclose(cached[100:], expected, atol=1e-4)
    # more than the training split holds: all that follow --train-limit (256 - 100)
    out2 = tmp_path / "all"
    r = run_cli("distill", "--student", "logreg", "--teacher", str(teacher_run), "--epochs", "1",
                "--max-length", "32", "--train-limit", "100", "--unlabeled-examples", "1000",
                "--out", str(out2))
    assert r.returncode == 0, r.stderr
    assert json.loads((out2 / "summary.json").read_text())["unlabeled_examples"] == 156


def test_augmentation_operator_flags_reach_the_transfer_set(teacher_run, tmp_path, nltk_data):
    """--p-mask 1 --p-pos 0 --p-ngram 0: every augmented copy is its example with every word masked;
    the cached transfer logits are keyed by exactly those texts."""
    from compress.distill.augment import AugmentConfig, augment_texts, split_words
    from compress.distill.teacher import CACHE_DIR, read_cache, teacher_fingerprint, transfer_key
    from compress.recipes.distill import DistillConfig
    from compress.tasks.task_data import load_task_data

    out = tmp_path / "run"
    r = run_cli("distill", "--student", "logreg", "--teacher", str(teacher_run), "--epochs", "1",
                "--max-length", "32", "--train-limit", "20", "--augment", "2", "--p-mask", "1",
                "--p-pos", "0", "--p-ngram", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    texts = load_task_data(DistillConfig(task="sample"))[1]["train"].texts[:20]
    copies, _ = augment_texts(texts, None, AugmentConfig(copies=2, p_mask=1, p_pos=0, p_ngram=0, seed=42))
    # independently of the augmenter: one [MASK] per word or punctuation mark of the example, each
    # written without the space before it (it stands for the word and its space)
    assert copies == ["[MASK]" * len(split_words(t)) for t in texts for _ in range(2)]
    key, cached = read_cache(out / CACHE_DIR / "transfer.safetensors")
    assert cached.shape[0] == 60
    assert key == transfer_key(teacher_fingerprint(teacher_run / "model"), texts + copies, None, 32)
    assert "p_mask: 1.0" in (out / "config.yaml").read_text().splitlines()


def test_teacher_embeddings_are_copied(teacher_run, tmp_path):
    out = tmp_path / "run"
    r = run_cli("distill", "--student", "kimcnn", "--teacher", str(teacher_run), "--epochs", "1",
                "--lr", "1e-12", "--max-length", "32", "--student-options", "num_filters=4",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file

    student = load_file(str(out / "student" / "model.safetensors"))["embedding.weight"]
    teacher = load_file(str(teacher_run / "model" / "model.safetensors"))
    t = next(v for k, v in teacher.items() if k.endswith("word_embeddings.weight"))
    assert student.shape == t.shape == (30522, 32)
    assert (student - t).abs().max().item() < 1e-6  # lr 1e-12: still the teacher's table


@pytest.fixture(scope="module")
def other_labels(tmp_path_factory):
    d = tmp_path_factory.mktemp("three")
    rows = "\n".join(f"text {i},{'abc'[i % 3]}" for i in range(12))
    (d / "train.csv").write_text("text,label\n" + rows + "\n")
    (d / "dev.csv").write_text("text,label\n" + rows + "\n")
    return d


@pytest.mark.parametrize("args, code, needle", [
    (["--student", "gpt"], 2, "unknown student 'gpt'; known students: bilstm, kimcnn, logreg"),
    (["--temperature", "0"], 2, "--temperature must be in (0, 100.0]"),
    (["--temperature", "-1"], 2, "--temperature"),
    (["--temperature", "1e20"], 2, "--temperature must be in (0, 100.0], got 1e+20"),
    (["--kd-lambda", "-0.5"], 2, "--kd-lambda must be in [0, 10000.0]"),
    (["--kd-lambda", "1e5"], 2, "--kd-lambda must be in [0, 10000.0], got 100000.0"),
    (["--teacher", ""], 2, "--teacher '' is empty"),
    (["--teacher", "  "], 2, "--teacher '  ' is empty"),
    (["--no-kd", "--kd-lambda", "2"], 2, "--kd-lambda 2.0 has no effect with --no-kd"),
    (["--no-kd", "--temperature", "3"], 2, "--temperature 3.0 has no effect with --no-kd"),
    (["--kd-loss", "l2"], 2, "unknown kd loss 'l2'; choose one of: kl, mse"),
    (["--kd-loss", "mse", "--temperature", "2"], 2, "no effect with --kd-loss mse"),
    (["--augment", "2", "--no-kd"], 2, "cannot be combined with --no-kd"),
    (["--student-options", "hidden=3"], 2, "unknown option 'hidden'"),
    (["--student-options", "num_labels=5"], 2, "student option num_labels is set by the run"),
    (["--student-options", "pad_id=3"], 2, "drop pad_id= from --student-options"),
    (["--student", "logreg", "--student-options", "special_ids=0"], 2, "special_ids is set by the run"),
    (["--student-embeddings", "/no/such/vectors.txt"], 2, "--student-embeddings"),
    (["--teacher-cache", "/no/such/run"], 2, "--teacher-cache"),
    (["--val-fraction", "0.5"], 2, "--val-fraction must be in [0, 0.5)"),
    (["--lr-schedule", "cosine"], 2, "unknown lr schedule 'cosine'; choose one of: constant, linear"),
    (["--weight-decay", "-1"], 2, "--weight-decay must be in [0, inf]"),
    (["--unlabeled-examples", "10"], 2, "takes the training examples after the first --train-limit"),
    (["--train-limit", "100", "--unlabeled-examples", "-1"], 2, "--unlabeled-examples must be in [0, inf]"),
    (["--train-limit", "100", "--unlabeled-examples", "10", "--no-kd"], 2, "cannot be combined with --no-kd"),
    (["--p-mask", "0.3"], 2, "--p-mask 0.3 has no effect without augmented copies; add --augment N"),
    (["--augment", "2", "--p-ngram", "1.5"], 2, "--p-ngram must be in [0, 1], got 1.5"),
    (["--augment", "2", "--max-ngram", "0"], 2, "--max-ngram must be in [1, inf], got 0"),
    (["--augment", "2", "--p-mask", "0.6", "--p-pos", "0.6"], 2, "--p-mask 0.6 plus --p-pos 0.6 exceeds 1"),
    (["--augment", "2", "--p-mask", "0", "--p-pos", "0", "--p-ngram", "0", "--p-shuffle", "0"], 2,
     "would only repeat the examples"),
])
def test_bad_input_one_line_no_run_folder(teacher_run, tmp_path, args, code, needle):
    out = tmp_path / "run"
    r = run_cli("distill", "--teacher", str(teacher_run), "--epochs", "1", "--max-length", "32",
                *args, "--out", str(out), env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln.lower()]
    assert len(lines) == 1 and lines[0].startswith("compress distill: error: "), r.stderr
    assert needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_teacher_with_other_label_set_is_refused(teacher_run, other_labels, tmp_path):
    out = tmp_path / "run"
    r = run_cli("distill", "--teacher", str(teacher_run), "--task", "csv", "--data-dir", str(other_labels),
                "--out", str(out), env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln.lower()]
    assert len(lines) == 1 and "was trained for labels ['negative', 'positive']" in lines[0]
    assert "['a', 'b', 'c']" in lines[0]
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_missing_tagger_data_is_one_line(teacher_run, tmp_path):
    empty = tmp_path / "nltk_empty"
    empty.mkdir()
    out = tmp_path / "run"
    r = run_cli("distill", "--teacher", str(teacher_run), "--augment", "2", "--out", str(out),
                env={"NLTK_DATA": str(empty), "HOME": str(tmp_path),
                     "COMPRESS_ARTIFACTS": str(tmp_path / "a")}, isolated=True)  # nltk reads it once
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln.lower()]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "python -m nltk.downloader averaged_perceptron_tagger_eng" in lines[0] and "NLTK_DATA" in lines[0]
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_embed_dim_conflict_is_refused_before_the_teacher_is_fine_tuned(tmp_path):
    out = tmp_path / "run"
    r = run_cli("distill", "--teacher", "minilm", "--student-options", "embed_dim=16", "--out", str(out),
                env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == 2, r.stderr
    assert "compress distill: error: embed_dim=16 differs from the 384-d initial embeddings" in r.stderr
    assert not r.stdout.strip(), r.stdout  # a fine-tuned teacher would have printed its accuracy
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_distill_reqa_dual_encoder_through_the_cli(tiny_bert, tmp_path, nltk_data):
    data = write_tiny_squad(tmp_path)
    out = tmp_path / "run"
    r = run_cli("distill", "--task", "reqa", "--student", "dual-encoder", "--model", str(tiny_bert),
                "--teacher", str(tiny_bert), "--data-dir", str(data), "--split-by-article", "2/1",
                "--max-steps", "2", "--batch-size", "4", "--max-length", "32",
                "--mining-threshold", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    # 4 train questions x 3 sentences: at threshold 0 every non-gold candidate is mined
    assert s["mining"]["gold_pairs"] == 4 and s["mining"]["mined_pairs"] == 8
    assert (out / "mined_pairs.jsonl").is_file() and (out / "teacher" / "compress.json").is_file()


@pytest.mark.parametrize("args, needle", [
    (["--student", "dual-encoder"], "--task reqa"),
    (["--task", "reqa", "--augment", "2"], "--augment"),
    (["--task", "sst2", "--mining-top-k", "3"], "--mining-top-k"),
    (["--task", "reqa", "--student", "bilstm"], "bilstm"),
])
def test_reqa_options_are_checked_before_anything_runs(tmp_path, args, needle):
    out = tmp_path / "run"
    r = run_cli("distill", *args, "--data-dir", str(write_tiny_squad(tmp_path)), "--out", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_sigkill_after_an_epoch_then_resume_equals_uninterrupted(teacher_run, tmp_path):
    args = ["distill", "--student", "kimcnn", "--teacher", str(teacher_run), "--epochs", "3",
            "--max-length", "32", "--student-options", "num_filters=4", "--student-embeddings", "random"]
    ref = tmp_path / "ref"
    r = run_cli(*args, "--out", str(ref))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    kill_at_first_checkpoint([*args, "--out", str(out)], tmp_path / ".tmp-run",
                             marker="checkpoint/student.pt")
    assert not out.exists()
    r = run_cli(*args, "--out", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    assert "epoch 1/3" not in r.stdout and "epoch 2/3" in r.stdout  # continued after epoch 1

    def records(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows if "epoch" in row]

    assert [row["epoch"] for row in records(out)] == [1, 2, 3]  # each epoch logged once
    assert records(out) == records(ref)
    s, s_ref = (json.loads((p / "summary.json").read_text()) for p in (out, ref))
    assert s["student_eval"] == s_ref["student_eval"]
    assert s["steps"] == s_ref["steps"]  # the steps before the kill count too
    w, w_ref = (load_file(str(p / "student" / "model.safetensors")) for p in (out, ref))
    assert w.keys() == w_ref.keys() and all(torch.equal(w[k], w_ref[k]) for k in w)
