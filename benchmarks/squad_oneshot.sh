#!/usr/bin/env bash
# SQuAD v1.1 one-shot post-training pruning, end to end: fine-tune MiniLM on the first 38 articles of
# the dev file (two epochs, length 256, the settings of the QA section of docs/results.md), then prune
# it once with SparseGPT, Wanda and magnitude (encoder matrices, 512 calibration windows, no training
# after pruning) and score each on all questions of the other 10 articles. Made for a GPU (minutes);
# on a CPU the fine-tune alone takes about two hours.
#
#   MODEL=path/to/minilm DATA=../shared/data OUT=artifacts/squad-oneshot benchmarks/squad_oneshot.sh
#
# DATA holds squad_v1.1/dev-v1.1.json. FINETUNE_FLAGS adds flags to the fine-tune (e.g. --max-steps 2
# for a rehearsal), RUNS chooses the pruned runs, SPLIT (38/10) and MAX_LENGTH (256) the data. $OUT
# gets device.txt, finetune.log, dense_summary.json and oneshot_squad.json (one row per pruned run,
# written as each ends); the models go to $WORK (default: a temporary folder). A fine-tuned model
# already in $WORK/dense is used again: remove it after changing SPLIT, MAX_LENGTH or MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a MiniLM folder}" "${DATA:?set DATA to a folder holding squad_v1.1/dev-v1.1.json}"
OUT="${OUT:-$PWD/artifacts/squad-oneshot}"
WORK="${WORK:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
RUNS="${RUNS:-sparsegpt-50,wanda-50,magnitude-50,sparsegpt-60,sparsegpt-2of4,sparsegpt-70}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COMPRESS_NO_PROGRESS=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1 ||
  echo "no nvidia-smi: $(nproc) CPU cores" > "$OUT/device.txt"
SPLIT="${SPLIT:-38/10}"
MAX_LENGTH="${MAX_LENGTH:-256}"
data=(--task squad --data-dir "$DATA" --split-by-article "$SPLIT")
start=$(date +%s)
if [ ! -f "$WORK/dense/summary.json" ]; then
  "$PY" -m compress finetune --model "$MODEL" "${data[@]}" --max-length "$MAX_LENGTH" --seed 42 \
    --epochs 2 --lr 1e-4 --batch-size 16 ${FINETUNE_FLAGS:-} --out "$WORK/dense" > "$OUT/finetune.log" 2>&1 || { tail -20 "$OUT/finetune.log"; exit 1; }
fi
cp "$WORK/dense/summary.json" "$OUT/dense_summary.json"
echo "fine-tune: $(( $(date +%s) - start )) s"
"$PY" benchmarks/oneshot_post_training.py --dense "$WORK/dense" "${data[@]}" --max-length "$MAX_LENGTH" \
  --seed 42 --cells oneshot,recovery --only "$RUNS" --runs-dir "$WORK/runs" --out "$OUT/oneshot_squad.json"
echo "all: $(( $(date +%s) - start )) s"
