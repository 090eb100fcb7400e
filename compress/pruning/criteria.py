"""Pruning criteria: what decides which weights go, and what each one needs to see.

A criterion is an entry of ``CRITERIA`` (name -> ``Criterion``). It declares the statistics it needs
(``needs``); a weight-only criterion needs none and scores a matrix from its weights alone, so the
training-time pruner (``compress.pruning.pruner``) can call it at any step. A criterion that needs
statistics gets them from a calibration pass (``compress.pruning.calibration``), which runs data
through the model and gathers, for one matrix at a time, exactly what the criterion asked for:

- ``"input_gram"``: ``sum_t x_t x_t^T`` over the calibration tokens of the matrix's input, ``[in, in]``
  (the layer-wise Hessian of the squared reconstruction error, up to a factor 2; SparseGPT);
- ``"input_sq"``: ``sum_t x_t^2`` per input feature, ``[in]`` (Wanda's input norms, squared);
- ``"grad_sq"``: the sum over calibration batches of the squared gradient of the task loss, shaped
  like the weight (a Fisher diagonal; movement pruning or a Fisher criterion read it). The
  calibration pass gathers it by a backward pass; no registered criterion asks for it yet.

A criterion either only scores (the lowest scores are pruned: ``score``) or prunes and rewrites
the kept weights itself (``reconstruct``: SparseGPT's layer-wise reconstruction). ``compare`` is the
group inside which scores are compared in local scope: the whole matrix, or each output row
(Wanda compares within rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from compress.core.errors import UsageError

STATISTICS = ("input_gram", "input_sq", "grad_sq")


@dataclass
class LayerStats:
    """What a calibration pass gathered for one matrix; a field the criterion did not ask for is None.
    ``tokens`` counts the (non-padding) calibration tokens the input statistics sum over."""

    input_gram: torch.Tensor | None = None
    input_sq: torch.Tensor | None = None
    grad_sq: torch.Tensor | None = None
    tokens: int = 0


# score(weight [out, in], stats or None, seeded CPU generator) -> scores shaped like the weight
ScoreFn = Callable[[torch.Tensor, "LayerStats | None", torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class Criterion:
    name: str
    summary: str
    score: ScoreFn | None = None
    needs: frozenset[str] = frozenset()
    compare: str = "matrix"  # "matrix" or "row": the comparison group in local scope
    reconstructs: bool = False  # prunes and updates the kept weights (``compress.pruning.sparsegpt``)
    structured_only: bool = False  # scores whole heads / FFN neurons, not single weights

    @property
    def data_aware(self) -> bool:
        return bool(self.needs)


def magnitude_scores(weight: torch.Tensor, stats: LayerStats | None, generator: torch.Generator
                     ) -> torch.Tensor:
    """|w|: the smallest weights go first (Gordon et al. 2020, after Han et al. 2015)."""
    return weight.detach().abs().float()


def random_scores(weight: torch.Tensor, stats: LayerStats | None, generator: torch.Generator
                  ) -> torch.Tensor:
    """Uniform noise from a seeded CPU generator: the paper's random-pruning control."""
    return torch.rand(weight.shape, generator=generator, dtype=torch.float32).to(weight.device)


def wanda_scores(weight: torch.Tensor, stats: LayerStats | None, generator: torch.Generator
                 ) -> torch.Tensor:
    """|w_ij| * ||x_j||_2 (Sun et al. 2023): a weight matters as much as the inputs it multiplies."""
    if stats is None or stats.input_sq is None:
        raise UsageError("the wanda criterion needs calibration data (input norms); prune with "
                         "--stage post-training or compress.prune_model(..., calibration=batches)")
    norm = stats.input_sq.to(weight.device, torch.float32).clamp_min(0).sqrt()
    return weight.detach().abs().float() * norm.reshape(1, -1)


def obs_saliency(weight: torch.Tensor, stats: LayerStats | None, generator: torch.Generator
                 ) -> torch.Tensor:
    """w_ij^2 / U_jj^2 with U the upper Cholesky factor of the damped ``(X^T X)^-1``: the
    optimal-brain-surgeon saliency SparseGPT selects with, used to compare matrices in global scope."""
    from compress.pruning.sparsegpt import damped_inverse

    if stats is None or stats.input_gram is None:
        raise UsageError("the sparsegpt criterion needs calibration data (input second moments); prune "
                         "with --stage post-training or compress.prune_model(..., calibration=batches)")
    u = torch.linalg.cholesky(damped_inverse(stats.input_gram, weight), upper=True)
    d = torch.diagonal(u).float().to(weight.device)
    return weight.detach().float() ** 2 / d.reshape(1, -1) ** 2


CRITERIA: dict[str, Criterion] = {
    "magnitude": Criterion("magnitude", "|w|, per matrix or globally", magnitude_scores),
    "random": Criterion("random", "uniform noise (the random-pruning control)", random_scores),
    "wanda": Criterion("wanda", "|w| x input norm, compared within each output row (needs calibration)",
                       wanda_scores, frozenset({"input_sq"}), compare="row"),
    "sparsegpt": Criterion("sparsegpt", "layer-wise OBS reconstruction of the kept weights (needs "
                                        "calibration)", obs_saliency, frozenset({"input_gram"}),
                           reconstructs=True),
    # heads and FFN neurons (``compress.pruning.fisher_structured``), with --structured only
    "fisher": Criterion("fisher", "Fisher information of head / FFN-neuron masks, searched under a "
                                  "FLOPs target with least-squares mask tuning (Kwon et al. 2022; "
                                  "--structured, needs calibration)",
                        needs=frozenset({"grad_sq"}), structured_only=True),
    "obs": Criterion("obs", "structured OBS: heads and FFN neurons removed one at a time with the optimal "
                            "update of what each layer keeps, searched under a FLOPs or latency target "
                            "(ZipLM, Kurtic et al. 2023; --structured, needs calibration)",
                     needs=frozenset({"input_gram"}), structured_only=True, reconstructs=True),
}

# the structured criteria that search a FLOPs (--flops-reduction) or latency (--speedup) target
STRUCTURED_SEARCHES = ("fisher", "obs")
# what --structured with --speedup or --flops-reduction uses unless --criterion says otherwise, by
# task family, as measured (docs/results.md): on classification the reconstruction kept more
# accuracy than Fisher + rescaling at every target (SST-2, AG News); on sentence embeddings the
# embedding Fisher's choice kept more ReQA P@1 one-shot at 2x (56.54 against 53.57)
DEFAULT_STRUCTURED_SEARCH = {"embedding": "fisher"}
DEFAULT_STRUCTURED_SEARCH_OTHERWISE = "obs"


def default_structured_search(task_family: str) -> str:
    """The structured search a task family gets when --criterion is not given."""
    return DEFAULT_STRUCTURED_SEARCH.get(task_family, DEFAULT_STRUCTURED_SEARCH_OTHERWISE)


def get_criterion(name: str) -> Criterion:
    if name not in CRITERIA:
        raise UsageError(f"unknown criterion '{name}'; choose one of: {', '.join(CRITERIA)}")
    return CRITERIA[name]


def unstructured(name: str) -> Criterion:
    """The criterion ``name`` when it scores single weights; UsageError for a structured one."""
    crit = get_criterion(name)
    if crit.structured_only:
        raise UsageError(f"criterion '{name}' removes whole heads / FFN neurons: add --structured "
                         "heads,ffn (and --flops-reduction)")
    return crit


def weight_only(name: str) -> Criterion:
    """The criterion ``name`` when it scores from weights alone (the training-time pruner's kind);
    UsageError naming the one-shot alternative for a criterion that needs calibration data."""
    crit = unstructured(name)
    if crit.data_aware:
        raise UsageError(f"criterion '{name}' needs calibration data and prunes once: use --stage "
                         f"post-training (a fine-tuned model; --recovery-steps N to train after), or "
                         f"compress.prune_model(model, sparsity, criterion='{name}', calibration=batches)")
    return crit
