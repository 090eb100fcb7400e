"""Each default has one home: the configs, the Python API and the Trainer integration all read
the schedule power and the KD temperature from the module that defines them, and every sparsity
is range-checked by one function."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from compress.core.config import check_sparsity
from compress.core.errors import UsageError
from compress.distill.losses import DEFAULT_TEMPERATURE
from compress.pruning.schedules import DEFAULT_POWER


def _default(cls, name):
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


def test_schedule_power_and_temperature_defaults_come_from_one_place():
    import compress
    from compress.api.prune_stages import PruneConfig
    from compress.distill.teacher_kd import TeacherKDOptions
    from compress.distill.train import StudentTrainConfig
    from compress.integrations.hf_trainer import DistillationTrainer, PruningCallback
    from compress.pruning.schedules import GradualSchedule
    from compress.recipes.distill import DistillConfig

    assert DEFAULT_POWER == 3.0 and DEFAULT_TEMPERATURE == 1.0  # Zhu & Gupta's cubic; plain softmax
    assert _default(PruneConfig, "schedule_power") == DEFAULT_POWER
    assert _default(GradualSchedule, "power") == DEFAULT_POWER
    assert inspect.signature(compress.make_pruner).parameters["power"].default == DEFAULT_POWER
    assert inspect.signature(PruningCallback).parameters["power"].default == DEFAULT_POWER
    for cls in (DistillConfig, TeacherKDOptions, StudentTrainConfig):
        assert _default(cls, "temperature") == DEFAULT_TEMPERATURE, cls.__name__
    assert inspect.signature(compress.kd_loss).parameters["temperature"].default == DEFAULT_TEMPERATURE
    trainer_init = inspect.signature(DistillationTrainer.__init__)
    assert trainer_init.parameters["temperature"].default == DEFAULT_TEMPERATURE


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, float("nan")])
def test_every_sparsity_entry_point_refuses_the_same_values(value, tiny_bert):
    import compress
    from compress.api.prune_stages import PruneConfig
    from compress.pruning.schedules import GradualSchedule, OneShotSchedule

    with pytest.raises(UsageError, match="--sparsity must be in \\[0, 1\\)"):
        check_sparsity(value)
    for build in (lambda: PruneConfig(sparsity=value), lambda: OneShotSchedule(value),
                  lambda: GradualSchedule(value, 0, 10), lambda: compress.PruningCallback(value)):
        with pytest.raises(UsageError, match="--sparsity must be in \\[0, 1\\)"):
            build()
