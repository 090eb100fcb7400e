#!/usr/bin/env bash
# The reduced Gordon et al. sweep for a 2-core CPU (issue 7 acceptance run).
#
#   MiniLM; SST-2 (first $TRAIN_LIMIT training sentences, full 872-sentence dev set) and RTE
#   (full 277-pair dev set); sparsities 0, 0.2, 0.4, 0.6, 0.8; magnitude vs random pruning during
#   $PRETRAIN_STEPS steps of masked-LM pre-training on WikiText-2, then $STEPS fine-tuning steps
#   per task. 9 pre-training cells (dense + 4 sparsities x 2 criteria) + 18 fine-tuning cells.
#
# Resumable: if it is interrupted, run the same command again (same OUT); finished cells are kept.
# Time: see the estimate printed below and benchmarks/README-sweep.md; parameters via env vars:
#   OUT=artifacts/sweep-small STEPS=30 PRETRAIN_STEPS=20 TRAIN_LIMIT=2000 JOBS=1 benchmarks/sweep_small.sh
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-artifacts/sweep-small}
DATA=${DATA:-../shared/data}
STEPS=${STEPS:-30}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-20}
TRAIN_LIMIT=${TRAIN_LIMIT:-2000}
LR=${LR:-1e-4}
JOBS=${JOBS:-1}
COMPRESS=${COMPRESS:-.venv/bin/compress}

echo "sweep_small: $OUT (steps=$STEPS pretrain_steps=$PRETRAIN_STEPS train_limit=$TRAIN_LIMIT jobs=$JOBS)"
echo "estimate on an idle 2-core CPU with the defaults: ~35 minutes (9 pre-training cells ~1.3 min,"
echo "9 SST-2 cells ~1.2 min, 9 RTE cells ~1.6 min each; see the report for the measured time)"
start=$(date +%s)
"$COMPRESS" sweep \
  --model minilm --data-dir "$DATA" \
  --tasks sst2,rte --sparsities 0,0.2,0.4,0.6,0.8 --variants magnitude,random \
  --lrs "$LR" --train-limit "$TRAIN_LIMIT" --max-steps "$STEPS" --batch-size 16 --max-length 64 \
  --pretrain-corpus "$DATA/wikitext2" --pretrain-steps "$PRETRAIN_STEPS" --pretrain-lr 1e-4 \
  --pretrain-batch-size 16 --pretrain-max-length 64 --pretrain-heldout-blocks 64 \
  --jobs "$JOBS" --out "$OUT"
"$COMPRESS" report "$OUT"
echo "sweep_small: finished in $(( ($(date +%s) - start) / 60 )) min; table: $OUT/report.md"
