#!/usr/bin/env bash
# Role discovery on real pretrained weights, checked against the role table: the packaged
# all-MiniLM-L6-v2 (BERT, role table) and the same weights saved as ERNIE (no role table, roles found
# by discovery; benchmarks/as_ernie.py) go through the same commands, as embedding models with no
# fine-tuning: eval, SparseGPT 50% one-shot, Fisher-structured to -50% FLOPs (one-shot, then the
# int8 export with its fusion and embedding parity, both int8 graphs timed in one bench run).
# benchmarks/discovered_table.py compares them.
#
#   DATA=../shared/data OUT=artifacts/discovered-minilm benchmarks/discovered_minilm.sh
#
# A step is skipped when its output is there already.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATA:?set DATA to a folder holding squad_v1.1, mrpc and wikitext2}"
OUT="${OUT:-$PWD/artifacts/discovered-minilm}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT/runs"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COMPRESS_NO_PROGRESS=1
data=(--task embedding --data-dir "$DATA" --split-by-article 38/10)
source benchmarks/run_step.sh  # run NAME ARGS...: one compress command, unless finished
[ -f "$OUT/minilm-ernie/config.json" ] || "$PY" benchmarks/as_ernie.py "$OUT/minilm-ernie" minilm
for pair in "bert=minilm" "ernie=$OUT/minilm-ernie"; do
  tag=${pair%%=*}; model=${pair#*=}
  run "$tag-eval" eval --model "$model" "${data[@]}" --out "$OUT/runs/$tag-eval"
  post=(prune --stage post-training --model "$model" "${data[@]}")
  run "$tag-sparsegpt-50" "${post[@]}" --criterion sparsegpt --sparsity 0.5 --out "$OUT/runs/$tag-sparsegpt-50"
  run "$tag-fisher-50" "${post[@]}" --structured heads,ffn --criterion fisher --flops-reduction 0.5 \
    --out "$OUT/runs/$tag-fisher-50"
  run "$tag-fisher-50-int8" export "$OUT/runs/$tag-fisher-50" --to "$OUT/runs/$tag-fisher-50-int8.onnx" \
    --optimize --quantize int8 "${data[@]}"
done
run bench bench "bert-int8=$OUT/runs/bert-fisher-50-int8.onnx" "ernie-int8=$OUT/runs/ernie-fisher-50-int8.onnx" \
  --batch-sizes 1,32 --seq-lens 128 --runtimes ort --provider cpu --rounds 5 --out "$OUT/runs/bench"
"$PY" benchmarks/discovered_table.py "$OUT/runs" --out "$OUT/discovered_minilm.json"
