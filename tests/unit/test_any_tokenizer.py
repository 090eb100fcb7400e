"""Special ids, model inputs and SQuAD windows taken from the tokenizer, on the three tokenizer kinds
of tests/tiny_encoders.py: WordPiece (BERT), byte-level BPE (RoBERTa, ModernBERT) and
SentencePiece-style Unigram (DeBERTa-v3, XLM-R). The expected ids are looked up by the tokens'
literal strings, not through the attributes the code under test reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.distill.augment import mask_token_of
from compress.distill.embeddings import vectors_for_vocab
from compress.qa.features import collate_features, prepare_eval_features, prepare_train_features
from compress.recipes.distill import flops_input_ids, non_feature_ids
from compress.tasks.qa import QAExample
from students.logreg import LogRegConfig, LogRegStudent
from tests.conftest import TINY_CONTEXT
from tests.tiny_encoders import build

# arch -> (cls, sep, pad, unk, mask) as the family writes them
SPECIALS = {
    "bert": ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"),
    "roberta": ("<s>", "</s>", "<pad>", "<unk>", "<mask>"),
    "modernbert": ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"),
    "deberta-v2": ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"),
    "albert": ("[CLS]", "[SEP]", "<pad>", "<unk>", "[MASK]"),
    "xlm-roberta": ("<s>", "</s>", "<pad>", "<unk>", "<mask>"),
}


@pytest.fixture(scope="module")
def tokenizers():
    return {arch: build(arch)[1] for arch in SPECIALS}


def _ids(tok, tokens) -> list[int]:
    vocab = tok.get_vocab()
    return [vocab[t] for t in tokens]


@pytest.mark.parametrize("arch", list(SPECIALS))
def test_non_feature_ids_are_exactly_cls_sep_pad_unk(tokenizers, arch):
    tok = tokenizers[arch]
    cls, sep, pad, unk, mask = _ids(tok, SPECIALS[arch])
    assert non_feature_ids(tok) == tuple(sorted({cls, sep, pad, unk}))
    assert mask not in non_feature_ids(tok)
    assert mask_token_of(tok) == SPECIALS[arch][4]


@pytest.mark.parametrize("arch", ["roberta", "deberta-v2"])
def test_logreg_features_drop_the_special_ids_and_keep_the_mask(tokenizers, arch):
    """The student's features of ``<s> film <mask> movie </s>`` are the ids of film, <mask> and movie
    and their two bigrams: none touches [CLS]/[SEP] (or padding), the mask is a word."""
    tok = tokenizers[arch]
    mask = tok.mask_token
    enc = tok([f"film{mask} movie", "film"], padding=True)
    ids = enc["input_ids"]
    cls, sep, pad, _, mask_id = _ids(tok, SPECIALS[arch])
    assert ids[0][0] == cls and mask_id in ids[0] and pad in ids[1]
    words = [i for i in ids[0] if i not in (cls, sep, pad)]
    student = LogRegStudent(LogRegConfig(num_labels=2, bigram_buckets=7, special_ids=non_feature_ids(tok)),
                            len(tok))
    v = len(tok)
    expected = words + [v + (a * 1_000_003 + b) % 7 for a, b in zip(words, words[1:])]
    assert sorted(student.analyze(ids[0])) == sorted(expected)
    # the graph computes the same bag: a row of ones as idf gives the raw counts, l2-normalised
    student.idf.fill_(1.0)
    feats = student.features(torch.tensor(ids), torch.tensor(enc["attention_mask"]))
    counts = np.bincount(expected, minlength=student.num_features).astype(np.float32)
    torch.testing.assert_close(feats[0], torch.from_numpy(counts / np.linalg.norm(counts)))
    assert feats[0, [cls, sep, pad]].abs().sum() == 0 and feats[0, mask_id] > 0


@pytest.mark.parametrize("arch", list(SPECIALS))
def test_flops_input_ids_are_in_the_vocabulary(tokenizers, arch):
    tok = tokenizers[arch]
    cls, sep, *_ = _ids(tok, SPECIALS[arch])
    ids = flops_input_ids(tok, 6)
    assert ids.shape == (1, 6) and ids[0, 0] == cls and ids[0, -1] == sep
    assert int(ids.max()) < len(tok) and not set(ids[0, 1:-1].tolist()) & set(tok.all_special_ids)


def test_word_vectors_find_bpe_and_sentencepiece_pieces():
    vectors = {"film": np.array([1.0, 2.0], np.float32), "good": np.array([3.0, 4.0], np.float32)}
    vocab = {"<pad>": 0, "\u0120film": 1, "\u2581Good": 2, "##good": 3, "\u0120": 4}
    mat, coverage = vectors_for_vocab(vectors, vocab, pad_id=0)
    assert coverage == pytest.approx(3 / 5)
    assert mat[1].tolist() == [1.0, 2.0] and mat[2].tolist() == [3.0, 4.0] and mat[3].tolist() == [3.0, 4.0]
    assert mat[0].tolist() == [0.0, 0.0]


def _squad_example(answer: str, question: str = "Tower?") -> QAExample:
    return QAExample("q", "T", TINY_CONTEXT, question, (answer,), (TINY_CONTEXT.index(answer),))


def test_a_window_with_no_room_for_the_stride_is_a_data_error(tokenizers):
    """The byte-level BPE spends most of 24 tokens on this question; the Rust tokenizer then panics
    (a BaseException), which must still become the one-line DataError."""
    from compress.core.errors import DataError

    with pytest.raises(DataError, match="raise --max-length or lower --doc-stride"):
        prepare_train_features(tokenizers["roberta"], [_squad_example("Paris", "What does Paris have?")],
                               max_length=24, doc_stride=8)


@pytest.mark.parametrize("arch", ["roberta", "modernbert", "deberta-v2", "xlm-roberta"])
def test_squad_windows_without_token_type_ids(tokenizers, arch):
    """Labels and offsets come from sequence_ids: in every window the labelled tokens' offsets cover
    exactly the answer, ``context_mask`` marks the context tokens (RoBERTa: after ``</s></s>``), and
    only the inputs the tokenizer declares are present."""
    tok = tokenizers[arch]
    ex = _squad_example("Eiffel Tower")
    feats = prepare_train_features(tok, [ex], max_length=24, doc_stride=8)
    assert len(feats) > 1
    has_types = "token_type_ids" in tok.model_input_names
    for f in feats:
        assert ("token_type_ids" in f) == has_types
        enc = tok(ex.question, TINY_CONTEXT, truncation="only_second", max_length=24, stride=8,
                  return_overflowing_tokens=True, return_offsets_mapping=True)
        k = next(i for i, row in enumerate(enc["input_ids"]) if row == f["input_ids"])
        seq = enc.sequence_ids(k)
        assert f["context_mask"] == [int(s == 1) for s in seq]
        first_context = seq.index(1)
        if arch in ("roberta", "xlm-roberta"):  # <s> Q </s></s> C </s>
            assert f["input_ids"][first_context - 2:first_context] == _ids(tok, ["</s>", "</s>"])
        if f["start_positions"]:
            offs = enc["offset_mapping"][k]
            s, e = offs[f["start_positions"]][0], offs[f["end_positions"]][1]
            assert TINY_CONTEXT[s:e].strip() == "Eiffel Tower"
    assert any(f["start_positions"] for f in feats)
    batch = collate_features(tok, feats)
    assert batch["context_mask"].shape == batch["input_ids"].shape
    assert (batch["context_mask"].bool() & ~batch["attention_mask"].bool()).sum() == 0
    for f in prepare_eval_features(tok, [ex], max_length=24, doc_stride=8):
        kept = [o for o in f["offset_mapping"] if o is not None]
        assert f["offset_mapping"][0] is None and kept and len(kept) < len(f["input_ids"])


def test_match_tokenizer_inputs_drops_what_the_forward_does_not_take():
    """DistilBERT's forward takes no token_type_ids, though the WordPiece tokenizer it is paired with
    here emits them; ALBERT's takes them."""
    from transformers import AutoModel

    from compress.models.loading import match_tokenizer_inputs

    for arch, expected in (("distilbert", ["input_ids", "attention_mask"]),
                           ("albert", ["input_ids", "token_type_ids", "attention_mask"])):
        cfg, tok = build(arch)
        match_tokenizer_inputs(tok, AutoModel.from_config(cfg))
        assert tok.model_input_names == expected
        assert sorted(tok("a film", "a movie").keys()) == sorted(expected)


def test_hl_aacl_draws_its_candidate_spans_from_the_context_mask(tokenizers, monkeypatch):
    """RoBERTa has no token_type_ids; hl-aacl's top-k spans are restricted to the windows' context
    tokens through ``context_mask`` (from sequence_ids) instead."""
    from transformers import AutoModelForQuestionAnswering

    import compress.qa.objectives as objectives

    tok = tokenizers["roberta"]
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_config(build("roberta")[0])
    feats = prepare_train_features(tok, [_squad_example("Eiffel Tower")], max_length=32, doc_stride=8)
    batch = collate_features(tok, feats)
    assert "token_type_ids" not in batch
    seen, real = [], objectives.topk_spans
    monkeypatch.setattr(objectives, "topk_spans", lambda *a: seen.append(a[-1]) or real(*a))
    loss, _ = objectives.HLAACLObjective(k=5).loss(model, batch)
    assert torch.isfinite(loss)
    assert torch.equal(seen[0], batch["context_mask"].bool())
    shape = batch["input_ids"].shape
    starts, ends, _ = real(torch.randn(shape), torch.randn(shape), 5, 30, seen[0])
    assert batch["context_mask"].gather(1, starts).all() and batch["context_mask"].gather(1, ends).all()
