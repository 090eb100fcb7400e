"""The role table on tiny random encoders of every supported architecture: targets cover every
Linear of every encoder layer, pruning reaches the sparsity in each, the report reads roles and
heads (fused QKV included), and bad input is refused in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    FNetConfig,
    FNetModel,
    MPNetConfig,
    MPNetModel,
)

from compress.core.errors import ModelError, UsageError
from compress.measure.sparsity import format_sparsity_table, sparsity_report
from compress.models.architectures import encoder_layers, layout_for
from compress.pruning.pruner import ScheduledPruner
from compress.pruning.schedules import OneShotSchedule
from compress.pruning.targets import canonical_name, select_targets
from tests.tiny_encoders import ARCHITECTURES, build

# Linear modules of each base model that sit outside the encoder layers (written by hand from the
# architectures' source, not from the role table): they are not default targets.
OUTSIDE_LAYERS = {
    "bert": {"pooler.dense"},
    "roberta": set(),
    "xlm-roberta": set(),
    "distilbert": set(),
    "electra": {"embeddings_project"},
    "albert": {"encoder.embedding_hidden_mapping_in", "pooler"},
    "deberta-v2": set(),
    "modernbert": set(),
}
WORD_EMBEDDINGS = {"modernbert": "embeddings.tok_embeddings.weight"}


def _classifier(arch: str, seed: int = 0):
    cfg, _ = build(arch)
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(cfg)


def _hand_targets(model, arch: str) -> set[str]:
    base = model.base_model
    linears = {name for name, m in base.named_modules() if isinstance(m, torch.nn.Linear)}
    return {f"{n}.weight" for n in linears - OUTSIDE_LAYERS[arch]} | {
        WORD_EMBEDDINGS.get(arch, "embeddings.word_embeddings.weight")}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_default_targets_are_every_encoder_linear_and_the_word_embeddings(arch):
    model = _classifier(arch)
    assert set(select_targets(model)) == _hand_targets(model, arch)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("scope", ["local", "global"])
def test_every_encoder_matrix_reaches_the_sparsity(arch, scope):
    model = _classifier(arch)
    pruner = ScheduledPruner(select_targets(model), OneShotSchedule(0.4), scope=scope)
    pruner.initialize()  # a one-shot schedule prunes at step 0
    report = sparsity_report(model)
    assert abs(report["global"]["sparsity"] - 0.4) < 1e-3
    for name in _hand_targets(model, arch):
        w = dict(model.base_model.named_parameters())[name]
        zeros = float((w == 0).float().mean())
        if scope == "local":
            assert abs(zeros - 0.4) < 0.01, name
        assert report["matrices"][name]["sparsity"] == pytest.approx(zeros)
    assert report["encoder"]["numel"] > 0 and report["embeddings"]["numel"] > 0
    assert report["architecture"] == layout_for(model).name
    heads = report["heads"]
    assert len(heads) == len(encoder_layers(model))
    assert all(len(h["per_head"]) == 4 for h in heads.values())


def test_fused_qkv_heads_are_read_from_each_block():
    model = _classifier("modernbert")
    w = model.model.layers[1].attn.Wqkv.weight
    with torch.no_grad():  # head 2 (head size 8): rows 16:24 of the q, k and v blocks (32 rows each)
        for block in range(3):
            w[block * 32 + 16: block * 32 + 24] = 0
    report = sparsity_report(model)
    by_qkv = report["heads"]["1"]["by_matrix"]["qkv"]["per_head"]
    assert by_qkv == [0.0, 0.0, 1.0, 0.0]
    # the head's share of its four slices: all of its qkv rows (3 * 8 * 32), none of its Wo columns
    assert report["heads"]["1"]["per_head"][2] == pytest.approx(3 * 8 * 32 / (3 * 8 * 32 + 32 * 8))
    table = format_sparsity_table(report)
    assert "qkv" in table and "query" not in table


def test_albert_shared_layer_is_pruned_once_and_said_so():
    model = _classifier("albert")
    targets = select_targets(model)
    assert sum("albert_layers" in n for n in targets) == 6  # one shared layer, six matrices
    report = sparsity_report(model)
    assert "shared" in report["shared_layers"] and "run 2 times" in report["shared_layers"]
    assert "shared" in format_sparsity_table(report)


def test_masked_lm_and_classifier_share_canonical_names():
    cfg, _ = build("roberta")
    mlm, cls = AutoModelForMaskedLM.from_config(cfg), AutoModelForSequenceClassification.from_config(cfg)
    assert set(select_targets(mlm)) == set(select_targets(cls))


def test_role_patterns():
    model = _classifier("deberta-v2")
    everything = set(select_targets(model))
    no_ffn_in = set(select_targets(model, exclude=("role:ffn_in",)))
    assert everything - no_ffn_in == {f"encoder.layer.{i}.intermediate.dense.weight" for i in range(2)}
    only_qkv_out = set(select_targets(model, exclude=("role:qkv", "role:word_embeddings")))
    assert not any("_proj" in n for n in only_qkv_out) and "embeddings.word_embeddings.weight" \
        not in only_qkv_out


@pytest.mark.parametrize("pattern, needle", [
    ("role:query", "fuses query, key and value"),
    ("role:value", "name role:qkv instead"),
    ("role:pos_key", "has no pos_key matrix"),
    ("role:nonsense", "unknown role 'nonsense'"),
])
def test_bad_role_patterns_on_a_fused_qkv(pattern, needle):
    with pytest.raises(UsageError) as e:
        select_targets(_classifier("modernbert"), include=(pattern,))
    assert needle in str(e.value) and "\n" not in str(e.value)


def _mpnet():
    return MPNetModel(MPNetConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=40))


def _fnet():  # no self-attention: role discovery cannot read it
    return FNetModel(FNetConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, intermediate_size=32,
                                max_position_embeddings=40))


def test_an_architecture_outside_the_table_gets_its_roles_discovered():
    model = _mpnet()
    targets = select_targets(model)
    layer = "encoder.layer.0."
    assert sorted(targets) == ["embeddings.word_embeddings.weight"] + sorted(
        f"{layer}{sub}.weight" for sub in ("attention.attn.q", "attention.attn.k", "attention.attn.v",
                                           "attention.attn.o", "intermediate.dense", "output.dense"))
    assert list(select_targets(model, include=("role:value",), word_embeddings=False)) == sorted(
        set(targets) - {"embeddings.word_embeddings.weight"})


def test_an_architecture_discovery_cannot_read_is_refused_saying_what_is_missing():
    with pytest.raises(UsageError) as e:
        select_targets(_fnet())
    msg = str(e.value)
    assert "'fnet'" in msg and "attention head count" in msg and "--include" in msg and "\n" not in msg


def test_an_architecture_outside_the_table_prunes_what_include_names():
    model = _fnet()
    t = select_targets(model, include=("re:layer\\.0\\.output\\.dense\\.weight",))
    assert list(t) == ["encoder.layer.0.output.dense.weight"]
    with pytest.raises(UsageError, match="no role table"):
        select_targets(model, include=("role:query",))


def test_a_layer_with_an_unknown_linear_is_refused():
    model = _classifier("bert")
    model.bert.encoder.layer[1].attention.self.extra = torch.nn.Linear(32, 32)
    with pytest.raises(ModelError) as e:
        select_targets(model)
    assert "encoder.layer.1.attention.self.extra" in str(e.value)


def test_a_layer_missing_a_role_is_refused():
    model = _classifier("distilbert")
    del model.distilbert.transformer.layer[0].ffn.lin2
    with pytest.raises(ModelError, match="no 'ffn.lin2'"):
        select_targets(model)


def test_canonical_names_strip_each_base_prefix():
    for arch, prefix in (("modernbert", "model."), ("distilbert", "distilbert."), ("deberta-v2", "deberta.")):
        model = _classifier(arch)
        full = next(n for n, _ in model.named_parameters() if n.startswith(prefix))
        assert canonical_name(model, full) == full[len(prefix):]
