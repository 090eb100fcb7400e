#!/usr/bin/env bash
# Export the dense model and every member of a finished --speedup family again with today's
# `compress export --optimize --quantize int8` (with their SST-2 dev scores), then time them all in
# one `compress bench` run beside the dense model in PyTorch eager fp32 (batch 1 and 32, 128 tokens).
# For a quiet re-measure of a family whose own bench shared the CPU, or after an export change.
#
#   bash benchmarks/family_rebench.sh FAMILY_DIR OUT_DIR
set -euo pipefail
FAMILY=${1:?usage: family_rebench.sh FAMILY_DIR OUT_DIR}
OUT=${2:?usage: family_rebench.sh FAMILY_DIR OUT_DIR}
DATA=${DATA:-../shared/data}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
DENSE=$(grep '^model:' "$FAMILY/config.yaml" | awk '{print $2}')  # the family's dense --model
export_one() {  # export_one MODEL NAME
  [[ -f "$OUT/$2-int8.onnx" ]] || "$PY" -m compress export "$1" --to "$OUT/$2-int8.onnx" --optimize \
      --quantize int8 --task sst2 --data-dir "$DATA" --max-length 64 > "$OUT/$2-export.log" 2>&1
}
export_one "$DENSE" dense
ENTRIES=("dense-eager-fp32=$DENSE" "dense-int8=$OUT/dense-int8.onnx")
for member in "$FAMILY"/speedup-*; do
  name=$(basename "$member"); name=${name#speedup-}
  export_one "$member" "$name"
  ENTRIES+=("$name=$OUT/$name-int8.onnx")
done
"$PY" -m compress bench "${ENTRIES[@]}" --batch-sizes 1,32 --seq-lens 128 --runtimes torch --rounds 5 \
    --out "$OUT/bench"
