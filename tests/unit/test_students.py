"""Every registered student: output shape, a gradient step, padding invariance, save/load;
hand-computed FLOPs; logreg features against scikit-learn; the registry's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.core.errors import UsageError
from compress.distill.embeddings import vectors_for_vocab
from students.registry import (
    STUDENTS,
    build_student,
    get_student,
    load_student,
    parse_options,
    save_student,
    student_config,
)

VOCAB = 50
SPECIAL = (0, 1, 2)  # pad, cls, sep in these tests


def _make(name, num_labels=3, **extra):
    opts = {"num_labels": num_labels, **extra}
    if name == "logreg":
        opts.setdefault("bigram_buckets", 16)
        opts.setdefault("special_ids", SPECIAL)
    else:
        opts.setdefault("embed_dim", 8)
    if name == "bilstm":
        opts.setdefault("hidden_size", 6)
        opts.setdefault("mlp_hidden", 5)
    if name == "kimcnn":
        opts.setdefault("num_filters", 4)
    torch.manual_seed(0)
    model = build_student(name, student_config(name, opts), VOCAB)
    model.prepare([[1, 5, 6, 7, 2], [1, 5, 8, 2], [1, 9, 10, 11, 12, 2]])
    return model


def _batch():
    ids = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0], [1, 11, 2, 0, 0, 0]])
    return ids, (ids != 0).long()


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_output_shape(name):
    model = _make(name)
    ids, mask = _batch()
    assert model(ids, mask).shape == (3, 3)
    assert model(ids).shape == (3, 3)
    assert _make(name, num_labels=90)(ids, mask).shape == (3, 90)


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_gradient_step_lowers_loss_and_changes_parameters(name):
    model = _make(name).eval()  # no dropout: the step's effect is deterministic
    ids, mask = _batch()
    y = torch.tensor([0, 1, 2])
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss0 = torch.nn.functional.cross_entropy(model(ids, mask), y)
    loss0.backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.step()
    with torch.no_grad():
        loss1 = torch.nn.functional.cross_entropy(model(ids, mask), y)
    assert loss1.item() < loss0.item()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert changed


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_padding_does_not_change_logits(name):
    model = _make(name).eval()
    ids = torch.tensor([[1, 9, 10, 11, 2]])
    padded = torch.tensor([[1, 9, 10, 11, 2, 0, 0, 0]])
    with torch.no_grad():
        a = model(ids)
        b = model(padded, (padded != 0).long())
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_save_and_load_roundtrip(name, tmp_path):
    model = _make(name).eval()
    ids, mask = _batch()
    save_student(model, name, tmp_path / "student", {"task": "t", "label_names": ["a", "b", "c"]})
    loaded, info = load_student(tmp_path)  # accepts the run folder holding student/
    assert info["student"] == name and info["label_names"] == ["a", "b", "c"]
    with torch.no_grad():
        assert torch.allclose(loaded(ids, mask), model(ids, mask))


def test_bilstm_weight_drop_is_dropconnect_on_hidden_weights():
    model = _make("bilstm", weight_drop=0.5, embed_dropout=0.0, dropout=0.0)
    ids, mask = _batch()
    w = model.lstm.weight_hh_l0.detach().clone()
    model.train()
    torch.manual_seed(1)
    a = model(ids, mask)
    b = model(ids, mask)
    assert not torch.allclose(a, b)  # a different mask on weight_hh each call
    assert torch.equal(model.lstm.weight_hh_l0, w)  # the raw weights are not modified
    a.sum().backward()
    assert model.lstm.weight_hh_l0.grad is not None and model.lstm.weight_hh_l0.grad.abs().sum() > 0
    model.eval()
    assert torch.allclose(model(ids, mask), model(ids, mask))


def test_bilstm_last_pooling_uses_real_last_token():
    model = _make("bilstm", pooling="last").eval()
    ids = torch.tensor([[1, 9, 10, 2]])
    padded = torch.tensor([[1, 9, 10, 2, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(ids), model(padded, (padded != 0).long()), atol=1e-6)


def test_embedding_dropout_drops_word_types():
    from students.base import embed_with_dropout

    emb = torch.nn.Embedding(10, 4)
    torch.nn.init.ones_(emb.weight)
    ids = torch.tensor([[3, 3, 3, 4, 4, 4]])
    torch.manual_seed(0)
    for _ in range(20):
        out = embed_with_dropout(emb, ids, 0.5, True)
        # every occurrence of a word type is kept (x2) or dropped (0) together
        assert len(set(out[0, :3, 0].tolist())) == 1 and len(set(out[0, 3:, 0].tolist())) == 1
        assert set(out[0, :, 0].tolist()) <= {0.0, 2.0}
    assert torch.equal(embed_with_dropout(emb, ids, 0.5, False), emb(ids))


def test_flops_formulas_by_hand():
    lstm = build_student("bilstm", student_config("bilstm", {"num_labels": 2, "embed_dim": 10,
                                                             "hidden_size": 4, "mlp_hidden": 3}), 20)
    # 2 directions x 7 tokens x 4 gates x 4 x (10 + 4) MACs + MLP 8x3 + 3x2, times 2
    assert lstm.flops_per_example(7) == 2 * (2 * 7 * 4 * 4 * 14 + 8 * 3 + 3 * 2)
    cnn = build_student("kimcnn", student_config("kimcnn", {"num_labels": 2, "embed_dim": 10,
                                                            "num_filters": 5}), 20)
    # widths 3,4,5 on 7 tokens padded by w - 1: 7 windows each of w x 10 x 5 MACs; output 15 x 2
    assert cnn.flops_per_example(7) == 2 * (7 * 3 * 50 + 7 * 4 * 50 + 7 * 5 * 50 + 15 * 2)


def test_logreg_features_equal_sklearn_tfidf():
    from sklearn.feature_extraction.text import TfidfVectorizer

    train = [[1, 5, 6, 7, 2], [1, 5, 8, 2, 9, 2], [1, 9, 10, 11, 12, 2], [1, 5, 5, 6, 2]]
    model = _make("logreg")
    model.prepare(train)
    test_seqs = [[1, 5, 6, 8, 2], [1, 9, 5, 2, 13, 5, 2]]  # 13 unseen in training
    # sklearn on the same analyzer, independently of the module's buffers
    vec = TfidfVectorizer(analyzer=model.analyze, lowercase=False).fit(train)
    expected = vec.transform(test_seqs).toarray()
    width = max(len(s) for s in test_seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in test_seqs])
    got = model.features(ids, (ids != 0).long()).numpy()
    cols = {f: c for f, c in vec.vocabulary_.items()}
    for row in range(2):
        ours = {f: got[row, f] for f in np.nonzero(got[row])[0]}
        theirs = {f: expected[row, c] for f, c in cols.items() if expected[row, c] != 0}
        assert set(ours) == set(theirs)
        for f in ours:
            assert ours[f] == pytest.approx(theirs[f], rel=1e-5)


def test_logreg_gather_forward_equals_the_dense_tfidf_path():
    """The inference path (gather + pairwise norm) gives the logits of the explicit tf-idf vector,
    with repeated unigrams and bigrams, padding, special tokens and unseen ids."""
    torch.manual_seed(0)
    model = _make("logreg")
    model.prepare([[1, 5, 6, 7, 2], [1, 5, 8, 2, 9, 2], [1, 9, 10, 11, 12, 2], [1, 5, 5, 6, 2]])
    with torch.no_grad():
        model.linear.weight.normal_()
        model.linear.bias.normal_()
    model.eval()
    ids = torch.tensor([[1, 5, 6, 5, 6, 5, 6, 2], [1, 9, 5, 2, 13, 5, 2, 0], [1, 2, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    dense = model.linear(model.features(ids, mask))
    got = model(ids, mask)
    assert torch.allclose(got, dense, atol=1e-6)
    assert torch.allclose(got[2], model.linear.bias)  # no real token: all-zero features


def test_logreg_flops_count_the_gather_path_by_hand():
    model = _make("logreg")
    labels = model.config.num_labels
    n = 2 * 7 - 1  # 7 unigram and 6 bigram positions
    assert model.flops_per_example(7) == n + 2 * n * labels + 2 * n * n + 2 * n


def test_logreg_bigrams_do_not_cross_special_tokens():
    model = _make("logreg")
    feats = model.analyze([1, 5, 2, 6, 2])
    assert feats[:2] == [5, 6] and len(feats) == 2  # no bigram (5, 6) across [SEP]


def test_registry_errors():
    with pytest.raises(UsageError, match="unknown student 'gpt'; known students: bilstm, kimcnn, logreg"):
        get_student("gpt")
    with pytest.raises(UsageError, match="unknown option 'hidden'"):
        student_config("bilstm", {"hidden": "3"})
    with pytest.raises(UsageError, match="pooling"):
        student_config("bilstm", {"pooling": "mean"})
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_options(("hidden_size",))
    assert student_config("kimcnn", parse_options(("widths=2;3",))).widths == (2, 3)


@pytest.mark.parametrize("name", ["bilstm", "kimcnn", "logreg"])
def test_output_layer_is_the_one_that_makes_the_logits(name):
    model = _make(name)
    layer = model.output_layer()
    assert isinstance(layer, torch.nn.Linear) and layer.out_features == model.config.num_labels
    ids = torch.randint(5, 50, (3, 9))
    model.eval()
    before = model(ids)
    with torch.no_grad():
        layer.bias.add_(torch.arange(layer.out_features, dtype=layer.bias.dtype))
    # only this layer's bias moved, and it shifts every logit by exactly that amount
    torch.testing.assert_close(model(ids) - before, torch.arange(layer.out_features).float().expand(3, -1))


def test_multilabel_default_weight_decay_is_divided_by_the_label_count():
    logreg = STUDENTS["logreg"]
    assert logreg.weight_decay_for(2, multilabel=False) == logreg.default_weight_decay == 5e-5
    assert logreg.weight_decay_for(90, multilabel=True) == pytest.approx(2e-6 / 90)
    assert logreg.weight_decay_for(1, multilabel=True) == pytest.approx(2e-6)
    assert (logreg.lr_for(False), logreg.lr_for(True)) == (3e-2, 1.0)
    assert STUDENTS["bilstm"].weight_decay_for(90, multilabel=True) == 0.0
    assert STUDENTS["kimcnn"].lr_for(True) == STUDENTS["kimcnn"].lr_for(False) == 1e-3
    # Why: with the mean BCE over L labels plus (wd / L)/2 ||W||^2, label j's weight row gets
    # 1/L of the gradient of its own binary problem with penalty wd/2 ||w_j||^2 -- the same
    # direction and the same balance of loss against penalty, whatever L is.
    g = torch.Generator().manual_seed(0)
    n, d, L, j, wd = 16, 5, 7, 3, 0.3
    x, y = torch.randn(n, d, generator=g), (torch.rand(n, L, generator=g) > 0.7).float()
    w = torch.randn(L, d, generator=g, requires_grad=True)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    multi = bce(x @ w.t(), y) + wd / L / 2 * w.pow(2).sum()
    (grad_multi,) = torch.autograd.grad(multi, w)
    wj = w[j].detach().clone().requires_grad_(True)
    single = bce(x @ wj, y[:, j]) + wd / 2 * wj.pow(2).sum()
    (grad_single,) = torch.autograd.grad(single, wj)
    torch.testing.assert_close(grad_multi[j] * L, grad_single)


def test_vectors_file_mapped_onto_wordpiece_vocab():
    vectors = {"film": np.array([1.0, 2.0], dtype=np.float32), "good": np.array([3.0, 4.0], np.float32)}
    vocab = {"[PAD]": 0, "film": 1, "Good": 2, "##good": 3, "zzz": 4}
    mat, coverage = vectors_for_vocab(vectors, vocab, pad_id=0)
    assert mat.shape == (5, 2) and coverage == pytest.approx(3 / 5)
    assert mat[1].tolist() == [1.0, 2.0] and mat[2].tolist() == [3.0, 4.0] and mat[3].tolist() == [3.0, 4.0]
    assert mat[0].tolist() == [0.0, 0.0]


def test_vectors_text_file_with_word2vec_header(tmp_path):
    from compress.core.errors import DataError
    from compress.distill.embeddings import initial_embeddings, read_vectors
    from compress.models.loading import load_tokenizer

    f = tmp_path / "vec.txt"
    f.write_text("3 4\nfilm 1 2 3 4\nthe 0.5 0.5 0.5 0.5\nplay 1 1 1 1\n")
    assert set(read_vectors(f)) == {"film", "the", "play"}
    tok = load_tokenizer("minilm")
    mat, info = initial_embeddings(str(f), None, tok)
    vocab = tok.get_vocab()
    assert mat.shape == (len(vocab), 4) and info["dim"] == 4
    assert mat[vocab["film"]].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert mat[vocab["##play"]].tolist() == [1.0, 1.0, 1.0, 1.0]  # a ## piece takes its word's vector
    assert mat[tok.pad_token_id].abs().sum() == 0
    assert 0 < info["vocab_coverage"] < 0.01
    bad = tmp_path / "bad.txt"
    bad.write_text("film 1 2\nthe 1 2 3\n")
    with pytest.raises(DataError, match="bad.txt:2"):
        read_vectors(bad)


@pytest.mark.parametrize("name", ["logreg", "kimcnn"])
def test_onnx_export_matches_torch_on_another_padded_batch(name, tmp_path):
    import warnings

    ort = pytest.importorskip("onnxruntime")
    model = _make(name).eval()
    ids, mask = _batch()
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids[:1], mask[:1]), str(path), input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        expected = model(ids, mask).numpy()
    assert np.abs(got - expected).max() < 1e-5


def test_embedding_width_is_known_before_training(tiny_bert, tmp_path):
    from compress.distill.embeddings import check_embed_dim, embedding_width

    assert embedding_width("random", str(tiny_bert)) is None
    assert embedding_width("teacher", str(tiny_bert)) == 32  # the tiny BERT's hidden size
    f = tmp_path / "vec.txt"
    f.write_text("2 3\nfilm 0.1 0.2 0.3\nplay 1 2 3\n")
    assert embedding_width(str(f), str(tiny_bert)) == 3
    check_embed_dim({"embed_dim": "3"}, 3)
    check_embed_dim({}, 3)
    with pytest.raises(UsageError, match="embed_dim=16 differs from the 3-d initial embeddings"):
        check_embed_dim({"embed_dim": "16"}, 3)
