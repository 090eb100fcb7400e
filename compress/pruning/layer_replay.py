"""Replaying one encoder layer at a time on calibration inputs, as the layer-wise reconstructions
(Kwon et al.'s mask tuning, ``compress.pruning.fisher_tuning``; the structured OBS removal,
``compress.pruning.obs_structured``) need: each layer's call arguments from one pass of the model,
then the layer run alone on a stream of hidden states, optionally stopped at a role's input."""

from __future__ import annotations

import torch
from torch import nn

from compress.core.errors import ModelError
from compress.pruning.fisher_masks import split_labels


class Stop(Exception):
    """Raised by a capture hook: the rest of the layer is not needed."""


def real_tokens(x: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[tokens, features]``, padded positions dropped when the batch has an attention mask."""
    mask = batch.get("attention_mask")
    if mask is not None and x.dim() == 3 and tuple(mask.shape) == tuple(x.shape[:2]):
        return x[mask.bool()]
    return x.reshape(-1, x.shape[-1])


def layer_calls(model: nn.Module, layers, batches: list[dict[str, torch.Tensor]]
                 ) -> list[list[tuple[tuple, dict]]]:
    """Per batch, each layer's call arguments from one dense pass: layer 0's positional arguments,
    the others' without their hidden states (those come from the streams), and every keyword."""
    calls: list[list[tuple[tuple, dict]]] = []
    hooks = [lay.module.register_forward_pre_hook(
        lambda m, a, k: calls[-1].append((a if not calls[-1] else (None,) + a[1:], k)), with_kwargs=True)
        for lay in layers]
    try:
        for batch in batches:
            calls.append([])
            model(**split_labels(batch)[0])
            if len(calls[-1]) != len(layers):
                raise ModelError(f"expected one call per layer, got {len(calls[-1])} for {len(layers)}")
    finally:
        for h in hooks:
            h.remove()
    return calls


def replay_layer(lay, call: tuple[tuple, dict], hidden: torch.Tensor, capture: str | None = None
                 ) -> torch.Tensor:
    """Run encoder layer ``lay`` on ``hidden`` with the other arguments of ``call`` (one entry of
    ``layer_calls``); with ``capture`` (a role), stop at that role's input and return it."""
    args, kwargs = call
    handle = None
    if capture:
        def grab(m, a):
            raise Stop(a[0])
        handle = lay.linears[capture].register_forward_pre_hook(grab)
    try:
        out = lay.module(hidden, *args[1:], **kwargs)
        return out[0] if isinstance(out, tuple) else out
    except Stop as stop:
        return stop.args[0]
    finally:
        if handle is not None:
            handle.remove()
