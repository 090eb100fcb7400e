"""Export the dense model and every member of a finished --speedup family again with today's
`compress export --optimize --quantize int8` (with their SST-2 dev scores), then time them all in
one `compress bench` run beside the dense model in PyTorch eager fp32 (batch 1 and 32, 128 tokens).
For a quiet re-measure of a family whose own bench shared the CPU, or after an export change.

    python -m benchmarks family-rebench FAMILY_DIR --work OUT_DIR
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "work", "python")


def add_arguments(p) -> None:
    p.add_argument("family", type=Path, help="a finished --speedup family folder (speedup-* members)")


def budget(args) -> str:
    return "one int8 export with SST-2 dev scores per model; one bench run: 5 rounds, batch 1 and 32 x 128"


def dense_model(family: Path) -> str:
    """The family's dense --model, from its config.yaml."""
    config = family / "config.yaml"
    for line in config.read_text().splitlines() if config.is_file() else ():
        if line.startswith("model:"):
            return line.split(":", 1)[1].strip()
    raise BenchmarkError(f"{config} names no model: is {family} a --speedup family folder?")


def run(args, ctx) -> dict | None:
    dense = dense_model(args.family)
    members = [(m.name.removeprefix("speedup-"), str(m)) for m in sorted(args.family.glob("speedup-*"))]
    entries = [f"dense-eager-fp32={dense}"]
    for name, model in [("dense", dense), *members]:
        onnx = args.work / f"{name}-int8.onnx"
        ctx.compress(f"export-{name}", ["export", model, "--to", onnx, "--optimize", "--quantize", "int8",
                                        "--task", "sst2", "--data-dir", args.data_dir, "--max-length", 64],
                     done=(onnx,), log=args.work / f"{name}-export.log")
        entries.append(f"{name}-int8={onnx}" if name == "dense" else f"{name}={onnx}")
    bench = args.work / "bench"
    ctx.compress("bench", ["bench", *entries, "--batch-sizes", "1,32", "--seq-lens", "128",
                           "--runtimes", "torch", "--rounds", 5, "--out", bench],
                 done=(bench / "bench.json",))
    if ctx.dry_run:
        return None
    exports = {p.stem: read_json(p).get("accuracy") for p in sorted(args.work.glob("*-int8.json"))}
    return {"family": str(args.family), "dense": dense, "exports": exports,
            "bench": read_json(bench / "bench.json"), "timings": ctx.timings()}
