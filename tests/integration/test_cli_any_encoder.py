"""finetune -> eval -> distill (every student) and squad on a tiny random encoder of every supported
architecture, each with its family's tokenizer (tests/tiny_encoders.py: WordPiece, byte-level BPE,
SentencePiece-style Unigram).

The commands run through the CLI's entry point, ``compress.cli.main.main`` (argument parsing, the
command, its error handling and exit code), in this process: a subprocess per command costs 15-20 s
of interpreter start and imports on a shared 2-core machine, and this file runs about 50 commands.
Cross-checks use independent paths: ``eval`` reloads the saved model and must reproduce the metric
``finetune`` reported, and every distill run's teacher score (computed by the teacher-logit code,
on length-sorted batches) must equal it too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from compress.cli.main import main
from tests.conftest import write_tiny_squad
from tests.tiny_encoders import ARCHITECTURES

LIMITS = ["--max-length", "32", "--train-limit", "16", "--eval-limit", "16"]
STUDENT_OPTIONS = {"bilstm": ["--student-options", "hidden_size=8,mlp_hidden=8"],
                   "kimcnn": ["--student-options", "num_filters=4"],
                   "logreg": ["--student-options", "bigram_buckets=64"]}


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def finetuned(tiny_encoder, tmp_path_factory):
    """``finetuned(arch)`` -> a finetune run folder of the tiny ``arch`` on the bundled sample (2 steps),
    made once per module and architecture."""
    runs: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in runs:
            out = tmp_path_factory.mktemp(f"ft_{arch}") / "run"
            code = main(["finetune", "--model", str(tiny_encoder(arch)), "--task", "sample",
                         "--max-steps", "2", "--batch-size", "8", *LIMITS, "--out", str(out)])
            assert code == 0
            runs[arch] = out
        return runs[arch]

    return make


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_finetune_eval_and_distill_every_student(arch, finetuned, tiny_encoder, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    run = finetuned(arch)
    ft = _summary(run)
    assert ft["metric"] == "accuracy" and ft["eval"]["n"] == 16 and ft["steps"] == 2
    accuracy = ft["eval"]["accuracy"]
    assert accuracy * 16 == pytest.approx(round(accuracy * 16))  # a count of 16 examples
    assert AutoConfig.from_pretrained(run / "model").model_type == AutoConfig.from_pretrained(
        tiny_encoder(arch)).model_type
    tok = AutoTokenizer.from_pretrained(tiny_encoder(arch))
    assert AutoTokenizer.from_pretrained(run / "model").get_vocab() == tok.get_vocab()

    assert main(["eval", "--model", str(run), "--task", "sample", "--eval-limit", "16",
                 "--out", str(tmp_path / "eval")]) == 0
    assert _summary(tmp_path / "eval")["eval"]["accuracy"] == pytest.approx(accuracy)

    teacher_embeddings = next(v for k, v in load_file(str(run / "model" / "model.safetensors")).items()
                              if k.endswith(("word_embeddings.weight", "tok_embeddings.weight")))
    for student, options in STUDENT_OPTIONS.items():
        out = tmp_path / student
        assert main(["distill", "--student", student, "--teacher", str(run), "--task", "sample",
                     "--epochs", "1", *LIMITS, *options, "--out", str(out)]) == 0, student
        s = _summary(out)
        assert s["teacher_eval"]["accuracy"] == pytest.approx(accuracy), student
        assert 0.0 <= s["student_eval"]["accuracy"] <= 1.0 and s["eval_examples"] == 16
        assert s["train_examples"] == 16 and s["flops_per_example"]["teacher"] > 0
        cfg = s["student_config"]
        assert cfg["pad_id"] == tok.pad_token_id
        info = json.loads((out / "student" / "student.json").read_text())
        assert info["vocab_size"] == len(tok)  # the teacher's tokenizer is the student's
        assert AutoTokenizer.from_pretrained(out / "student").get_vocab() == tok.get_vocab()
        if student == "logreg":
            assert cfg["special_ids"] == sorted({tok.cls_token_id, tok.sep_token_id, tok.pad_token_id,
                                                 tok.unk_token_id})
        else:  # initialised from the teacher's input embeddings (ALBERT's and ELECTRA's are 16-wide)
            emb = load_file(str(out / "student" / "model.safetensors"))["embedding.weight"]
            assert emb.shape == teacher_embeddings.shape


@pytest.mark.parametrize("arch", ["roberta", "deberta-v2"])  # byte-level BPE, SentencePiece Unigram
def test_distill_with_augmentation_masks_with_the_teachers_mask_token(arch, finetuned, tiny_encoder,
                                                                      tmp_path, nltk_data):
    """--p-mask 1: every augmented copy is the teacher's mask token once per word, so the logistic
    regression's idf knows the mask id (a feature) and never the [CLS]/[SEP]-like ids."""
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    assert main(["distill", "--student", "logreg", "--teacher", str(finetuned(arch)), "--task", "sample",
                 "--epochs", "1", *LIMITS, "--augment", "1", "--p-mask", "1", "--p-pos", "0",
                 "--p-ngram", "0", "--out", str(out)]) == 0
    s = _summary(out)
    assert s["augmented_examples"] == 16
    tok = AutoTokenizer.from_pretrained(tiny_encoder(arch))
    idf = load_file(str(out / "student" / "model.safetensors"))["idf"]
    assert idf[tok.mask_token_id] > 0
    assert idf[tok.cls_token_id] == 0 and idf[tok.sep_token_id] == 0 and idf[tok.pad_token_id] == 0


@pytest.mark.parametrize("arch, objective", [("roberta", "plain"), ("modernbert", "plain"),
                                             ("deberta-v2", "plain"), ("xlm-roberta", "plain"),
                                             ("roberta", "hl-aacl")])
def test_squad_finetune_then_eval(arch, objective, tiny_encoder, tmp_path):
    """SQuAD on tokenizers without token_type_ids (RoBERTa, ModernBERT, XLM-R) and with them
    (DeBERTa-v3); hl-aacl keeps its candidate spans in the context through the features'
    context_mask. eval of the saved model reproduces the F1 the fine-tuning run reported."""
    data = write_tiny_squad(tmp_path)
    squad = ["--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1"]
    run = tmp_path / "run"
    assert main(["finetune", *squad, "--model", str(tiny_encoder(arch)), "--max-steps", "2",
                 "--batch-size", "4", "--max-length", "48", "--objective", objective,
                 "--out", str(run)]) == 0
    s = _summary(run)
    assert s["train_questions"] == 4 and s["eval_questions"] == 2 and s["train_windows"] >= 4
    preds = json.loads((run / "predictions.json").read_text())
    assert sorted(preds) == ["2-a", "2-b"]
    assert main(["eval", *squad, "--model", str(run), "--out", str(tmp_path / "eval")]) == 0
    e = _summary(tmp_path / "eval")["eval"]
    assert e["f1"] == pytest.approx(s["eval"]["f1"]) and e["exact_match"] == pytest.approx(
        s["eval"]["exact_match"])
