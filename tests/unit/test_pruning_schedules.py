"""Schedules against hand-computed values."""

from __future__ import annotations

import pytest

from compress.core.errors import UsageError
from compress.pruning.schedules import GradualSchedule, OneShotSchedule, make_schedule


def test_gradual_cubic_hand_computed():
    s = GradualSchedule(final_sparsity=0.4, span_steps=10, every=2)
    # s_t = 0.4 + (0 - 0.4) * (1 - t/10)^3
    assert s.sparsity_at(0) == pytest.approx(0.0)
    assert s.sparsity_at(2) == pytest.approx(0.4 - 0.4 * 0.8 ** 3)  # 0.1952
    assert s.sparsity_at(2) == pytest.approx(0.1952)
    assert s.sparsity_at(5) == pytest.approx(0.35)
    assert s.sparsity_at(8) == pytest.approx(0.4 - 0.4 * 0.008)  # 0.3968
    assert s.sparsity_at(10) == pytest.approx(0.4)
    assert s.sparsity_at(500) == pytest.approx(0.4)
    assert [t for t in range(15) if s.is_prune_step(t)] == [0, 2, 4, 6, 8, 10]


def test_gradual_offset_initial_and_power():
    s = GradualSchedule(final_sparsity=0.5, span_steps=4, every=1, start_step=10,
                        initial_sparsity=0.1, power=1.0)
    assert s.sparsity_at(3) == 0.0  # nothing before t0
    assert s.sparsity_at(10) == pytest.approx(0.1)
    assert s.sparsity_at(12) == pytest.approx(0.3)  # linear halfway
    assert s.sparsity_at(14) == pytest.approx(0.5)
    assert s.end_step == 14


def test_last_prune_step_is_the_end_even_when_every_does_not_divide():
    s = GradualSchedule(final_sparsity=0.3, span_steps=10, every=3)
    assert [t for t in range(20) if s.is_prune_step(t)] == [0, 3, 6, 9, 10]


def test_schedule_is_monotone():
    s = GradualSchedule(final_sparsity=0.9, span_steps=37, every=1)
    vals = [s.sparsity_at(t) for t in range(50)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))


def test_oneshot():
    s = OneShotSchedule(0.4, start_step=3)
    assert [s.sparsity_at(t) for t in range(5)] == [0.0, 0.0, 0.0, 0.4, 0.4]
    assert [t for t in range(6) if s.is_prune_step(t)] == [3]


def test_make_schedule_defaults_prune_over_first_half_in_tenths():
    s = make_schedule("gradual", 0.4, total_steps=100)
    assert (s.span_steps, s.every, s.start_step) == (50, 5, 0)
    s = make_schedule("gradual", 0.4, total_steps=10)
    assert (s.span_steps, s.every) == (5, 1)
    assert isinstance(make_schedule("oneshot", 0.4, 10), OneShotSchedule)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(name="cosine"), "unknown schedule 'cosine'; choose one of: oneshot, gradual"),
    (dict(prune_steps=4, prune_every=5), "--prune-every (5) must not exceed --prune-steps (4)"),
    (dict(final_sparsity=1.0), "--sparsity must be in [0, 1)"),
    (dict(name="oneshot", start_step=100), "--prune-start (100) must be below the number of training "
                                           "steps (100)"),
])
def test_bad_schedule_options(kwargs, needle):
    args = dict(name="gradual", final_sparsity=0.4, total_steps=100)
    args.update(kwargs)
    with pytest.raises(UsageError) as e:
        make_schedule(**args)
    assert needle in str(e.value)
