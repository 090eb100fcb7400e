from compress.core.errors import UsageError
from compress.report import write_report

HELP = "write report.md with PNG plots and CSV tables for a sweep folder or a run folder"
EXAMPLES = """examples:
  compress report artifacts/sweep/gordon        # metric vs sparsity, pre-training loss, Pareto, ...
  compress report artifacts/prune/20260101-120000-sst2-finetune-magnitude-40
"""


def add_arguments(parser):
    parser.add_argument("path", nargs="?", help="a sweep folder (sweep.json) or a run folder (summary.json)")


def run(args):
    if not args.path:
        raise UsageError("pass the sweep or run folder to report on, e.g. compress report artifacts/sweep/x")
    out = write_report(args.path)
    print(f"report: {out}")
    return 0
