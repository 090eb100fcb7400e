"""The stock copy of a structured-pruned model: its stock transformers class at the unpruned head
count, removed units zero, the same outputs, a config with no trace of this project."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import BertConfig, BertModel

from compress.core.errors import ModelError
from compress.pruning.stock_copy import stock_copy
from compress.pruning.structured import layer_sizes, remove_structured
from tests.unit.test_role_discovery import batch, tiny_model


def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=48,
                                num_hidden_layers=3, vocab_size=100)).eval()


def _padded_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def test_stock_copy_of_bert_with_emptied_blocks_computes_the_pruned_model_and_places_units():
    model = _tiny_bert()
    q0 = model.encoder.layer[0].attention.self.query.weight.clone()
    ffn_in0 = model.encoder.layer[0].intermediate.dense.weight.clone()
    remove_structured(model, [[1, 3], [], [0, 1, 2, 3]], [[0, 5, 7], [1, 2], []])
    stock = stock_copy(model).eval()
    assert type(stock) is BertModel and stock.config.model_type == "bert"
    assert stock.config.num_attention_heads == 4
    assert stock.config.intermediate_size == 3  # the widest kept layer
    inputs = _padded_batch()
    want = model(**inputs).last_hidden_state
    got = stock(**inputs).last_hidden_state
    assert torch.allclose(want, got, atol=1e-6)
    # layer 0 keeps heads 1 and 3 of 4 (head dim 8): they fill the first two slots, the rest is zero
    q = stock.encoder.layer[0].attention.self.query.weight
    assert torch.equal(q[:8], q0[8:16]) and torch.equal(q[8:16], q0[24:32])
    assert not q[16:].any()
    # its FFN keeps neurons 0, 5, 7 in that order; layer 1 keeps no head, layer 2 no neuron
    assert torch.equal(stock.encoder.layer[0].intermediate.dense.weight, ffn_in0[[0, 5, 7]])
    assert not stock.encoder.layer[1].attention.self.value.weight.any()
    assert not stock.encoder.layer[1].attention.output.dense.weight.any()
    assert not stock.encoder.layer[2].output.dense.weight.any()
    assert torch.equal(stock.encoder.layer[2].output.dense.bias, model.encoder.layer[2].output.dense.bias)


def test_saved_stock_copy_loads_with_transformers_alone(tmp_path):
    model = _tiny_bert()
    remove_structured(model, [[0], [2, 3], [1]], [[4, 9], [0], [3, 30, 47]])
    stock_copy(model).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bert" and "auto_map" not in config and "layer_heads" not in config
    assert not list(tmp_path.glob("*.py"))
    inputs = _padded_batch()
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
    code = ("import json, sys, torch; from transformers import AutoModel; "
            f"m = AutoModel.from_pretrained({str(tmp_path)!r}).eval(); "
            f"ids = torch.tensor({inputs['input_ids'].tolist()}); mask = torch.tensor("
            f"{inputs['attention_mask'].tolist()}); "
            "out = m(input_ids=ids, attention_mask=mask).last_hidden_state; "
            "print(json.dumps({'out': out.tolist(), 'type': type(m).__name__, "
            "'compress': any(k.startswith('compress') for k in sys.modules)}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    fresh = json.loads(run.stdout.strip().splitlines()[-1])
    assert fresh["type"] == "BertModel" and fresh["compress"] is False
    assert torch.allclose(torch.tensor(fresh["out"]), want, atol=1e-5)


# role-table types, and discovered ones whose heads carry per-head state: MPNet's position bias
# (computed outside the layers, so the heads keep their places), DeBERTa v1's q/v biases and
# position projections, Nyströmformer's per-head convolution, BigBird's rebuilt attention
@pytest.mark.parametrize("model_type", ["distilbert", "albert", "deberta-v2", "modernbert", "mpnet",
                                        "deberta", "nystromformer", "big_bird"])
@torch.no_grad()
def test_stock_copy_computes_the_pruned_model_across_types(model_type):
    model = tiny_model(model_type)
    sizes = layer_sizes(model)
    keep_heads = [[h for h in range(n) if h % 2 == 1] for n in sizes["heads"]]
    keep_neurons = [list(range(0, n, 3)) for n in sizes["ffn"]]
    stock_class = type(model)
    remove_structured(model, keep_heads, keep_neurons)
    stock = stock_copy(model).eval()
    assert type(stock) is stock_class
    assert not stock.config.model_type.startswith("compress")
    inputs = batch(3)
    assert torch.allclose(model(**inputs).logits, stock(**inputs).logits, atol=1e-5)


def test_a_model_that_is_not_structured_pruned_is_refused():
    with pytest.raises(ModelError, match="not a structured-pruned model"):
        stock_copy(_tiny_bert())


@torch.no_grad()
def test_bigbird_stock_copy_keeps_block_sparse_attention_after_its_check():
    """The copy's own check runs a short batch, on which BigBird switches to full attention for
    good; the returned copy is still block-sparse and equals the pruned model on a long input."""
    import transformers

    from tests.unit.test_role_discovery import TINY

    config = transformers.BigBirdConfig(**{k: v for k, v in TINY.items() if k != "num_key_value_heads"},
                                        block_size=2, num_random_blocks=1)
    torch.manual_seed(0)
    model = transformers.BigBirdForSequenceClassification(config).eval()
    remove_structured(model, [[1, 2, 3], [0, 2]], [list(range(37)), list(range(0, 37, 2))])
    stock = stock_copy(model).eval()
    for layer in stock.base_model.encoder.layer:
        assert type(layer.attention.self).__name__ == "BigBirdBlockSparseAttention"
    long = {"input_ids": torch.randint(5, 120, (2, 40), generator=torch.Generator().manual_seed(1))}
    assert torch.allclose(model(**long).logits, stock(**long).logits, atol=1e-5)


def test_a_copy_whose_weights_land_in_the_wrong_places_is_refused(monkeypatch):
    """The copy is checked on a probe batch: kept FFN neurons placed in the wrong rows (their
    input weights reversed, their output columns and biases not) give other outputs, and no copy."""
    import compress.pruning.stock_copy as sc

    real = sc._element_sources

    def misplaced(*args):
        sources = real(*args)
        name = "encoder.layer.0.intermediate.dense.weight"
        sources[name] = sources[name].flip(0)
        return sources

    model = _tiny_bert()
    remove_structured(model, [[1, 3], [0, 2], [0]], [[0, 5, 7], [1, 2], [4]])
    monkeypatch.setattr(sc, "_element_sources", misplaced)
    with pytest.raises(ModelError, match="differs from it by"):
        stock_copy(model)
