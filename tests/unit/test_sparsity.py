"""The sparsity report on a hand-made model, counts computed by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from compress.measure.sparsity import format_sparsity_table, sparsity_report


def _hand_made():
    # hidden 8, 2 heads of size 4, 1 layer, FFN 16, vocab 10
    cfg = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16)
    m = BertModel(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(1.0)
        layer = m.encoder.layer[0]
        layer.attention.self.query.weight[0:4, :] = 0  # head 0's query rows: 32 zeros
        layer.attention.self.key.weight[0, 0] = 0  # one zero in head 0's key rows
        layer.attention.output.dense.weight[:, 4:8] = 0  # head 1's attention-output columns: 32
        layer.intermediate.dense.weight[:2, :] = 0  # 16 zeros of 128
        m.embeddings.word_embeddings.weight[:5, :4] = 0  # 20 zeros of 80
        m.embeddings.position_embeddings.weight.zero_()  # not a target: must not count
    return m


def test_report_hand_made():
    r = sparsity_report(_hand_made())
    mats = r["matrices"]
    assert set(mats) == {"embeddings.word_embeddings.weight"} | {
        f"encoder.layer.0.{s}.weight" for s in ("attention.self.query", "attention.self.key",
                                                "attention.self.value", "attention.output.dense",
                                                "intermediate.dense", "output.dense")}
    q = mats["encoder.layer.0.attention.self.query.weight"]
    assert (q["zeros"], q["numel"], q["sparsity"], q["kind"], q["layer"]) == (32, 64, 0.5, "query", 0)
    assert mats["encoder.layer.0.attention.self.key.weight"]["zeros"] == 1
    assert mats["encoder.layer.0.attention.output.dense.weight"]["kind"] == "attn_out"
    assert mats["encoder.layer.0.output.dense.weight"]["kind"] == "ffn_out"
    assert mats["encoder.layer.0.intermediate.dense.weight"]["sparsity"] == 16 / 128
    # layer: 4 x 64 + 2 x 128 = 512 weights, 32 + 1 + 32 + 16 = 81 zeros
    assert r["layers"]["0"] == {"numel": 512, "zeros": 81, "sparsity": 81 / 512}
    assert r["encoder"]["sparsity"] == 81 / 512
    assert r["embeddings"] == {"numel": 80, "zeros": 20, "sparsity": 0.25}
    assert r["global"] == {"numel": 592, "zeros": 101, "sparsity": 101 / 592}
    # heads: each owns 4 rows of Q, K, V (32 each) and 4 columns of the output (32): 128 weights
    h = r["heads"]["0"]
    assert h["per_head"] == [33 / 128, 32 / 128]
    assert (h["min"], h["max"]) == (32 / 128, 33 / 128) and h["mean"] == pytest.approx(65 / 256)
    assert h["by_matrix"]["query"]["per_head"] == [1.0, 0.0]
    assert h["by_matrix"]["attn_out"]["per_head"] == [0.0, 1.0]
    assert h["by_matrix"]["key"]["per_head"] == [1 / 32, 0.0]
    assert r["heads_overall"]["max"] == 33 / 128


def test_report_follows_masks_and_canonical_names():
    base = _hand_made()
    clf = BertForSequenceClassification(base.config)
    clf.bert.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        clf.classifier.weight.zero_()
    masks = {"encoder.layer.0.attention.self.query.weight": torch.ones(8, 8, dtype=torch.bool),
             "classifier.weight": torch.ones(2, 8, dtype=torch.bool)}
    r = sparsity_report(clf, masks)
    assert set(r["matrices"]) == set(masks)  # names without the "bert." prefix
    assert r["other"] == {"numel": 16, "zeros": 16, "sparsity": 1.0}
    assert r["global"]["zeros"] == 32 + 16
    assert r["embeddings"]["numel"] == 0


def test_table_lists_layers_heads_and_groups():
    text = format_sparsity_table(sparsity_report(_hand_made()))
    lines = text.splitlines()
    row0 = next(ln for ln in lines if ln.strip().startswith("0 "))
    # query 50.0%, key 1/64, value 0, attn_out 50%, ffn_in 12.5%, ffn_out 0, layer 81/512, heads
    assert row0.split()[:8] == ["0", "50.0%", "1.6%", "0.0%", "50.0%", "12.5%", "0.0%", "15.8%"]
    assert "25.0% / 25.4% / 25.8%" in row0
    assert "embeddings: 25.0% (20 of 80 weights)" in text
    assert "global: 17.1% (101 of 592 weights)" in text
