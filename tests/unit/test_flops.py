"""Known-answer FLOP counts: hand-built Linear / Conv / LSTM / attention models and MiniLM by formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compress.measure.flops import FLOP_HANDLES, count_flops


class OneLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 20)

    def forward(self, x):
        return self.fc(x)


class BiLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, kernel_size=3)

    def forward(self, x):
        return self.conv(x)


class SelfAttention(nn.Module):
    """Q/K/V/O projections around ``F.scaled_dot_product_attention`` with ``heads`` heads."""

    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape

        def split(t):
            return t.view(b, n, self.h, d // self.h).transpose(1, 2)

        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(a.transpose(1, 2).reshape(b, n, d))


def test_linear_equals_hand_count_and_zeros_are_not_effective():
    m = OneLinear()
    r = count_flops(m, {"x": torch.randn(1, 7, 10)})
    assert r["dense_macs"] == 7 * 10 * 20
    assert r["dense_flops"] == 2 * 7 * 10 * 20
    assert r["effective_macs"] == r["dense_macs"]
    with torch.no_grad():
        m.fc.weight[:, :5] = 0.0  # 100 of 200 weights
        m.fc.weight[0, 5] = 0.0   # one more: 101 zeros
    r = count_flops(m, {"x": torch.randn(1, 7, 10)})
    assert r["dense_macs"] == 1400
    assert r["effective_macs"] == 7 * (200 - 101)
    assert r["effective_flops"] == 2 * 7 * 99


def test_conv_equals_hand_count():
    m = Conv()
    r = count_flops(m, {"x": torch.randn(1, 4, 10)})
    assert r["dense_macs"] == 8 * 6 * 4 * 3  # 8 output positions x out x in x kernel
    with torch.no_grad():
        m.conv.weight[:2] = 0.0  # 2 of 6 filters: 24 of 72 weights
    r = count_flops(m, {"x": torch.randn(1, 4, 10)})
    assert r["effective_macs"] == 8 * (72 - 24)


def test_lstm_equals_hand_count():
    m = BiLSTM()
    r = count_flops(m, {"x": torch.randn(1, 5, 8)})
    # per direction and step: layer 0 = 4H x I + 4H x H, layer 1 input is 2H (both directions)
    per_step = 2 * (64 * 8 + 64 * 16) + 2 * (64 * 32 + 64 * 16)
    assert r["dense_macs_by_operator"]["lstm"] == 5 * per_step
    assert r["dense_macs"] == 5 * per_step
    with torch.no_grad():
        m.rnn.weight_hh_l0.zero_()  # 64 x 16 elements in one direction
    r = count_flops(m, {"x": torch.randn(1, 5, 8)})
    assert r["effective_macs"] == 5 * (per_step - 64 * 16)


def test_sdpa_attention_equals_hand_count():
    d, n = 16, 9
    r = count_flops(SelfAttention(d, 4), {"x": torch.randn(1, n, d)})
    attention = 2 * n * n * d  # Q K^T and P V summed over 4 heads of d/4
    assert r["dense_macs_by_operator"]["scaled_dot_product_attention"] == attention
    assert r["dense_macs"] == 4 * n * d * d + attention


def test_not_counted_ops_are_listed():
    class WithGelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.fc = nn.Linear(8, 8)

        def forward(self, ids):
            return F.gelu(self.fc(self.emb(ids))) + 1.0

    r = count_flops(WithGelu(), {"ids": torch.tensor([[1, 2, 3]])})
    assert r["dense_macs"] == 3 * 8 * 8  # embedding counts zero
    assert "embedding" in r["zero_by_definition"]
    assert "aten::gelu" in r["not_counted"]
    assert "1 MAC" in r["unit"] and "2 FLOPs" in r["unit"]


def test_handles_table_covers_attention_and_rnns():
    for op in ("aten::scaled_dot_product_attention", "aten::lstm", "aten::gru", "aten::embedding"):
        assert op in FLOP_HANDLES


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_minilm_at_128_matches_formula(attn):
    from transformers import AutoModelForSequenceClassification

    from compress.models import packaged_model_path

    model = AutoModelForSequenceClassification.from_pretrained(
        packaged_model_path("minilm"), num_labels=2, attn_implementation=attn).eval()
    c = model.config
    L, d, f, layers = 128, c.hidden_size, c.intermediate_size, c.num_hidden_layers
    ids = torch.randint(1000, 2000, (1, L))
    r = count_flops(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                            "token_type_ids": torch.zeros_like(ids)})
    # Q,K,V,O + FFN in/out per layer and token, then pooler + 2-class head on the [CLS] token
    linear = layers * L * (4 * d * d + 2 * d * f) + d * d + d * 2
    attention = layers * 2 * L * L * d                     # scores + weighted values, all heads
    by_op = r["dense_macs_by_operator"]
    attn_macs = by_op.get("scaled_dot_product_attention", 0) + by_op.get("matmul", 0)
    assert attn_macs == attention > 0
    assert by_op["linear"] == linear
    formula_flops = 2 * (linear + attention)
    assert abs(r["dense_flops"] - formula_flops) / formula_flops < 0.02
    assert r["effective_flops"] <= r["dense_flops"]


@pytest.mark.parametrize("name", ["bilstm", "kimcnn"])
def test_students_match_their_analytic_counts(name):
    """The traced count equals the student's own formula (an independent, hand-written count)."""
    registry = pytest.importorskip("students.registry")
    torch.manual_seed(0)
    model = registry.build_student(name, registry.student_config(name, {}), 5000).eval()
    ids = torch.randint(100, 5000, (1, 40))
    r = count_flops(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert r["dense_flops"] == model.flops_per_example(40)
    op = "lstm" if name == "bilstm" else "conv"
    assert r["dense_macs_by_operator"][op] > 0.9 * r["dense_macs"]
