"""ReQA: candidate sentences and targets, P@N/MRR, BM25, the in-batch softmax, mining pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compress.retrieval.bm25 import bm25_order
from compress.retrieval.dual_encoder import in_batch_softmax_loss, mean_pool
from compress.tasks.qa import QADataset, QAExample
from compress.tasks.ranking import first_gold_ranks, retrieval_metrics
from compress.tasks.retrieval import build_reqa

C1 = "Paris is the capital of France. The Eiffel Tower is in Paris. It was built in 1889."
C2 = "Berlin is in Germany. It is the capital. Paris is the capital of France."


@pytest.fixture(scope="module")
def reqa(shared_data):  # Punkt comes from ../shared/data/nltk_data
    ex = [QAExample("q1", "A", C1, "When was the tower built?", ("1889",), (C1.index("1889"),)),
          QAExample("q2", "A", C1, "What is the capital of France?", ("Paris", "Paris"), (0, 0)),
          QAExample("q3", "B", C2, "Where is Berlin?", ("Germany",), (C2.index("Germany"),))]
    return build_reqa(QADataset(ex, ("A", "B")))


def test_candidates_are_distinct_sentences_and_targets_hold_the_answer(reqa):
    assert reqa.sentences == ["Paris is the capital of France.", "The Eiffel Tower is in Paris.",
                              "It was built in 1889.", "Berlin is in Germany.", "It is the capital."]
    assert reqa.gold == [(2,), (0,), (3,)]
    assert reqa.sentence_context == [0, 0, 0, 1, 1]


def test_metrics_hand_computed():
    order = np.array([[3, 1, 2], [0, 1, 2], [1, 2, 0], [2, 1, 0]])
    gold = [(1,), (0,), (0, 2), (5,)]  # ranks 2, 1, 2, none
    assert first_gold_ranks(order, gold).tolist() == [2, 1, 2, math.inf]
    m = retrieval_metrics(order, gold, ks=(1, 2))
    assert m["p@1"] == pytest.approx(1 / 4) and m["p@2"] == pytest.approx(3 / 4)
    assert m["mrr"] == pytest.approx((1 / 2 + 1 + 1 / 2 + 0) / 4)


def test_bm25_ranks_the_lexical_match_first(reqa):
    order = bm25_order(reqa.questions, reqa.sentences)
    assert order.shape == (3, 5)
    assert order[0, 0] == 2 and order[2, 0] == 3  # 'built', 'Berlin'


def test_in_batch_softmax_hand_computed():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    s = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    scale = 2.0
    # row 0 logits [2, 1.2] target 0; row 1 logits [0, 1.6] target 1
    l0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(1.2)))
    l1 = -math.log(math.exp(1.6) / (1 + math.exp(1.6)))
    assert float(in_batch_softmax_loss(q, s, scale)) == pytest.approx((l0 + l1) / 2, rel=1e-5)
    w = torch.tensor([1.0, 0.25])
    assert float(in_batch_softmax_loss(q, s, scale, w)) == pytest.approx((l0 + 0.25 * l1) / 1.25, rel=1e-5)
    # a sentence marked 'not a negative' drops out of the row's softmax: loss 0 for a 2-row batch
    nn_mask = torch.tensor([[False, True], [True, False]])
    assert float(in_batch_softmax_loss(q, s, scale, None, nn_mask)) == pytest.approx(0.0, abs=1e-6)


def test_mean_pool_ignores_padding():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    m = torch.tensor([[1, 1, 0]])
    assert mean_pool(h, m).tolist() == [[2.0, 3.0]]


def test_cross_encoder_examples_one_negative_per_positive_cycling_sources(reqa):
    from compress.recipes.reqa_mining import cross_encoder_examples

    bm25 = bm25_order(reqa.questions, reqa.sentences)
    ds, sources = cross_encoder_examples(reqa, bm25, seed=0)
    assert ds.labels.count(1) == ds.labels.count(0) == 3  # 1:1
    assert sources == ["gold", "bm25", "gold", "same_document", "gold", "random"]
    gold_text = {reqa.questions[i]: {reqa.sentences[j] for j in g} for i, g in enumerate(reqa.gold)}
    for q, s, y, src in zip(ds.texts, ds.pairs, ds.labels, sources):
        assert (s in gold_text[q]) == (y == 1)
        if src == "same_document":  # question 2 (q2) lives in context 0
            assert reqa.sentence_context[reqa.sentences.index(s)] == 0


def test_mine_pairs_keeps_p_at_least_threshold_weighted_p_squared(reqa, monkeypatch):
    from compress.recipes import reqa_mining as mining

    probs = {"It was built in 1889.": 0.9, "The Eiffel Tower is in Paris.": 0.5,
             "It is the capital.": 0.49}
    monkeypatch.setattr(mining, "relevance_probabilities",
                        lambda m, t, qs, ss, ml, bs: np.array([probs.get(s, 0.1) for s in ss]))
    bm25 = np.array([[2, 1, 4, 0, 3], [0, 1, 2, 4, 3], [3, 4, 0, 1, 2]])
    mined = mining.mine_pairs(None, None, reqa, bm25, top_k=3, threshold=0.5, max_length=32, batch_size=8)
    # q0: gold 2 excluded; 1 (p .5) kept, 4 (p .49) dropped. q1: gold 0 excluded; 1 kept, 2 kept.
    # q2: gold 3 excluded; 4 dropped, 0 (p .1) dropped.
    assert sorted(mined) == sorted([(0, 1, 0.25), (1, 1, 0.25), (1, 2, pytest.approx(0.81))])


def test_mining_distillation_end_to_end_on_a_tiny_model(tiny_bert, tmp_path, nltk_data):
    import json

    from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill
    from tests.conftest import write_tiny_squad

    write_tiny_squad(tmp_path)
    cfg = ReQAMiningConfig(model=str(tiny_bert), teacher=str(tiny_bert), data_dir=str(tmp_path),
                           split_by_article="2/1", max_steps=2, batch_size=4, max_length=32,
                           mining_threshold=0.0, out=str(tmp_path / "run"))
    run = run_reqa_mining_distill(cfg)
    s = json.loads((run / "summary.json").read_text())
    # 4 train questions (2 articles) x 3 sentences: every non-gold candidate is mined at threshold 0
    assert s["mining"]["gold_pairs"] == 4 and s["mining"]["mined_pairs"] == 8
    assert s["train_pairs"] == 12 and s["mining"]["teacher_pairs"]["gold"] == 4
    assert s["mining"]["mining_candidates"] == 8
    # eval split: 2 questions -> 2 gold + 2 negative pairs, so accuracy is a multiple of 1/4
    assert s["mining"]["teacher_dev_accuracy"] * 4 == round(s["mining"]["teacher_dev_accuracy"] * 4)
    assert (run / "teacher" / "compress.json").is_file()
    rows = [json.loads(x) for x in (run / "mined_pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(0 <= r["weight"] <= 1 for r in rows)
    # the saved teacher is reused as is by a second run
    cfg2 = replace_cfg(cfg, teacher=str(run / "teacher"), out=str(tmp_path / "run2"))
    s2 = json.loads((run_reqa_mining_distill(cfg2) / "summary.json").read_text())
    assert s2["mining"]["teacher_trained_here"] is False


def test_unlabeled_questions_get_mined_pairs_only(tiny_bert, tmp_path, nltk_data):
    import json

    from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill
    from tests.conftest import write_tiny_squad

    write_tiny_squad(tmp_path)
    cfg = ReQAMiningConfig(model=str(tiny_bert), teacher=str(tiny_bert), data_dir=str(tmp_path),
                           split_by_article="2/1", max_steps=1, batch_size=4, max_length=32,
                           teacher_epochs=1, mining_threshold=0.0, train_limit=2, unlabeled_questions=2,
                           out=str(tmp_path / "run"))
    run = run_reqa_mining_distill(cfg)
    s = json.loads((run / "summary.json").read_text())
    m = s["mining"]
    # 2 labeled questions: their gold (1 each) + 2 non-gold candidates each; 2 unlabeled questions:
    # all 3 candidates each, their gold sentence included, since it is hidden
    assert (m["labeled_questions"], m["unlabeled_questions"]) == (2, 2)
    assert m["gold_pairs"] == 2 and m["teacher_pairs"]["gold"] == 2
    assert m["mined_pairs"] == 2 * 2 + 2 * 3 and m["mined_pairs_unlabeled"] == 6
    assert s["train_questions"] == 4 and s["train_pairs"] == 12
    rows = [json.loads(x) for x in (run / "mined_pairs.jsonl").read_text().splitlines()]
    assert sum(not r["labeled_question"] for r in rows) == 6


def test_unlabeled_questions_need_a_train_limit():
    from compress.core.errors import UsageError
    from compress.recipes.reqa_mining import ReQAMiningConfig

    with pytest.raises(UsageError, match="add --train-limit"):
        ReQAMiningConfig(unlabeled_questions=10)


def replace_cfg(cfg, **kw):
    from dataclasses import replace

    return replace(cfg, **kw)


def test_cross_encoder_trains_with_its_own_lr_and_epochs(reqa, tiny_bert, monkeypatch):
    from compress.recipes import reqa_mining as mining

    seen = {}

    def fake_train(model, tok, data, cfg):
        seen.update(lr=cfg.lr, epochs=cfg.epochs, max_steps=cfg.max_steps)
        return {"steps": 0}

    monkeypatch.setattr(mining, "train", fake_train)
    cfg = mining.ReQAMiningConfig(teacher=str(tiny_bert), lr=2e-5, teacher_lr=1e-4,
                                  teacher_epochs=3, max_steps=5, max_length=32)
    _, _, info = mining._teacher(cfg, reqa, bm25_order(reqa.questions, reqa.sentences))
    # the teacher's own epochs and lr; the student's --max-steps does not cut it short
    assert seen == {"lr": 1e-4, "epochs": 3, "max_steps": None}
    assert info["teacher_lr"] == 1e-4


def test_teacher_lr_must_be_positive():
    from compress.core.errors import UsageError
    from compress.recipes.reqa_mining import ReQAMiningConfig

    with pytest.raises(UsageError, match="--teacher-lr must be in"):
        ReQAMiningConfig(teacher_lr=0.0)
