"""``TrainHook``: the extension points of the training loop (``compress.training.loop.train``).

Pruners, distillation losses and trackers implement it; the loop calls it. It lives on the ground
floor, beside errors and config, so that a hook's module never has to import the loop it plugs into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class TrainHook:
    """Extension points of the loop; every method is optional.

    ``state_dict`` is saved in every checkpoint and must hold only tensors and plain Python values
    (checkpoints are read back with ``torch.load(weights_only=True)``). Its tensors are also what
    the cross-rank check compares in multi-process runs.
    """

    def on_train_begin(self, model, total_steps: int) -> None:
        pass

    def compute_loss(self, model, batch: dict, outputs) -> torch.Tensor | None:
        """Return a loss to replace the model's own, or None to keep it."""
        return None

    def on_after_backward(self, model) -> None:
        """Called after the backward pass, before gradient clipping and the optimizer step
        (pruning hooks zero the gradients of pruned weights here)."""

    def on_step_end(self, model, step: int) -> None:
        """Called after every optimizer step (masks are re-applied here)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
