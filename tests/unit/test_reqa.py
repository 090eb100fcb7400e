"""ReQA: candidate sentences and targets, P@N/MRR, BM25, the in-batch softmax, mining pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compress.retrieval.bm25 import bm25_order
from compress.retrieval.dual_encoder import in_batch_softmax_loss, mean_pool
from compress.retrieval.metrics import first_gold_ranks, retrieval_metrics
from compress.tasks.qa import QADataset, QAExample
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
