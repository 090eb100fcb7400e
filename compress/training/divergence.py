"""The finite-loss guard of every training loop: the first NaN or infinite loss stops the run.

A loss that is not finite poisons the gradients, then the weights, and every later step; a model
saved after it would be garbage that still loads. The loops check the loss of each step before its
backward pass and raise ``TrainingDivergedError`` naming the step and the values most likely to
blame, so the run folder is never completed (``compress.core.runs.RunDir`` keeps it only when it holds a
checkpoint of the steps before, for ``--resume``).
"""

from __future__ import annotations

import math

from compress.core.errors import TrainingDivergedError


def likely_cause(lr: float, temperature: float | None = None, kd_lambda: float | None = None) -> str:
    """The flags to look at first: the KD values when a teacher is used, else the learning rate."""
    if temperature is not None and kd_lambda is not None:
        return (f"the KD values --temperature {temperature:g} and --kd-lambda {kd_lambda:g} "
                f"(learning rate --lr {lr:g}); lower --kd-lambda or --lr")
    return f"the learning rate --lr {lr:g}; lower it"


def check_finite_loss(loss: float, step: int, cause: str, elsewhere: bool = False) -> None:
    """Raise TrainingDivergedError when ``loss`` (of optimizer step ``step``, 1-based) is NaN or
    infinite, or when ``elsewhere`` (another process's loss of the step is); ``cause`` is
    ``likely_cause(...)``."""
    if math.isfinite(loss) and not elsewhere:
        return
    what = f"the loss is {loss}" if not math.isfinite(loss) else "another process's loss is not finite"
    raise TrainingDivergedError(f"training diverged: {what} at step {step}; no model was saved. "
                                f"Likely cause: {cause}")
