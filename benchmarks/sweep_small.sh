#!/usr/bin/env bash
# The reduced Gordon et al. sweep for a 2-core CPU (issue 7 acceptance run).
#
#   MiniLM; SST-2 (first $TRAIN_LIMIT training sentences, full 872-sentence dev set) and RTE
#   (full 277-pair dev set); sparsities 0, 0.2, 0.4, 0.6, 0.8; magnitude vs random pruning during
#   $PRETRAIN_STEPS steps of masked-LM pre-training on WikiText-2, then $STEPS fine-tuning steps
#   per task. 9 pre-training cells (dense + 4 sparsities x 2 criteria) + 18 fine-tuning cells.
#
# Resumable: if it is interrupted, run the same command again (same OUT); finished cells are kept.
# Parameters via env vars:
#   OUT=artifacts/sweep-small STEPS=50 PRETRAIN_STEPS=30 TRAIN_LIMIT=2000 JOBS=1 benchmarks/sweep_small.sh
#
# Time estimate (idle 2-core CPU, defaults): ~25-35 minutes. Basis, measured single-threaded here
# (CPU seconds): MiniLM classification step, batch 16 x 64 tokens, 0.65-0.7 s; masked-LM step
# (full-vocabulary head) 1.56 s; dev scoring 0.65 s per 128 sentences of 32 tokens. So a
# pre-training cell is ~30 x 1.56 + ~20 s start/score/save = ~70 CPU s, and a fine-tuning cell
# ~50 x 0.7 + ~15 s = ~50 CPU s. 27 cells come to ~1,500 CPU s, which is 15-20 min of wall time
# with 2 threads, before process start-up and the report. Whole cells run on this machine while
# 5+ other jobs shared the 2 cores took 2.8 CPU min each (9.5 min wall), so a busy machine is much
# slower. Halve STEPS and PRETRAIN_STEPS to halve the training part.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-artifacts/sweep-small}
DATA=${DATA:-../shared/data}
STEPS=${STEPS:-50}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-30}
TRAIN_LIMIT=${TRAIN_LIMIT:-2000}
LR=${LR:-1e-4}
JOBS=${JOBS:-1}
COMPRESS=${COMPRESS:-.venv/bin/compress}

echo "sweep_small: $OUT (steps=$STEPS pretrain_steps=$PRETRAIN_STEPS train_limit=$TRAIN_LIMIT jobs=$JOBS)"
echo "estimate on an idle 2-core CPU with the defaults: 25-35 minutes (27 cells; see the header)"
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
