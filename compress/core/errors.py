"""One exception type per domain failure; the CLI turns each into one line and an exit code."""


class CompressError(Exception):
    """Base class. ``exit_code`` is what the CLI returns: 1 for data/runtime, 2 for usage."""

    exit_code = 1


class UsageError(CompressError):
    """A flag or config value is wrong: unknown name, value out of range, missing argument."""

    exit_code = 2


class DataError(CompressError):
    """Input data is missing, empty or malformed."""


class ModelError(CompressError):
    """A model cannot be found or loaded, or does not fit the task."""


class ParityError(CompressError):
    """An exported model disagrees with PyTorch beyond the tolerance."""


class IntegrityError(CompressError):
    """A pruned weight became non-zero where its mask says zero."""


class CorruptFileError(CompressError):
    """A saved file (weights, masks) is truncated or unreadable: a copy cut short, a full disk."""


class MeasurementError(CompressError):
    """A timing cannot be trusted (the machine was busy while it ran): nothing is built on it."""


class TrainingDivergedError(CompressError):
    """The training loss became NaN or infinite: the run stops and saves no model."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message for a one-line report, its class name when it has none."""
    return next(iter(str(err).strip().splitlines()), "") or type(err).__name__
