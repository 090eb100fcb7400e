"""Checks on paths that come from flags and config files, applied before anything is written.

The loading rules themselves live where loading happens and are enforced by tests that scan the
source (tests/unit/test_security.py): weights only from safetensors, ``torch.load`` only with
``weights_only=True``, ``trust_remote_code`` never on, YAML only through ``yaml.safe_load``.
"""

from __future__ import annotations

import re
from pathlib import Path

from compress.core.errors import UsageError

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]")


def _no_nul(value: str, option: str) -> None:
    if "\x00" in value:
        raise UsageError(f"{option} contains a NUL byte ({value!r}); pass a plain path")


def resolve_out(out: str | Path, option: str = "--out") -> Path:
    """The absolute, symlink-resolved run folder for ``out``; refuses what cannot become a folder.

    An existing file, or a path under an existing file, is a usage error; an existing folder is
    left to the caller (``RunDir`` refuses to overwrite it).
    """
    text = str(out)
    _no_nul(text, option)
    if not text.strip():
        raise UsageError(f"{option} is empty; pass the run folder to create")
    p = Path(text).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {p} is an existing file, not a run folder; choose a new folder name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{option} {p}: {parent} is a file, so no folder can be created "
                                 "under it; choose another path")
            break
    return p


def safe_run_name(name: str) -> str:
    """``name`` as one safe path component: characters other than letters, digits and ``._+=@-``
    become ``-`` and leading dots are dropped, so a run name can never leave its parent folder
    (``../x`` -> ``-x``) or hide it."""
    cleaned = _UNSAFE.sub("-", str(name)).lstrip(".")[:128]
    return cleaned or "run"
