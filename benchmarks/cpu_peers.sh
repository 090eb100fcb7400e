#!/usr/bin/env bash
# onnxruntime on the CPU against PyTorch's own CPU paths, in one `compress bench` run: eager fp32,
# torch.compile, dynamic int8 nn.Linear (torch-int8), the fp32 export (ort) and its dynamic int8
# quantization, batch 1 and 32 x 128. Writes <out>/bench/bench.json (ratios vs eager fp32).
#   benchmarks/cpu_peers.sh [MODEL] [OUT]      MODEL: a fine-tuned run/model folder or minilm
set -euo pipefail
MODEL=${1:-minilm}
OUT=${2:-artifacts/cpu-peers}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
if [ ! -f "$OUT/int8.onnx" ]; then
  "$PY" -m compress export "$MODEL" --to "$OUT/int8.onnx" --optimize --quantize int8
fi
"$PY" -m compress bench "base=$MODEL" "ort-int8=$OUT/int8.onnx" \
  --runtimes torch,torch-compile,torch-int8,ort --batch-sizes 1,32 --seq-lens 128 \
  --iterations 5 --rounds 5 --out "$OUT/bench"
