#!/usr/bin/env bash
# Creates .venv and installs compress with its dev tools. torch is installed first, pinned to the
# CPU build that pip finds locally here; on a machine with CUDA, install your torch build first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0" -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import compress, torch, transformers; print('compress installed; torch', torch.__version__)"
