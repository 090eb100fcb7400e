"""Known-answer FLOP counts: hand-built Linear / Conv / LSTM / attention models and MiniLM by formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compress.measure.flops import FLOP_HANDLES, count_flops
from tests.tiny_encoders import ARCHITECTURES


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

    from compress.models.loading import packaged_model_path

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


# ----------------------------------------------------------------------------- every architecture

def _tiny_classifier(arch: str, attn: str | None):
    """The tiny ``arch`` of tests/tiny_encoders.py with a 2-label sequence-classification head."""
    from transformers import AutoModelForSequenceClassification

    from tests.tiny_encoders import build

    cfg, _ = build(arch)
    cfg.num_labels = 2
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(cfg, attn_implementation=attn).eval()


def _inputs(model, length: int) -> dict[str, torch.Tensor]:
    from compress.export.inputs import declared_inputs

    ids = torch.randint(5, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    all_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                  "token_type_ids": torch.zeros_like(ids)}
    return {k: all_inputs[k] for k in declared_inputs(model)}


def expected_macs(arch: str, c, L: int) -> dict[str, int]:
    """Hand count of the tiny ``arch`` classifier at batch 1, length L, from its config, by kind:
    ``linear`` (every Linear, per role), ``attention`` (activation x activation products: Q K^T and
    P V, plus DeBERTa's relative-position products) and ``layer_norm`` (fvcore: 5 per element)."""
    d, heads = c.hidden_size, c.num_attention_heads
    f = c.intermediate_size if arch != "distilbert" else c.hidden_dim
    layers, labels = c.num_hidden_layers, 2
    qkv_o = 4 * d * d                          # query, key, value, attn_out
    ffn = 2 * d * f                            # ffn_in, ffn_out
    scores_and_values = 2 * L * L * d          # Q K^T and P V summed over heads (heads x head_dim = d)
    head = d * d + d * labels                  # pooler / pre_classifier / head.dense, then classifier
    norms = L + 2 * layers * L                 # embedding LayerNorm + two per layer, in rows of d
    linear = layers * L * (qkv_o + ffn) + head
    attention = layers * scores_and_values
    norm_elems = norms * d
    if arch in ("electra", "albert"):
        e = c.embedding_size                   # embeddings_project / ALBERT's embedding projection
        linear += L * e * d                    # ALBERT's one shared layer is executed `layers` times
        norm_elems = L * e + 2 * layers * L * d
    elif arch == "deberta-v2":
        assert c.share_att_key and c.position_buckets > 0
        span2 = 2 * c.position_buckets         # relative positions projected, whatever L is
        linear += layers * 2 * span2 * d * d   # query_proj and key_proj of the relative embeddings
        attention += layers * 2 * L * span2 * d  # c2p: Q x pos_K^T, p2c: K x pos_Q^T, all heads
        norm_elems += span2 * d                # LayerNorm of the relative embeddings (once)
    elif arch == "modernbert":
        linear = layers * L * (3 * d * d + d * d + 2 * f * d + f * d) + head  # Wqkv, Wo, GLU Wi, Wo
        # layer 0 has no attention norm; + final norm over L rows, + the head's norm on the CLS row
        norm_elems = (L + (2 * layers - 1) * L + L + 1) * d
    assert heads * (d // heads) == d
    return {"linear": linear, "attention": attention, "layer_norm": 5 * norm_elems}


ATTENTION_OPS = ("matmul", "bmm", "scaled_dot_product_attention")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_matches_its_hand_count_under_each_attention(arch):
    L = 24  # longer than ModernBERT's local half-window (8): its local layers still cost L x L
    counts = {}
    for attn in ("eager", "sdpa"):
        model = _tiny_classifier(arch, "eager")
        if attn == "sdpa":
            if not type(model)._supports_sdpa:
                assert arch == "deberta-v2"  # the only one without an SDPA path
                continue
            model = _tiny_classifier(arch, "sdpa")
        r = count_flops(model, _inputs(model, L))
        assert r["attention_implementation"] == attn
        by_op = r["dense_macs_by_operator"]
        assert set(by_op) <= {"linear", "layer_norm", *ATTENTION_OPS}, by_op
        want = expected_macs(arch, model.config, L)
        got = {"linear": by_op["linear"], "attention": sum(by_op.get(op, 0) for op in ATTENTION_OPS),
               "layer_norm": by_op["layer_norm"]}
        assert got == want
        assert r["dense_macs"] == sum(want.values()) and r["dense_flops"] == 2 * r["dense_macs"]
        counts[attn] = r["dense_macs"]
    if "sdpa" in counts:
        assert counts["sdpa"] == counts["eager"]


def test_modernbert_local_layers_cost_what_global_ones_do():
    """Under eager/SDPA a sliding-window layer computes all L x L scores and masks the far ones."""
    model = _tiny_classifier("modernbert", "sdpa")
    assert model.config.global_attn_every_n_layers == 3 and model.config.num_hidden_layers == 3
    L = 40  # > local_attention (16): layers 1 and 2 see a window, layer 0 everything
    by_op = count_flops(model, _inputs(model, L))["dense_macs_by_operator"]
    assert by_op["scaled_dot_product_attention"] == 3 * 2 * L * L * model.config.hidden_size
