"""SQuAD features: question + context windows with offsets mapped back to the context.

A context longer than the window is cut into overlapping windows (``doc_stride`` tokens of overlap,
Hugging Face semantics). Training windows label the answer's first/last token, or the [CLS] token
(index 0) when the answer is not wholly inside the window. Evaluation windows keep, per token, the
(start, end) character offsets into the context, or None for question/special tokens, so that the
post-processing can map a token span back to context text.

The context is found through the encoding's ``sequence_ids`` (never ``token_type_ids``, which
RoBERTa, XLM-R and ModernBERT do not have), so any pair template works (BERT's
``[CLS] Q [SEP] C [SEP]``, RoBERTa's ``<s> Q </s></s> C </s>``). Every window also carries
``context_mask`` (1 on context tokens), which the span objectives use to keep spans in the context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compress.tasks.qa import QAExample

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def _tokenize(tokenizer, examples: Sequence[QAExample], max_length: int, doc_stride: int):
    if not getattr(tokenizer, "is_fast", False):
        from compress.core.errors import ModelError

        raise ModelError("SQuAD features need a fast (Rust) tokenizer for offset mapping; "
                         "use a model folder with tokenizer.json")
    try:
        enc = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                        truncation="only_second", max_length=max_length, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True, padding=False)
    except BaseException as exc:  # noqa: BLE001 - the Rust tokenizer refuses windows with no context room
        # by raising, or by panicking (pyo3's PanicException derives from BaseException)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        from compress.core.errors import DataError

        longest = max(examples, key=lambda e: len(e.question))
        raise DataError(f"cannot cut windows of {max_length} tokens with {doc_stride} tokens of overlap "
                        f"(longest question: {longest.qid}, {len(longest.question)} characters; "
                        f"{type(exc).__name__}); raise --max-length or lower --doc-stride") from None
    check_windows_cover_contexts(tokenizer, examples, enc)
    return enc


def check_windows_cover_contexts(tokenizer, examples: Sequence[QAExample], enc) -> None:
    """Raise ModelError when the windows of an example stop before the end of its context.

    tokenizers 0.23.1 and 0.23.2 return only the first one or two overflow windows of a truncated
    encoding (huggingface/tokenizers#2091): a 612-token context in windows of 64 gave 2 windows
    instead of 15, so most of every long context would silently drop out of training and evaluation.
    Each example's windows must reach its context's last token. The context is tokenized alone only
    for the examples whose windows end before its last non-space character (none when the
    tokenizer is sound, except where normalization drops trailing characters).
    """
    reach: dict[int, int] = {}
    for i, sample in enumerate(enc["overflow_to_sample_mapping"]):
        _, last_tok = _context_range(enc.sequence_ids(i))
        reach[sample] = max(reach.get(sample, 0), enc["offset_mapping"][i][last_tok][1])
    short = [j for j, e in enumerate(examples) if reach.get(j, 0) < len(e.context.rstrip())]
    if not short:
        return
    alone = tokenizer([examples[j].context for j in short], add_special_tokens=False,
                      return_offsets_mapping=True, verbose=False)["offset_mapping"]
    for j, offsets in zip(short, alone):
        last = max((o[1] for o in offsets), default=0)
        if reach.get(j, 0) < last:
            import tokenizers

            from compress.core.errors import ModelError

            raise ModelError(
                f"the tokenizer's windows cover only the first {reach.get(j, 0)} of {last} characters "
                f"of the context of example {examples[j].qid} (tokenizers {tokenizers.__version__}; "
                "0.23.1 and 0.23.2 drop overflow windows, huggingface/tokenizers#2091); "
                "pip install 'tokenizers>=0.23.3'")


def _context_range(seq_ids: list) -> tuple[int, int]:
    first = seq_ids.index(1)
    last = len(seq_ids) - 1 - seq_ids[::-1].index(1)
    return first, last


def prepare_train_features(tokenizer, examples: Sequence[QAExample], max_length: int,
                           doc_stride: int) -> list[dict]:
    """One dict per window: model inputs + ``start_positions``/``end_positions`` (token indices)."""
    enc = _tokenize(tokenizer, examples, max_length, doc_stride)
    feats = []
    for i in range(len(enc["input_ids"])):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        offsets = enc["offset_mapping"][i]
        seq_ids = enc.sequence_ids(i)
        start_char = ex.answer_starts[0]
        end_char = start_char + len(ex.answers[0])
        c0, c1 = _context_range(seq_ids)
        start_tok = end_tok = 0
        if offsets[c0][0] <= start_char and offsets[c1][1] >= end_char:
            t = c0
            while t <= c1 and offsets[t][0] <= start_char:
                t += 1
            start_tok = t - 1
            t = c1
            while t >= c0 and offsets[t][1] >= end_char:
                t -= 1
            end_tok = t + 1
        f = {k: enc[k][i] for k in MODEL_INPUTS if k in enc}
        f["context_mask"] = [int(s == 1) for s in seq_ids]
        f["start_positions"] = start_tok
        f["end_positions"] = end_tok
        feats.append(f)
    return feats


def prepare_eval_features(tokenizer, examples: Sequence[QAExample], max_length: int,
                          doc_stride: int) -> list[dict]:
    """One dict per window: model inputs, ``example_index`` and context-only ``offset_mapping``."""
    enc = _tokenize(tokenizer, examples, max_length, doc_stride)
    feats = []
    for i in range(len(enc["input_ids"])):
        seq_ids = enc.sequence_ids(i)
        f = {k: enc[k][i] for k in MODEL_INPUTS if k in enc}
        f["example_index"] = enc["overflow_to_sample_mapping"][i]
        f["offset_mapping"] = [tuple(o) if seq_ids[t] == 1 else None
                               for t, o in enumerate(enc["offset_mapping"][i])]
        feats.append(f)
    return feats


def collate_features(tokenizer, rows: list[dict]) -> dict[str, torch.Tensor]:
    """Pad model inputs and ``context_mask`` (0 on padding); stack the span labels when present.
    Bookkeeping keys are dropped."""
    batch = tokenizer.pad([{k: r[k] for k in MODEL_INPUTS if k in r} for r in rows],
                          return_tensors="pt")
    out = dict(batch)
    if "context_mask" in rows[0]:
        mask = torch.zeros_like(out["input_ids"])
        for j, r in enumerate(rows):
            n = len(r["context_mask"])
            cols = slice(0, n) if tokenizer.padding_side == "right" else slice(mask.shape[1] - n, None)
            mask[j, cols] = torch.tensor(r["context_mask"])
        out["context_mask"] = mask
    if "start_positions" in rows[0]:
        out["start_positions"] = torch.tensor([r["start_positions"] for r in rows], dtype=torch.long)
        out["end_positions"] = torch.tensor([r["end_positions"] for r in rows], dtype=torch.long)
    return out
