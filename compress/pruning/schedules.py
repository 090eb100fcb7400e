"""Sparsity schedules: pure functions of the optimizer step, testable without a model.

``sparsity_at(step)`` is the target fraction of zeros after optimizer step ``step`` (step 0 = before
training); ``is_prune_step(step)`` says whether masks are recomputed at that step. Between pruning
steps, and after the last one, the masks stay fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress.core.config import check_range, check_sparsity
from compress.core.errors import UsageError

# Zhu & Gupta (2017): sparsity rises as 1 - (1 - t)^3 over the pruning span (Gordon et al. use it)
DEFAULT_POWER = 3.0

@dataclass(frozen=True)
class OneShotSchedule:
    """Prune to ``final_sparsity`` once, at ``start_step``; zero sparsity before."""

    final_sparsity: float
    start_step: int = 0

    def __post_init__(self):
        check_sparsity(self.final_sparsity)
        check_range("prune_start", self.start_step, 0)

    def sparsity_at(self, step: int) -> float:
        return self.final_sparsity if step >= self.start_step else 0.0

    def is_prune_step(self, step: int) -> bool:
        return step == self.start_step

    @property
    def end_step(self) -> int:
        return self.start_step


@dataclass(frozen=True)
class GradualSchedule:
    """Zhu & Gupta (2017) polynomial schedule, cubic by default.

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** power  for t0 <= t <= t0 + n*dt,
    with ``span_steps`` = n*dt (``--prune-steps``) and ``every`` = dt (``--prune-every``).
    Masks are recomputed at t0, t0 + dt, t0 + 2dt, ... and always at t0 + n*dt, so the final
    sparsity is reached even when dt does not divide the span. Before t0 nothing is pruned.
    """

    final_sparsity: float
    span_steps: int
    every: int = 1
    start_step: int = 0
    initial_sparsity: float = 0.0
    power: float = DEFAULT_POWER

    def __post_init__(self):
        check_sparsity(self.final_sparsity)
        check_range("initial_sparsity", self.initial_sparsity, 0, self.final_sparsity)
        check_range("prune_steps", self.span_steps, 1)
        check_range("prune_every", self.every, 1)
        check_range("prune_start", self.start_step, 0)
        check_range("schedule_power", self.power, 0, None, lo_open=True)
        if self.every > self.span_steps:
            raise UsageError(f"--prune-every ({self.every}) must not exceed --prune-steps "
                             f"({self.span_steps})")

    @property
    def end_step(self) -> int:
        return self.start_step + self.span_steps

    def sparsity_at(self, step: int) -> float:
        if step < self.start_step:
            return 0.0
        if step >= self.end_step:
            return self.final_sparsity
        frac = (step - self.start_step) / self.span_steps
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * (1 - frac) ** self.power

    def is_prune_step(self, step: int) -> bool:
        if step < self.start_step or step > self.end_step:
            return False
        return (step - self.start_step) % self.every == 0 or step == self.end_step


Schedule = OneShotSchedule | GradualSchedule

SCHEDULES: dict[str, type] = {"oneshot": OneShotSchedule, "gradual": GradualSchedule}


def make_schedule(name: str, final_sparsity: float, total_steps: int, prune_steps: int | None = None,
                  prune_every: int | None = None, start_step: int = 0, initial_sparsity: float = 0.0,
                  power: float = DEFAULT_POWER) -> Schedule:
    """Build a schedule from CLI-level options; unset spans default to short-run friendly values.

    ``prune_steps`` defaults to the first half of the ``total_steps`` after ``start_step`` (the paper
    prunes over the first 10k of its steps, then trains with fixed masks); ``prune_every`` defaults
    to a tenth of that span, so a gradual run prunes in about ten increments.
    """
    if name not in SCHEDULES:
        raise UsageError(f"unknown schedule '{name}'; choose one of: {', '.join(SCHEDULES)}")
    if start_step >= total_steps and total_steps > 0:  # one-shot too: it would prune after training
        raise UsageError(f"--prune-start ({start_step}) must be below the number of training steps "
                         f"({total_steps})")
    if name == "oneshot":
        return OneShotSchedule(final_sparsity, start_step)
    span = prune_steps if prune_steps is not None else max(1, (total_steps - start_step) // 2)
    every = prune_every if prune_every is not None else max(1, span // 10)
    return GradualSchedule(final_sparsity, span, every, start_step, initial_sparsity, power)
