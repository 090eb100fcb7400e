"""Masked-LM pieces: corpus reading, blocks, 15% / 80-10-10 masking, tied head, held-out loss."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from compress.core.errors import DataError
from compress.models.loading import packaged_model_path
from compress.pruning.mlm import (
    HEAD_FILE,
    MaskedLMObjective,
    build_mlm_model,
    corpus_files,
    head_state,
    heldout_loss,
    make_blocks,
    mask_heldout,
    read_corpus,
    split_heldout,
)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


def test_corpus_files_and_errors(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "b.raw").write_text("second file\n")
    (d / "a.txt").write_text("first line\n\n  \nsecond line\n")
    (d / "skip.json").write_text("{}")
    assert [f.name for f in corpus_files([str(d)])] == ["a.txt", "b.raw"]
    assert read_corpus([str(d)]) == ["first line", "second line", "second file"]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="corpus folder .* has no text files"):
        read_corpus([str(empty)])
    (empty / "blank.txt").write_text("\n   \n")
    with pytest.raises(DataError, match="is empty"):
        read_corpus([str(empty)])
    with pytest.raises(DataError, match="corpus not found"):
        read_corpus([str(tmp_path / "nope.txt")])
    with pytest.raises(DataError, match="needs --corpus"):
        read_corpus([])


def test_split_heldout_is_the_tail():
    lines = [str(i) for i in range(100)]
    tr, ho = split_heldout(lines, 0.05)
    assert ho == ["95", "96", "97", "98", "99"] and tr == lines[:95]
    tr, ho = split_heldout(["a", "b"], 0.05)
    assert (tr, ho) == (["a"], ["b"])


def test_blocks_concatenate_in_order(tok):
    lines = ["the cat sat on the mat"] * 30
    blocks = make_blocks(tok, lines, block_size=16)
    flat = [t for b in blocks for t in b["input_ids"][1:-1]]
    assert flat == tok(" ".join(lines), add_special_tokens=False)["input_ids"][:len(flat)]
    assert all(b["input_ids"][0] == tok.cls_token_id and b["input_ids"][-1] == tok.sep_token_id
               for b in blocks)
    assert all(len(b["input_ids"]) == 16 for b in blocks[:-1])
    assert len(make_blocks(tok, lines, 16, max_blocks=3)) == 3


def test_masking_rates_15_percent_80_10_10(tok):
    lines = [f"sentence number {i} talks about rivers , hills and the sea ." for i in range(600)]
    blocks = make_blocks(tok, lines, block_size=64)
    masked = mask_heldout(tok, blocks, seed=0)
    n_tok = sel = as_mask = unchanged = 0
    for b, m in zip(blocks, masked):
        for orig, new, lab in zip(b["input_ids"][1:-1], m["input_ids"][1:-1], m["mlm_labels"][1:-1]):
            n_tok += 1
            if lab != -100:
                sel += 1
                assert lab == orig
                as_mask += new == tok.mask_token_id
                unchanged += new == orig
            else:
                assert new == orig
        assert m["mlm_labels"][0] == -100 and m["mlm_labels"][-1] == -100  # [CLS]/[SEP] never
    assert n_tok > 5000
    assert abs(sel / n_tok - 0.15) < 0.015
    assert abs(as_mask / sel - 0.8) < 0.04
    assert abs(unchanged / sel - 0.1) < 0.03
    assert mask_heldout(tok, blocks, seed=0) == masked  # the same inputs for every model scored


def test_mlm_head_is_fresh_and_tied(tok):
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    enc = BertModel(cfg)
    mlm = build_mlm_model(enc)
    assert mlm.bert is enc and enc.pooler is not None
    assert mlm.cls.predictions.decoder.weight is enc.embeddings.word_embeddings.weight
    names = [n for n, _ in mlm.named_parameters()]
    assert "bert.embeddings.word_embeddings.weight" in names
    assert not any("decoder.weight" in n for n in names)  # tied: one parameter
    # the same fresh head every time (dense baseline and pruned run start alike)
    h2 = build_mlm_model(BertModel(cfg)).cls.predictions.transform.dense.weight
    assert torch.equal(mlm.cls.predictions.transform.dense.weight, h2)


def test_pretrained_head_comes_from_the_checkpoint_or_the_saved_file(tok, tmp_path):
    from transformers import BertForMaskedLM

    from compress.pruning.mlm import pretrained_head, save_head

    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    torch.manual_seed(3)
    BertModel(cfg).save_pretrained(tmp_path / "encoder")  # MiniLM-like: no head
    assert pretrained_head(str(tmp_path / "encoder")) == (None, "fresh")
    hub = BertForMaskedLM(cfg)  # a BERT checkpoint with its head, as bert-base-uncased on the hub
    with torch.no_grad():
        hub.cls.predictions.transform.dense.weight.normal_()
        hub.cls.predictions.bias.uniform_()
    hub.save_pretrained(tmp_path / "hub")
    head, source = pretrained_head(str(tmp_path / "hub"))
    assert source == "checkpoint" and not any(k.startswith("predictions.decoder.") for k in head)
    enc = BertModel.from_pretrained(tmp_path / "hub")
    mlm = build_mlm_model(enc, head)
    for name, value in hub.cls.state_dict().items():
        if name != "predictions.decoder.weight":  # decoder.bias is predictions.bias: checked too
            assert torch.equal(mlm.cls.state_dict()[name], value), name
    assert mlm.cls.predictions.decoder.weight is enc.embeddings.word_embeddings.weight  # still tied
    assert not torch.equal(mlm.cls.predictions.transform.dense.weight,
                           build_mlm_model(BertModel(cfg)).cls.predictions.transform.dense.weight)
    # an earlier pre-training run's head wins over the checkpoint's
    with torch.no_grad():
        mlm.cls.predictions.transform.dense.weight.add_(1.0)
    save_head(mlm, tmp_path / "hub")
    head2, source2 = pretrained_head(str(tmp_path / "hub"))
    assert source2 == HEAD_FILE
    assert torch.equal(head2["predictions.transform.dense.weight"],
                       head_state(mlm)["predictions.transform.dense.weight"])


def test_sharded_checkpoint_is_read_from_its_index(tmp_path):
    import json

    from compress.pruning.mlm import _local_has_no_head

    index = {"metadata": {}, "weight_map": {"bert.embeddings.word_embeddings.weight": "a.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _local_has_no_head(str(tmp_path))
    index["weight_map"]["cls.predictions.bias"] = "b.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert not _local_has_no_head(str(tmp_path))
    assert not _local_has_no_head("org/some-hub-model")  # a hub id: from_pretrained decides


def test_a_head_of_another_width_is_a_one_line_error(tok):
    from compress.core.errors import ModelError

    small = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32)
    wide = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32)
    head = head_state(build_mlm_model(BertModel(small)))
    with pytest.raises(ModelError, match="does not fit this encoder"):
        build_mlm_model(BertModel(wide), head)


def test_heldout_loss_untrained_head_near_uniform_and_training_masks_vary(tok):
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    torch.manual_seed(0)
    obj = MaskedLMObjective(build_mlm_model(BertModel(cfg)), tok)
    held = mask_heldout(tok, make_blocks(tok, ["a quiet river runs past the old mill"] * 40, 32), seed=1)
    loss = heldout_loss(obj, tok, held, batch_size=4)
    assert loss == pytest.approx(heldout_loss(obj, tok, held, batch_size=8), rel=1e-5)  # batch-independent
    assert abs(loss - math.log(tok.vocab_size)) < 1.0  # random head: close to uniform
    ids = torch.tensor([held[0]["input_ids"]] * 4)
    a, _ = obj.mask(ids)
    b, _ = obj.mask(ids)
    assert not torch.equal(a, b)  # dynamic masking: fresh masks per step


def test_every_trainable_parameter_gets_a_gradient_from_the_mlm_loss(tok):
    # DDP (several processes) stops at the second step when a trainable parameter got no gradient:
    # the encoder's pooler is not on the MLM loss's path, so it is frozen, not left waiting.
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    torch.manual_seed(0)
    obj = MaskedLMObjective(build_mlm_model(BertModel(cfg)), tok)
    block = make_blocks(tok, ["a quiet river runs past the old mill"] * 40, 32)[0]
    ids = torch.tensor([block["input_ids"]] * 4)
    out = obj(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    out.loss.backward()
    no_grad = [n for n, p in obj.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []
    assert all(not p.requires_grad for p in obj.mlm.bert.pooler.parameters())
