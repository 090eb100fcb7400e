"""The package version (one home: the root package and ``compress info`` read it here)."""

__version__ = "0.1.0"
