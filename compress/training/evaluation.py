"""One evaluation for every runtime: a task's metrics from a function that maps a padded batch to
logits. PyTorch models (``torch_logits_fn``) and onnxruntime sessions (``compress.export.ort``)
are scored by the same code, with the same tokenisation, batching and metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from compress.tasks.metrics import compute_metrics
from compress.training.loop import encode, make_collate

PredictFn = Callable[[dict[str, torch.Tensor]], Any]  # a batch of model inputs -> logits [batch, labels]


def evaluate(predict_fn: PredictFn, tokenizer, spec, ds, max_length: int, batch_size: int = 128,
             with_logits: bool = False) -> dict[str, Any]:
    """The task's metrics of ``predict_fn`` on ``ds`` (its primary metric also under ``'score'``,
    the example count under ``'n'``); with ``with_logits`` the logits too (numpy, ``'logits'``)."""
    feats = encode(tokenizer, ds, max_length)
    collate = make_collate(tokenizer)
    outs = []
    for i in range(0, len(feats), batch_size):
        batch = collate(feats[i:i + batch_size])
        batch.pop("labels")
        out = predict_fn(batch)
        outs.append(out.detach().float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out))
    logits = np.concatenate(outs, axis=0)
    labels = np.array([f["labels"] for f in feats])
    m: dict[str, Any] = compute_metrics(spec.family, logits, labels)
    m["score"] = m[spec.metric]
    m["n"] = len(ds)
    if with_logits:
        m["logits"] = logits
    return m


def torch_logits_fn(model: torch.nn.Module) -> PredictFn:
    """``predict_fn`` of a PyTorch classifier: eval mode, no gradients, inputs moved to its device."""
    device = next(model.parameters()).device

    def predict(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return model(**{k: v.to(device) for k, v in batch.items()}).logits

    return predict
