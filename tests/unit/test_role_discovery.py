"""Role discovery on every encoder type of the installed transformers, built tiny with ``from_config``.

The types come from transformers' auto mappings: those with both a masked-LM and a
sequence-classification class, not encoder-decoders, whose config names an attention head count.
Each is built tiny (no download) and run once; a type whose tiny build or plain forward fails is
"not buildable offline" and left out of the count. Every other type either prunes one-shot with
SparseGPT and Wanda at 50% (every discovered matrix at 50%) or is refused in one line before any
data is read. The outcomes are printed, so a new transformers release shows what it added.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

import compress
from compress.api.functions import prune_model
from compress.core.errors import CompressError
from compress.measure.sparsity import sparsity_report
from compress.models.architectures import LAYOUTS, encoder_layers, find_layout, layout_for

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 37,
        "vocab_size": 128, "embedding_size": 32, "pooler_hidden_size": 32, "head_dim": 8,
        "entity_vocab_size": 16, "max_position_embeddings": 64}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
             "mask_token_id")


def encoder_types() -> list[str]:
    mlm = modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    seq = modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    return sorted(set(mlm) & set(seq))


def tiny_model(model_type: str) -> torch.nn.Module:
    """A tiny random classifier of ``model_type``; raises when this type cannot be built so."""
    config = transformers.AutoConfig.for_model(model_type)
    for key, value in TINY.items():
        if getattr(config, key, None) is not None or key == "vocab_size":
            setattr(config, key, value)
    if isinstance(getattr(config, "layer_types", None), list):  # one entry per layer (ModernBERT)
        config.layer_types = config.layer_types[:config.num_hidden_layers]
    for i, key in enumerate(TOKEN_IDS):
        value = getattr(config, key, 0)
        if value is None or (isinstance(value, int) and value >= TINY["vocab_size"]):
            setattr(config, key, i + 1)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    if hasattr(model, "set_default_language"):
        model.set_default_language(next(iter(config.languages)))
    model(**batch())  # a tiny build that does not run is not buildable offline
    return model


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (4, 12), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def tokenizer():
    from transformers import AutoTokenizer

    from compress.models.loading import packaged_model_path

    return AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


def outcome(model_type: str, tmp_path) -> tuple[str, str]:
    """(kind, detail): kind in encdec, no-attention, not-buildable, refused, pruned."""
    config = transformers.AutoConfig.for_model(model_type)
    if getattr(config, "is_encoder_decoder", False):
        return "encdec", ""
    if not any(hasattr(config, k) for k in ("num_attention_heads", "n_heads", "num_heads")):
        return "no-attention", "its config names no attention heads"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = tiny_model(model_type)
    except Exception as err:  # noqa: BLE001 - any failure of the tiny build counts as not buildable
        return "not-buildable", f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"
    try:
        layout = layout_for(model)
    except CompressError as err:
        message = str(err)
        assert "\n" not in message and model_type in message
        return "refused", message
    source = "discovered" if layout.discovered else "table"
    matrices = {f"{lay.path}.{sub}.weight" for lay in encoder_layers(model, layout)
                for sub in (layout.roles[r] for r in lay.linears)}
    for criterion in ("sparsegpt", "wanda"):
        pruned = tiny_model(model_type)
        masks = prune_model(pruned, 0.5, criterion=criterion, calibration=[batch(1), batch(2)])
        missing = matrices - set(masks)
        assert not missing, f"{model_type}: {criterion} left {sorted(missing)[:2]} unpruned"
        for name in matrices:
            kept = masks[name].float().mean().item()
            assert abs(kept - 0.5) < 0.02, f"{model_type} {criterion} {name}: kept {kept:.3f}"
        logits = pruned(**batch(3)).logits
        assert torch.isfinite(logits).all()
        report = sparsity_report(pruned)  # what measure and the model card print
        assert report["encoder"]["sparsity"] == pytest.approx(0.5, abs=0.03), model_type
        assert all(len(h["per_head"]) >= 1 for h in report["heads"].values())
        if criterion == "sparsegpt":  # saved with its masks and model card, then `compress verify`
            folder = tmp_path / model_type
            compress.save_model(pruned, tokenizer(), folder, masks)
            verified = compress.verify_masks(folder)
            assert verified["pruned"] >= len(matrices) and verified["sparsity"] > 0, verified
    return "pruned", f"{source}: {', '.join(sorted(layout.roles))}"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("one_shot")
    return {t: outcome(t, root) for t in encoder_types()}


def test_encoder_types_prune_one_shot_or_are_refused_in_one_line(outcomes):
    for model_type, (kind, detail) in outcomes.items():
        print(f"{model_type:24s} {kind:14s} {detail}")
    counted = {t: k for t, (k, _) in outcomes.items() if k in ("pruned", "refused")}
    pruned = [t for t, k in counted.items() if k == "pruned"]
    # the nine table families and the BERT-named types (ERNIE among them) must be read
    for model_type in ("bert", "roberta", "ernie", "data2vec-text", "mpnet", "nomic_bert", "gte",
                       "eurobert", "longformer", "convbert"):
        assert outcomes[model_type][0] == "pruned", (model_type, outcomes[model_type])
    assert len(pruned) / len(counted) >= 0.9, sorted(t for t, k in counted.items() if k == "refused")


def test_table_families_keep_their_table(outcomes):
    for layout in LAYOUTS.values():
        for model_type in layout.model_types:
            if model_type in outcomes and outcomes[model_type][0] == "pruned":
                assert outcomes[model_type][1].startswith("table"), model_type


class NeutralLayer(torch.nn.Module):
    """Self-attention and an FFN whose Linears have names that say nothing (p1..p6)."""

    def __init__(self, hidden=16, heads=4, ffn=24):
        super().__init__()
        self.heads = heads
        self.p1, self.p2, self.p3 = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.p4 = torch.nn.Linear(hidden, hidden)
        self.p5, self.p6 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def forward(self, x):
        b, n, h = x.shape
        split = lambda t: t.view(b, n, self.heads, -1).transpose(1, 2)  # noqa: E731
        k, v, q = split(self.p1(x)), split(self.p2(x)), split(self.p3(x))  # p3 is the query
        ctx = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        x = x + self.p4(ctx.transpose(1, 2).reshape(b, n, h))
        return x + self.p6(torch.relu(self.p5(x)))


class NeutralEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = transformers.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=24,
                                              vocab_size=50)
        self.config.model_type = "neutral"
        self.emb = torch.nn.Embedding(50, 16)
        self.blocks = torch.nn.ModuleList(NeutralLayer() for _ in range(2))

    @property
    def base_model(self):
        return self

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, attention_mask=None):
        x = self.emb(input_ids)
        for block in self.blocks:
            x = block(x)
        return x


def test_discovery_reads_roles_from_shapes_and_data_flow_not_names():
    torch.manual_seed(0)
    layout = find_layout(NeutralEncoder())
    assert layout is not None and layout.discovered
    assert layout.roles["value"] == "p2"  # zeroing p2 zeroes p4's input; p1/p3 only flatten attention
    assert {layout.roles["query"], layout.roles["key"]} == {"p1", "p3"}
    assert (layout.roles["attn_out"], layout.roles["ffn_in"], layout.roles["ffn_out"]) == ("p4", "p5", "p6")
    assert layout.layers == r"blocks\.(\d+)" and layout.word_embeddings == "emb"


def test_a_model_without_encoder_layers_is_refused_in_one_line():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = transformers.BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16)
            self.config.model_type = "plain"
            self.lin = torch.nn.Linear(8, 8)

        @property
        def base_model(self):
            return self

    with pytest.raises(CompressError, match="architecture 'plain'.*no stack of repeated encoder layers"):
        layout_for(Plain())


def test_measure_export_and_tables_name_the_real_type():
    from compress.export.loading import LoadedModel
    from compress.measure.sparsity import format_sparsity_table, sparsity_report

    model = tiny_model("ernie")
    loaded = LoadedModel(model, ("input_ids", "attention_mask"), "bert")
    assert loaded.architecture == "ernie"  # what measure and export print
    report = sparsity_report(model)
    assert report["architecture"] == "ernie"
    table = format_sparsity_table(report).splitlines()
    assert table[1].split()[:2] == ["layer", "query"] and table[1].split()[-3] == "all"


def test_sparsity_table_sorts_unassigned_matrices_by_layer_number():
    from compress.measure.sparsity import format_sparsity_table

    zero = {"embeddings": {"numel": 0}, "encoder": {"numel": 0}, "other": {"numel": 0},
            "global": {"numel": 0}}
    names = [f"stack.{i}.w.weight" for i in (1, 10, 2, 9)]
    report = {"matrices": {n: {"layer": None, "kind": None, "sparsity": 0.5, "numel": 4} for n in names},
              "heads": {}, "layers": {}, **zero}
    rows = [line.split(":")[0] for line in format_sparsity_table(report).splitlines()[1:]]
    assert rows == [f"stack.{i}.w.weight" for i in (1, 2, 9, 10)]


@pytest.mark.parametrize("criterion", ["sparsegpt", "wanda"])
def test_include_is_honoured_by_calibrated_criteria_where_roles_are_unknown(criterion):
    model = tiny_model("fnet")  # no attention heads: discovery cannot read it
    with pytest.raises(CompressError, match="architecture 'fnet'"):
        layout_for(model)
    pattern = r"re:encoder\.layer\.\d+\.(intermediate|output)\.dense\.weight$"
    masks = prune_model(model, 0.5, criterion=criterion, include=(pattern,),
                        calibration=[batch(1), batch(2)])
    assert sorted(masks) == [f"encoder.layer.{i}.{m}.dense.weight" for i in (0, 1)
                             for m in ("intermediate", "output")]
    for name, keep in masks.items():
        assert keep.float().mean().item() == pytest.approx(0.5, abs=0.02), name
        weight = dict(model.base_model.named_parameters())[name]
        assert bool((weight[~keep] == 0).all())


def test_structured_removal_of_a_discovered_type_is_tried_on_a_copy_up_front():
    from compress.pruning.structured import check_removable

    assert check_removable(tiny_model("bert")).name == "bert"
    for model_type, accepted in (("ernie", True), ("mpnet", True), ("nystromformer", True),
                                 ("longformer", False)):
        model = tiny_model(model_type)
        before = {n: p.clone() for n, p in model.state_dict().items()}
        if accepted:
            assert check_removable(model).discovered
        else:  # Longformer reshapes its attention output by the input's hidden size
            with pytest.raises(CompressError, match="cannot remove heads of longformer") as err:
                check_removable(model)
            assert "only its FFN neurons can be removed (--structured ffn" in str(err.value)
            assert "\n" not in str(err.value)
            assert check_removable(model, ("ffn",)).discovered  # its FFN neurons can go
        assert not type(model).__name__.startswith("Compress")  # the probe worked on a copy
        assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def structured_outcome(model_type: str, tmp_path) -> tuple[str, str]:
    """("refused", one line) or ("removed", sizes): Fisher-structured pruning to -30% FLOPs, then the
    saved folder's shapes checked against its config and its reload's logits against the model's."""
    from compress.models.loading import load_pretrained
    from compress.pruning.fisher_structured import fisher_prune_structured
    from compress.pruning.integrity import check_structure
    from compress.pruning.structured import check_removable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_model(model_type)
        targets, kind = ("heads", "ffn"), "removed"
        try:
            check_removable(model)
        except CompressError as err:
            assert "\n" not in str(err) and model_type in str(err)
            if "only its FFN neurons can be removed" not in str(err):
                return "refused", str(err)
            targets, kind = ("ffn",), "ffn-only"
        labelled = [dict(batch(i), labels=torch.tensor([0, 1, 0, 1])) for i in (1, 2)]
        report = fisher_prune_structured(model, labelled, 0.3, 12, targets)
        assert report["flops_reduction"] >= 0.3, (model_type, report["flops_reduction"])
        folder = tmp_path / model_type
        model.save_pretrained(folder)
        assert check_structure(folder) is not None
        again = load_pretrained(transformers.AutoModelForSequenceClassification, str(folder)).eval()
        with torch.no_grad():
            assert torch.allclose(again(**batch(3)).logits, model.eval()(**batch(3)).logits, atol=1e-5)
    return kind, f"heads {report['layer_heads']} ffn {report['layer_ffn']}"


def test_encoder_types_prune_fisher_structured_or_are_refused_in_one_line(outcomes, tmp_path):
    results = {t: structured_outcome(t, tmp_path) for t, (kind, _) in outcomes.items() if kind == "pruned"}
    for model_type, (kind, detail) in results.items():
        print(f"{model_type:24s} {kind:8s} {detail}")
    removed = [t for t, (k, _) in results.items() if k == "removed"]
    for model_type in ("bert", "roberta", "ernie", "data2vec-text", "nomic_bert", "gte", "mpnet", "eurobert",
                       "big_bird", "deberta", "nystromformer"):
        assert model_type in removed, (model_type, results.get(model_type))
    for model_type in ("longformer", "esmc"):  # their heads cannot go, their FFN neurons can
        assert results[model_type][0] == "ffn-only", (model_type, results[model_type])
    assert len(removed) / len(results) >= 0.9, sorted(t for t, (k, _) in results.items() if k != "removed")
    assert all(k != "refused" for k, _ in results.values()), \
        sorted(t for t, (k, _) in results.items() if k == "refused")




def test_every_structured_entry_point_refuses_a_type_that_cannot_shrink_before_reading_data(tmp_path):
    from compress.models.loading import load_pretrained
    from compress.pruning.fisher_structured import fisher_prune_structured
    from compress.pruning.structured import prune_structured

    def batches():
        raise AssertionError("data was read")
        yield  # a generator that fails when iterated

    model = tiny_model("longformer")
    with pytest.raises(CompressError, match="cannot remove heads of longformer"):
        fisher_prune_structured(model, batches(), 0.3, 12)
    with pytest.raises(CompressError, match="cannot remove heads of longformer"):
        prune_structured(model, 0.25)
    assert not type(model).__name__.startswith("Compress")
    # removing FFN neurons only works, and the folder reloads to the same logits
    report = prune_structured(model, 0.25, ("ffn",))
    assert report["ffn_removed"] == 18 and model.config.layer_heads is None  # 25% of 2 x 37, rounded down
    model.save_pretrained(tmp_path)
    again = load_pretrained(transformers.AutoModelForSequenceClassification, str(tmp_path)).eval()
    with torch.no_grad():
        assert torch.allclose(again(**batch(3)).logits, model.eval()(**batch(3)).logits, atol=1e-5)


def test_the_removal_probe_runs_once_per_model(monkeypatch):
    import compress.pruning.structured as structured

    calls = []
    real = structured.probe_removal
    monkeypatch.setattr(structured, "probe_removal", lambda m, t: calls.append(1) or real(m, t))
    model = tiny_model("ernie")
    structured.check_removable(model)
    structured.prune_structured(model, 0.25)
    assert calls == [1] and type(model).__name__ == "CompressErnieForSequenceClassification"


def test_a_saved_pruned_type_outside_the_table_is_registered_from_its_folder(tmp_path, monkeypatch):
    import json

    from compress.models import loading, modeling_pruned

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text(json.dumps({"model_type": "compress_roformer"}))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps({"model_type": "roformer"}))
    assert loading._saved_pruned_type(tmp_path / "p") == ("compress_roformer",)
    assert loading._saved_pruned_type(tmp_path / "d") == ()
    monkeypatch.setattr(modeling_pruned, "PRUNED_CLASSES", {k: v for k, v in
                                                            modeling_pruned.PRUNED_CLASSES.items()
                                                            if k != "roformer"})
    loading.register_model_types(tmp_path / "p")
    assert "roformer" in modeling_pruned.PRUNED_CLASSES
    config = transformers.AutoConfig.for_model("compress_roformer")
    assert type(config).__name__ == "CompressRoFormerConfig"


def test_grouped_query_attention_prunes_one_shot_and_is_refused_structured(monkeypatch):
    """EuroBERT with 4 query heads sharing 2 key/value heads: the narrower key and value are found by
    reading one input with the query; removing heads is refused in one line before any work."""
    from compress.pruning.structured import check_removable

    monkeypatch.setitem(TINY, "num_key_value_heads", 2)
    model = tiny_model("eurobert")
    layout = layout_for(model)
    assert layout.discovered and layout.roles["query"].endswith("q_proj")
    assert (layout.roles["key"], layout.roles["value"]) == ("self_attn.k_proj", "self_attn.v_proj")
    masks = prune_model(model, 0.5, criterion="sparsegpt", calibration=[batch(1), batch(2)])
    layer0 = {k for k in masks if ".0." in k}
    assert len(layer0) == 7 and all(abs(masks[k].float().mean().item() - 0.5) < 0.02 for k in layer0)
    with pytest.raises(CompressError, match="grouped-query attention") as err:
        check_removable(tiny_model("eurobert"))
    assert "\n" not in str(err.value)


def _zeroed_head_logits(model, layer, head, head_dim, inputs):
    """Logits of ``model`` with ``head`` of encoder layer ``layer`` zeroed at the output projection."""
    from compress.models.architectures import encoder_layers

    lin = encoder_layers(model)[layer].linears["attn_out"]
    cols = torch.arange(head * head_dim, (head + 1) * head_dim)
    hook = lin.register_forward_pre_hook(lambda m, a: (a[0].index_fill(-1, cols, 0.0), *a[1:]))
    try:
        with torch.no_grad():
            return model(**inputs).logits
    finally:
        hook.remove()


def test_bigbird_keeps_its_pruned_heads_when_it_switches_attention_kernels(tmp_path):
    """BigBird builds a new attention module from its config whenever it switches between block-sparse
    and full attention; the pruned layers keep their head counts in both, after a reload too, and
    the probing forward passes (a short dummy batch) leave the model on block-sparse attention."""
    from compress.models.loading import load_pretrained
    from compress.pruning.structured import check_removable, remove_structured

    config = transformers.BigBirdConfig(**{k: v for k, v in TINY.items() if k != "num_key_value_heads"},
                                        block_size=2, num_random_blocks=1)
    torch.manual_seed(0)
    model = transformers.BigBirdForSequenceClassification(config).eval()
    attention = model.base_model.encoder.layer[0].attention
    check_removable(model)
    assert type(attention.self).__name__ == "BigBirdBlockSparseAttention"  # not switched for good
    long = {"input_ids": torch.randint(5, 120, (2, 40), generator=torch.Generator().manual_seed(1))}
    expected = _zeroed_head_logits(model, 0, 0, 8, long)
    remove_structured(model, [[1, 2, 3], [0, 1, 2, 3]], [list(range(37))] * 2)
    model.save_pretrained(tmp_path)
    again = load_pretrained(transformers.AutoModelForSequenceClassification, str(tmp_path)).eval()
    for pruned in (model, again):
        with torch.no_grad():
            assert torch.allclose(pruned(**long).logits, expected, atol=1e-5)
            pruned(**batch(3))  # 12 tokens: full attention, built anew from the config
        layer0 = pruned.base_model.encoder.layer[0].attention.self
        assert type(layer0).__name__ == "BigBirdSelfAttention" and layer0.num_attention_heads == 3


def test_deberta_v1_fused_per_head_qkv_biases_and_position_projections_are_removed_by_head(tmp_path):
    """DeBERTa v1 (relative attention on, as deberta-base): the output projection is the Linear that
    reads the heads' context (not the as-wide position projection called before it), the fused
    ``in_proj`` holds each head's q, k, v rows together, and the query/value biases and position
    projections lose the removed heads' entries."""
    from compress.models.loading import load_pretrained
    from compress.pruning.structured import check_removable, remove_structured

    config = transformers.DebertaConfig(**{k: v for k, v in TINY.items() if k != "num_key_value_heads"},
                                        relative_attention=True, pos_att_type=["c2p", "p2c"],
                                        max_relative_positions=16)
    torch.manual_seed(0)
    model = transformers.DebertaForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_bias", "v_bias")):
                p.normal_()  # zero at init: random values show whether they follow their heads
    model.train()  # as a Trainer leaves it: discovery's probes must still run without dropout
    layout = check_removable(model)
    assert model.training
    model.eval()
    assert layout.roles["qkv"] == "attention.self.in_proj"
    assert layout.roles["attn_out"] == "attention.output.dense"
    assert layout.extra["qkv_order"] == "heads"
    assert layout.extra["head_extras"] == {
        "attention.self.pos_proj": "rows", "attention.self.pos_q_proj": "rows",
        "attention.self.q_bias": "vector", "attention.self.v_bias": "vector"}
    expected = _zeroed_head_logits(model, 0, 2, 8, batch(3))
    remove_structured(model, [[0, 1, 3], [0, 1, 2, 3]], [list(range(37))] * 2)
    attention = model.base_model.encoder.layer[0].attention.self
    assert attention.in_proj.out_features == 72 and attention.q_bias.shape == (24,)
    assert attention.pos_proj.out_features == 24
    model.save_pretrained(tmp_path)
    again = load_pretrained(transformers.AutoModelForSequenceClassification, str(tmp_path)).eval()
    for pruned in (model, again):
        with torch.no_grad():
            assert torch.allclose(pruned(**batch(3)).logits, expected, atol=1e-5)


def test_head_slices_of_a_fused_qkv_with_rows_per_head():
    from compress.models.architectures import head_slices

    assert head_slices("qkv", (12, 4), 2, "heads") == [[(0, 0, 6)], [(0, 6, 12)]]
    assert head_slices("qkv", (12, 4), 2) == [[(0, 0, 2), (0, 4, 6), (0, 8, 10)],
                                             [(0, 2, 4), (0, 6, 8), (0, 10, 12)]]


def test_nystromformer_per_head_convolution_keeps_the_kept_heads_channels(tmp_path):
    from compress.models.architectures import find_layout
    from compress.models.loading import load_pretrained
    from compress.pruning.structured import remove_structured

    model = tiny_model("nystromformer")
    assert find_layout(model).extra["head_extras"] == {"attention.self.conv": "channels"}
    weight = model.base_model.encoder.layer[0].attention.self.conv.weight.detach().clone()
    expected = _zeroed_head_logits(model, 0, 1, 8, batch(3))
    remove_structured(model, [[0, 2, 3], [0, 1, 2, 3]], [list(range(37))] * 2)
    conv = model.base_model.encoder.layer[0].attention.self.conv
    assert conv.groups == conv.in_channels == 3 and torch.equal(conv.weight, weight[[0, 2, 3]])
    model.save_pretrained(tmp_path)
    again = load_pretrained(transformers.AutoModelForSequenceClassification, str(tmp_path)).eval()
    for pruned in (model, again):
        with torch.no_grad():
            assert torch.allclose(pruned(**batch(3)).logits, expected, atol=1e-5)
