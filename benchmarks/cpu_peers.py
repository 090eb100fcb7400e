"""onnxruntime on the CPU against PyTorch's own CPU paths, in one `compress bench` run: eager fp32,
torch.compile, dynamic int8 nn.Linear (torch-int8), the fp32 export (ort) and its dynamic int8
quantization, batch 1 and 32 x 128 (ratios against eager fp32).

MODEL: a fine-tuned run or model folder, or minilm. The int8 export is kept in --work and reused.
"""

from __future__ import annotations

from benchmarks.suite import read_json

COMMON = ("work", "python")


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default="minilm", help="a fine-tuned run/model folder, or minilm")


def budget(args) -> str:
    return "one export; one bench run: 5 rounds of 5 timed calls per runtime, batch 1 and 32 x 128"


def run(args, ctx) -> dict | None:
    onnx = args.work / "int8.onnx"
    ctx.compress("export-int8", ["export", args.model, "--to", onnx, "--optimize", "--quantize", "int8"],
                 done=(onnx,))
    bench = args.work / "bench"
    ctx.compress("bench", ["bench", f"base={args.model}", f"ort-int8={onnx}",
                           "--runtimes", "torch,torch-compile,torch-int8,ort", "--batch-sizes", "1,32",
                           "--seq-lens", "128", "--iterations", 5, "--rounds", 5, "--out", bench],
                 done=(bench / "bench.json",))
    if ctx.dry_run:
        return None
    return {"bench": read_json(bench / "bench.json"), "timings": ctx.timings()}
