"""Phase 4 of Fisher-guided structured pruning (``compress.pruning.fisher_structured``): Kwon et
al.'s mask tuning by layer-wise least squares, and folding the tuned mask values into the weights."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compress.core.errors import UsageError
from compress.models.architectures import encoder_layers, head_layout, layout_for
from compress.pruning.fisher_masks import to_device, unit_masks
from compress.pruning.layer_replay import layer_calls as _layer_calls
from compress.pruning.layer_replay import real_tokens as _tokens
from compress.pruning.layer_replay import replay_layer

SCALE_BOUND = 10.0


def _bounded_solve(a: torch.Tensor, b: torch.Tensor, bound: float, rounds: int = 100) -> torch.Tensor:
    """``argmin_s s^T A s - 2 s^T b`` subject to ``|s_k| <= bound`` (``A`` positive definite): an
    active set. Units whose free solution leaves the box are held at the nearer bound and the rest
    solved again; a held unit is released when the gradient says moving it inwards lowers the
    objective. Stops when neither happens (the box-constrained optimum) or after ``rounds``."""
    held = torch.zeros(len(b), dtype=torch.bool)
    value = torch.zeros_like(b)
    s = value
    for _ in range(rounds):
        free = ~held
        s = value.clone()
        if free.any():
            s[free] = torch.linalg.solve(a[free][:, free], b[free] - a[free][:, held] @ value[held])
        over = free & (s.abs() > bound)
        if over.any():
            held |= over
            value[over] = bound * torch.sign(s[over])
            continue
        grad = a @ s - b  # half the objective's gradient
        release = held & (grad * torch.sign(value) > 0)  # at +bound: grad > 0 says go down
        if not release.any():
            break
        held &= ~release
    return s.clamp(-bound, bound)


def _solve(gram: torch.Tensor, rhs: torch.Tensor, const: float, damping: float,
           bound: float | None = None) -> tuple[torch.Tensor, float, float]:
    """Scales minimising ``|sum_k s_k C_k - R|^2`` (= s^T G s - 2 s^T r + |R|^2) + a ridge pulling
    them towards 1, within ``[-bound, bound]`` when ``bound`` is set; returns (scales, error at 1,
    error at the scales), falling back to 1."""
    ones = torch.ones_like(rhs)

    def err(s):
        return float(s @ gram @ s - 2 * s @ rhs + const)

    lam = damping * float(gram.diagonal().mean().clamp_min(1e-30))
    eye = torch.eye(len(rhs), dtype=gram.dtype)
    a, b = gram + lam * eye, rhs + lam * ones
    scales = torch.linalg.solve(a, b)
    if bound is not None and torch.isfinite(scales).all() and bool((scales.abs() > bound).any()):
        scales = _bounded_solve(a, b, bound)
    before, after = err(ones), err(scales)
    if not torch.isfinite(scales).all() or after > before:
        return ones, before, before
    return scales, before, after


def _normal_equations(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gram matrix ``[k, k]`` and right-hand side ``[k]`` of ``min_s |sum_k s_k C_k - r|^2``, where unit
    k's contribution to token n is ``C_k[n] = w[:, k] @ x[n, k]`` (``x`` ``[tokens, k, width]``, ``w``
    ``[out, k, width]``, ``r`` ``[tokens, out]``). Width-1 units (neurons) use
    ``(X^T X) * (W^T W)`` and never build the ``[tokens, k, out]`` contributions."""
    if x.shape[2] == 1:
        a, w1 = x[:, :, 0], w[:, :, 0]
        return (a.T @ a) * (w1.T @ w1), (a * (r @ w1)).sum(0)
    contrib = torch.einsum("nkw,okw->nko", x, w)
    return torch.einsum("nko,njo->kj", contrib, contrib), torch.einsum("nko,no->k", contrib, r)


def _fit_scales(linear: nn.Linear, width: int, kept: torch.Tensor, inputs, targets: list[torch.Tensor],
                damping: float, bound: float | None) -> tuple[torch.Tensor, float, float]:
    """Scales of the ``kept`` units (groups of ``width`` input columns of ``linear``) whose scaled
    contributions best match ``targets`` (the dense outputs, ``[tokens, out]`` per batch), from the
    pruned model's ``inputs`` (``[tokens, in]`` per batch); see ``_solve``."""
    w = linear.weight.detach().float()
    w_k = w.view(w.shape[0], -1, width)[:, kept]  # [hidden, kept, width]
    gram = torch.zeros(len(kept), len(kept), dtype=torch.float64, device=w.device)
    rhs = torch.zeros(len(kept), dtype=torch.float64, device=w.device)
    const = 0.0
    for x, r in zip(inputs, targets):
        x = x.float().view(x.shape[0], -1, width)[:, kept]  # [tokens, kept, width]
        r = r.float()
        if linear.bias is not None:
            r = r - linear.bias.detach().float()
        g, rh = _normal_equations(x, w_k, r)
        gram += g.double()
        rhs += rh.double()
        const += float((r.double() ** 2).sum())
    return _solve(gram, rhs, const, damping, bound)


@torch.no_grad()
def tune_masks_least_squares(model: nn.Module, batches: list[dict[str, torch.Tensor]],
                             keep_heads: list[list[int]], keep_neurons: list[list[int]],
                             damping: float = 1e-3, bound: float | None = SCALE_BOUND) -> dict[str, Any]:
    """Kwon et al.'s mask tuning (module docstring, phase 4); the model's weights are not changed.

    Returns ``heads`` / ``neurons``: per layer, full-length mask values (0 for removed units, the
    fitted scale for kept ones), and per layer the squared output error at scale 1 and tuned
    (``attn_error``, ``ffn_error``: [before, after]). ``bound``: every scale stays in ``[-bound,
    bound]`` (``_bounded_solve``; None: unbounded); it must be >= 1, so that the fallback to 1
    obeys it too. Memory: the tuned and the dense hidden states entering the current layer
    and that layer's dense attention and FFN outputs (real tokens only), about 4 x tokens x hidden
    floats whatever the depth (BERT-base, 512 sequences of 384 tokens: about 2.4 GB). ALBERT's
    shared layers are not tuned (one set of scales would serve every pass): scales stay 1 and
    ``skipped`` says so.
    """
    if bound is not None and not bound >= 1:
        raise UsageError(f"bound must be >= 1 (a scale of 1 is the untuned mask), got {bound}")
    layout = layout_for(model)
    layers = encoder_layers(model, layout)
    _, d = head_layout(model)
    heads = [torch.zeros(lay.linears["attn_out"].in_features // d) for lay in layers]
    neurons = [torch.zeros(lay.linears["ffn_out"].in_features) for lay in layers]
    for values, keep in ((heads, keep_heads), (neurons, keep_neurons)):
        for v, k in zip(values, keep):
            v[k] = 1.0
    report: dict[str, Any] = {"heads": heads, "neurons": neurons, "attn_error": [], "ffn_error": []}
    if layout.shared_layers:
        report["skipped"] = "shared layers (ALBERT): one set of scales would serve every pass"
        return report
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batches = [to_device(b, device) for b in batches]
    calls = _layer_calls(model, layers, batches)
    stream = [c[0][0][0] for c in calls]  # the tuned model's hidden states entering the layer
    dense_stream = list(stream)  # the dense model's

    def replay(lay, b, capture=None, hidden=None):
        """Run layer ``lay`` on the tuned stream (or ``hidden``); with ``capture``, stop at that
        role's input."""
        return replay_layer(lay, calls[b][lay.index], stream[b] if hidden is None else hidden, capture)

    def dense_targets(lay) -> list[dict[str, torch.Tensor]]:
        """The dense layer's attention / FFN outputs (real tokens only) per batch; advances the
        dense stream. One layer's targets at a time: memory stays at a few activations' worth."""
        kept = heads[lay.index], neurons[lay.index]
        heads[lay.index], neurons[lay.index] = torch.ones_like(kept[0]), torch.ones_like(kept[1])
        out: list[dict[str, torch.Tensor]] = []
        hooks = [lay.linears[role].register_forward_hook(
            lambda m, a, o, role=role: out[-1].__setitem__(role, _tokens(o, batches[len(out) - 1])))
            for role in ("attn_out", "ffn_out")]
        try:
            for b in range(len(batches)):
                out.append({})
                dense_stream[b] = replay(lay, b, hidden=dense_stream[b])
        finally:
            for h in hooks:
                h.remove()
            heads[lay.index], neurons[lay.index] = kept
        return out

    try:
        with unit_masks(model, heads, neurons):
            for lay in layers:
                targets = dense_targets(lay)
                for role, values, width in (("attn_out", heads, d), ("ffn_out", neurons, 1)):
                    kept = values[lay.index].nonzero().squeeze(1)
                    if len(kept) == 0:  # the whole block goes: nothing to tune
                        report["attn_error" if role == "attn_out" else "ffn_error"].append(None)
                        continue
                    inputs = (_tokens(replay(lay, b, role), batch) for b, batch in enumerate(batches))
                    scales, before, after = _fit_scales(lay.linears[role], width, kept, inputs,
                                                        [t[role] for t in targets], damping, bound)
                    values[lay.index][kept] = scales.float().cpu()
                    report["attn_error" if role == "attn_out" else "ffn_error"].append([before, after])
                for b in range(len(batches)):
                    stream[b] = replay(lay, b)
    finally:
        model.train(was_training)
    return report


@torch.no_grad()
def fold_scales(model: nn.Module, heads: list[torch.Tensor], neurons: list[torch.Tensor]) -> None:
    """Multiply each head's ``attn_out`` columns and each neuron's ``ffn_out`` column by its mask
    value, so the model computes, without hooks, what it computed under ``unit_masks``."""
    _, d = head_layout(model)
    for lay in encoder_layers(model):
        lay.linears["attn_out"].weight.mul_(heads[lay.index].repeat_interleave(d).to(lay.linears["attn_out"].weight))
        lay.linears["ffn_out"].weight.mul_(neurons[lay.index].to(lay.linears["ffn_out"].weight))
