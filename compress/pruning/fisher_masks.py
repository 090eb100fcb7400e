"""Phase 1 of Fisher-guided structured pruning (``compress.pruning.fisher_structured``): unit
masks on every encoder layer and the empirical Fisher of those masks.

A head's mask multiplies its context columns at the ``attn_out`` input (head h = columns
h*d:(h+1)*d), a neuron's its ``ffn_out`` input column, by forward pre-hooks, so every architecture
of the role table works alike. ``unit_flops`` says what one head and one neuron cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.errors import ModelError, UsageError
from compress.models.architectures import encoder_layers, head_layout, layout_for

LABEL_KEYS = ("labels", "start_positions", "end_positions")


@contextmanager
def unit_masks(model: nn.Module, heads: list[torch.Tensor], neurons: list[torch.Tensor]):
    """Within the block, layer l's ``attn_out`` input is multiplied per head by ``heads[l]`` and its
    ``ffn_out`` input per neuron by ``neurons[l]`` (``[units]`` or ``[batch, units]``). The lists are
    read at every call, so their entries may be replaced inside the block."""
    layers = encoder_layers(model)
    _, head_dim = head_layout(model)

    def hook(values: list[torch.Tensor], layer: int, width: int):
        def pre(module, args):
            x, m = args[0], values[layer]
            m = m.to(device=x.device, dtype=x.dtype).repeat_interleave(width, dim=-1)
            if m.dim() == 2:
                if x.shape[0] != m.shape[0]:
                    raise ModelError(f"per-example masks need the batch first; got input {tuple(x.shape)}")
                m = m.view(m.shape[0], *([1] * (x.dim() - 2)), m.shape[1])
            return (x * m,) + args[1:]
        return pre

    handles = []
    for lay in layers:
        handles.append(lay.linears["attn_out"].register_forward_pre_hook(hook(heads, lay.index, head_dim)))
        handles.append(lay.linears["ffn_out"].register_forward_pre_hook(hook(neurons, lay.index, 1)))
    try:
        yield layers
    finally:
        for h in handles:
            h.remove()


def per_example_loss(outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[batch]``: each example's loss as the model would compute it at batch size 1 (single- or
    multi-label classification, regression, token labels with -100 ignored, QA spans); without
    labels, cross-entropy against the model's own argmax (the logits' KL to themselves has no
    gradient). Padded positions of token-level logits do not count."""
    if "start_positions" in batch:
        return (F.cross_entropy(outputs.start_logits, batch["start_positions"], reduction="none")
                + F.cross_entropy(outputs.end_logits, batch["end_positions"], reduction="none")) / 2
    logits = getattr(outputs, "logits", None)
    if logits is None:
        raise ModelError("the model returns no logits (a bare encoder?); load it with a task head "
                         "or pass loss_fn(outputs, batch) -> per-example losses")
    labels = batch.get("labels")
    if labels is None:
        labels = logits.detach().argmax(-1)
        if logits.dim() == 3 and "attention_mask" in batch:
            labels = labels.masked_fill(batch["attention_mask"] == 0, -100)
    if logits.dim() == 3:  # token-level: mean over each example's counted tokens
        tok = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        valid = (labels != -100).to(tok.dtype)
        return (tok * valid).sum(1) / valid.sum(1).clamp_min(1)
    if labels.is_floating_point() and labels.shape == logits.shape and logits.shape[-1] > 1:
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(-1)
    if logits.shape[-1] == 1:
        return (logits.squeeze(-1) - labels.to(logits.dtype)) ** 2
    return F.cross_entropy(logits, labels, reduction="none")


@dataclass(frozen=True)
class FisherImportance:
    """Per layer: ``heads[l]`` ``[heads]`` and ``neurons[l]`` ``[ffn]`` importances, and the
    per-example gradients ``head_grads[l]`` ``[examples, heads]``, ``neuron_grads[l]`` ``[examples, ffn]``."""

    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]
    head_grads: list[torch.Tensor]
    neuron_grads: list[torch.Tensor]
    loss: str


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with its tensors on ``device`` (the model's): calibration batches are built on the CPU."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def split_labels(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """(the model's inputs without the label keys, batch size)."""
    inputs = {k: v for k, v in batch.items() if k not in LABEL_KEYS}
    return inputs, next(iter(inputs.values())).shape[0]


def fisher_importance(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
                      loss_fn: Callable[[Any, dict], torch.Tensor] | None = None) -> FisherImportance:
    """Empirical Fisher of the head and neuron masks (module docstring, phase 1) over ``batches``.

    ``loss_fn(outputs, batch) -> [batch]`` per-example losses; default ``per_example_loss``.
    Exact per-example gradients at any batch size; memory: examples x (heads + neurons) floats.
    The model runs in eval mode (no dropout); its weights get no gradients.
    """
    loss_fn = loss_fn or per_example_loss
    layers = encoder_layers(model)
    _, head_dim = head_layout(model)
    device = next(model.parameters()).device
    sizes = [(lay.linears["attn_out"].in_features // head_dim, lay.linears["ffn_out"].in_features)
             for lay in layers]
    head_g: list[list[torch.Tensor]] = [[] for _ in layers]
    neuron_g: list[list[torch.Tensor]] = [[] for _ in layers]
    was_training, grad_flags = model.training, [p.requires_grad for p in model.parameters()]
    model.eval().requires_grad_(False)
    heads: list[torch.Tensor] = []
    neurons: list[torch.Tensor] = []
    labelled = None
    try:
        with unit_masks(model, heads, neurons):
            for batch in batches:
                batch = to_device(batch, device)
                inputs, n = split_labels(batch)
                labelled = any(k in batch for k in LABEL_KEYS) if labelled is None else labelled
                heads[:] = [torch.ones(n, h, device=device, requires_grad=True) for h, _ in sizes]
                neurons[:] = [torch.ones(n, f, device=device, requires_grad=True) for _, f in sizes]
                losses = loss_fn(model(**inputs), batch)
                grads = torch.autograd.grad(losses.sum(), heads + neurons, allow_unused=True)
                for i, g in enumerate(grads):
                    g = torch.zeros_like((heads + neurons)[i]) if g is None else g
                    store = head_g if i < len(layers) else neuron_g
                    store[i % len(layers)].append(g.detach().float().cpu())
    finally:
        for p, flag in zip(model.parameters(), grad_flags):
            p.requires_grad_(flag)
        model.train(was_training)
    if labelled is None:
        raise UsageError("fisher_importance needs at least one batch")
    hg, ng = [torch.cat(g) for g in head_g], [torch.cat(g) for g in neuron_g]
    loss = "custom loss_fn" if loss_fn is not per_example_loss else (
        "task loss on the labels" if labelled else "cross-entropy against the model's own argmax")
    return FisherImportance([g.pow(2).sum(0) for g in hg], [g.pow(2).sum(0) for g in ng], hg, ng, loss)


def unit_flops(model: nn.Module, seq_len: int) -> tuple[int, int]:
    """(FLOPs of one head, FLOPs of one FFN neuron) per sequence of ``seq_len`` tokens (module docstring)."""
    layout = layout_for(model)
    layers = encoder_layers(model, layout)
    _, d = head_layout(model)
    hidden = layers[0].linears["attn_out"].out_features
    passes = 1
    if layout.shared_layers:
        cfg = model.config
        passes = cfg.num_hidden_layers * getattr(cfg, "inner_group_num", 1) // len(layers)
    head = seq_len * 4 * hidden * d + 2 * seq_len * seq_len * d
    neuron = seq_len * hidden * (3 if layout.glu or "ffn_gate" in layout.roles else 2)
    return 2 * passes * head, 2 * passes * neuron
