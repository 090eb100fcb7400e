"""Tiny random-weight encoders of every supported architecture, built in the test (no hub).

Each is 2-3 layers, hidden 32, 4 heads, FFN 64, saved as a base model (``AutoModel``) with a
tokenizer of the kind its family uses:

- WordPiece (BERT, DistilBERT, ELECTRA): the packaged MiniLM tokenizer;
- byte-level BPE (RoBERTa, ModernBERT): trained here with the ``tokenizers`` library;
- SentencePiece-style Unigram (ALBERT, DeBERTa-v3, XLM-RoBERTa): trained here likewise.

The tokenizers are trained on the bundled sample's sentences plus the tiny SQuAD paragraph, so
every test text tokenizes without unknown pieces.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = [line.split("\t")[0] for line in
        (ROOT / "compress" / "data" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:]]
TEXT += ["Paris is the capital of France. It has the Eiffel Tower. The Seine flows through it.",
         "Capital? Tower? What flows through Paris?"]

HIDDEN, HEADS, FFN = 32, 4, 64
COMMON = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=FFN,
              max_position_embeddings=512)


def _bpe_tokenizer(cls_tok: str, sep_tok: str, pad_tok: str, unk_tok: str, mask_tok: str,
                   roberta_pairs: bool):
    """A byte-level BPE tokenizer (RoBERTa/ModernBERT style) wrapped for transformers."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    specials = [cls_tok, pad_tok, sep_tok, unk_tok, mask_tok]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TEXT, vocab_size=400, min_frequency=1, special_tokens=specials)
    cls_id, sep_id = tok.token_to_id(cls_tok), tok.token_to_id(sep_tok)
    if roberta_pairs:
        tok.post_processor = processors.RobertaProcessing((sep_tok, sep_id), (cls_tok, cls_id),
                                                          trim_offsets=True, add_prefix_space=False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls_tok} $A {sep_tok}", pair=f"{cls_tok} $A {sep_tok} $B {sep_tok}",
            special_tokens=[(cls_tok, cls_id), (sep_tok, sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token=cls_tok, eos_token=sep_tok,
                                   cls_token=cls_tok, sep_token=sep_tok, pad_token=pad_tok,
                                   unk_token=unk_tok, mask_token=mask_tok)


def _unigram_tokenizer(cls_tok: str, sep_tok: str, pad_tok: str, unk_tok: str, mask_tok: str,
                       type_ids: bool, roberta_pairs: bool = False):
    """A SentencePiece-style Unigram tokenizer (ALBERT, DeBERTa-v3, XLM-R style); XLM-R's
    ``roberta_pairs`` are ``<s> A </s></s> B </s>``."""
    from tokenizers import SentencePieceUnigramTokenizer, processors
    from transformers import PreTrainedTokenizerFast

    specials = [pad_tok, cls_tok, sep_tok, unk_tok, mask_tok]
    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(TEXT, vocab_size=300, special_tokens=specials, unk_token=unk_tok)
    cls_id, sep_id = tok.token_to_id(cls_tok), tok.token_to_id(sep_tok)
    second = ":1" if type_ids else ""
    middle = f"{sep_tok} {sep_tok}" if roberta_pairs else sep_tok
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls_tok} $A {sep_tok}", pair=f"{cls_tok} $A {middle} $B{second} {sep_tok}{second}",
        special_tokens=[(cls_tok, cls_id), (sep_tok, sep_id)])
    # ALBERT's and DeBERTa-v3's tokenizers emit token_type_ids (XLM-R's do not)
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if type_ids else ["input_ids",
                                                                              "attention_mask"]
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token=cls_tok, eos_token=sep_tok,
                                   cls_token=cls_tok, sep_token=sep_tok, pad_token=pad_tok,
                                   unk_token=unk_tok, mask_token=mask_tok, model_input_names=inputs)


def _wordpiece_tokenizer():
    from transformers import AutoTokenizer

    from compress.models.loading import packaged_model_path

    return AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


def _special(tokenizer) -> dict[str, int]:
    return dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)


def build(arch: str):
    """(config, tokenizer) of the tiny ``arch``; see ARCHITECTURES."""
    import transformers as tf

    if arch in ("bert", "electra", "distilbert"):
        tok = _wordpiece_tokenizer()
        if arch == "bert":
            cfg = tf.BertConfig(num_hidden_layers=2, **COMMON, **_special(tok))
        elif arch == "electra":
            cfg = tf.ElectraConfig(num_hidden_layers=2, embedding_size=16, **COMMON, **_special(tok))
        else:
            cfg = tf.DistilBertConfig(n_layers=2, dim=HIDDEN, n_heads=HEADS, hidden_dim=FFN,
                                      max_position_embeddings=512, **_special(tok))
    elif arch == "roberta":
        tok = _bpe_tokenizer("<s>", "</s>", "<pad>", "<unk>", "<mask>", roberta_pairs=True)
        tok.model_input_names = ["input_ids", "attention_mask"]
        cfg = tf.RobertaConfig(num_hidden_layers=2, type_vocab_size=1, bos_token_id=tok.cls_token_id,
                               eos_token_id=tok.sep_token_id, **{**COMMON, "max_position_embeddings": 514},
                               **_special(tok))
    elif arch == "xlm-roberta":
        tok = _unigram_tokenizer("<s>", "</s>", "<pad>", "<unk>", "<mask>", type_ids=False,
                                 roberta_pairs=True)
        tok.model_input_names = ["input_ids", "attention_mask"]
        cfg = tf.XLMRobertaConfig(num_hidden_layers=2, type_vocab_size=1, bos_token_id=tok.cls_token_id,
                                  eos_token_id=tok.sep_token_id,
                                  **{**COMMON, "max_position_embeddings": 514}, **_special(tok))
    elif arch == "albert":
        tok = _unigram_tokenizer("[CLS]", "[SEP]", "<pad>", "<unk>", "[MASK]", type_ids=True)
        cfg = tf.AlbertConfig(num_hidden_layers=2, embedding_size=16, num_hidden_groups=1,
                              inner_group_num=1, hidden_act="gelu_new", **COMMON, **_special(tok))
    elif arch == "deberta-v2":
        tok = _unigram_tokenizer("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", type_ids=True)
        cfg = tf.DebertaV2Config(num_hidden_layers=2, relative_attention=True, position_buckets=64,
                                 max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                                 share_att_key=True, position_biased_input=False, norm_rel_ebd="layer_norm",
                                 type_vocab_size=0, **COMMON, **_special(tok))
    elif arch == "modernbert":
        tok = _bpe_tokenizer("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", roberta_pairs=False)
        tok.model_input_names = ["input_ids", "attention_mask"]
        cfg = tf.ModernBertConfig(num_hidden_layers=3, global_attn_every_n_layers=3, local_attention=16,
                                  cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                                  bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                                  **COMMON, **_special(tok))
    else:
        raise KeyError(f"no tiny builder for '{arch}'; known: {', '.join(ARCHITECTURES)}")
    return cfg, tok


ARCHITECTURES = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert", "deberta-v2",
                 "modernbert")


def perturb_defaults(model, seed: int = 3):
    """Non-zero biases and LayerNorms that are not the identity, in place (returns ``model``). A
    default-initialised model has every bias zero and every LayerNorm the identity, so a block that
    wrongly returns its input, drops a bias or skips a LayerNorm gives the same outputs and no test
    sees it."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm) and module.weight is not None:
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=g))
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=g))
    return model


def save_tiny_encoder(arch: str, folder: Path, seed: int = 0) -> Path:
    """Build the tiny ``arch`` with random weights (seeded; biases and LayerNorms perturbed,
    ``perturb_defaults``) and save it with its tokenizer."""
    import torch
    from transformers import AutoModel

    cfg, tok = build(arch)
    torch.manual_seed(seed)
    perturb_defaults(AutoModel.from_config(cfg)).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder
