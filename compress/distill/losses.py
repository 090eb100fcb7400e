"""Knowledge-distillation losses (pure functions of logits).

L = L_task + lambda * L_distill (Adhikari et al. 2020; Hinton et al. 2015):

- single-label: L_task = cross-entropy with the gold label; L_distill = T^2 * KL(p_t || p_s) with
  p = softmax(logits / T), averaged over the batch. The T^2 factor keeps the gradient scale of the
  soft term independent of T (Hinton et al. 2015).
- multi-label: L_task = binary cross-entropy per label; L_distill = T^2 * mean over examples and labels
  of the Bernoulli KL(q_t || q_s) with q = sigmoid(logits / T).

``kd_loss="mse"`` replaces either KL by the mean squared difference of the raw logits, averaged
over examples and labels (Tang et al. 2019, who distil BERT into a BiLSTM this way); it has no
temperature.

Examples without a gold label (augmented ones) have ``label_mask`` 0: they add to L_distill only.

``layerwise_mse`` is a term on activations instead of logits: the token-level layer-wise
distillation of ZipLM (Kurtic, Frantar & Alistarh 2023), for a pruned student that keeps its
teacher's layer count and hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

# T = 1: the teacher's probabilities as they are (Hinton et al. 2015 soften them with T > 1)
DEFAULT_TEMPERATURE = 1.0

def kl_single_label(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                    temperature: float = DEFAULT_TEMPERATURE) -> torch.Tensor:
    """T^2 * mean_i KL(softmax(t_i / T) || softmax(s_i / T)); logits are (batch, labels)."""
    t = temperature
    log_p_s = F.log_softmax(student_logits / t, dim=-1)
    log_p_t = F.log_softmax(teacher_logits / t, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    return kl.mean() * t * t


def kl_bernoulli(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                 temperature: float = DEFAULT_TEMPERATURE) -> torch.Tensor:
    """T^2 * mean over examples and labels of KL(Bern(q_t) || Bern(q_s)), q = sigmoid(logit / T)."""
    t = temperature
    s, z = student_logits / t, teacher_logits / t
    q_t = torch.sigmoid(z)
    # log q = logsigmoid(x), log (1 - q) = logsigmoid(-x): stable for large |x|
    kl = q_t * (F.logsigmoid(z) - F.logsigmoid(s)) + (1 - q_t) * (F.logsigmoid(-z) - F.logsigmoid(-s))
    return kl.mean() * t * t


def logit_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
              temperature: float = DEFAULT_TEMPERATURE) -> torch.Tensor:
    """mean over examples and labels of (s - t)^2 on raw logits; ``temperature`` is not used."""
    return (student_logits - teacher_logits).pow(2).mean()


def task_loss(student_logits: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor,
              multilabel: bool) -> torch.Tensor:
    """Cross-entropy (labels: int (batch,)) or BCE (labels: multi-hot (batch, labels)) averaged
    over the examples whose ``label_mask`` is true; 0 when the batch has none."""
    keep = label_mask.bool()
    if not keep.any():
        return student_logits.sum() * 0.0
    s, y = student_logits[keep], labels[keep]
    if multilabel:
        return F.binary_cross_entropy_with_logits(s, y.float())
    return F.cross_entropy(s, y.long())


KD_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "kl": kl_single_label,
    "bernoulli_kl": kl_bernoulli,
    "mse": logit_mse,
}
KD_LOSS_CHOICES = ("kl", "mse")  # what a user picks; "kl" is Bernoulli KL for multi-label tasks


# Beyond these a KD loss stops being a sensible objective and floats overflow: T^2 * KL grows with
# T^2 (T = 1e20 squares to inf in float32), and lambda multiplies the whole KD term.
MAX_TEMPERATURE = 100.0
MAX_KD_LAMBDA = 1e4
KD_BOUNDS_HELP = f"T in (0, {MAX_TEMPERATURE:g}], lambda in [0, {MAX_KD_LAMBDA:g}]"


def check_kd_values(temperature: float, kd_lambda: float | None) -> None:
    """Raise UsageError when the temperature is outside (0, MAX_TEMPERATURE] or the KD weight
    (unless None: the default) outside [0, MAX_KD_LAMBDA]."""
    from compress.core.config import check_range

    check_range("temperature", temperature, 0, MAX_TEMPERATURE, lo_open=True)
    if kd_lambda is not None:
        check_range("kd_lambda", kd_lambda, 0, MAX_KD_LAMBDA)


def default_kd_lambda(multilabel: bool) -> float:
    """The KD weight when none is given: 4 single-label, 1 multi-label (Adhikari et al. 2020)."""
    return 1.0 if multilabel else 4.0


def kd_loss_name(multilabel: bool, kind: str = "kl") -> str:
    """The KD_LOSSES entry for a task family and a user's choice (kl or mse)."""
    if kind == "mse":
        return "mse"
    return "bernoulli_kl" if multilabel else "kl"


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None,
                      labels: torch.Tensor, label_mask: torch.Tensor, multilabel: bool,
                      temperature: float, kd_lambda: float, kind: str = "kl") -> dict[str, torch.Tensor]:
    """{"loss", "task", "distill"}: loss = task + kd_lambda * distill. With ``teacher_logits`` None
    (the --no-kd baseline) distill is 0."""
    task = task_loss(student_logits, labels, label_mask, multilabel)
    if teacher_logits is None or kd_lambda == 0:
        distill = student_logits.sum() * 0.0
    else:
        distill = KD_LOSSES[kd_loss_name(multilabel, kind)](student_logits, teacher_logits, temperature)
    return {"loss": task + kd_lambda * distill, "task": task, "distill": distill}


def layerwise_mse(student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
                  attention_mask: torch.Tensor | None = None,
                  layers: Sequence[int] | None = None) -> torch.Tensor:
    """Token-level layer-wise distillation (ZipLM, Kurtic et al. 2023): for each matched encoder
    layer l, the squared difference of the student's and the teacher's output token
    representations at layer l, averaged over the non-padding tokens of the batch and the hidden
    dimension; then the mean over the matched layers.

    ``student_hidden`` / ``teacher_hidden``: the ``hidden_states`` of a transformers model called
    with ``output_hidden_states=True``, entry 0 the embeddings and entry l + 1 the output of encoder
    layer l, each (batch, seq, hidden); the embeddings are never matched. ``attention_mask``
    (batch, seq): 1 on real tokens, 0 on padding (None: every token counts). ``layers``: the
    0-based encoder layers to match (None: all), e.g. those a structured prune left something in.
    Computed in float32 whatever the activations' dtype. Raises ValueError when the two do not
    pair up (another count or shape) or when ``layers`` is empty or out of range."""
    if len(student_hidden) != len(teacher_hidden):
        raise ValueError(f"the student has {len(student_hidden) - 1} layers' hidden states, the teacher "
                         f"{len(teacher_hidden) - 1}; layer-wise distillation needs the same count")
    n_layers = len(student_hidden) - 1
    chosen = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    if not chosen:
        raise ValueError("no layer to match: layers is empty")
    outside = [i for i in chosen if not 0 <= i < n_layers]
    if outside:
        raise ValueError(f"layers {outside} are not encoder layers of a {n_layers}-layer model (0-based)")
    first = student_hidden[chosen[0] + 1]
    if attention_mask is None:
        weights = torch.ones(first.shape[:2], device=first.device)
    else:
        weights = attention_mask.to(device=first.device, dtype=torch.float32)
    weights = weights.unsqueeze(-1)  # (batch, seq, 1): broadcast over the hidden dimension
    per_layer = []
    for i in chosen:
        s, t = student_hidden[i + 1], teacher_hidden[i + 1]
        if s.shape != t.shape:
            raise ValueError(f"layer {i}: student hidden states {tuple(s.shape)}, teacher "
                             f"{tuple(t.shape)}; layer-wise distillation needs the same shape")
        squared = (s.float() - t.float()).pow(2) * weights
        per_layer.append(squared.sum() / (weights.sum().clamp(min=1.0) * s.shape[-1]))
    return torch.stack(per_layer).mean()
