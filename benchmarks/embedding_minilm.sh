#!/usr/bin/env bash
# The packaged all-MiniLM-L6-v2 compressed as an embedding model, end to end, with no fine-tuning:
# scored as is on ReQA (SQuAD dev, the last 10 of 48 articles) and MRPC dev pairs; pruned one-shot
# (SparseGPT, Wanda, magnitude at 50%, SparseGPT over several calibration draws and with 2048
# sentences), calibrated on WikiText-2 sentences; a structured model aimed at SPEEDUP times the
# dense int8 speed (latency table of this machine) and recovered by RECOVERY steps of embedding
# distillation; the dense and structured models exported to int8 ONNX with their embedding parity;
# the static student beside Model2Vec; one fixed-shape bench (batch 1 and 32 x 128 tokens, int8
# graphs in onnxruntime) and one bench on real sentences (sentences/s with scores).
#
#   DATA=../shared/data OUT=artifacts/embedding-minilm benchmarks/embedding_minilm.sh
#
# Each step is skipped when its run folder (under $OUT/runs) or file is there already, so the script
# can be stopped and run again. Results: $OUT/embedding_minilm.json (every run's scores, the exports'
# parity, both benches), built by benchmarks/embedding_table.py.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATA:?set DATA to a folder holding squad_v1.1, mrpc and wikitext2}"
OUT="${OUT:-$PWD/artifacts/embedding-minilm}"
PY="${PYTHON:-python3}"
SPEEDUP="${SPEEDUP:-2}"
RECOVERY="${RECOVERY:-500}"
SEEDS="${SEEDS:-42 1 2}"
mkdir -p "$OUT/runs"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COMPRESS_NO_PROGRESS=1
nvidia-smi --query-gpu=name --format=csv > "$OUT/device.txt" 2>&1 || echo "no GPU: $(nproc) CPU cores" > "$OUT/device.txt"
data=(--task embedding --data-dir "$DATA" --split-by-article 38/10)
source benchmarks/run_step.sh  # run NAME ARGS...: one compress command, unless finished
run dense-eval eval --model minilm "${data[@]}" --out "$OUT/runs/dense-eval"
post=(prune --stage post-training --model minilm "${data[@]}")
# the same structured prune (same seed, same Fisher), three recoveries: embeddings alone at the
# default rate, plus the layer-wise MSE of the kept layers, and embeddings alone at 4x the rate
s="structured-${SPEEDUP}x"
structured=(--structured heads,ffn --criterion fisher --speedup "$SPEEDUP" --recovery-steps "$RECOVERY")
run "$s" "${post[@]}" "${structured[@]}" --out "$OUT/runs/$s"
run "$s-layers" "${post[@]}" "${structured[@]}" --teacher self --kd-layers 1 --out "$OUT/runs/$s-layers"
run "$s-lr2e-4" "${post[@]}" "${structured[@]}" --lr 2e-4 --out "$OUT/runs/$s-lr2e-4"
run dense-int8 export minilm --to "$OUT/runs/dense-int8.onnx" --optimize --quantize int8 "${data[@]}"
for m in "$s" "$s-lr2e-4"; do
  run "$m-int8" export "$OUT/runs/$m" --to "$OUT/runs/$m-int8.onnx" --optimize --quantize int8 "${data[@]}"
done
for seed in $SEEDS; do
  run "sparsegpt-50-seed$seed" "${post[@]}" --criterion sparsegpt --sparsity 0.5 --seed "$seed" \
    --out "$OUT/runs/sparsegpt-50-seed$seed"
done
run sparsegpt-50-2048 "${post[@]}" --criterion sparsegpt --sparsity 0.5 --calibration-samples 2048 \
  --out "$OUT/runs/sparsegpt-50-2048"
run wanda-50 "${post[@]}" --criterion wanda --sparsity 0.5 --out "$OUT/runs/wanda-50"
run magnitude-50 "${post[@]}" --criterion magnitude --sparsity 0.5 --out "$OUT/runs/magnitude-50"
run static-256 distill --student static --teacher minilm "${data[@]}" --out "$OUT/runs/static-256"
run bench-grid bench "dense-int8=$OUT/runs/dense-int8.onnx" "structured-int8=$OUT/runs/$s-int8.onnx" \
  "structured-lr2e-4-int8=$OUT/runs/$s-lr2e-4-int8.onnx" --batch-sizes 1,32 --seq-lens 128 --runtimes ort \
  --provider cpu --rounds 5 --out "$OUT/runs/bench-grid"
run bench-sentences bench --task embedding dense-torch=minilm "dense-int8=$OUT/runs/dense-int8.onnx" \
  "structured-int8=$OUT/runs/$s-int8.onnx" "structured-lr2e-4-int8=$OUT/runs/$s-lr2e-4-int8.onnx" \
  "static=$OUT/runs/static-256" "${data[@]:2}" --out "$OUT/runs/bench-sentences"
"$PY" benchmarks/embedding_table.py "$OUT/runs" --out "$OUT/embedding_minilm.json"
