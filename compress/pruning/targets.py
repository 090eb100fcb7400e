"""Which parameters are pruned, by name.

Names are *canonical*: relative to the Hugging Face base model (``encoder.layer.0.attention.self.query
.weight``, ``embeddings.word_embeddings.weight``), so masks made on a BertForMaskedLM during
pre-training apply unchanged to the BertForSequenceClassification fine-tuned from it. Heads outside
the base model keep their own names (``classifier.weight``).

Default: every role matrix of every encoder layer in the architecture's role table
(``compress.models.architectures``: Q, K, V or a fused QKV, attention output, FFN in and out) and the
word embeddings, as in Gordon et al. (2020); the post-training (one-shot) prune leaves the word
embeddings out of its default (``word_embeddings=False``), as SparseGPT and Wanda do, and prunes
them only where ``--include`` names them (``role:word_embeddings``). ``--include`` adds,
``--exclude`` removes. A pattern is
``role:NAME`` (a role of the table, e.g. ``role:ffn_in``, or ``role:word_embeddings``), a glob
(``*.pooler.*``; a pattern without wildcards matches any name containing it) or, prefixed with
``re:``, a regular expression searched in the name. Biases, LayerNorms and other 1-D tensors are
never pruned. A model outside the role table is pruned only where ``--include`` names it.
"""

from __future__ import annotations

import fnmatch
import re

import torch

from compress.core.errors import UsageError
from compress.models.architectures import (
    QKV_PARTS,
    ROLES,
    EncoderLayout,
    canonical_name,
    find_layout,
    layout_for,
    role_of_weights,
)

WORD_EMBEDDINGS = "word_embeddings"


def named_weights(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """All parameters by canonical name; tied parameters appear once (under their first name)."""
    return {canonical_name(model, n): p for n, p in model.named_parameters()}


def is_prunable(name: str, param: torch.Tensor) -> bool:
    """Biases, LayerNorm weights and other vectors are never pruned."""
    low = name.lower()
    return param.ndim >= 2 and not low.endswith(".bias") and "layernorm" not in low \
        and "layer_norm" not in low


def weight_roles(model: torch.nn.Module, layout: EncoderLayout | None = None
                 ) -> dict[str, tuple[int | None, str]]:
    """Canonical name -> (layer index, role) of every matrix the role table names, including the
    word embeddings (layer None). Raises when the model is outside the table (UsageError) or its
    layers do not match it (ModelError)."""
    layout = layout or layout_for(model)
    roles: dict[str, tuple[int | None, str]] = dict(role_of_weights(model, layout))
    emb = f"{layout.word_embeddings}.weight"
    if emb in named_weights(model):
        roles[emb] = (None, WORD_EMBEDDINGS)
    return roles


def matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.search(pattern[3:], name) is not None
        except re.error as exc:
            raise UsageError(f"invalid regular expression '{pattern}': {exc}") from None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def _role_hits(pattern: str, flag: str, layout: EncoderLayout | None,
               roles: dict[str, tuple[int | None, str]]) -> list[str]:
    """Names a ``role:NAME`` pattern selects; a part of a fused QKV is refused."""
    role = pattern[len("role:"):]
    known = (*ROLES, WORD_EMBEDDINGS)
    if role not in known:
        raise UsageError(f"{flag} '{pattern}': unknown role '{role}'; roles: {', '.join(known)}")
    if layout is None:
        raise UsageError(f"{flag} '{pattern}': this architecture has no role table; name matrices "
                         "with a glob or re:REGEX")
    wanted = {role}
    if layout.fused_qkv and role in QKV_PARTS:
        raise UsageError(f"{flag} '{pattern}': {layout.name} fuses query, key and value in one matrix "
                         f"({layout.roles['qkv']}), which is pruned whole; name role:qkv instead")
    if role == "qkv" and not layout.fused_qkv:
        wanted = set(QKV_PARTS)
    hits = sorted(n for n, (_, r) in roles.items() if r in wanted)
    if not hits:
        raise UsageError(f"{flag} '{pattern}': the {layout.name} model has no {role} matrix")
    return hits


def select_targets(model: torch.nn.Module, include: tuple[str, ...] = (),
                   exclude: tuple[str, ...] = (), word_embeddings: bool = True
                   ) -> dict[str, torch.nn.Parameter]:
    """The parameters to prune, by canonical name, in sorted order. ``word_embeddings=False``
    leaves the word embeddings out of the default set (``include`` may still name them).

    Raises UsageError when the architecture is outside the role table and ``--include`` names
    nothing, when a pattern matches no parameter, when ``--include`` matches only
    biases/LayerNorms, when a pattern names part of a fused QKV, or when nothing is left to prune;
    ModelError when the model's layers do not match its role table (a matrix would stay dense).
    """
    params = named_weights(model)
    layout = find_layout(model)
    if layout is None and not include:
        layout_for(model)  # raises: the supported architectures, and --include
    roles = weight_roles(model, layout) if layout is not None else {}
    chosen = {n for n, (_, role) in roles.items() if is_prunable(n, params[n])
              and (word_embeddings or role != WORD_EMBEDDINGS)}
    for pat in include:
        if pat.startswith("role:"):
            chosen.update(_role_hits(pat, "--include", layout, roles))
            continue
        hits = [n for n in params if matches(pat, n)]
        if not hits:
            raise UsageError(f"--include '{pat}' matches no parameter of the model; names look like "
                             f"{', '.join(sorted(params)[:3])} (glob, re:REGEX or role:NAME)")
        ok = [n for n in hits if is_prunable(n, params[n])]
        if not ok:
            raise UsageError(f"--include '{pat}' matches only biases/LayerNorm weights "
                             f"({', '.join(hits[:3])}), which are never pruned")
        chosen.update(ok)
    for pat in exclude:
        if pat.startswith("role:"):
            chosen.difference_update(_role_hits(pat, "--exclude", layout, roles))
            continue
        hits = [n for n in params if matches(pat, n)]
        if not hits:
            raise UsageError(f"--exclude '{pat}' matches no parameter of the model; names look like "
                             f"{', '.join(sorted(params)[:3])} (glob, re:REGEX or role:NAME)")
        chosen.difference_update(hits)
    if not chosen:
        raise UsageError("no parameter is left to prune (--exclude removed them all); use --include "
                         "to name some")
    return {n: params[n] for n in sorted(chosen)}
