"""python -m benchmarks [list | NAME [options]]: list the benchmarks, or run one."""

from __future__ import annotations

import sys

from benchmarks.registry import BENCHMARKS
from benchmarks.suite import run_benchmark

USAGE = """usage: python -m benchmarks NAME [options]     run one benchmark (NAME --help: its options)
       python -m benchmarks list                  this list

Each writes artifacts/benchmarks/NAME-<date>.json (or --out): date, commit, machine, load average,
budget and results; --dry-run prints the steps it would run.

benchmarks:"""


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    return "\n".join([USAGE, *(f"  {name:<{width}}  {b.summary}" for name, b in BENCHMARKS.items())])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        print(f"python -m benchmarks: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    return run_benchmark(BENCHMARKS[name], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
