"""Sentence-embedding models: pooling read from the sentence-transformers config, the saved folder
that sentence-transformers opens, the scores against hand-computed values, the label-free Fisher
against the exact Gauss-Newton diagonal, the distillation loss and the static-embedding student."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from compress.core.errors import ModelError, UsageError
from compress.embedding.model import (
    Pooling,
    SentenceEncoder,
    embed,
    load_sentence_encoder,
    pool,
    read_pooling,
    save_sentence_transformer,
)
from compress.embedding.scores import embedding_scores
from compress.tasks.base import TextDataset
from compress.tasks.embedding import EmbeddingEval
from compress.tasks.retrieval import ReQADataset
from tests.tiny_encoders import ARCHITECTURES

TEXTS = ["the cat sat on the mat", "a dog ran", "stocks fell sharply today", "rain is expected tomorrow"]


def write_st_config(folder: Path, mode: str, normalize: bool, max_length: int = 64) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length}))


@pytest.fixture()
def st_folder(tiny_bert, tmp_path) -> Path:
    import shutil

    folder = tmp_path / "st"
    shutil.copytree(tiny_bert, folder)
    write_st_config(folder, "cls", normalize=False, max_length=48)
    return folder


def test_pool_modes_match_hand_computed_values():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[2.0, -1.0]]))
    assert torch.allclose(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(pool(hidden, mask, "max"), torch.tensor([[3.0, 2.0]]))  # the padded 100 is ignored


def test_pooling_is_read_from_the_sentence_transformers_config(st_folder, tiny_bert):
    assert read_pooling(str(st_folder)) == Pooling("cls", False, 48, "sentence-transformers config")
    assert read_pooling(str(tiny_bert)) == Pooling()  # no modules.json: mean + normalise, said so
    assert read_pooling(str(tiny_bert)).source == "default"


def test_unsupported_sentence_transformers_pipelines_are_refused(st_folder):
    modules = json.loads((st_folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"})
    (st_folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelError, match="LSTM"):
        read_pooling(str(st_folder))
    (st_folder / "modules.json").write_text("{not json")
    with pytest.raises(ModelError, match="not readable JSON"):
        read_pooling(str(st_folder))


@pytest.mark.parametrize("edit, words", [
    (lambda m: m[1].update(path="../../x"), "has path '../../x'"),
    (lambda m: m[1].update(path="/etc"), "has path '/etc'"),
    (lambda m: m[1].pop("path"), "has path None"),
    (lambda m: m[1].update(type=7), "entry 1 has no module type"),
])
def test_modules_json_entries_outside_the_folder_or_malformed_are_refused(st_folder, edit, words):
    from compress.embedding.model import read_dense

    modules = json.loads((st_folder / "modules.json").read_text())
    edit(modules)
    (st_folder / "modules.json").write_text(json.dumps(modules))
    for read in (read_pooling, read_dense):
        with pytest.raises(ModelError, match=words):
            read(str(st_folder))


def test_max_seq_length_must_be_a_number_and_is_capped_at_the_positions(st_folder):
    (st_folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": "long"}))
    with pytest.raises(ModelError, match="max_seq_length 'long'"):
        read_pooling(str(st_folder))
    (st_folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 100000}))
    positions = json.loads((st_folder / "config.json").read_text())["max_position_embeddings"]
    assert read_pooling(str(st_folder)).max_length == positions


@pytest.mark.parametrize("mode,normalize", [("cls", False), ("mean", True), ("max", True)])
def test_saved_folder_opens_in_sentence_transformers_with_the_same_embeddings(tiny_bert, tmp_path, mode,
                                                                              normalize):
    from sentence_transformers import SentenceTransformer

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    model.pooling = Pooling(mode, normalize, 40)
    ours = embed(model, tok, TEXTS)
    folder = tmp_path / "saved"
    save_sentence_transformer(model, tok, folder, {"task": "embedding"})
    st = SentenceTransformer(str(folder), device="cpu")
    assert st.max_seq_length == 40
    theirs = torch.as_tensor(st.encode(TEXTS))
    assert torch.allclose(theirs, ours, atol=1e-5)
    reloaded, _, meta = load_sentence_encoder(str(folder))
    assert reloaded.pooling == Pooling(mode, normalize, 40, "sentence-transformers config")
    assert meta["pooling"]["mode"] == mode
    if normalize:
        assert torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_structured_pruned_encoder_saves_as_a_folder_sentence_transformers_opens(tiny_encoder, arch,
                                                                                  tmp_path):
    """Every tiny architecture: the folder holds the pruned weights (compress_<type>) and, where
    modules.json sends sentence-transformers, the stock copy, which gives the same embeddings."""
    from sentence_transformers import SentenceTransformer

    from compress.pruning.structured import layer_sizes, remove_structured

    model, tok, _ = load_sentence_encoder(str(tiny_encoder(arch)))
    sizes = layer_sizes(model.encoder)
    remove_structured(model.encoder, [[h for h in range(n) if h % 2] for n in sizes["heads"]],
                      [list(range(0, n, 2)) for n in sizes["ffn"]])
    ours = embed(model, tok, TEXTS)
    folder = tmp_path / "pruned"
    save_sentence_transformer(model, tok, folder, {"task": "embedding"})
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    assert model_type.startswith("compress_")
    stock = json.loads((folder / "0_Transformer" / "config.json").read_text())
    assert stock["model_type"] == model_type.removeprefix("compress_") and "auto_map" not in stock
    assert json.loads((folder / "modules.json").read_text())[0]["path"] == "0_Transformer"
    st = SentenceTransformer(str(folder), device="cpu")
    assert not type(st[0].auto_model).__name__.startswith("Compress")
    assert torch.allclose(torch.as_tensor(st.encode(TEXTS)), ours, atol=1e-5)
    again, _, _ = load_sentence_encoder(str(folder))  # this project reads the pruned weights
    assert type(again.encoder).__name__.startswith("Compress")


def test_a_failed_stock_copy_still_saves_the_pruned_folder_and_says_why(tiny_bert, tmp_path, monkeypatch,
                                                                       capsys):
    import compress.pruning.stock_copy as stock_module
    from compress.pruning.structured import remove_structured

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    remove_structured(model.encoder, [[0, 2], [1, 2, 3]], [list(range(0, 64, 2)), list(range(40))])
    folder = tmp_path / "pruned"
    assert save_sentence_transformer(model, tok, folder, {"task": "embedding"}) is None
    assert (folder / "0_Transformer").is_dir()

    def differs(encoder):
        raise ModelError("the stock copy of CompressBertModel differs from it by 1.0e+00 of its output")

    monkeypatch.setattr(stock_module, "stock_copy", differs)
    why = save_sentence_transformer(model, tok, folder, {"task": "embedding"})  # saved again, same folder
    assert why is not None and "differs" in why and why in capsys.readouterr().err
    assert not (folder / "0_Transformer").exists()  # the earlier copy is gone, not left stale
    assert json.loads((folder / "modules.json").read_text())[0]["path"] == ""
    again, _, _ = load_sentence_encoder(str(folder))
    assert torch.allclose(embed(again, tok, TEXTS), embed(model, tok, TEXTS), atol=1e-6)


def test_a_stock_copy_that_runs_out_of_memory_does_not_cost_the_saved_folder(tiny_bert, tmp_path, monkeypatch,
                                                                            capsys):
    import compress.pruning.stock_copy as stock_module
    from compress.pruning.structured import remove_structured

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    remove_structured(model.encoder, [[0, 2], [1, 2, 3]], [list(range(0, 64, 2)), list(range(40))])

    def out_of_memory(encoder):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB\nmore detail")

    monkeypatch.setattr(stock_module, "stock_copy", out_of_memory)
    why = save_sentence_transformer(model, tok, tmp_path / "pruned", {"task": "embedding"})
    assert why == "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
    assert why in capsys.readouterr().err
    again, _, _ = load_sentence_encoder(str(tmp_path / "pruned"))
    assert torch.allclose(embed(again, tok, TEXTS), embed(model, tok, TEXTS), atol=1e-6)


def test_an_unpruned_encoder_is_saved_once_for_sentence_transformers(tiny_bert, tmp_path):
    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    save_sentence_transformer(model, tok, tmp_path / "dense", {"task": "embedding"})
    assert not (tmp_path / "dense" / "0_Transformer").exists()
    assert json.loads((tmp_path / "dense" / "modules.json").read_text())[0]["path"] == ""


def tiny_eval() -> EmbeddingEval:
    reqa = ReQADataset(["q0", "q1"], ["Q0", "Q1"], [(1,), (2,)], ["S0", "S1", "S2"], [0, 0, 0], ["c"])
    pairs = TextDataset(["A", "B", "C"], [1, 0, 1], ("not", "yes"), pairs=["A2", "B2", "C2"])
    return EmbeddingEval(reqa, pairs)


VECTORS = {"Q0": [1, 0], "Q1": [0, 1], "S0": [0.9, 0.1], "S1": [0.8, 0.3], "S2": [0, 1],
           "A": [1, 0], "A2": [1, 0], "B": [1, 0], "B2": [0.6, 0.8], "C": [0, 1], "C2": [0.28, 0.96]}


def test_scores_equal_hand_computed_values():
    def encode(texts):
        return torch.tensor([VECTORS[t] for t in texts], dtype=torch.float32)

    scores, emb = embedding_scores(encode, tiny_eval())
    # Q0 ranks S0 (cos .994) before its gold S1 (.936): rank 2; Q1 ranks its gold S2 first
    assert scores["reqa"]["p@1"] == pytest.approx(0.5)
    assert scores["reqa"]["mrr"] == pytest.approx((1 / 2 + 1) / 2)
    # pair cosines: A 1.0 (label 1), B 0.6 (label 0), C 0.96 (label 1): every positive above the negative
    assert scores["pairs"]["roc_auc"] == pytest.approx(1.0)
    assert scores["score"] == scores["reqa"]["p@1"]
    again, _ = embedding_scores(encode, tiny_eval(), reference=emb)
    assert again["cosine_to_reference"]["mean"] == pytest.approx(1.0, abs=1e-6)
    flipped, _ = embedding_scores(lambda t: -encode(t), tiny_eval(), reference=emb)
    assert flipped["cosine_to_reference"]["mean"] == pytest.approx(-1.0, abs=1e-6)


def test_fisher_of_random_projections_estimates_the_gauss_newton_diagonal(tiny_bert):
    """The projected-embedding Fisher of each head mask against sum_d (d e_d / d m)^2 computed
    exactly, one backward pass per embedding dimension."""
    from compress.embedding.losses import embedding_fisher
    from compress.embedding.model import tokens
    from compress.pruning.fisher_masks import unit_masks

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    model.eval()
    batch = tokens(tok, TEXTS[:2], 16)
    fisher = embedding_fisher(model, [batch], draws=600, seed=0)
    exact = torch.zeros(2, 4)
    heads = [torch.ones(1, 4, requires_grad=True) for _ in range(2)]
    neurons = [torch.ones(1, 64, requires_grad=True) for _ in range(2)]
    with unit_masks(model.encoder, heads, neurons):
        for row in range(2):
            single = {k: v[row:row + 1] for k, v in batch.items()}
            e = model(**single)[0]
            for d in range(e.shape[0]):
                grads = torch.autograd.grad(e[d], heads, retain_graph=True)
                exact += torch.cat(grads).pow(2)
    estimate = torch.stack(fisher.heads) / 600
    assert "Gauss-Newton" in fisher.loss
    assert torch.allclose(estimate, exact, rtol=0.25, atol=1e-3 * float(exact.max()))


def test_cosine_distillation_loss_is_zero_for_the_teacher_and_training_lowers_it(tiny_bert):
    import copy

    from compress.embedding.losses import cosine_distillation_loss
    from compress.embedding.model import tokens

    teacher, tok, _ = load_sentence_encoder(str(tiny_bert))
    student = copy.deepcopy(teacher)
    loss = cosine_distillation_loss(teacher)
    batch = tokens(tok, TEXTS, 16)
    assert float(loss(student, batch)[0]) == pytest.approx(0.0, abs=1e-6)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in student.encoder.encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    student.train()
    opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    before = float(loss(student, batch)[0])
    for _ in range(20):
        opt.zero_grad()
        value, _ = loss(student, batch)
        value.backward()
        opt.step()
    assert before > 1e-4
    assert float(loss(student, batch)[0]) < before / 2


@pytest.fixture(scope="module")
def tiny_wordpiece(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and a WordPiece tokenizer built here: the words
    of TEXTS, a few suffix pieces and two ``[unusedN]`` tokens, which Model2Vec drops."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from tests.tiny_encoders import perturb_defaults

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
    words = sorted({w for t in TEXTS + ["what flows through paris ?"] for w in t.split()})
    pieces = ["##s", "##ing", "##ed", "run", "dog"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(specials + words + pieces))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                             pad_token="[PAD]", mask_token="[MASK]")
    folder = tmp_path_factory.mktemp("tiny_wordpiece")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    perturb_defaults(BertModel(cfg)).save_pretrained(folder, safe_serialization=True)
    fast.save_pretrained(folder)
    return folder


LONG = " ".join(TEXTS[i % 4].split()[i % 3] for i in range(3000))
STATIC_TEXTS = TEXTS + ["What flows through Paris?", "the dogs running", "zzz qqq", "", "the cat " * 400,
                        LONG]


def _distilled(folder: Path, tmp_path: Path, **kwargs) -> tuple[object, Path, dict]:
    from compress.embedding.static import distil_static
    from students.static_embedding import save_static

    teacher, tok, _ = load_sentence_encoder(str(folder))
    student, report = distil_static(teacher, tok, 8, **kwargs)
    save_static(student, tmp_path / "student")
    return student, tmp_path / "student", report


@pytest.mark.parametrize("arch", ["wordpiece", "roberta", "xlm-roberta"])
def test_static_student_folder_opens_in_model2vec_and_sentence_transformers(arch, tiny_wordpiece,
                                                                            tiny_encoder, tmp_path):
    from model2vec import StaticModel
    from sentence_transformers import SentenceTransformer

    from students.static_embedding import encode_static, load_static

    folder = tiny_wordpiece if arch == "wordpiece" else tiny_encoder(arch)
    student, saved, report = _distilled(folder, tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json"} <= {
        p.name for p in saved.iterdir()}
    ours = encode_static(load_static(saved), STATIC_TEXTS, batch_size=3)
    assert ours.shape == (len(STATIC_TEXTS), 8) and ours.dtype == torch.float32
    assert torch.equal(ours, encode_static(student, STATIC_TEXTS))
    m2v = torch.as_tensor(StaticModel.from_pretrained(saved).encode(STATIC_TEXTS))
    assert (m2v - ours).abs().max() < 1e-5
    st = SentenceTransformer(str(saved), device="cpu")
    known = [i for i, t in enumerate(STATIC_TEXTS) if ours[i].any()]  # sentence-transformers: NaN for none
    assert len(known) >= len(TEXTS)
    got = torch.as_tensor(st.encode([STATIC_TEXTS[i] for i in known]))
    assert (got - ours[known]).abs().max() < 1e-5
    assert report["dims"] == 8 and report["vocab"] == len(student.tokens)


def test_bench_times_a_static_folder_with_this_projects_encoder_or_model2vecs(tiny_wordpiece, tmp_path):
    from compress.recipes.embedding_bench import EmbeddingBenchConfig, load_entry

    _, saved, _ = _distilled(tiny_wordpiece, tmp_path)
    cfg = EmbeddingBenchConfig(models=(str(saved),), batch_size=2)
    ours, theirs = load_entry(str(tmp_path), cfg), load_entry(f"model2vec:{saved}", cfg)
    assert (ours[0], theirs[0]) == ("static", "model2vec")
    a, b = ours[1](STATIC_TEXTS), theirs[1](STATIC_TEXTS)
    assert a.dtype == b.dtype == torch.float32 and (a - b).abs().max() < 1e-5
    with pytest.raises(ModelError, match="no model2vec folder there"):
        load_entry(f"model2vec:{tmp_path / 'nothing'}", cfg)


def test_static_student_is_the_mean_of_its_token_vectors_without_special_or_unknown_tokens(
        tiny_wordpiece, tmp_path):
    student, _, report = _distilled(tiny_wordpiece, tmp_path)
    from students.static_embedding import encode_static

    vocab = student.tokenizer.get_vocab()
    # Model2Vec's vocabulary: [unusedN] and the special tokens it never sees dropped, [UNK] kept (zero)
    assert not {"[unused0]", "[CLS]", "[SEP]", "[MASK]"} & set(vocab)
    assert report["teacher_vocab"] - report["vocab"] == 5
    assert not student.embedding[vocab["[UNK]"]].any() and student.max_length is None
    table = torch.as_tensor(student.embedding)
    got = encode_static(student, ["the cat sat", "the zzz cat"], batch_size=1)
    ids = [vocab[w] for w in ("the", "cat", "sat")]
    assert torch.allclose(got[0], torch.nn.functional.normalize(table[ids].mean(0), dim=0), atol=1e-6)
    assert torch.allclose(got[1], torch.nn.functional.normalize(table[ids[:2]].mean(0), dim=0), atol=1e-6)
    assert not encode_static(student, ["", "zzz"]).any()


def test_static_student_is_tuned_then_kept_in_float16_when_asked(tiny_wordpiece, tmp_path):
    from safetensors.numpy import load_file

    from compress.embedding.static import AlignConfig

    student, saved, report = _distilled(tiny_wordpiece, tmp_path, dtype="float16", texts=TEXTS,
                                        align=AlignConfig(epochs=2, batch_size=2))
    assert report["dtype"] == "float16" and report["align"]["texts"] == len(TEXTS)
    assert {v.dtype for v in load_file(str(saved / "model.safetensors")).values()} == {np.dtype("float16")}


def test_old_static_folders_and_other_folders_are_refused_in_one_line(tmp_path, tiny_bert):
    from students.static_embedding import find_static_folder, load_static

    old = tmp_path / "run" / "student"
    old.mkdir(parents=True)
    (old / "static.json").write_text("{}")
    for path in (old, tmp_path / "run"):
        with pytest.raises(ModelError, match=r"old format .* distil it again with 'compress distill") as err:
            load_static(path)
        assert "\n" not in str(err.value)
    assert find_static_folder(tiny_bert) is None
    with pytest.raises(ModelError, match="holds no static-embedding student"):
        load_static(tiny_bert)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "model2vec"}))
    with pytest.raises(ModelError, match="without model.safetensors"):
        load_static(broken)


def test_frequency_weights_follow_their_formula_on_the_students_tokens(tiny_wordpiece, tmp_path):
    from compress.embedding.static import sif_weights, text_probabilities

    assert np.allclose(sif_weights(np.array([0.0, 1e-4, 1.0]), 1e-4), [1.0, 0.5, 1e-4 / (1 + 1e-4)])
    student, _, report = _distilled(tiny_wordpiece, tmp_path, weighting="text", texts=["cat cat dog"])
    assert report["weighting"] == "text" and report["frequency_texts"] == 1
    p = text_probabilities(student, ["cat cat dog"])
    vocab = student.tokenizer.get_vocab()
    total = len(vocab) + 3
    assert p[vocab["cat"]] == pytest.approx(3 / total) and p[vocab["dog"]] == pytest.approx(2 / total)


def test_teacher_aligned_tuning_brings_the_students_similarities_towards_the_teachers(tiny_wordpiece,
                                                                                     tmp_path):
    from compress.embedding.static import AlignConfig, align_static
    from students.static_embedding import encode_static

    student, _, _ = _distilled(tiny_wordpiece, tmp_path)
    teacher, tok, _ = load_sentence_encoder(str(tiny_wordpiece))
    texts = TEXTS + ["What flows through Paris?", "the dogs ran", "a cat sat on the dog", "rain fell today"]
    targets = embed(teacher, tok, texts)

    def gap() -> float:
        s = encode_static(student, texts)
        t = torch.nn.functional.normalize(targets, dim=-1)
        return float((s @ s.T - t @ t.T).abs().mean())

    before, unk = gap(), student.tokenizer.get_vocab()["[UNK]"]
    report = align_static(student, texts + ["zzz"], torch.cat([targets, targets[:1]]),
                          AlignConfig(epochs=60, lr=0.05, batch_size=8))
    assert report["texts"] == len(texts)  # the text of unknown pieces only is left out
    assert report["loss_last_epoch"] < report["loss_first_epoch"] / 2
    assert gap() < before / 2
    assert student.embedding.dtype == np.float32 and not student.embedding[unk].any()
    with pytest.raises(UsageError, match="2 texts but 1 teacher embeddings"):
        align_static(student, texts[:2], targets[:1])
    with pytest.raises(UsageError, match="align epochs must be a positive integer"):
        AlignConfig(epochs=0)
    with pytest.raises(UsageError, match="align lr must be positive"):
        AlignConfig(lr=float("nan"))


def test_static_distillation_refuses_bad_settings(tiny_wordpiece):
    from compress.embedding.static import AlignConfig, distil_static

    teacher, tok, _ = load_sentence_encoder(str(tiny_wordpiece))
    with pytest.raises(UsageError, match="unknown weighting 'idf'"):
        distil_static(teacher, tok, 8, "idf")
    with pytest.raises(UsageError, match="weighting 'text'"):
        distil_static(teacher, tok, 8, "text", texts=())
    with pytest.raises(UsageError, match="--dims 64"):
        distil_static(teacher, tok, 64, "zipf")
    with pytest.raises(UsageError, match="unknown dtype 'int4'"):
        distil_static(teacher, tok, 8, dtype="int4")
    with pytest.raises(UsageError, match="teacher-aligned tuning needs unlabelled text"):
        distil_static(teacher, tok, 8, align=AlignConfig())
    with pytest.raises(UsageError, match="sif_coefficient 2"):
        distil_static(teacher, tok, 8, sif_coefficient=2)


def test_sentence_encoder_forward_normalises_only_where_configured(tiny_bert):
    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    raw = SentenceEncoder(model.encoder, Pooling("mean", False))
    unit = SentenceEncoder(model.encoder, Pooling("mean", True))
    a, b = embed(raw, tok, TEXTS), embed(unit, tok, TEXTS)
    assert torch.allclose(torch.nn.functional.normalize(a, dim=-1), b, atol=1e-6)
    assert not torch.allclose(a.norm(dim=-1), torch.ones(len(TEXTS)))


def test_python_api_prunes_distils_and_saves_what_sentence_transformers_opens(tiny_bert, tmp_path):
    import copy

    from sentence_transformers import SentenceTransformer

    import compress

    model, tok = compress.load_embedding_model(str(tiny_bert))
    dense = copy.deepcopy(model)
    texts = TEXTS * 4
    masks = compress.prune_embedding_model(model, tok, texts, criterion="wanda", sparsity=0.5, batch_size=4)
    q = "encoder.layer.0.attention.self.query.weight"
    assert float((~masks[q]).float().mean()) == pytest.approx(0.5, abs=0.02)
    before = compress.embed_texts(model, tok, TEXTS)
    result = compress.distil_embedding_model(model, dense, tok, texts, steps=3, masks=masks, lr=1e-3,
                                             batch_size=4)
    assert result["steps"] == 3
    after = compress.embed_texts(model, tok, TEXTS)
    assert not torch.allclose(before, after)  # it trained
    assert torch.equal(model.encoder.state_dict()[q] == 0, ~masks[q])  # and kept the zeros
    folder = compress.save_embedding_model(model, tok, tmp_path / "api", masks=masks)
    theirs = torch.as_tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    assert torch.allclose(theirs, after, atol=1e-5)
    with pytest.raises(UsageError, match="non-empty list"):
        compress.prune_embedding_model(model, tok, "one string")
    with pytest.raises(UsageError, match="flops_reduction=F"):
        compress.prune_embedding_model(model, tok, texts, structured=True)
    with pytest.raises(UsageError, match="add structured=True"):
        compress.prune_embedding_model(model, tok, texts, criterion="fisher")
    with pytest.raises(UsageError, match="pass a sentence encoder"):
        compress.prune_embedding_model(model.encoder, tok, texts, structured=True, flops_reduction=0.3)
    obs = copy.deepcopy(dense)
    report = compress.prune_embedding_model(obs, tok, texts, structured=True, flops_reduction=0.3,
                                            batch_size=4, criterion="obs")
    assert report["flops_reduction"] >= 0.3 and report["method"].startswith("structured OBS")
    report = compress.prune_embedding_model(dense, tok, texts, structured=True, flops_reduction=0.3,
                                            batch_size=4)
    assert report["flops_reduction"] >= 0.3 and "Gauss-Newton" in report["loss"]  # fisher by default


def test_do_lower_case_is_read_applied_and_saved_as_sentence_transformers_does(tiny_encoder, tmp_path):
    import dataclasses
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "cased"
    shutil.copytree(tiny_encoder("roberta"), folder)  # a byte-level BPE: case changes its tokens
    write_st_config(folder, "mean", normalize=True)
    st_cfg = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps({**st_cfg, "do_lower_case": True}))
    model, tok, _ = load_sentence_encoder(str(folder))
    assert model.pooling.lower_case is True
    texts = ["Paris Is The Capital", "THE SEINE FLOWS"]
    ours = embed(model, tok, texts)
    assert torch.allclose(ours, torch.as_tensor(SentenceTransformer(str(folder), device="cpu").encode(texts)),
                          atol=1e-5)
    cased = SentenceEncoder(model.encoder, dataclasses.replace(model.pooling, lower_case=False))
    assert not torch.allclose(embed(cased, tok, texts), ours, atol=1e-3)
    save_sentence_transformer(model, tok, tmp_path / "saved", {"task": "embedding"})
    assert json.loads((tmp_path / "saved" / "sentence_bert_config.json").read_text())["do_lower_case"] is True


def test_layer_states_are_the_hidden_states_and_survive_an_emptied_block(tiny_bert):
    from compress.embedding.losses import cosine_distillation_loss, layer_states
    from compress.embedding.model import tokens
    from compress.pruning.structured import remove_structured

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    teacher, _, _ = load_sentence_encoder(str(tiny_bert))
    batch = tokens(tok, TEXTS, 16)
    last, hidden = layer_states(model.encoder, batch)
    want = model.encoder(**batch, output_hidden_states=True).hidden_states
    assert len(hidden) == len(want) == 3
    assert all(torch.allclose(h, w) for h, w in zip(hidden[1:], want[1:]))
    assert torch.allclose(last, want[-1])
    # layer 0 loses its whole attention block, layer 1 its whole FFN
    remove_structured(model.encoder, [[], [0, 1]], [list(range(64)), []])
    last, hidden = layer_states(model.encoder, batch)
    assert all(h.shape == last.shape for h in hidden[1:]) and torch.allclose(hidden[-1], last)
    value, extra = cosine_distillation_loss(teacher, 2.0)(model, batch)
    assert float(value) == pytest.approx(extra["cosine"] + 2.0 * extra["layers"], rel=1e-5)
    assert extra["layers"] > 0


def test_dense_projection_after_the_pooling_is_run_and_saved_as_sentence_transformers_does(tiny_bert,
                                                                                          tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Transformer
    from sentence_transformers.models import Pooling as STPooling

    torch.manual_seed(0)
    st = SentenceTransformer(modules=[Transformer(str(tiny_bert)), STPooling(32, pooling_mode="cls"),
                                      Dense(32, 12), Normalize()], device="cpu")
    st.save(str(tmp_path / "labse-like"))
    model, tok, _ = load_sentence_encoder(str(tmp_path / "labse-like"))
    assert model.dim == 12 and list(model.dense) == ["2_Dense"]
    theirs = torch.as_tensor(st.encode(TEXTS))
    ours = embed(model, tok, TEXTS)
    assert ours.shape == (len(TEXTS), 12) and torch.allclose(ours, theirs, atol=1e-5)
    save_sentence_transformer(model, tok, tmp_path / "again", {"task": "embedding"})
    saved = json.loads((tmp_path / "again" / "modules.json").read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in saved]
    assert kinds == ["Transformer", "Pooling", "Dense", "Normalize"]
    reread = torch.as_tensor(SentenceTransformer(str(tmp_path / "again"), device="cpu").encode(TEXTS))
    assert torch.allclose(reread, ours, atol=1e-5)


def test_an_embedding_export_gets_its_encoders_attention_fusion(tiny_bert):
    from compress.export.loading import load_torch_model
    from compress.export.optimize import attention_executions, optimizer_model_type

    loaded = load_torch_model(str(tiny_bert), embedding=True)
    assert loaded.kind == "embedding" and loaded.output_name == "sentence_embedding"
    model_type, why = optimizer_model_type(loaded)
    assert model_type == "bert", why
    assert attention_executions(loaded) == 2


E5_PROMPTS = {"prompts": {"query": "query: ", "document": "", "passage": "passage: "},
              "default_prompt_name": "query", "similarity_fn_name": "cosine"}


def test_prompts_are_read_as_sentence_transformers_names_them():
    from compress.embedding.model import Prompts

    assert Prompts.of(E5_PROMPTS) == Prompts("query: ", "passage: ", "query: ")  # empty document skipped
    assert Prompts.of({"prompts": {"query": "Represent this: "}}) == Prompts("Represent this: ", "", "")
    assert Prompts.of({"prompts": {"corpus": "c: ", "document": "d: "}}) == Prompts("", "d: ", "")
    assert Prompts.of({}) == Prompts()


def test_scored_sets_carry_the_prompts_by_role():
    from compress.embedding.model import Prompts

    data = tiny_eval().with_prompts(Prompts("q: ", "d: ", "o: "))
    assert data.reqa.questions == ["q: Q0", "q: Q1"] and data.reqa.sentences == ["d: S0", "d: S1", "d: S2"]
    assert data.pairs.texts == ["o: A", "o: B", "o: C"] and data.pairs.pairs == ["o: A2", "o: B2", "o: C2"]
    assert data.reqa.gold == tiny_eval().reqa.gold
    assert tiny_eval().with_prompts(Prompts()).reqa.questions == ["Q0", "Q1"]


def test_prompts_are_kept_in_the_saved_folder_and_match_encode_query_and_document(st_folder, tmp_path):
    from sentence_transformers import SentenceTransformer

    import compress

    (st_folder / "config_sentence_transformers.json").write_text(json.dumps(
        {**E5_PROMPTS, "__version__": {"sentence_transformers": "5.0.0"}}))
    model, tok, _ = load_sentence_encoder(str(st_folder))
    assert model.model_config == E5_PROMPTS  # the version block is not carried
    save_sentence_transformer(model, tok, tmp_path / "saved", {"task": "embedding"})
    st = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert st.prompts["passage"] == "passage: " and st.default_prompt_name == "query"
    again, _, _ = load_sentence_encoder(str(tmp_path / "saved"))
    assert again.prompts == model.prompts
    q = torch.as_tensor(st.encode_query(TEXTS))
    assert torch.allclose(q, embed(model, tok, ["query: " + t for t in TEXTS]), atol=1e-5)
    assert st.prompts["document"] == "passage: "  # saved under the name encode_document takes first
    d = torch.as_tensor(st.encode_document(TEXTS))
    assert torch.allclose(d, embed(model, tok, ["passage: " + t for t in TEXTS]), atol=1e-5)
    plain = compress.embed_texts(model, tok, TEXTS)
    assert torch.allclose(torch.as_tensor(st.encode(TEXTS)), plain, atol=1e-5)
    assert not torch.allclose(q, embed(model, tok, TEXTS), atol=1e-3)  # the prompt changes the embedding


def test_bad_prompt_configs_are_refused_in_one_line(st_folder):
    (st_folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": ["query: "]}))
    with pytest.raises(ModelError, match="not a name -> text mapping"):
        load_sentence_encoder(str(st_folder))
    (st_folder / "config_sentence_transformers.json").write_text("{")
    with pytest.raises(ModelError, match="not readable JSON"):
        load_sentence_encoder(str(st_folder))
    (st_folder / "config_sentence_transformers.json").write_text("[]")
    with pytest.raises(ModelError, match="not a JSON object"):
        load_sentence_encoder(str(st_folder))
    (st_folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "q: "}, "default_prompt_name": "passage"}))
    with pytest.raises(ModelError, match="default prompt 'passage'"):
        load_sentence_encoder(str(st_folder))
    (st_folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": None}}))
    assert load_sentence_encoder(str(st_folder))[0].model_config == {"prompts": {"query": ""}}
    (st_folder / "config_sentence_transformers.json").unlink()
    cfg = json.loads((st_folder / "1_Pooling" / "config.json").read_text())
    (st_folder / "1_Pooling" / "config.json").write_text(json.dumps({**cfg, "include_prompt": False}))
    with pytest.raises(ModelError, match="include_prompt false"):
        read_pooling(str(st_folder))


def _st_saved(tiny_bert, folder: Path, max_seq_length: int):
    """A folder saved by sentence-transformers itself (its length limit in the tokenizer config)."""
    from sentence_transformers import SentenceTransformer, models

    module = models.Transformer(str(tiny_bert), max_seq_length=max_seq_length)
    SentenceTransformer(modules=[module, models.Pooling(32, "mean"), models.Normalize()]).save(str(folder))
    return SentenceTransformer(str(folder), device="cpu")


LONG_TEXTS = ["the cat sat on the mat " * 20, "stocks fell sharply today"]


def test_a_folder_saved_by_sentence_transformers_6_keeps_its_length_limit(tiny_bert, tmp_path):
    st = _st_saved(tiny_bert, tmp_path / "st", 16)
    assert "max_seq_length" not in json.loads((tmp_path / "st" / "sentence_bert_config.json").read_text())
    model, tok, _ = load_sentence_encoder(str(tmp_path / "st"))
    assert model.pooling.max_length == 16
    assert torch.allclose(embed(model, tok, LONG_TEXTS), torch.as_tensor(st.encode(LONG_TEXTS)), atol=1e-5)


def test_a_folder_keeping_its_encoder_in_a_subfolder_is_read_there(tiny_bert, tmp_path):
    """sentence-transformers 1 saved the Transformer in ``0_Transformer/``, named by modules.json."""
    import shutil

    folder = tmp_path / "st"
    st = _st_saved(tiny_bert, folder, 16)
    (folder / "0_Transformer").mkdir()
    for f in list(folder.iterdir()):
        if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json", "README.md"):
            shutil.move(str(f), folder / "0_Transformer" / f.name)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (folder / "modules.json").write_text(json.dumps(modules))
    want = torch.as_tensor(st.encode(LONG_TEXTS))
    model, tok, _ = load_sentence_encoder(str(folder))
    assert model.pooling == Pooling("mean", True, 16, "sentence-transformers config")
    assert torch.allclose(embed(model, tok, LONG_TEXTS), want, atol=1e-5)
    shutil.move(str(folder / "0_Transformer"), tmp_path / "encoder")  # a linked encoder folder
    (folder / "0_Transformer").symlink_to(tmp_path / "encoder", target_is_directory=True)
    model, tok, _ = load_sentence_encoder(str(folder))
    assert model.pooling == Pooling("mean", True, 16, "sentence-transformers config")


def test_without_a_length_limit_the_tokenizer_or_position_table_bounds_it_as_in_sentence_transformers(
        st_folder):
    from sentence_transformers import SentenceTransformer

    (st_folder / "sentence_bert_config.json").write_text("{}")
    tok_cfg = json.loads((st_folder / "tokenizer_config.json").read_text())
    for limit, want in ((100, 100), (8192, 512), (None, 512)):  # the tiny BERT has 512 positions
        if limit is None:
            tok_cfg.pop("model_max_length", None)
        else:
            tok_cfg["model_max_length"] = limit
        (st_folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
        assert read_pooling(str(st_folder)).max_length == want
        assert SentenceTransformer(str(st_folder), device="cpu").max_seq_length == want


def test_embed_texts_reads_any_iterable_and_refuses_non_finite_embeddings(tiny_bert):
    import compress

    model, tok = compress.load_embedding_model(str(tiny_bert))
    listed = compress.embed_texts(model, tok, TEXTS)
    assert torch.equal(compress.embed_texts(model, tok, (t for t in TEXTS)), listed)  # a generator
    with pytest.raises(UsageError, match="not a int"):
        compress.embed_texts(model, tok, 7)
    with torch.no_grad():
        model.encoder.embeddings.word_embeddings.weight.fill_(float("nan"))
    with pytest.raises(ModelError, match="4 of 4 embeddings hold NaN"):
        compress.embed_texts(model, tok, TEXTS)


def test_save_embedding_model_checks_its_masks_before_writing_anything(tiny_bert, tmp_path):
    import compress
    from compress.core.errors import IntegrityError

    model, tok = compress.load_embedding_model(str(tiny_bert))
    q = "encoder.layer.0.attention.self.query.weight"
    for masks, error, words in (
            ({q: torch.ones(3, 3, dtype=torch.bool)}, UsageError, "has shape"),
            ({q: torch.ones(32, 32)}, UsageError, "not a bool tensor"),
            (["not", "a", "dict"], UsageError, "must be a dict"),
            ({q: torch.zeros(32, 32, dtype=torch.bool)}, IntegrityError, "pruned weights are non-zero")):
        with pytest.raises(error, match=words):
            compress.save_embedding_model(model, tok, tmp_path / "out", masks=masks)
        assert not (tmp_path / "out").exists()


def test_embedding_api_refuses_wrong_objects_before_touching_the_model(tiny_bert, tmp_path):
    import copy

    from transformers import BertModel

    import compress

    model, tok = compress.load_embedding_model(str(tiny_bert))
    other = copy.deepcopy(model)
    other.dense = torch.nn.ModuleDict({"2_Dense": torch.nn.Linear(32, 16)})  # embeds in 16 dimensions
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for call, words in (
            (lambda: compress.embed_texts(model, "tok", TEXTS), "tokenizer must be a Hugging Face tokenizer"),
            (lambda: compress.embed_texts(model.encoder, tok, TEXTS), "model is a BertModel"),
            (lambda: compress.prune_embedding_model(model, 42, TEXTS, sparsity=0.5),
             "tokenizer must be a Hugging Face tokenizer, got 42"),
            (lambda: compress.distil_embedding_model(model, model, tok, TEXTS, steps=1), "the same object"),
            (lambda: compress.distil_embedding_model(model, other, tok, TEXTS, steps=1),
             "embeds in 32 dimensions and the teacher in 16"),
            (lambda: compress.distil_embedding_model(model, BertModel(model.config), tok, TEXTS, steps=1),
             "teacher is a BertModel"),
            (lambda: compress.save_embedding_model(model, None, tmp_path / "out"),
             "tokenizer must be a Hugging Face tokenizer, got None")):
        with pytest.raises(UsageError, match=words):
            call()
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen by a refused call
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not (tmp_path / "out").exists()


def test_recovery_loss_with_layers_equals_a_hand_computation_over_real_tokens_and_kept_layers(tiny_bert):
    """The pooled cosine term and the layer-wise term read only real tokens (the batch is padded),
    and the layer-wise term matches only the layers the prune left something in (layer 0 is gone)."""
    import copy
    import dataclasses

    from compress.embedding.losses import cosine_distillation_loss
    from compress.embedding.model import tokens
    from compress.pruning.structured import remove_structured

    teacher, tok, _ = load_sentence_encoder(str(tiny_bert))
    teacher.pooling = dataclasses.replace(teacher.pooling, mode="mean", normalize=False)
    student = copy.deepcopy(teacher)
    remove_structured(student.encoder, [[], [0, 2]], [[], list(range(0, 64, 2))])
    batch = tokens(tok, TEXTS, 16)
    mask = batch["attention_mask"]
    assert not mask.all()  # padding present
    value, extra = cosine_distillation_loss(teacher, 0.5)(student, batch)

    with torch.no_grad():
        t_hidden = teacher.encoder(**batch, output_hidden_states=True).hidden_states
        s_out = []
        hook = student.encoder.encoder.layer[1].register_forward_hook(
            lambda m, a, o: s_out.append(o[0] if isinstance(o, tuple) else o))
        try:
            s_last = student.encoder(**batch).last_hidden_state
        finally:
            hook.remove()
        m = mask[..., None].float()

        def mean_pool(h):
            return (h * m).sum(1) / m.sum(1)

        cos = (1 - torch.nn.functional.cosine_similarity(mean_pool(s_last), mean_pool(t_hidden[-1]))).mean()
        layers = ((s_out[0] - t_hidden[2]).pow(2) * m).sum() / (m.sum() * s_last.shape[-1])
    assert extra["cosine"] == pytest.approx(float(cos), rel=1e-5)
    assert extra["layers"] == pytest.approx(float(layers), rel=1e-5)
    assert float(value) == pytest.approx(float(cos + 0.5 * layers), rel=1e-5)


def test_verify_checks_the_stock_copy_sentence_transformers_loads(tiny_bert, tmp_path):
    """NaN, scaled or missing weights in 0_Transformer (what a bare SentenceTransformer reads) fail
    verify, though the pruned weights beside it are intact."""
    from safetensors.torch import load_file, save_file

    from compress.core.errors import IntegrityError
    from compress.pruning.integrity import verify_run
    from compress.pruning.structured import layer_sizes, remove_structured

    model, tok, _ = load_sentence_encoder(str(tiny_bert))
    sizes = layer_sizes(model.encoder)
    remove_structured(model.encoder, [[0] for _ in sizes["heads"]],
                      [list(range(0, n, 2)) for n in sizes["ffn"]])
    folder = tmp_path / "pruned"
    save_sentence_transformer(model, tok, folder, {"task": "embedding"})
    assert verify_run(folder)["stock_copy"] is True
    weights = folder / "0_Transformer" / "model.safetensors"
    intact = load_file(str(weights))
    key = next(k for k in intact if k.endswith("layer.1.output.dense.weight"))
    for edit, error, words in (
            (lambda t: {**t, key: t[key].clone().fill_(float("nan"))}, IntegrityError, "not finite|NaN"),
            (lambda t: {**t, key: t[key] * 3}, IntegrityError, "computes other outputs"),
            (lambda t: {k: v for k, v in t.items() if k != key}, ModelError, "0_Transformer' lacks weights")):
        save_file(edit(intact), str(weights))
        with pytest.raises(error, match=words):
            verify_run(folder)
    save_file(intact, str(weights))
    assert verify_run(folder)["stock_copy"] is True
