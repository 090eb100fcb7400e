#!/usr/bin/env bash
# Structured removal with reconstruction (--criterion obs) against Fisher + rescaling (--criterion
# fisher), paired: the same fine-tuned model, calibration draw (--seed), targets and latency table.
#
#   bash benchmarks/structured_reconstruction.sh TEACHER OUT [STEP ...]
#
# TEACHER: MiniLM fine-tuned on SST-2 (`compress finetune --task sst2 --data-dir ../shared/data
# --train-limit 20000 --epochs 1 --max-length 64`). STEP names one run (all by default, in order):
#   obs-oneshot-sSEED / fisher-oneshot-sSEED     --speedup 2,3,4, no recovery, each from dense
#   obs-gradual-sSEED / fisher-gradual-sSEED     --speedup 2,3,4, 500 KD steps each, gradual family
#   agnews-teacher                                MiniLM on the AG News 10,000-sentence subset
#   agnews-obs-gradual-sSEED / agnews-fisher-oneshot-sSEED  --speedup 2,3 on AG News
# Each run writes OUT/STEP (family.json / family.md) and its wall time to OUT/timings.json.
set -euo pipefail
TEACHER=${1:?usage: structured_reconstruction.sh TEACHER OUT [STEP ...]}
OUT=${2:?usage: structured_reconstruction.sh TEACHER OUT [STEP ...]}
shift 2
DATA=${DATA:-../shared/data}
PY=${PY:-.venv/bin/python}
RECOVERY=${RECOVERY:-500}
mkdir -p "$OUT"
export COMPRESS_CACHE_DIR=${COMPRESS_CACHE_DIR:-$OUT/cache}
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(obs-oneshot-s42 fisher-oneshot-s42 obs-gradual-s42 obs-oneshot-s1
                                   obs-gradual-s1 agnews-teacher agnews-obs-gradual-s42 fisher-gradual-s42)

timed() {  # timed NAME CMD...: run CMD, add {NAME: seconds} to timings.json
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@"
  "$PY" - "$OUT/timings.json" "$name" "$t0" <<'PYEOF'
import json, os, sys, time
path, name, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = json.load(open(path)) if os.path.exists(path) else {}
data[name] = round(time.time() - t0, 1)
json.dump(data, open(path, "w"), indent=2)
print(f"{name}: {data[name]} s")
PYEOF
}

family() {  # family STEP MODEL TASK TRAIN_LIMIT TARGETS CRITERION SEED MODE [extra flags]
  local step=$1 model=$2 task=$3 limit=$4 targets=$5 criterion=$6 seed=$7 mode=$8; shift 8
  [[ -d "$OUT/$step" ]] && return 0
  timed "$step" "$PY" -m compress prune --stage post-training --model "$model" --task "$task" \
      --data-dir "$DATA" --train-limit "$limit" --max-length 64 --structured heads,ffn \
      --criterion "$criterion" --calibration-samples 512 --latency-shape 32x128 --seed "$seed" \
      --speedup "$targets" --family-mode "$mode" "$@" --out "$OUT/$step"
}

for step in "${STEPS[@]}"; do
  case $step in
    obs-oneshot-s*|fisher-oneshot-s*)
      c=${step%%-*}; s=${step##*-s}
      family "$step" "$TEACHER" sst2 20000 2,3,4 "$c" "$s" independent ;;
    obs-gradual-s*|fisher-gradual-s*)
      c=${step%%-*}; s=${step##*-s}
      family "$step" "$TEACHER" sst2 20000 2,3,4 "$c" "$s" gradual --recovery-steps "$RECOVERY" \
          --teacher self ;;
    agnews-teacher)
      [[ -d "$OUT/agnews-teacher" ]] || timed agnews-teacher "$PY" -m compress finetune --task ag_news \
          --data-dir "$DATA" --train-limit 10000 --epochs 1 --max-length 64 --out "$OUT/agnews-teacher" ;;
    agnews-obs-gradual-s*|agnews-fisher-gradual-s*)
      c=${step#agnews-}; c=${c%%-*}; s=${step##*-s}
      family "$step" "$OUT/agnews-teacher" ag_news 10000 2,3 "$c" "$s" gradual \
          --recovery-steps "$RECOVERY" --teacher self ;;
    agnews-obs-oneshot-s*|agnews-fisher-oneshot-s*)
      c=${step#agnews-}; c=${c%%-*}; s=${step##*-s}
      family "$step" "$OUT/agnews-teacher" ag_news 10000 2,3 "$c" "$s" independent ;;
    *) echo "unknown step '$step'" >&2; exit 2 ;;
  esac
done
