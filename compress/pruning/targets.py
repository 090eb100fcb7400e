"""Which parameters are pruned, by name.

Names are *canonical*: relative to the Hugging Face base model (``encoder.layer.0.attention.self.query
.weight``, ``embeddings.word_embeddings.weight``), so masks made on a BertForMaskedLM during
pre-training apply unchanged to the BertForSequenceClassification fine-tuned from it. Heads outside
the base model keep their own names (``classifier.weight``).

Default: the six matrices of every encoder layer (Q, K, V, attention output, FFN in, FFN out) and the
word embeddings, as in Gordon et al. (2020). ``--include`` adds, ``--exclude`` removes. A pattern is a
glob (``*.pooler.*``; a pattern without wildcards matches any name containing it) or, prefixed with
``re:``, a regular expression searched in the name. Biases, LayerNorms and other 1-D tensors are
never pruned.
"""

from __future__ import annotations

import fnmatch
import re

import torch

from compress.errors import UsageError

DEFAULT_TARGETS = (
    r"^encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
    r"|intermediate\.dense|output\.dense)\.weight$",
    r"^embeddings\.word_embeddings\.weight$",
)


def canonical_name(model: torch.nn.Module, name: str) -> str:
    """Strip the base-model prefix (``bert.``) so names agree across heads."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and name.startswith(prefix + "."):
        return name[len(prefix) + 1:]
    return name


def named_weights(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """All parameters by canonical name; tied parameters appear once (under their first name)."""
    return {canonical_name(model, n): p for n, p in model.named_parameters()}


def is_prunable(name: str, param: torch.Tensor) -> bool:
    """Biases, LayerNorm weights and other vectors are never pruned."""
    low = name.lower()
    return param.ndim >= 2 and not low.endswith(".bias") and "layernorm" not in low \
        and "layer_norm" not in low


def matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.search(pattern[3:], name) is not None
        except re.error as exc:
            raise UsageError(f"invalid regular expression '{pattern}': {exc}") from None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def select_targets(model: torch.nn.Module, include: tuple[str, ...] = (),
                   exclude: tuple[str, ...] = ()) -> dict[str, torch.nn.Parameter]:
    """The parameters to prune, by canonical name, in sorted order.

    Raises UsageError when an ``--include``/``--exclude`` pattern matches no parameter, when
    ``--include`` matches only biases/LayerNorms, or when nothing is left to prune.
    """
    params = named_weights(model)
    chosen = {n for n, p in params.items()
              if is_prunable(n, p) and any(re.search(d, n) for d in DEFAULT_TARGETS)}
    for pat in include:
        hits = [n for n in params if matches(pat, n)]
        if not hits:
            raise UsageError(f"--include '{pat}' matches no parameter of the model; names look like "
                             f"{', '.join(sorted(params)[:3])} (glob, or re:REGEX)")
        ok = [n for n in hits if is_prunable(n, params[n])]
        if not ok:
            raise UsageError(f"--include '{pat}' matches only biases/LayerNorm weights "
                             f"({', '.join(hits[:3])}), which are never pruned")
        chosen.update(ok)
    for pat in exclude:
        hits = [n for n in params if matches(pat, n)]
        if not hits:
            raise UsageError(f"--exclude '{pat}' matches no parameter of the model; names look like "
                             f"{', '.join(sorted(params)[:3])} (glob, or re:REGEX)")
        chosen.difference_update(hits)
    if not chosen:
        raise UsageError("no parameter is left to prune (the model has no BERT encoder matrices, or "
                         "--exclude removed them all); use --include to name some")
    return {n: params[n] for n in sorted(chosen)}
