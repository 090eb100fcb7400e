"""Speed at kept accuracy: the dense fine-tuned model in PyTorch eager fp32 (the baseline) against
int8 exports of the dense model and of each pruned model given, in one `compress bench` run at
batch 1 and 32 x 128; each export's dev score (fp32 and int8, onnxruntime) is measured on --task
beside it. Exports go to --work as NAME-int8.onnx (+ .json report) and are reused.

    python -m benchmarks speed-at-kept-accuracy artifacts/dap/dense \\
        fisher40=artifacts/dap/runs/fisher-flops40-kd250 --work artifacts/speed
"""

from __future__ import annotations

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "work", "python")


def add_arguments(p) -> None:
    p.add_argument("dense", help="the dense fine-tuned run folder (the baseline)")
    p.add_argument("pruned", nargs="*", metavar="NAME=RUN", help="pruned models to export and bench")
    p.add_argument("--task", default="sst2", help="the task of the dev scores")
    p.add_argument("--max-length", type=int, default=64, help="of the dev scoring")


def budget(args) -> str:
    return (f"{1 + len(args.pruned)} int8 exports with {args.task} dev scores; one bench run: 5 rounds of "
            f"5 timed calls, batch 1 and 32 x 128")


def models(args) -> list[tuple[str, str]]:
    pairs = [("dense", args.dense)]
    for spec in args.pruned:
        name, sep, model = spec.partition("=")
        if not sep or not name or not model:
            raise BenchmarkError(f"pruned models are NAME=RUN, got {spec!r}")
        pairs.append((name, model))
    return pairs


def run(args, ctx) -> dict | None:
    task = ["--task", args.task, "--data-dir", args.data_dir, "--max-length", args.max_length]
    entries = [f"dense={args.dense}"]
    for name, model in models(args):
        onnx = args.work / f"{name}-int8.onnx"
        ctx.compress(f"export-{name}", ["export", model, "--to", onnx, "--optimize", "--quantize", "int8",
                                        *task], done=(onnx,))
        entries.append(f"{name}-int8={onnx}")
    bench = args.work / "bench"
    ctx.compress("bench", ["bench", *entries, "--runtimes", "torch,ort", "--batch-sizes", "1,32",
                           "--seq-lens", "128", "--iterations", 5, "--rounds", 5, "--out", bench],
                 done=(bench / "bench.json",))
    if ctx.dry_run:
        return None
    exports = {name: read_json(args.work / f"{name}-int8.json") for name, _ in models(args)
               if (args.work / f"{name}-int8.json").is_file()}
    return {"exports": {n: e.get("accuracy") for n, e in exports.items()},
            "bench": read_json(bench / "bench.json"), "timings": ctx.timings()}
