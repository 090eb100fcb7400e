"""Post-processing picks the best valid span over all windows of an example."""

from __future__ import annotations

import numpy as np
import pytest

from compress.models.loading import load_tokenizer
from compress.qa.features import prepare_eval_features
from compress.qa.postprocess import best_spans, postprocess_predictions
from compress.tasks.qa import QAExample


def test_best_span_in_the_second_window_of_a_context_longer_than_max_length():
    tok = load_tokenizer("minilm")
    filler = " ".join(f"alpha{i} beta." for i in range(40))
    context = "The decoy answer is here. " + filler + " The real answer is Zanzibar city. " + filler
    ex = QAExample("q", "T", context, "Which city?", ("Zanzibar city",), (context.index("Zanzibar"),))
    feats = prepare_eval_features(tok, [ex], max_length=64, doc_stride=16)
    assert len(feats) >= 3
    zs, ze = context.index("Zanzibar city"), context.index("Zanzibar city") + len("Zanzibar city")
    ds_, de_ = context.index("decoy answer"), context.index("decoy answer") + len("decoy answer")
    starts, ends, where = [], [], []
    for w, f in enumerate(feats):
        s = np.zeros(len(f["input_ids"]))
        e = np.zeros(len(f["input_ids"]))
        for t, o in enumerate(f["offset_mapping"]):
            if o is None:
                s[t] = e[t] = 50.0  # question/special tokens score highest but are never valid
                continue
            if o[0] == ds_:
                s[t] = 4.0
            if o[1] == de_:
                e[t] = 4.0
            if o[0] == zs:
                s[t] = 6.0
                where.append(w)
            if o[1] == ze:
                e[t] = 5.0
        starts.append(s)
        ends.append(e)
    assert where and min(where) >= 1, "the answer must lie beyond the first window"
    preds = postprocess_predictions([ex], feats, starts, ends, n_best=20, max_answer_length=30)
    assert preds == {"q": "Zanzibar city"}


def _feat(n, example_index=0):
    offsets = [None] + [(2 * i, 2 * i + 1) for i in range(n - 1)]
    return {"example_index": example_index, "offset_mapping": offsets}


def test_max_answer_length_and_end_before_start_are_rejected():
    offsets = _feat(6)["offset_mapping"]
    s = np.array([0, 9, 0, 0, 0, 1.0])
    e = np.array([0, 0, 0, 0, 9, 2.0])
    # (1, 4) is 4 tokens long: allowed with max 4, not with max 3
    assert best_spans(s, e, offsets, 20, 4)[0][1:] == (0, 7)
    assert best_spans(s, e, offsets, 20, 3)[0][1:] != (0, 7)
    # end before start never wins even with the highest sum
    s2 = np.array([0, 0, 0, 0, 9, 0.0])
    e2 = np.array([0, 9, 0, 0, 0, 0.0])
    assert all(c[1] <= c[2] for c in best_spans(s2, e2, offsets, 20, 30))


def test_n_best_limits_the_candidates_searched():
    offsets = _feat(5)["offset_mapping"]
    s = np.array([0, 3, 2, 1, 0.0])
    e = np.array([0, 0, 0, 5, 0.0])
    assert len(best_spans(s, e, offsets, n_best=1, max_answer_length=30)) <= 1
    assert best_spans(s, e, offsets, n_best=20, max_answer_length=30)[0][0] == pytest.approx(8.0)


def test_example_without_a_valid_span_gets_empty_string():
    ex = QAExample("q", "T", "abc", "?", ("a",), (0,))
    f = {"example_index": 0, "offset_mapping": [None, None]}
    assert postprocess_predictions([ex], [f], [np.zeros(2)], [np.zeros(2)]) == {"q": ""}
