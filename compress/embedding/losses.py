"""Label-free losses of a sentence-embedding model against its dense original.

**Recovery** (``cosine_distillation_loss``): the mean cosine distance ``1 - cos(s(x), t(x))`` between
the student's and the dense teacher's embeddings of each unlabelled sentence: for unit embeddings
it is half their squared distance, the quantity retrieval by cosine depends on.

**Fisher of the structured search** (``embedding_fisher``). Kwon et al. score a head / neuron mask
by the Fisher of a loss; the distance to the original embeddings has zero gradient at the original
model, so its empirical Fisher is zero there. Its curvature is not: at zero residual the Hessian of
``L = 1/2 ||e(m) - e(1)||^2`` in the masks ``m`` is the Gauss-Newton matrix ``J^T J`` (``J`` the
Jacobian of the embedding in the masks). For a random direction ``v ~ N(0, I)`` the gradient of
``v . e(m)`` is ``J^T v``, whose outer product has expectation ``J^T J``: per-example gradients of
that projection, ``draws`` directions per sentence, are an unbiased sample of the matrix the
search, rearrangement and removal-loss estimates read, in place of labels (the sampled-label Fisher
of a Gaussian output model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from compress.embedding.model import SentenceEncoder, tokens

FISHER_DRAWS = 4
PROJECTION_KEY = "labels"  # the batch key the Fisher and calibration code treat as a label (not an input)


def text_collate(tokenizer, max_length: int, lower_case: bool = False) -> Callable[[Sequence[str]], dict]:
    """Sentences -> padded model inputs (lowercased first with ``lower_case``)."""
    return lambda texts: tokens(tokenizer, list(texts), max_length, lower_case=lower_case)


LossFn = Callable[[SentenceEncoder, dict], tuple[torch.Tensor, dict]]


def cosine_distillation_loss(teacher: SentenceEncoder, layers_weight: float = 0.0) -> LossFn:
    """``loss_fn(model, batch)`` for ``compress.training.loop.train``: mean ``1 - cos`` to ``teacher``
    (kept frozen, moved to the batch's device on first use). ``layers_weight`` > 0 adds that weight
    times the token-level layer-wise MSE of the encoder layers the student kept (ZipLM;
    ``compress.distill.losses.layerwise_mse``), both terms then logged."""
    from compress.distill.losses import layerwise_mse
    from compress.distill.teacher_kd import kept_layers

    teacher.eval().requires_grad_(False)

    def loss(model, batch: dict) -> tuple[torch.Tensor, dict]:
        device = batch["input_ids"].device
        if next(teacher.parameters()).device != device:
            teacher.to(device)
        if layers_weight <= 0:
            with torch.no_grad():
                t = teacher(**batch)
            return (1 - F.cosine_similarity(model(**batch), t, dim=-1)).mean(), {}
        student = getattr(model, "module", model)  # DDP-wrapped on several processes
        mask = batch["attention_mask"]
        with torch.no_grad():
            t_last, t_hidden = layer_states(teacher.encoder, batch)
        s_last, s_hidden = layer_states(student.encoder, batch)
        cos = (1 - F.cosine_similarity(student.embedding_of(s_last, mask), teacher.embedding_of(t_last, mask),
                                       dim=-1)).mean()
        layers = layerwise_mse(s_hidden, t_hidden, mask, kept_layers(student.encoder))
        return cos + layers_weight * layers, {"cosine": cos.item(), "layers": layers.item()}
    return loss


def layer_states(encoder, batch: dict) -> tuple[torch.Tensor, list]:
    """(last token states, ``hidden_states``-style list: entry l + 1 the output of layer l, entry 0
    unused). Read by forward hooks on the layers: transformers' own ``output_hidden_states``
    collection returns None once a structured prune has emptied a block (its module class changes);
    where the hooks do not see one call per layer (shared layers), that collection is used."""
    from compress.models.architectures import encoder_layers

    outs: list[torch.Tensor] = []
    def grab(module, args, output):
        outs.append(output[0] if isinstance(output, tuple) else output)

    hooks = [lay.module.register_forward_hook(grab) for lay in encoder_layers(encoder)]
    try:
        last = encoder(**batch).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    if len(outs) == encoder.config.num_hidden_layers:
        return last, [None, *outs]
    out = encoder(**batch, output_hidden_states=True)
    return out.last_hidden_state, list(out.hidden_states)


def projected_embedding_loss(model: SentenceEncoder) -> Callable[[object, dict], torch.Tensor]:
    """``loss_fn(outputs, batch) -> [batch]`` for ``fisher_importance`` on ``model.encoder``: the
    pooled (and normalised) embedding projected on the batch's random directions."""
    def loss(outputs, batch: dict) -> torch.Tensor:
        e = model.embedding_of(outputs.last_hidden_state, batch["attention_mask"])
        return (e * batch[PROJECTION_KEY].to(e.dtype)).sum(-1)
    return loss


def with_projections(batches: Sequence[dict], width: int, draws: int, seed: int) -> list[dict]:
    """Each batch ``draws`` times, each time with fresh N(0, I) directions under ``PROJECTION_KEY``."""
    g = torch.Generator().manual_seed(seed)
    return [{**b, PROJECTION_KEY: torch.randn(len(b["input_ids"]), width, generator=g)}
            for _ in range(draws) for b in batches]


def embedding_fisher(model: SentenceEncoder, batches: Sequence[dict], draws: int = FISHER_DRAWS,
                     seed: int = 0):
    """``compress.pruning.fisher_masks.fisher_importance`` of ``model.encoder`` with the projected
    embedding loss (module docstring); ``loss`` names it in the report."""
    from dataclasses import replace

    from compress.pruning.fisher_masks import fisher_importance

    projected = with_projections(batches, model.dim, draws, seed)
    fisher = fisher_importance(model.encoder, projected, projected_embedding_loss(model))
    return replace(fisher, loss=f"Gauss-Newton of the distance to the dense embeddings ({draws} random "
                                "projections per sentence)")
