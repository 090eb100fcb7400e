"""Recipes: each command's end-to-end workflow, one module per command, reading as a training
script does (set-up, loop, evaluation, save). They are built from the layers below them
(``compress.models``, ``compress.training``, the blocks ``compress.pruning``, ``compress.distill``,
``compress.measure``, ``compress.export``, ..., and the API); the CLI (``compress.cli``) parses flags into a
recipe's config and calls its ``run_*``. Nothing below this package imports it."""
