"""The benchmarks behind docs/results.md, as one suite: ``python -m benchmarks`` lists them,
``python -m benchmarks NAME --help`` shows one's options (names in :mod:`benchmarks.registry`)."""
