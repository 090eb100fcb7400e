"""Whole attention blocks, FFN blocks and layers removed: the pruned model computes what the
original computes with every unit of those blocks zeroed, reloads with and without compress, and
exports to ONNX with parity."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
)

from compress.core.errors import UsageError
from compress.models.loading import save_model
from compress.pruning.structured import layer_sizes, remove_structured
from tests.tiny_encoders import perturb_defaults
from tests.unit.test_structured import logits_equal_without_compress

HEAD = 16
# layer 0 loses its attention block, layer 1 its FFN block, layer 2 both (the whole layer), layer 3
# keeps one head and three neurons
KEEP_HEADS = [[], [0, 2, 3], [], [1]]
KEEP_NEURONS = [[0, 5, 9, 100], [], [], [3, 4, 7]]


def tiny_classifier(seed: int = 0) -> BertForSequenceClassification:
    """Biases and LayerNorms perturbed: an empty block that skipped its LayerNorm or its output bias
    would compute the same as a default-initialised one (zero biases, identity LayerNorms)."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=3)
    return perturb_defaults(BertForSequenceClassification(cfg)).eval()


def inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 500, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def zeroed(model: BertForSequenceClassification) -> BertForSequenceClassification:
    """The original with the removed units' contributions zeroed (their attn_out / FFN-output columns)."""
    ref = copy.deepcopy(model)
    for lay, heads, neurons in zip(ref.bert.encoder.layer, KEEP_HEADS, KEEP_NEURONS):
        cols = torch.ones(64, dtype=torch.bool)
        for h in heads:
            cols[h * HEAD:(h + 1) * HEAD] = False
        lay.attention.output.dense.weight[:, cols] = 0
        keep = torch.zeros(128, dtype=torch.bool)
        keep[neurons] = True
        lay.output.dense.weight[:, ~keep] = 0
    return ref


def test_removed_blocks_compute_the_zeroed_original():
    model = tiny_classifier()
    ref = zeroed(model)
    report = remove_structured(model, KEEP_HEADS, KEEP_NEURONS)
    assert layer_sizes(model) == {"heads": [0, 3, 0, 1], "ffn": [4, 0, 0, 3]}
    removed = ("attention_blocks_removed", "ffn_blocks_removed", "layers_removed")
    assert [report[k] for k in removed] == [2, 2, 1]
    with torch.no_grad():
        assert torch.allclose(model(**inputs()).logits, ref(**inputs()).logits, atol=1e-5)
    # the removed blocks hold no weights: zero-size projections
    assert model.bert.encoder.layer[0].attention.self.query.weight.shape == (0, 64)
    assert model.bert.encoder.layer[1].output.dense.weight.shape == (64, 0)
    # and training through the empty blocks works (LayerNorm and the output bias still learn)
    model.train()
    model(**inputs(), labels=torch.tensor([0, 1, 2])).loss.backward()
    assert model.bert.encoder.layer[0].attention.output.dense.bias.grad is not None


def test_saved_model_reloads_with_equal_logits_with_and_without_compress(tmp_path):
    model = tiny_classifier()
    remove_structured(model, KEEP_HEADS, KEEP_NEURONS)
    model.save_pretrained(tmp_path / "m")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        ref = model(**inputs()).logits
        assert torch.equal(reloaded(**inputs()).logits, ref)
    alone = tmp_path / "elsewhere" / "m"
    shutil.copytree(tmp_path / "m", alone)
    out = logits_equal_without_compress(alone, inputs(), ref, tmp_path)
    assert "[0, 3, 0, 1] [4, 0, 0, 3]" in out


def test_exports_to_onnx_with_parity(tmp_path):
    from compress.export.loading import as_loaded
    from compress.export.onnx import check_parity, export_onnx

    model = tiny_classifier()
    remove_structured(model, KEEP_HEADS, KEEP_NEURONS)
    loaded = as_loaded(model)
    path = export_onnx(loaded, tmp_path / "m.onnx")
    report = check_parity(loaded, path)
    assert max(report["max_abs_diff"].values()) < 1e-4  # check_parity raises beyond its atol too


def test_an_architecture_without_empty_blocks_refuses_an_empty_keep_list(tiny_encoder):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_encoder("distilbert"), num_labels=2)
    sizes = layer_sizes(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads = [[] if i == 0 else list(range(n)) for i, n in enumerate(sizes["heads"])]
    with pytest.raises(UsageError, match="cannot remove a whole block"):
        remove_structured(model, heads, [list(range(n)) for n in sizes["ffn"]])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_save_model_writes_a_folder_the_project_loaders_read(tiny_encoder, tmp_path):
    from compress.models.loading import load_classifier, resolve_model

    folder = tiny_encoder("bert")
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    sizes = layer_sizes(model)
    heads = [[] for _ in sizes["heads"]]
    heads[-1] = [0]
    remove_structured(model, heads, [list(range(n)) for n in sizes["ffn"]])
    save_model(model, AutoTokenizer.from_pretrained(folder), tmp_path / "saved", {})
    again, _, _ = load_classifier(str(resolve_model(str(tmp_path / "saved"))), ("a", "b"))
    assert layer_sizes(again)["heads"] == [0] * (len(sizes["heads"]) - 1) + [1]
