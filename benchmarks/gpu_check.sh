#!/usr/bin/env bash
# One prepared check for a lent GPU machine, under 8 minutes, with no hub and no ../shared.
#
# Random-weight BERT classifiers with MiniLM's shapes (6 layers, hidden 384, 12 heads, FFN 1536)
# and BERT-base's (12, 768, 12, 3072) are built from config; each is exported fp32 (optimized) and
# fp16 (the MiniLM shape also bf16, last) with parity checks on onnxruntime CUDA; `compress bench` times
# PyTorch eager fp32 (the baseline), torch-fp16, torch-bf16, torch-compile and the onnxruntime CUDA
# fp32/fp16 files at batch 32 x 128 and 1 x 128; the tests marked `gpu` run. Everything lands in
# $OUT/gpu_check.json (rewritten after every step, so a cut-off run keeps what it finished), beside
# the bench run folders and the tests' JUnit XML; the models and .onnx files (about 1.5 GB) go to
# $WORK if set (kept), else to a temporary folder removed at the end.
#
#   OUT=/tmp/gpu-check benchmarks/gpu_check.sh          # PYTHON=... to choose the interpreter
#   benchmarks/gpu_check.sh --tiny                      # the CPU rehearsal (what the test runs)
#
# The driver starts no step once --budget-s (420 s) is spent; `timeout` is the hard stop at 470 s.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts/gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COMPRESS_NO_PROGRESS=1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi: not available" > "$OUT/nvidia-smi.txt"
timeout 470 "$PY" benchmarks/gpu_check.py --out "$OUT" ${WORK:+--work "$WORK"} --budget-s 420 "$@"
