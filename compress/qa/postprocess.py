"""From start/end logits of every window to one answer string per question.

For each example, over all of its windows: the ``n_best`` highest start and end logits are paired;
a pair is a candidate when both tokens are context tokens, end >= start, and the span has at most
``max_answer_length`` tokens. The candidate with the highest start + end logit wins, whichever
window it is in; its text is cut from the original context with the offset mapping.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, offsets: Sequence,
               n_best: int, max_answer_length: int) -> list[tuple[float, int, int]]:
    """Candidate (score, start_char, end_char) of one window, best first."""
    n = min(len(offsets), len(start_logits))
    s_idx = np.argsort(start_logits[:n])[::-1][:n_best]
    e_idx = np.argsort(end_logits[:n])[::-1][:n_best]
    out = []
    for s in s_idx:
        for e in e_idx:
            if offsets[s] is None or offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                continue
            out.append((float(start_logits[s] + end_logits[e]), offsets[s][0], offsets[e][1]))
    out.sort(key=lambda t: -t[0])
    return out


def postprocess_predictions(examples: Sequence, features: Sequence[dict], start_logits: Sequence,
                            end_logits: Sequence, n_best: int = 20, max_answer_length: int = 30
                            ) -> dict[str, str]:
    """``{question id: answer text}``; ``start_logits[i]`` belongs to ``features[i]``.

    ``features[i]`` needs ``example_index`` and ``offset_mapping`` (None for non-context tokens).
    A question with no valid span gets the empty string.
    """
    best: dict[int, tuple[float, int, int]] = {}
    for f, sl, el in zip(features, start_logits, end_logits):
        cands = best_spans(np.asarray(sl), np.asarray(el), f["offset_mapping"], n_best,
                           max_answer_length)
        if cands and (f["example_index"] not in best or cands[0][0] > best[f["example_index"]][0]):
            best[f["example_index"]] = cands[0]
    out = {}
    for i, ex in enumerate(examples):
        if i in best:
            _, a, b = best[i]
            out[ex.qid] = ex.context[a:b]
        else:
            out[ex.qid] = ""
    return out
