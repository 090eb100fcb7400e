"""The Python API of structured pruning: remove whole attention heads and FFN neurons of a loaded
encoder (any of the role table, or one whose roles discovery finds and whose layers can shrink) to a
FLOPs target or to a speedup the latency table of this machine predicts; the same blocks as
``compress prune --stage post-training --structured heads,ffn --criterion fisher``.

    batches = [dict(tok(texts[i:i + 32], padding=True, truncation=True, return_tensors="pt"))
               for i in range(0, len(texts), 32)]          # add "labels" for the task loss
    report = compress.prune_structured_model(model, batches, flops_reduction=0.4)
    compress.save_model(model, tok, "pruned")              # per-layer sizes in config.json
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from compress.api import checks as check
from compress.core.errors import UsageError

TARGETS = ("heads", "ffn")


def prune_structured_model(model: torch.nn.Module, calibration: Sequence[dict[str, torch.Tensor]], *,
                           flops_reduction: float | None = None, speedup: float | None = None,
                           seq_len: int = 128, targets: Sequence[str] = TARGETS,
                           latency_runtime: str = "ort-int8", latency_batch: int = 32,
                           tune: bool = True, method: str = "obs") -> dict[str, Any]:
    """Remove heads and FFN neurons of ``model`` in place, once, from ``calibration`` (batches of
    the model's inputs). ``method="obs"`` (default): one at a time with the optimal update of what
    each layer keeps (structured OBS, ZipLM; ``compress.pruning.obs_structured``); ``"fisher"``: by
    Fisher importance (with ``labels`` the task loss, without them the cross-entropy against the
    model's own predictions), then rearrange and tune the kept units' scales by least squares on the
    same batches (Kwon et al. 2022; ``tune`` applies to it). Give exactly one target:

    - ``flops_reduction`` F: the encoder's FLOPs at ``seq_len`` tokens drop by at least F;
    - ``speedup`` S: the latency table of ``model``'s architecture in ``latency_runtime`` at
      ``latency_batch`` x ``seq_len`` (measured on this machine, cached) predicts at least S.

    Afterwards ``model`` is its ``Compress*`` class with the per-layer sizes in its config;
    ``save_model`` writes a folder that reloads. Returns the report (sizes kept per layer, FLOPs
    before and after, predicted speedup, seconds per phase). Refused before any work (one
    UsageError line): no target or both, a model whose type cannot shrink its layers."""
    from compress.pruning.structured import check_removable

    check.check_module("model", model)
    if method not in ("obs", "fisher"):
        raise UsageError(f"unknown method '{method}'; choose obs (reconstruction) or fisher (rescaling)")
    if (flops_reduction is None) == (speedup is None):
        raise UsageError("give exactly one target: flops_reduction=F (0 < F < 1) or speedup=S (S > 1)")
    if flops_reduction is not None:
        check.check_real("flops_reduction", flops_reduction, 0, 1, lo_open=True)
        if flops_reduction == 1:
            raise UsageError("flops_reduction=1 would remove every head and neuron; give a value below 1")
    if speedup is not None:
        check.check_real("speedup", speedup, 1, None, lo_open=True)
    check.check_int("seq_len", seq_len, 1)
    check.check_int("latency_batch", latency_batch, 1)
    if speedup is not None:
        from compress.measure.latency_table import check_runtime

        check_runtime(latency_runtime)
    from compress.pruning.fisher_structured import check_targets

    targets = check_targets(tuple(targets))
    batches = check.check_calibration(calibration, model)  # labels, where given, are kept
    if len({"labels" in b for b in batches}) > 1:
        raise UsageError("either every calibration batch carries 'labels' or none does")
    check_removable(model, targets)
    from compress.pruning.integrity import check_finite_parameters

    check_finite_parameters(model)  # a NaN weight would be pruned around or spread, not reported
    if flops_reduction is not None and method == "obs":
        from compress.pruning.obs_structured import obs_prune_structured

        return obs_prune_structured(model, batches, flops_reduction, seq_len, targets)
    if flops_reduction is not None:
        from compress.pruning.fisher_structured import fisher_prune_structured

        return fisher_prune_structured(model, batches, flops_reduction, seq_len, targets, tune=tune)
    from compress.measure.latency_table import latency_table

    table = latency_table(model, latency_runtime, latency_batch, seq_len)
    if method == "obs":
        from compress.pruning.obs_structured import obs_prune_to_speedup

        report = obs_prune_to_speedup(model, batches, table, float(speedup), targets)
    else:
        from compress.pruning.latency_structured import prune_to_speedup

        report = prune_to_speedup(model, batches, table, float(speedup), targets, tune=tune)
    return {**report, "latency_runtime": latency_runtime, "latency_shape": f"{latency_batch}x{seq_len}"}
