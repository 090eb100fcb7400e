"""A sequence classifier's evaluation and the start of its fresh head, shared by the commands that
train or score one."""

from __future__ import annotations

import torch

from compress.tasks.base import TaskSpec, TextDataset


def evaluate_classifier(model, tokenizer, spec: TaskSpec, ds: TextDataset, max_length: int,
             batch_size: int = 128) -> dict[str, float]:
    """Metrics of a PyTorch ``model`` on ``ds`` (``compress.training.evaluation.evaluate``, as onnxruntime's
    are); the task's primary metric is also under ``'score'``."""
    from compress.training.evaluation import evaluate as evaluate_fn
    from compress.training.evaluation import torch_logits_fn

    return evaluate_fn(torch_logits_fn(model), tokenizer, spec, ds, max_length, batch_size)


def label_prior_logits(ds: TextDataset) -> torch.Tensor:
    """Log-odds of each label's training frequency, clipped away from 0 and 1 by half a document."""
    n = len(ds)
    counts = torch.zeros(len(ds.label_names), dtype=torch.float64)
    for y in ds.labels:
        counts[list(y)] += 1
    p = ((counts + 0.5) / (n + 1.0)).clamp(1e-6, 1 - 1e-6)
    return torch.log(p / (1 - p)).float()


def classifier_output_layer(model) -> torch.nn.Linear:
    """The Linear layer that makes a sequence classifier's logits: ``classifier`` itself (BERT,
    DistilBERT, DeBERTa, ModernBERT) or the last Linear inside it (RoBERTa's and ELECTRA's
    ``classifier.out_proj``)."""
    head = model.classifier
    layers = [head] if isinstance(head, torch.nn.Linear) else [
        m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and layers[-1].out_features == model.config.num_labels, type(head).__name__
    return layers[-1]


def init_bias_to_prior(head: torch.nn.Linear, ds: TextDataset) -> None:
    """Start a fresh multi-label head at the label prior (bias = log-odds of each label's frequency).

    With zero biases every one of Reuters' 90 sigmoids starts at 0.5 and the first hundreds of
    steps only push them down to the label frequencies; runs of 1-2 epochs then ended on a constant
    output (micro-F1 0). Starting at the prior is the usual remedy for rare positive classes
    (Lin et al. 2017, "Focal loss", section 3.3).
    """
    with torch.no_grad():
        head.bias.copy_(label_prior_logits(ds).to(head.bias.dtype))
