"""Make structured-pruned folders (model types ``compress_<type>``) loadable with plain
``Auto*.from_pretrained`` once ``compress`` is imported, without importing transformers early.

``import compress`` stays light (no torch, no transformers). If transformers is already imported,
the types are registered at once; otherwise a one-shot import hook registers them right after
transformers itself is imported, so ``import compress; from transformers import AutoModel...``
works in either order.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

MODELING = "compress.models.modeling_pruned"


def register_now() -> None:
    module = sys.modules.get(MODELING)
    if module is not None and not hasattr(module, "register_auto_classes"):
        # transformers is being imported by the modeling module itself, half-way through its own
        # import: the code that imports it registers the classes (compress.models.loading, structured)
        return
    from compress.models.modeling_pruned import register_auto_classes

    register_auto_classes()


class _RegisterAfterTransformers(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first ``import transformers`` it wraps the real loader so the
    pruned types are registered as soon as the package has been executed, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            register_now()

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Register now if transformers is loaded, else on its import (idempotent)."""
    if "transformers" in sys.modules:
        register_now()
    elif not any(isinstance(f, _RegisterAfterTransformers) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterTransformers())
