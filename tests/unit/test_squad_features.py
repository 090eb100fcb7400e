"""SQuAD windows: answer labels map back to the answer text; long contexts get overlapping windows."""

from __future__ import annotations

import pytest

from compress.models.loading import load_tokenizer
from compress.qa.features import collate_features, prepare_eval_features, prepare_train_features
from compress.tasks.qa import QAExample


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm")


def _long_example():
    filler = " ".join(f"word{i} is here." for i in range(60))
    context = filler + " The treasure is buried under the old oak tree. " + filler
    start = context.index("the old oak tree")
    return QAExample("q1", "T", context, "Where is the treasure?", ("the old oak tree",), (start,))


def test_train_labels_point_at_the_answer_in_the_window_that_holds_it(tok):
    ex = _long_example()
    feats = prepare_train_features(tok, [ex], max_length=64, doc_stride=16)
    assert len(feats) > 3  # the context is much longer than one window
    labelled = [f for f in feats if f["start_positions"] > 0]
    assert labelled, "some window must hold the answer"
    for f in labelled:
        span = tok.decode(f["input_ids"][f["start_positions"]:f["end_positions"] + 1])
        assert span == "the old oak tree"
    # windows that do not hold the whole answer point at [CLS]
    assert all(f["end_positions"] == 0 for f in feats if f["start_positions"] == 0)
    assert all(len(f["input_ids"]) <= 64 for f in feats)


def test_eval_offsets_cover_only_the_context_and_windows_overlap(tok):
    ex = _long_example()
    feats = prepare_eval_features(tok, [ex], max_length=64, doc_stride=16)
    assert all(f["example_index"] == 0 for f in feats)
    for f in feats:
        offs = [o for o in f["offset_mapping"] if o is not None]
        assert offs and len(offs) < len(f["input_ids"])  # question and special tokens are None
        assert f["offset_mapping"][0] is None  # [CLS]
    # consecutive windows share context: the second starts before the first ends
    first_end = max(o[1] for o in feats[0]["offset_mapping"] if o is not None)
    second_start = min(o[0] for o in feats[1]["offset_mapping"] if o is not None)
    assert second_start < first_end


def test_collate_pads_and_stacks_labels(tok):
    ex = _long_example()
    feats = prepare_train_features(tok, [ex], max_length=64, doc_stride=16)[:3]
    b = collate_features(tok, feats)
    assert b["input_ids"].shape[0] == 3
    assert b["start_positions"].tolist() == [f["start_positions"] for f in feats]


def test_question_too_long_for_the_window_is_a_data_error(tok):
    from compress.core.errors import DataError

    ex = QAExample("long-q", "T", "Short context here.", " ".join(["why"] * 60), ("Short",), (0,))
    with pytest.raises(DataError, match="longest question: long-q"):
        prepare_train_features(tok, [ex], max_length=48, doc_stride=16)


class _DropsOverflowWindows:
    """The real tokenizer, returning only the first ``keep`` windows of an overflowing encoding,
    as tokenizers 0.23.1 and 0.23.2 do (huggingface/tokenizers#2091)."""

    is_fast = True

    def __init__(self, tok, keep: int):
        self.tok, self.keep = tok, keep

    def __call__(self, *args, **kwargs):
        from transformers import BatchEncoding

        enc = self.tok(*args, **kwargs)
        if not kwargs.get("return_overflowing_tokens"):
            return enc
        return BatchEncoding({k: v[:self.keep] for k, v in enc.items()}, encoding=enc.encodings[:self.keep])


@pytest.mark.parametrize("prepare", [prepare_train_features, prepare_eval_features])
def test_windows_that_stop_before_the_end_of_the_context_are_a_model_error(tok, prepare):
    from compress.core.errors import ModelError

    ex = _long_example()
    windows = prepare(tok, [ex], max_length=64, doc_stride=16)
    last = max(o[1] for o in tok(ex.context, return_offsets_mapping=True, verbose=False)["offset_mapping"])
    assert last == len(ex.context)  # the context ends in a token (checked independently of the guard)
    assert len(prepare(_DropsOverflowWindows(tok, len(windows)), [ex], 64, 16)) == len(windows)
    with pytest.raises(ModelError, match=rf"cover only the first \d+ of {last} characters of the context "
                                         r"of example q1 .*tokenizers>=0\.23\.3"):
        prepare(_DropsOverflowWindows(tok, 2), [ex], max_length=64, doc_stride=16)


def test_characters_the_tokenizer_drops_at_the_end_of_a_context_are_no_error(tok):
    ex = _long_example()
    padded = QAExample("q2", "T", ex.context + " \u200b\u200b", ex.question, ex.answers, ex.answer_starts)
    # a zero-width space is normalized away: the last window ends before the context's last character
    assert len(prepare_eval_features(tok, [padded], 64, 16)) == len(prepare_eval_features(tok, [ex], 64, 16))
