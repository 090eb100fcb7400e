#!/usr/bin/env bash
# A family of structured MiniLM models aimed at measured int8 speedups on SST-2, and what each costs:
#   1. the latency table of the shipping runtime (onnxruntime int8, this machine, 32 x 128), timed;
#   2. the one-shot family (no recovery) at TARGETS, timed;
#   3. the family with RECOVERY steps of distillation from the dense model each, timed; its report
#      (family.md / family.json / family.png) names the fastest model within 1 point of dense.
#
#   bash benchmarks/speed_family.sh TEACHER [OUT]
#
# TEACHER: a run folder of MiniLM fine-tuned on SST-2, e.g. `compress finetune --task sst2 --data-dir
# ../shared/data --train-limit 20000 --epochs 1 --max-length 64`. Environment: DATA (../shared/data),
# TARGETS (2,3,4), RECOVERY (500), KD_LAYERS (0: logits only), SEED (42), ONLY ("table oneshot
# recovered": the steps to run). Every step's wall time goes to OUT/timings.json.
set -euo pipefail
TEACHER=${1:?usage: speed_family.sh TEACHER [OUT]}
OUT=${2:-artifacts/speed-family}
DATA=${DATA:-../shared/data}
TARGETS=${TARGETS:-2,3,4}
RECOVERY=${RECOVERY:-500}
KD_LAYERS=${KD_LAYERS:-0}
SEED=${SEED:-42}
ONLY=${ONLY:-table oneshot recovered}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
export COMPRESS_CACHE_DIR=${COMPRESS_CACHE_DIR:-$OUT/latency-cache}

COMMON=(--stage post-training --model "$TEACHER" --task sst2 --data-dir "$DATA" --train-limit 20000
        --max-length 64 --structured heads,ffn --criterion fisher --calibration-samples 512
        --latency-shape 32x128 --seed "$SEED")

timed() {  # timed NAME CMD...: run CMD, add {NAME: seconds} to timings.json
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@"
  "$PY" - "$OUT/timings.json" "$name" "$t0" <<'EOF'
import json, os, sys, time
path, name, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = json.load(open(path)) if os.path.exists(path) else {}
data[name] = round(time.time() - t0, 1)
json.dump(data, open(path, "w"), indent=2)
print(f"{name}: {data[name]} s")
EOF
}

if [[ " $ONLY " == *" table "* ]]; then
  timed latency_table "$PY" benchmarks/latency_table.py --model "$TEACHER" --runtime ort-int8 --batch 32 \
      --seq-len 128 --rebuild --cache-dir "$COMPRESS_CACHE_DIR/latency" --out "$OUT/latency_table.json"
fi
if [[ " $ONLY " == *" oneshot "* && ! -d "$OUT/oneshot" ]]; then
  timed oneshot_family "$PY" -m compress prune "${COMMON[@]}" --speedup "$TARGETS" --out "$OUT/oneshot"
fi
if [[ " $ONLY " == *" recovered "* && ! -d "$OUT/recovered" ]]; then
  KD=(--teacher self)
  [[ "$KD_LAYERS" != 0 ]] && KD+=(--kd-layers "$KD_LAYERS")
  timed recovered_family "$PY" -m compress prune "${COMMON[@]}" --speedup "$TARGETS" \
      --recovery-steps "$RECOVERY" "${KD[@]}" --out "$OUT/recovered"
fi
