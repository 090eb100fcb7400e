#!/usr/bin/env bash
# Speed at kept accuracy: the dense fine-tuned model in PyTorch eager fp32 (the baseline) against
# int8 exports of the dense model and of each pruned model given, in one `compress bench` run at
# batch 1 and 32 x 128; each export's dev accuracy (fp32 and int8, onnxruntime) is measured on
# --task beside it. Writes <out>/<name>-int8.onnx (+ .json report) and <out>/bench/bench.json.
#   benchmarks/speed_at_kept_accuracy.sh DENSE OUT NAME=PRUNED [NAME=PRUNED ...]
#   e.g. benchmarks/speed_at_kept_accuracy.sh artifacts/dap/dense artifacts/speed \
#            fisher40=artifacts/dap/runs/fisher-flops40-kd250
# TASK_FLAGS (default: SST-2 from ../shared/data) says where the dev set is.
set -euo pipefail
DENSE=$1; OUT=$2; shift 2
PY=${PYTHON:-.venv/bin/python}
TASK_FLAGS=${TASK_FLAGS:---task sst2 --data-dir ../shared/data --max-length 64}
mkdir -p "$OUT"
ENTRIES=("dense=$DENSE")
for spec in "dense=$DENSE" "$@"; do
  name=${spec%%=*}; model=${spec#*=}
  if [ ! -f "$OUT/$name-int8.onnx" ]; then
    # shellcheck disable=SC2086
    "$PY" -m compress export "$model" --to "$OUT/$name-int8.onnx" --optimize --quantize int8 $TASK_FLAGS
  fi
  ENTRIES+=("$name-int8=$OUT/$name-int8.onnx")
done
"$PY" -m compress bench "${ENTRIES[@]}" --runtimes torch,ort --batch-sizes 1,32 --seq-lens 128 \
  --iterations 5 --rounds 5 --out "$OUT/bench"
